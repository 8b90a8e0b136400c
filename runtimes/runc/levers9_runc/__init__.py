"""The runc runtime: containers isolated by Linux namespaces and cgroups, through the host's ``runc``.

runc is the reference OCI runtime and what most container engines use
underneath, so a pool that wants ordinary container isolation with the least
overhead (and direct GPU access through the NVIDIA container toolkit) names
``runtime: runc``. The container hooks hand the work to the shared OCI engine
(:mod:`levers9.engine.oci`); :mod:`levers9.engine.runc` says how to drive runc.

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
  root is an unprivileged host user where this host allows it
  (:mod:`levers9.engine.runc` says how it is decided). The capability
  report's ``notes`` say whether it is on and, when it is off, why;
  ``levers9 check`` shows them.
* Whatever the user namespace, every container runs with the seccomp
  profile of :mod:`levers9.engine.seccomp`, without ``CAP_MKNOD`` and
  ``CAP_NET_RAW`` (:mod:`levers9.engine.spec`), and cannot open connections
  to the host (:mod:`levers9.engine.host_guard`).

The plugin is one object, :data:`plugin`, a :class:`RuncRuntime`: it declares
the settings and reports the capabilities; its container hooks come from
:class:`levers9.engine.hooks.CapturingRuntime`, handing each call to the
engine :func:`levers9.engine.runc.engine` builds (the ``criu`` plugin builds
the same engine there for checkpoints).
"""

from __future__ import annotations

import re

from levers9 import probe
from levers9.engine import runc as runc_engine
from levers9.engine.hooks import CapturingRuntime
from levers9.engine.oci import OciEngine
from levers9.engine.runc import NVIDIA_HOOKS, RuncSettings, engine, find_nvidia_hook, user_namespace
from levers9.engine.spec import CGROUP_PARENT
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import Isolation, RuntimeCapabilities, RuntimeContext

__all__ = [
    "CHECKPOINT_REASON",
    "NVIDIA_HOOKS",
    "VERSION_TIMEOUT",
    "RuncRuntime",
    "RuncSettings",
    "engine",
    "find_nvidia_hook",
    "parse_version",
    "plugin",
    "user_namespace",
]

#: seconds ``runc --version`` may take before runc is reported unusable
VERSION_TIMEOUT = 10.0

CHECKPOINT_REASON = (
    "checkpointing of runc containers is provided by the 'criu' plugin; "
    "its levers9_checkpoint_support says whether this host can"
)

_VERSION = re.compile(r"^runc version (\S+)", re.MULTILINE)


def parse_version(output: str) -> str | None:
    """The version from ``runc --version`` output (``runc version 1.1.5+ds1`` gives ``1.1.5+ds1``)."""
    match = _VERSION.search(output)
    return match.group(1) if match else None


def _unavailable(reason: str) -> RuntimeCapabilities:
    return RuntimeCapabilities(
        available=False,
        unavailable_reason=reason,
        isolation=Isolation.NAMESPACES,
        checkpoint=False,
        checkpoint_reason=CHECKPOINT_REASON,
    )


class RuncRuntime(CapturingRuntime):
    """The ``runc`` plugin: its settings, its capability report, and the container hooks on runc's engine."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = RuncSettings

    def engine(self, runtime: RuntimeContext) -> OciEngine:
        return runc_engine.engine(runtime)

    @hookimpl
    def levers9_runtime_capabilities(self, runtime: RuntimeContext) -> RuntimeCapabilities:
        settings = RuncSettings.of(runtime)
        path = probe.which(settings.binary)
        if path is None:
            where = " on PATH" if "/" not in settings.binary else ""
            return _unavailable(f"runc binary {settings.binary!r} not found{where} (apt-get install -y runc)")
        result = probe.run([path, "--version"], timeout=VERSION_TIMEOUT)
        if not result.ok:
            detail = "; ".join(result.output_lines()) or "no output"
            return _unavailable(f"'{path} --version' failed with exit status {result.rc}: {detail}")
        version = parse_version(result.stdout)
        if version is None:
            first = (result.output_lines() or ["no output"])[0]
            return _unavailable(f"{path} does not look like runc: '--version' printed {first!r}")
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


#: the plugin the entry point names
plugin = RuncRuntime()
