"""The OCI runtime configuration (``config.json``) for one container.

runc and runsc read the same file, so this is written once for both. It is
built from the task's :class:`~levers9.hooks.types.ContainerSpec` and the
resolved image, and says exactly what the container may do: its own PID, IPC,
UTS and mount namespaces, a network namespace (the worker's bridge, none, or
the host's when the pool asks for it), cgroup limits for CPU, memory (no swap
beyond it) and processes, read-only binds for code and volumes, and no new
privileges.

What the container's processes may do to the kernel is cut three ways, for runc and runsc alike:

* capabilities: root in a container keeps only :data:`CAPABILITIES` (owning files, switching users,
  signalling, binding low ports); not ``CAP_MKNOD`` (no device nodes), ``CAP_NET_RAW`` (no raw or packet
  sockets, so no forged packets on the bridge), ``CAP_SETFCAP``, ``CAP_SYS_CHROOT`` or
  ``CAP_AUDIT_WRITE``, which ordinary software does not need;
* devices: the devices cgroup denies every device but the few every container has (``/dev/null``,
  ``zero``, ``full``, ``random``, ``urandom``, ``tty``, the pty multiplexer) and the GPUs it was given;
* system calls: the seccomp profile of :mod:`levers9.engine.seccomp`.

With an :class:`~levers9.engine.userns.IdMapping` the container also gets a user namespace (runc only;
see :mod:`levers9.engine.userns`). Its root then has no privilege over a network namespace the host made,
which is not enough to mount ``sysfs`` there, so ``/sys`` is then a bind of a read-only ``sysfs`` the
engine mounted in the container's network namespace (``sysfs_source``): the same view a ``sysfs`` mount
inside the container would give.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from levers9.engine.seccomp import profile
from levers9.engine.userns import IdMapping
from levers9.hooks.errors import InvalidRequest
from levers9.hooks.types import ContainerSpec, GpuDevice

__all__ = [
    "CAPABILITIES",
    "CGROUP_PARENT",
    "CPU_PERIOD_US",
    "DEFAULT_PATH",
    "cgroups_path",
    "gpu_env",
    "oci_config",
    "parse_user",
]

CPU_PERIOD_US = 100_000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: what a container process keeps of root's capabilities: enough to run ordinary software (install packages,
#: own files, switch users, serve on port 80), nothing to make devices, forge packets or manage the host
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_KILL",
)

_MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
]
_READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


#: the cgroup every container's own cgroup sits under, so leftovers are easy to find (runtimes report it
#: as ``RuntimeCapabilities.cgroup_parent``)
CGROUP_PARENT = "/levers9"


def cgroups_path(container_id: str) -> str:
    """A container's cgroup: its id, below :data:`CGROUP_PARENT`."""
    return f"{CGROUP_PARENT}/{container_id}"


def parse_user(user: str | None) -> tuple[int, int]:
    """``uid[:gid]`` (numbers) or ``root``; names would need the image's passwd file, which a task should not rely on."""
    if user is None or user in ("", "root", "0"):
        return 0, 0
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if not match:
        raise InvalidRequest(f"user {user!r} is not accepted; give a numeric uid or uid:gid such as 1000:1000, or root")
    uid = int(match.group(1))
    return uid, int(match.group(2)) if match.group(2) is not None else uid


def gpu_env(gpus: Sequence[GpuDevice]) -> dict[str, str]:
    """What the NVIDIA container stack reads to expose exactly these GPUs (by uuid, stable across reboots)."""
    if not gpus:
        return {"NVIDIA_VISIBLE_DEVICES": "void"}
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus))),
    }


def _gpu_devices(gpus: Sequence[GpuDevice], dev: Path) -> list[dict[str, Any]]:
    """Device nodes for the given GPUs plus the shared control nodes, where the host has them."""
    if not gpus:
        return []
    names = [f"nvidia{g.index}" for g in gpus] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
    out = []
    for name in names:
        path = dev / name
        try:
            st = path.stat()
        except OSError:
            continue
        out.append(
            {
                "path": f"/dev/{name}",
                "type": "c",
                "major": os.major(st.st_rdev),
                "minor": os.minor(st.st_rdev),
                "fileMode": 0o666,
                "uid": 0,
                "gid": 0,
            }
        )
    return out


