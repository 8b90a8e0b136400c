"""The runc runtime: containers isolated by Linux namespaces and cgroups, through the host's ``runc``.

runc is the reference OCI runtime and what most container engines use
underneath, so a pool that wants ordinary container isolation with the least
overhead (and direct GPU access through the NVIDIA container toolkit) names
``runtime: runc``. The container hooks hand the work to the shared OCI engine
(:mod:`levers9.engine.oci`); this module says how to drive runc.

Decisions worth knowing when reading the capability report:

* **GPU** is reported only when the NVIDIA container toolkit's OCI hook
  (``nvidia-container-runtime-hook``) or its CLI (``nvidia-ctk``) is on PATH:
  runc itself knows nothing about GPUs, and without the toolkit a container
  would start without its devices and driver libraries.
* **Checkpointing** is reported as False here, with a reason pointing at the
  ``criu`` plugin. runc checkpoints only through CRIU, and whether CRIU works
  on this kernel is the ``criu`` plugin's ``levers9_checkpoint_support``
  answer, which the core asks of every plugin. Answering it a second time here
  would duplicate CRIU's probe and could claim support when the plugin that
  would do the checkpointing is not even installed.
* **User namespace** (``user_namespace``, on by default): each container's
  root is an unprivileged host user (ids from ``userns_host_id`` up), where
  this host allows it: user namespaces turned on, and idmapped mounts on the
  image cache's file system (:func:`levers9.engine.userns.support` tries
  both). The capability report's ``notes`` say whether it is on and, when it
  is off, why; ``levers9 check`` shows them. Containers the worker will
  checkpoint, and containers with GPUs, get none (see
  :mod:`levers9.engine.oci`).
* Whatever the user namespace, every container runs with the seccomp
  profile of :mod:`levers9.engine.seccomp`, without ``CAP_MKNOD`` and
  ``CAP_NET_RAW`` (:mod:`levers9.engine.spec`), and cannot open connections
  to the host (:mod:`levers9.engine.host_guard`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import ConfigDict, Field

from levers9 import probe
from levers9.engine.hooks import changes_hook, container_hooks
from levers9.engine.node import NodeSettings, bridge_for, images_for
from levers9.engine.oci import OciEngine, OciFlavor
from levers9.engine.spec import CGROUP_PARENT
from levers9.engine.userns import DEFAULT_HOST_ID, IdMapping, support
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    Isolation,
    RuntimeCapabilities,
    RuntimeContext,
)

__all__ = [
    "CHECKPOINT_REASON",
    "NVIDIA_HOOKS",
    "VERSION_TIMEOUT",
    "RuncSettings",
    "engine",
    "find_nvidia_hook",
    "levers9_container_changes",
    "levers9_container_kill",
    "levers9_container_list",
    "levers9_container_logs",
    "levers9_container_prepare",
    "levers9_container_remove",
    "levers9_container_start",
    "levers9_container_state",
    "levers9_runtime_capabilities",
    "levers9_runtime_settings",
    "parse_version",
    "settings_of",
    "user_namespace",
]

#: seconds ``runc --version`` may take before runc is reported unusable
VERSION_TIMEOUT = 10.0

#: the NVIDIA container toolkit programs that can give a runc container its GPUs, in order of preference
NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-ctk")

CHECKPOINT_REASON = (
    "checkpointing of runc containers is provided by the 'criu' plugin; "
    "its levers9_checkpoint_support says whether this host can"
)

_VERSION = re.compile(r"^runc version (\S+)", re.MULTILINE)


class RuncSettings(NodeSettings):
    """A pool's ``runtime_settings:`` for ``runtime: runc``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the runc executable: a name looked up on PATH, or a path
    binary: str = Field("runc", min_length=1)
    #: runc's ``--root``, where it keeps container state; None keeps runc's default (``/run/runc``)
    root: str | None = None
    #: let systemd manage the containers' cgroups (runc ``--systemd-cgroup``)
    systemd_cgroup: bool = False
    #: set ``noNewPrivileges`` so no process in a container can gain privileges through setuid binaries
    no_new_privileges: bool = True
    #: run each container in a user namespace where this host allows it (see the module's docstring)
    user_namespace: bool = True
    #: the host id a container's root (and group 0) is; its ids 0..65535 are this and the 65535 after it
    userns_host_id: int = Field(DEFAULT_HOST_ID, ge=1, le=2**32 - 1 - 65536)


def settings_of(runtime: RuntimeContext) -> RuncSettings:
    """The runtime's settings, or the defaults when the pool gave none."""
    return RuncSettings.of(runtime)


