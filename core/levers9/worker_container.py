"""What a worker container of a ``runc`` or ``gvisor`` pool is given beyond Docker's defaults, as data.

Two places start worker containers: the agent of a joined machine (through the
Docker SDK, :mod:`levers9.agent.runtime_access`) and a booted cloud VM's boot
script (through the ``docker`` CLI, :mod:`levers9.bootstrap`). Both take what
they give from here, so the two cannot drift apart; why each item is needed is
written once, in :mod:`levers9.agent.runtime_access` (and for operators in
docs/agents.md). Standard library only: the bootstrap, a foundation, imports
it.

Invariant: a runtime outside :data:`OCI_RUNTIMES` (``process``) gets nothing
from here: :func:`docker_run_flags` answers no flag for it, and its worker
container stays an unprivileged container with Docker's defaults.
"""

from __future__ import annotations

__all__ = [
    "CAPABILITIES",
    "CGROUP_ROOT",
    "DEVICES",
    "NETWORK_STATE",
    "OCI_RUNTIMES",
    "SECURITY_OPTIONS",
    "STATE_DIR",
    "STATE_MOUNT",
    "SYSTEM_PATHS",
    "docker_run_flags",
    "volume_name",
]

#: the runtimes whose workers run containers of their own
OCI_RUNTIMES = frozenset({"runc", "gvisor"})
CAPABILITIES = ("SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE")
SECURITY_OPTIONS = ("seccomp=unconfined", "apparmor=unconfined")
#: ``--security-opt systempaths=unconfined`` as the Docker API takes it: these HostConfig fields empty
SYSTEM_PATHS: tuple[str, ...] = ("MaskedPaths", "ReadonlyPaths")
#: the worker container's volume: its state directory and, inside it, the runtime's image cache
STATE_MOUNT = "/var/lib/levers9"
STATE_DIR = f"{STATE_MOUNT}/worker"
#: the engine's host-wide network records (levers9.engine.node.NETWORK_STATE)
NETWORK_STATE = "/run/levers9/network"
CGROUP_ROOT = "/sys/fs/cgroup"
#: host devices the worker container gets: FUSE, which its worker mounts volumes with (levers9.volumes)
DEVICES = ("/dev/fuse",)
_VOLUME_SUFFIX = "-state"


def volume_name(machine_id: str) -> str:
    """The Docker volume of machine ``machine_id``'s worker container."""
    return f"l9w-{machine_id}{_VOLUME_SUFFIX}"


def docker_run_flags(runtime: str, machine_id: str, *, devices: bool = True) -> list[str]:
    """``docker run`` arguments giving machine ``machine_id``'s worker container what ``runtime`` needs.

    The CLI's spelling of what the agent passes the SDK: ``systempaths=unconfined`` is the CLI's name for
    :data:`SYSTEM_PATHS` left empty; a named volume ``-v`` creates on first use holds :data:`STATE_MOUNT`, and
    ``LEVERS9_WORKER_STATE_DIR`` points the worker into it (an ``-e`` after ``--env-file`` wins). Empty for a
    runtime outside :data:`OCI_RUNTIMES`. ``devices=False`` leaves out :data:`DEVICES`, for a caller that adds
    each only where the machine has it (the boot script: ``docker run`` fails on a device that is not there).
    """
    if runtime not in OCI_RUNTIMES:
        return []
    flags: list[str] = []
    for capability in CAPABILITIES:
        flags += ["--cap-add", capability]
    for option in (*SECURITY_OPTIONS, "systempaths=unconfined"):
        flags += ["--security-opt", option]
    flags += ["--cgroupns", "host", "--init"]
    for device in DEVICES if devices else ():
        flags += ["--device", f"{device}:{device}:rwm"]
    for source, target, mode in (
        (volume_name(machine_id), STATE_MOUNT, "rw"),
        (CGROUP_ROOT, CGROUP_ROOT, "rw"),
        (NETWORK_STATE, NETWORK_STATE, "rw"),
    ):
        flags += ["-v", f"{source}:{target}:{mode}"]
    flags += ["-e", f"LEVERS9_WORKER_STATE_DIR={STATE_DIR}"]
    return flags
