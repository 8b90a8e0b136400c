"""What a worker container is given so that its worker can run containers of its own (runc, gVisor).

A pool whose runtime is ``process`` runs its calls as processes of the worker
container, which is the isolation boundary: that container stays as it always
was, unprivileged, with Docker's defaults. A pool of an OCI runtime (``runc``
or ``gvisor``, :data:`OCI_RUNTIMES`) runs each call in a container the worker
starts with the machine's ``runc`` or ``runsc`` (the worker image carries
both, with ``ip`` and ``iptables``), and the worker container is only the
worker's home. For that it needs, each for a reason (``docs/agents.md`` says
the same to operators):

* capabilities ``SYS_ADMIN`` (mounts, namespaces, overlay and idmapped
  mounts, the ``trusted.overlay`` attributes of unpacked layers: what runc
  and the image cache do), ``NET_ADMIN`` (the bridge, veth pairs, network
  namespaces and the host guard's iptables rules) and ``SYS_PTRACE`` (runc
  opens its user-namespaced child's ``/proc/<pid>/ns/mnt`` to hand it its
  mount sources, a ptrace-mode access: without it every call runs without a
  user namespace or fails with "failed to get container mount namespace:
  Permission denied"; gVisor's platforms trace the sandbox). Nothing else is
  added: Docker's default set covers the rest (chown, setuid, mknod ...);
* ``seccomp=unconfined``: Docker's default filter refuses ``keyctl``, and runc
  gives every container a session keyring of its own;
* ``apparmor=unconfined``: Docker's ``docker-default`` profile (hosts with
  AppArmor: Ubuntu, Debian) refuses ``mount`` whatever the capabilities;
  Docker ignores the option where AppArmor is off;
* ``systempaths=unconfined`` (:data:`SYSTEM_PATHS`: the API has no security
  option of that name, the CLI sends these HostConfig fields empty,
  ``MaskedPaths`` and ``ReadonlyPaths``): ``/proc/sys`` is read-only in a Docker container, and
  the engine writes sysctls of its own interfaces (IPv6 off on the bridge,
  ``ip_unprivileged_port_start`` in each container's namespace);
* the host's network namespace (the order's ``network_mode`` must be
  ``host``): the bridge and the host guard's rules must be where the box's
  own addresses are, or the guard would protect the worker container's
  addresses and leave the box's open;
* the host's cgroup tree, writable (``/sys/fs/cgroup`` bound read-write, and
  the host's cgroup namespace, without which cgroup v2 refuses to move a
  process out of the container's subtree): runc puts each call's container
  in a cgroup of its own below ``/levers9`` with the call's own limits. Those
  cgroups are not below the worker container's, so the worker container's
  CPU and memory limits bound the worker only, and a call is bounded by its
  own;
* the host's ``/run/levers9/network`` (:data:`NETWORK_STATE`, the engine's
  ``engine.node.NETWORK_STATE``: the agent may not import the engine): the
  bridge is the host's, so which container holds which of its addresses must
  be one record for every worker on the box, in a container or not, or two
  would hand out the same address;
* ``/dev/fuse`` (:data:`DEVICES`): the worker mounts the volumes its calls
  name (JuiceFS, or rclone over the controlplane's WebDAV) through FUSE, and
  binds them into the calls' containers; the device is useless without
  ``SYS_ADMIN`` above (``fusermount3`` runs as root inside);
* ``init``: Docker's init as process 1, which reaps the per-container shims
  the engine starts in sessions of their own (they outlive whoever started
  them, and the worker does not reap what it did not start);
* a Docker volume for the worker's state directory and image cache
  (:data:`STATE_MOUNT`, named by :func:`volume_name` and labelled with the
  machine id): an overlay's upper directory cannot be on overlayfs, which is
  what the container's own file system is. It lives as long as the container
  (restarts included) and is removed with it.

Invariant: :func:`worker_access` is the whole difference between the two kinds
of worker container; no option here is given to a ``process`` worker. The
constants live in :mod:`levers9.worker_container`, where a booted cloud VM's
boot script (:mod:`levers9.bootstrap`) takes the same list as ``docker run``
flags.
Failures: an order asking for an OCI runtime on a network other than the
host's is a ValueError naming the field and what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from levers9.worker_container import (  # one source for the agent's options and the boot script's flags
    CAPABILITIES,
    CGROUP_ROOT,
    DEVICES,
    NETWORK_STATE,
    OCI_RUNTIMES,
    SECURITY_OPTIONS,
    STATE_DIR,
    STATE_MOUNT,
    SYSTEM_PATHS,
    volume_name,
)

__all__ = ["WorkerAccess", "check_access", "worker_access"]


@dataclass(frozen=True)
class WorkerAccess:
    """What a worker container gets beyond an unprivileged container's defaults."""

    #: keyword arguments of ``docker.containers.run`` (capabilities, security options, binds, init ...)
    options: dict[str, Any] = field(default_factory=dict)
    #: worker variables the agent sets (they name the mounts above; they win over the order's)
    env: dict[str, str] = field(default_factory=dict)
    #: the Docker volume to create (labelled) before the container, and remove after it; None: none
    volume: str | None = None
    #: HostConfig fields the Docker SDK has no argument for, set as they are
    host_config: dict[str, Any] = field(default_factory=dict)


def check_access(runtime: str, network_mode: str) -> None:
    """ValueError naming the field when an order's runtime cannot run as asked (see the module docstring)."""
    if runtime in OCI_RUNTIMES and network_mode != "host":
        raise ValueError(
            f"runtime {runtime!r} needs the worker container on the host's network (docker_network_mode: host), "
            f"got {network_mode!r}: its bridge and the host guard's rules belong where the machine's addresses are"
        )


def worker_access(runtime: str, machine_id: str) -> WorkerAccess:
    """The options of machine ``machine_id``'s worker container for ``runtime``; nothing for a ``process`` worker."""
    if runtime not in OCI_RUNTIMES:
        return WorkerAccess()
    volume = volume_name(machine_id)
    binds: dict[str, Mapping[str, str]] = {
        volume: {"bind": STATE_MOUNT, "mode": "rw"},
        CGROUP_ROOT: {"bind": CGROUP_ROOT, "mode": "rw"},
        NETWORK_STATE: {"bind": NETWORK_STATE, "mode": "rw"},
    }
    env = {"LEVERS9_WORKER_STATE_DIR": STATE_DIR}
    options: dict[str, Any] = {
        "cap_add": list(CAPABILITIES),
        "security_opt": list(SECURITY_OPTIONS),
        "cgroupns": "host",
        "init": True,
        "devices": [f"{device}:{device}:rwm" for device in DEVICES],
        "volumes": {source: dict(bind) for source, bind in binds.items()},
    }
    return WorkerAccess(options=options, env=env, volume=volume, host_config={k: [] for k in SYSTEM_PATHS})
