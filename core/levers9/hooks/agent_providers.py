"""The names of the built-in providers whose machines are served by a levers9 agent that dials out.

Two providers are *agent-backed*: ``agent_machine`` (boxes joined with ``levers9
machine create``, workers in Docker) and ``attached_cluster`` (a workspace's own
Kubernetes cluster, workers as Jobs). Their plugins, the controlplane's services
for them (:mod:`levers9.services.agent_pools`), the config checks and the CLI all
name them; this module is the one place those names are written, low enough that
each of them may import it (plugins may import :mod:`levers9.hooks`). A name here
is the plugin's entry-point name: renaming one is a breaking change for configs.
"""

from __future__ import annotations

__all__ = ["AGENT_MACHINE", "AGENT_PROVIDERS", "ATTACHED_CLUSTER"]

#: joined machines: one agent per box, workers as Docker containers
AGENT_MACHINE = "agent_machine"
#: attached clusters: one agent per Kubernetes cluster, workers as Jobs
ATTACHED_CLUSTER = "attached_cluster"
#: every provider whose pools are served by agents
AGENT_PROVIDERS = frozenset({AGENT_MACHINE, ATTACHED_CLUSTER})
