"""The controlplane process: gRPC for the SDK, CLI and workers, REST under /api/v1, and metrics.

Every front end here only translates: it parses a request, calls one function
of :mod:`levers9.services` and renders the answer, so REST and gRPC share one
implementation (and one authorisation) of every operation.

- :mod:`~levers9.controlplane.server`: one process composed of everything (services, gRPC, the
  gateway in front of REST, metrics), started and stopped in order;
- :mod:`~levers9.controlplane.http`: the REST app, its error answers and the ranges numbers accept;
- :mod:`~levers9.controlplane.rest_routes`: the REST routes; :mod:`~levers9.controlplane.rest_schemas`:
  their request and answer models;
- :mod:`~levers9.controlplane.grpc_api`: the ControlPlane gRPC service (SDK and CLI);
- :mod:`~levers9.controlplane.grpc_worker`: the Worker gRPC service (registration, sessions);
- :mod:`~levers9.controlplane.grpc_errors`: domain errors to gRPC status codes, in one table.
"""
