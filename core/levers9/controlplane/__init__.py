"""The controlplane process: gRPC for the SDK, CLI and workers, REST under /api/v1, and metrics.

The servicers are thin: each turns a wire message into a call on
:class:`~levers9.services.dataplane.DataPlane` (or a store) and back, so the
gRPC and HTTP front ends share one implementation of every operation.
"""
