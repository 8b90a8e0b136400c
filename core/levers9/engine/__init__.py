"""The OCI container engine behind the runc and runsc runtime plugins (and the process runtime).

A worker runs each container from a bundle (a ``config.json`` and a root
filesystem) with an OCI runtime, supervised by a small shim, on a network
namespace of its own. This package owns every step of that, and nothing above
the runtime hooks:

- :mod:`~levers9.engine.hooks`: the container hooks, as base classes of a runtime plugin whose work an engine does;
- :mod:`~levers9.engine.oci`: running containers with runc or runsc; their state directories;
- :mod:`~levers9.engine.runc`: a pool's runc settings and the engine built from them (runc and criu plugins);
- :mod:`~levers9.engine.process`: the process runtime's engine (a plain host process, same records);
- :mod:`~levers9.engine.spec`: the OCI runtime configuration (``config.json``) of one container;
- :mod:`~levers9.engine.seccomp`: the seccomp profile of every runc and gVisor container;
- :mod:`~levers9.engine.userns`: user namespaces for runc containers, with idmapped mounts;
- :mod:`~levers9.engine.shim` (and ``shim.sh``): the per-container process that records how it ended;
- :mod:`~levers9.engine.as_user`: running the process runtime's command as an unprivileged user;
- :mod:`~levers9.engine.node`: what every runtime on a worker shares: the image cache and the bridge;
- :mod:`~levers9.engine.images`: the image store: refs to resolved images, the layer cache, its records and locks;
- :mod:`~levers9.engine.image_types`: the public image types and :class:`~levers9.engine.image_types.ImageError`;
- :mod:`~levers9.engine.image_sources`: reading OCI layouts and ``docker save`` tarballs;
- :mod:`~levers9.engine.layers`: unpacking one layer safely (whiteouts, path checks);
- :mod:`~levers9.engine.host_image`: the ``host`` image (the host's own /usr and Python);
- :mod:`~levers9.engine.rootfs`: a container's root filesystem (an overlay of the image's layers);
- :mod:`~levers9.engine.network`: network namespaces, the bridge, addresses and forwarded ports;
- :mod:`~levers9.engine.host_guard`: the rule that keeps containers on a bridge off their host's listeners;
- :mod:`~levers9.engine.cdi`: GPUs through the Container Device Interface.

Invariants: every hook is a stateless call (a container's state lives in its
own directory, so a restarted worker finds it again), removal is idempotent,
and state files are written whole (:func:`levers9.files.write_atomic`).
"""
