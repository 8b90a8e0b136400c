"""OCI images over the network: a distribution-spec client, the embedded registry, pulls into the node cache.

Blueprint images are built on a worker of a build pool, pushed to an OCI
registry (CNCF distribution: Debian's ``docker-registry``, which ``levers9 up``
runs beside its Redis, or any registry that speaks the distribution spec), and
pulled by digest into each worker's layer cache. This package owns the wire
side of that; unpacking and caching stay in :mod:`levers9.engine.images`.

- :mod:`~levers9.registry.refs`: ``host[:port]/repository[:tag][@sha256:...]`` refs (:func:`parse_ref`);
- :mod:`~levers9.registry.errors`: :class:`~levers9.registry.errors.RegistryError`, naming the registry,
  repository, operation and the registry's own error code;
- :mod:`~levers9.registry.auth`: credentials, HTTP basic and the bearer-token flow;
- :mod:`~levers9.registry.client`: :class:`~levers9.registry.client.RegistryClient` (blobs, manifests, tags)
  and :func:`~levers9.registry.client.push_image`;
- :mod:`~levers9.registry.pull`: :class:`~levers9.registry.pull.RegistryPuller`, what
  :class:`~levers9.engine.images.ImageStore` is given to resolve registry refs;
- :mod:`~levers9.registry.server`: :class:`~levers9.registry.server.EmbeddedRegistry`, a ``docker-registry``
  child process; :mod:`~levers9.registry.supervisor` restarts it when it dies.

Invariants: nothing here reaches Docker Hub (a ref must name its registry's
host); every digest read is checked against the bytes that came back; every
failure is a :class:`~levers9.registry.errors.RegistryError`, never a bare
HTTP or connection exception.
"""
