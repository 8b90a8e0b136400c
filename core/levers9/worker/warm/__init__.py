"""The worker's warm pool: containers kept after a call for the next call of the same stub.

- :mod:`~levers9.worker.warm.pool`: :class:`~levers9.worker.warm.pool.WarmPool`,
  the calls' queues and each container's life;
- :mod:`~levers9.worker.warm.scaling`: when a stub gets another container,
  the back-off after failed starts, which idle container makes room;
- :mod:`~levers9.worker.warm.launch`: the container recipe (spec, environment,
  mounts, ports) and starting, signalling and removing containers;
- :mod:`~levers9.worker.warm.runner_client`: connecting and authenticating to
  the runner inside, and the frames of one call.

Not to be confused with the OCI engine (:mod:`levers9.engine`), the gateway's
serving autoscaler, or a provider's pool of machines (``PoolSpec``).
"""
