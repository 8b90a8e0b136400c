"""Fast, shared state in Redis: the backlog, the worker registry, per-worker queues and containers.

SQL holds the truth about tasks; Redis holds what the scheduler must change many
thousand times a second and share between controlplane replicas. Every change
that touches more than one key is one Lua script, so it is atomic.
"""
