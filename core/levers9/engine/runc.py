"""Driving the host's ``runc``: a pool's runc settings, and the OCI engine built from them.

Two plugins need runc's engine: the ``runc`` runtime (its container hooks)
and the ``criu`` plugin (runc checkpoints and restores its containers through
CRIU). Both build it here, from the same ``runtime_settings``, so a
checkpoint is taken and restored by the very runc binary, ``--root`` and
user-namespace mapping that run the container; neither plugin imports the
other.

What the engine is given:

* **runc's own flags**: the binary (looked up on PATH), ``--root`` (the
  pool's ``root``, else ``runc/`` in the runtime's state directory) and
  ``--systemd-cgroup`` when the pool asks for it; containers run with
  ``run --keep``, so a stopped container (and its memory cgroup) stays until
  the shim has read whether the OOM killer ended it.
* **GPUs**: where the NVIDIA container toolkit's OCI hook
  (``nvidia-container-runtime-hook``) is on PATH, it is every container's
  ``prestart`` hook (:func:`find_nvidia_hook` also finds the toolkit's CLI,
  ``nvidia-ctk``, which the capability report counts).
* **User namespace** (``user_namespace``, on by default): each container's
  root is an unprivileged host user (ids from ``userns_host_id`` up), where
  this host allows it: user namespaces turned on, and idmapped mounts on the
  image cache's file system (:func:`levers9.engine.userns.support` tries
  both). :func:`user_namespace` returns the mapping and a note saying
  whether it is on and, when it is off, why. Containers the worker will
  checkpoint, and containers with GPUs, get none (see
  :mod:`levers9.engine.oci`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from levers9 import probe
from levers9.engine.node import NodeSettings, bridge_for, images_for
from levers9.engine.oci import OciEngine, OciFlavor
from levers9.engine.userns import DEFAULT_HOST_ID, IdMapping, support
from levers9.hooks.types import RuntimeContext

__all__ = ["NVIDIA_HOOKS", "RuncSettings", "engine", "find_nvidia_hook", "user_namespace"]

#: the NVIDIA container toolkit programs that can give a runc container its GPUs, in order of preference
NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-ctk")


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


def user_namespace(runtime: RuntimeContext) -> tuple[IdMapping | None, str]:
    """The id mapping containers get (None: no user namespace) and a note saying which, and why."""
    settings = RuncSettings.of(runtime)
    if not settings.user_namespace:
        return None, "user namespace: off (runtime_settings.user_namespace is false); container root is host root"
    mapping = IdMapping(host_id=settings.userns_host_id)
    works, words = support(images_for(runtime, settings).cache_dir, mapping)
    if not works:
        return None, f"user namespace: off, this host does not allow it ({words}); container root is host root"
    return mapping, f"user namespace: on ({words})"


def find_nvidia_hook() -> str | None:
    """The path of the first NVIDIA container toolkit program on PATH, or None."""
    for name in NVIDIA_HOOKS:
        path = probe.which(name)
        if path:
            return path
    return None


def engine(runtime: RuntimeContext) -> OciEngine:
    """The OCI engine driving this host's runc with the pool's settings."""
    settings = RuncSettings.of(runtime)
    binary = probe.which(settings.binary) or settings.binary
    argv = [binary, "--root", settings.root or str(Path(runtime.state_dir) / "runc")]
    if settings.systemd_cgroup:
        argv.append("--systemd-cgroup")
    hooks = {}
    nvidia = find_nvidia_hook()
    if nvidia and nvidia.endswith("nvidia-container-runtime-hook"):
        hooks = {"prestart": [{"path": nvidia, "args": [nvidia, "prestart"]}]}
    mapping, _ = user_namespace(runtime)
    flavor = OciFlavor(
        "runc",
        tuple(argv),
        run=("run", "--keep"),
        no_new_privileges=settings.no_new_privileges,
        oci_hooks=hooks,
        leave_running=True,
        id_mapping=mapping,
    )
    return OciEngine(flavor, Path(runtime.state_dir), images=images_for(runtime, settings), bridge=bridge_for(settings))
