"""The process runtime: a container's command run as a plain child process of the worker.

It exists for development and CI, where installing runc or gVisor is a chore
and isolation does not matter: the command sees the host's filesystem,
network, users and GPUs, and nothing limits what it may do. Because that is
easy to forget once a pool is configured, the first capability report in a
process logs a warning (logger ``levers9.runtime.process``). A process cannot
be checkpointed: there is no container boundary to freeze. The plugin is one
object, :data:`plugin`, a :class:`ProcessRuntime`; its container hooks
(:class:`levers9.engine.hooks.EngineRuntime`) run the command through
:mod:`levers9.engine.process`.

The one line it draws: a worker running as root runs commands as ``nobody``
(uid and gid from the host's passwd, 65534 where it has none), so a call
cannot read the worker's state or credential, the controlplane's database or
key, nor trace or signal either of them (see :mod:`levers9.engine.process`).

It fails closed. Where it cannot run a call as ``nobody`` (the worker is not
root, or ``nobody`` cannot execute the worker's Python or read levers9, as
with an interpreter under ``/root``), the runtime reports itself unavailable,
so a worker of it does not start and ``levers9 check`` says why and how to fix
it; a call whose own program or workdir ``nobody`` cannot reach is refused.
Only an operator who sets ``allow_calls_as_worker_user: true`` in the pool's
``runtime_settings`` (a single-user machine, where calls may read whatever the
worker can) gets calls run as the worker's own user instead; ``levers9 check``
and ``levers9 pools`` show that choice in red.
"""

from __future__ import annotations

import logging
import os
import pwd
import sys
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from levers9 import __version__
from levers9.engine.hooks import EngineRuntime
from levers9.engine.process import ProcessEngine, RunAs, unreachable
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    ContainerSpec,
    Isolation,
    RuntimeCapabilities,
    RuntimeContext,
)

__all__ = [
    "CHECKPOINT_REASON",
    "FIX",
    "ISOLATION_WARNING",
    "WORKER_USER_NOTE",
    "ProcessRuntime",
    "ProcessSettings",
    "call_user",
    "cannot_drop",
    "plugin",
]

logger = logging.getLogger("levers9.runtime.process")

CHECKPOINT_REASON = "the process runtime isolates nothing and cannot checkpoint"
ISOLATION_WARNING = (
    "the 'process' runtime isolates nothing: commands run as plain processes on the worker's "
    "filesystem, network and GPUs, as 'nobody' (or as the worker's own user where a pool allows it); "
    "use it for development only, one workspace per pool"
)
#: who runs the commands of a root worker when the host has no ``nobody``
NOBODY = 65534

_warn_lock = threading.Lock()
_warned = False


#: the fix for a worker that cannot run calls as another user, in the runtime's own words
FIX = (
    "run the worker as root with a Python and levers9 that every user can read (scripts/setup builds .venv on "
    "such a Python: not one under /root), or use runtime runc or gvisor; on a single-user machine only, set "
    "runtime_settings.allow_calls_as_worker_user: true on the pool"
)
#: what ``check`` and ``pools`` say of a pool that opted in
WORKER_USER_NOTE = (
    "calls run as the worker's own user (allow_calls_as_worker_user): each can read what the worker and the "
    "controlplane can, their database and keys included"
)


class ProcessSettings(BaseModel):
    """A pool's ``runtime_settings:`` for ``runtime: process``; unknown keys are refused, so typos are caught."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_calls_as_worker_user: bool = Field(
        False,
        description="Run calls as the worker's own user where they cannot run as nobody (a worker that is not "
        "root, a Python nobody cannot execute). Only for a single-user machine: such calls can read the worker's "
        "and the controlplane's files, secrets and tokens. Off: such a worker does not start (fail closed).",
    )


def _warn_once() -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    logger.warning(ISOLATION_WARNING)


def _settings(runtime: RuntimeContext) -> ProcessSettings:
    """The pool's settings, or the defaults when it gave none."""
    settings = runtime.settings
    if isinstance(settings, ProcessSettings):
        return settings
    return ProcessSettings.model_validate(settings or {})


def cannot_drop(run_as: RunAs | None) -> str | None:
    """Why calls of this worker could not run as an unprivileged user; None when they can.

    The runner is the worker's own interpreter running levers9, so ``nobody`` must be able to execute the one
    and read the other.
    """
    if run_as is None:
        return f"the worker runs as uid {os.geteuid()}, not root, so it cannot run calls as another user"
    import levers9

    for what, path, bits in (("the worker's Python", sys.executable, 1), ("levers9", levers9.__file__ or "", 4)):
        blocked = unreachable(path, run_as, bits=bits)
        if blocked is not None:
            return f"{run_as.name} cannot reach {what} at {path} (blocked at {blocked})"
    return None


def call_user() -> RunAs | None:
    """The unprivileged user a root worker runs commands as; None when the worker is not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return RunAs(uid=NOBODY, gid=NOBODY, name="nobody")
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name="nobody")


class ProcessRuntime(EngineRuntime):
    """The ``process`` plugin: its settings, its capability report, and the container hooks on plain processes."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = ProcessSettings

    def engine(self, runtime: RuntimeContext) -> ProcessEngine:
        return ProcessEngine(
            Path(runtime.state_dir),
            run_as=call_user(),
            as_worker=_settings(runtime).allow_calls_as_worker_user,
            fix=FIX,
        )

    def check(self, runtime: RuntimeContext, spec: ContainerSpec) -> None:
        _warn_once()

    @hookimpl
    def levers9_runtime_capabilities(self, runtime: RuntimeContext) -> RuntimeCapabilities:
        _warn_once()
        opted_in = _settings(runtime).allow_calls_as_worker_user
        why = cannot_drop(call_user())
        return RuntimeCapabilities(
            available=why is None or opted_in,
            unavailable_reason=None
            if why is None or opted_in
            else f"calls cannot run as an unprivileged user: {why}; {FIX}",
            notes=[WORKER_USER_NOTE] if opted_in and why is not None else [],
            calls_as_worker_user=opted_in and why is not None,
            isolation=Isolation.NONE,
            gpu=True,
            checkpoint=False,
            checkpoint_reason=CHECKPOINT_REASON,
            version=__version__,
            # a plain process: the worker's files, the worker's network, no cgroup of its own
            host_filesystem=True,
            host_network=True,
            cgroup_parent=None,
        )


#: the plugin the entry point names
plugin = ProcessRuntime()
