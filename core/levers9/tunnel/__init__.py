"""The tunnel a worker the controlplane cannot connect to opens: many byte streams over one gRPC stream.

:mod:`levers9.tunnel.frames` (the frames and their protobuf form),
:mod:`levers9.tunnel.mux` (one multiplexed connection with per-stream flow
control, the same on both ends), :mod:`levers9.tunnel.streams` (asyncio
reader/writer pairs over a stream, and the relay to a local TCP connection).
"""