def user_namespace(runtime: RuntimeContext) -> tuple[IdMapping | None, str]:
    """The id mapping containers get (None: no user namespace) and a note saying which, and why."""
    settings = settings_of(runtime)
    if not settings.user_namespace:
        return None, "user namespace: off (runtime_settings.user_namespace is false); container root is host root"
    mapping = IdMapping(host_id=settings.userns_host_id)
    works, words = support(images_for(runtime, settings).cache_dir, mapping)
    if not works:
        return None, f"user namespace: off, this host does not allow it ({words}); container root is host root"
    return mapping, f"user namespace: on ({words})"


def parse_version(output: str) -> str | None:
    """The version from ``runc --version`` output (``runc version 1.1.5+ds1`` gives ``1.1.5+ds1``)."""
    match = _VERSION.search(output)
    return match.group(1) if match else None


def find_nvidia_hook() -> str | None:
    """The path of the first NVIDIA container toolkit program on PATH, or None."""
    for name in NVIDIA_HOOKS:
        path = probe.which(name)
        if path:
            return path
    return None


@hookimpl
def levers9_runtime_settings() -> type[RuncSettings]:
    return RuncSettings


@hookimpl
def levers9_runtime_capabilities(runtime: RuntimeContext) -> RuntimeCapabilities:
    settings = settings_of(runtime)

    def unavailable(reason: str) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            available=False,
            unavailable_reason=reason,
            isolation=Isolation.NAMESPACES,
            checkpoint=False,
            checkpoint_reason=CHECKPOINT_REASON,
        )

    path = probe.which(settings.binary)
    if path is None:
        where = " on PATH" if "/" not in settings.binary else ""
        return unavailable(f"runc binary {settings.binary!r} not found{where} (apt-get install -y runc)")
    result = probe.run([path, "--version"], timeout=VERSION_TIMEOUT)
    if not result.ok:
        detail = "; ".join(result.output_lines()) or "no output"
        return unavailable(f"'{path} --version' failed with exit status {result.rc}: {detail}")
    version = parse_version(result.stdout)
    if version is None:
        first = (result.output_lines() or ["no output"])[0]
        return unavailable(f"{path} does not look like runc: '--version' printed {first!r}")
    mapping, userns_note = user_namespace(runtime)
    return RuntimeCapabilities(
        available=True,
        isolation=Isolation.NAMESPACES,
        root_host_uid=mapping.host_id if mapping is not None else 0,
        gpu=find_nvidia_hook() is not None,
        checkpoint=False,
        checkpoint_reason=CHECKPOINT_REASON,
        version=version,
        host_filesystem=False,
        host_network=False,
        # under systemd the cgroup is a unit whose path systemd chooses: none the worker can name
        cgroup_parent=None if settings.systemd_cgroup else CGROUP_PARENT,
        notes=[userns_note, "seccomp: levers9's profile; capabilities: no CAP_MKNOD or CAP_NET_RAW"],
    )


def engine(runtime: RuntimeContext) -> OciEngine:
    """The OCI engine driving this host's runc with the pool's settings."""
    settings = settings_of(runtime)
    binary = probe.which(settings.binary) or settings.binary
    argv = [binary, "--root", settings.root or str(Path(runtime.state_dir) / "runc")]
    if settings.systemd_cgroup:
        argv.append("--systemd-cgroup")
    hooks = {}
    nvidia = find_nvidia_hook()
    if nvidia and nvidia.endswith("nvidia-container-runtime-hook"):
        hooks = {"prestart": [{"path": nvidia, "args": [nvidia, "prestart"]}]}
    # --keep: the stopped container (and its memory cgroup) stays until the shim has read whether OOM killed it
    mapping, _ = user_namespace(runtime)
    flavor = OciFlavor("runc", tuple(argv), run=("run", "--keep"), no_new_privileges=settings.no_new_privileges,
                       oci_hooks=hooks, leave_running=True, id_mapping=mapping)  # fmt: skip
    return OciEngine(flavor, Path(runtime.state_dir), images=images_for(runtime, settings), bridge=bridge_for(settings))


_hooks = container_hooks(engine)
levers9_container_prepare = _hooks.prepare
levers9_container_start = _hooks.start
levers9_container_state = _hooks.state
levers9_container_kill = _hooks.kill
levers9_container_logs = _hooks.logs
levers9_container_remove = _hooks.remove
levers9_container_list = _hooks.list
levers9_container_changes = changes_hook(engine)

#: the plugin object the entry point names; for now this module itself (its functions are the hooks)
plugin = sys.modules[__name__]