def oci_config(
    spec: ContainerSpec,
    *,
    rootfs: str,
    image_env: Sequence[str] = (),
    image_workdir: str | None = None,
    binds: Sequence[tuple[str, str]] = (),
    netns_path: str | None = None,
    hostname: str | None = None,
    no_new_privileges: bool = True,
    dev: Path = Path("/dev"),
    hooks: dict[str, list[dict[str, Any]]] | None = None,
    id_mapping: IdMapping | None = None,
    sysfs_source: str | None = None,
    mount_sources: Mapping[str, str] | None = None,
    seccomp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``config.json`` for ``spec``; ``binds`` are read-only (source, target) pairs from the image.

    ``id_mapping`` gives the container a user namespace; ``sysfs_source`` is then the sysfs to bind at
    ``/sys`` (see the module's docstring), and ``mount_sources`` the idmapped stand-in for each of
    ``spec.mounts``' sources (the spec's own sources are checked either way). ``seccomp`` replaces the
    profile of :func:`levers9.engine.seccomp.profile` (a runtime's own variant of it).
    """
    uid, gid = parse_user(spec.user)
    env: dict[str, str] = {"PATH": DEFAULT_PATH, "HOME": "/root" if uid == 0 else "/tmp"}
    for item in image_env:
        key, _, value = item.partition("=")
        env[key] = value
    env.update(gpu_env(spec.gpus))
    image_path = env.get("PYTHONPATH")
    env.update(spec.env)
    if image_path and spec.env.get("PYTHONPATH") and image_path not in spec.env["PYTHONPATH"].split(":"):
        # the spec's Python path (the runner's packages) first, then the image's own (a blueprint's PYTHONPATH)
        env["PYTHONPATH"] = f"{spec.env['PYTHONPATH']}:{image_path}"
    env["HOSTNAME"] = hostname or spec.container_id[:63]

    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
        if sysfs_source is None
        else {
            "destination": "/sys",
            "type": "bind",
            "source": sysfs_source,
            "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
        },
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
    ]
    for source, target in binds:
        mounts.append({"destination": target, "type": "bind", "source": source, "options": ["rbind", "ro", "nosuid"]})
    for m in spec.mounts:
        if not os.path.isabs(m.target) or ".." in Path(m.target).parts:
            raise InvalidRequest(f"mount target {m.target!r} must be an absolute path without '..'")
        if not os.path.exists(m.source):
            raise InvalidRequest(f"mount source {m.source!r} does not exist on this worker")
        options = ["rbind", "ro" if m.read_only else "rw", "nosuid", "nodev"]
        source = (mount_sources or {}).get(m.source, m.source)
        mounts.append({"destination": m.target, "type": "bind", "source": source, "options": options})

    namespaces: list[dict[str, str]] = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if id_mapping is not None:
        namespaces.append({"type": "user"})
    if spec.network != "host":
        namespaces.append({"type": "network", "path": netns_path} if netns_path else {"type": "network"})

    resources: dict[str, Any] = {
        "devices": [{"allow": False, "access": "rwm"}]
        + [
            {"allow": True, "type": "c", "major": d["major"], "minor": d["minor"], "access": "rwm"}
            for d in _gpu_devices(spec.gpus, dev)
        ],
        "memory": {"limit": spec.memory_mib * 1024 * 1024, "swap": spec.memory_mib * 1024 * 1024},
        "cpu": {"quota": spec.cpu_millicores * CPU_PERIOD_US // 1000, "period": CPU_PERIOD_US},
    }
    if spec.pids_limit is not None:
        resources["pids"] = {"limit": spec.pids_limit}

    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(spec.command),
            "env": [f"{k}={v}" for k, v in env.items()],
            # the spec's directory; where it leaves the default (/), the image's own WorkingDir
            "cwd": image_workdir if spec.workdir == "/" and image_workdir else spec.workdir,
            "capabilities": {k: list(CAPABILITIES) for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": no_new_privileges,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": env["HOSTNAME"],
        "mounts": mounts,
        "linux": {
            "cgroupsPath": cgroups_path(spec.container_id),
            "resources": resources,
            "namespaces": namespaces,
            "devices": _gpu_devices(spec.gpus, dev),
            "maskedPaths": _MASKED,
            "readonlyPaths": _READONLY,
            "seccomp": dict(seccomp) if seccomp is not None else profile(),
        },
    }
    if id_mapping is not None:
        config["linux"]["uidMappings"] = id_mapping.oci()
        config["linux"]["gidMappings"] = id_mapping.oci()
    if hooks:
        config["hooks"] = hooks
    return config
