"""The application services: every operation of the controlplane and who may do it, whatever the transport.

REST (:mod:`levers9.controlplane.http`), gRPC (:mod:`levers9.controlplane.grpc_api`,
:mod:`~levers9.controlplane.grpc_worker`) and the gateway (:mod:`levers9.gateway`)
translate to and from these modules; none of them reaches into the scheduler,
Redis or the SQL stores itself. This package imports nothing from the
controlplane, the gateway, the worker or the CLI.

- :mod:`~levers9.services.core`: :class:`~levers9.services.core.Services`, everything one process holds
  (stores, Redis, the scheduler), opened once from the config;
- :mod:`~levers9.services.auth`: tokens checked against their hashes, cached; the principal behind a call;
- :mod:`~levers9.services.access`: every authorisation rule (operators, own workspace, what is visible);
- :mod:`~levers9.services.errors`: the domain errors and their one HTTP table (REST and the gateway);
- :mod:`~levers9.services.dataplane`: the call engine (:class:`~levers9.services.dataplane.DataPlane`):
  stubs, payloads and blobs, submit, watch, cancel, and what workers take and report;
- :mod:`~levers9.services.stubs`: a stub's settings, validated once; :mod:`~levers9.services.reports`:
  what workers report, and the listener told of serving containers;
- :mod:`~levers9.services.tasks`: listing tasks, one task, its history and output, cancelling (REST and gRPC
  alike), a deployment's task as the gateway answers it;
- :mod:`~levers9.services.deployments`: deploying, listing, stopping a version, which stub serves a name;
- :mod:`~levers9.services.pools`: pools and workers, one visibility rule and one set of fields;
- :mod:`~levers9.services.machines`: machines (operators only);
- :mod:`~levers9.services.workspaces`: who am I, workspaces, user tokens (issue, list, revoke);
- :mod:`~levers9.services.secrets`: a workspace's write-only secrets;
- :mod:`~levers9.services.fleet`: the workers' side: who a worker is, registering, its blobs, checkpoints and
  stub definitions, keepalives, draining and leaving;
- :mod:`~levers9.services.serving`: which replica owns which serving container (orphans are stopped);
- :mod:`~levers9.services.health`: whether the database and Redis answer;
- :mod:`~levers9.services.hub`: wake-ups between replicas (placed work, finished tasks, cancels);
- :mod:`~levers9.services.metrics`: Prometheus metrics; :mod:`~levers9.services.isolation`: how isolated a
  pool's calls are.
"""
