"""The process runtime: a container's command run as a plain child process of the worker.

It exists for development and CI, where installing runc or gVisor is a chore
and isolation does not matter: the command sees the host's filesystem,
network, users and GPUs, and nothing limits what it may do. Because that is
easy to forget once a pool is configured, the first capability report in a
process logs a warning (logger ``levers9.runtime.process``). A process cannot
be checkpointed: there is no container boundary to freeze. The container hooks
run the command through :mod:`levers9.engine.process`.

The one line it draws: a worker running as root runs commands as ``nobody``
(uid and gid from the host's passwd, 65534 where it has none), so a call
cannot read the worker's state or credential, nor trace or signal it (see
:mod:`levers9.engine.process` for how, and for the fallback when the
command lives where ``nobody`` cannot reach it). A worker that is not root
runs them as its own user, which it can do nothing else about.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from levers9 import __version__
from levers9.engine.hooks import container_hooks
from levers9.engine.process import ProcessEngine, RunAs
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    ContainerSpec,
    Isolation,
    RuntimeCapabilities,
    RuntimeContext,
)

__all__ = [
    "CHECKPOINT_REASON",
    "ISOLATION_WARNING",
    "ProcessSettings",
    "call_user",
    "levers9_container_kill",
    "levers9_container_list",
    "levers9_container_logs",
    "levers9_container_prepare",
    "levers9_container_remove",
    "levers9_container_start",
    "levers9_container_state",
    "levers9_runtime_capabilities",
    "levers9_runtime_settings",
]

logger = logging.getLogger("levers9.runtime.process")

CHECKPOINT_REASON = "the process runtime isolates nothing and cannot checkpoint"
ISOLATION_WARNING = (
    "the 'process' runtime isolates nothing: commands run as plain processes on the worker's "
    "filesystem, network and GPUs (as 'nobody' when the worker is root, else as the worker's user); "
    "use it for development only"
)
#: who runs the commands of a root worker when the host has no ``nobody``
NOBODY = 65534

_warn_lock = threading.Lock()
_warned = False


class ProcessSettings(BaseModel):
    """A pool's ``runtime_settings:`` for ``runtime: process``: none are accepted yet, so typos are caught."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _warn_once() -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    logger.warning(ISOLATION_WARNING)


@hookimpl
def levers9_runtime_settings() -> type[ProcessSettings]:
    return ProcessSettings


@hookimpl
def levers9_runtime_capabilities(runtime: RuntimeContext) -> RuntimeCapabilities:
    _warn_once()
    return RuntimeCapabilities(
        available=True,
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


def call_user() -> RunAs | None:
    """The unprivileged user a root worker runs commands as; None when the worker is not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return RunAs(uid=NOBODY, gid=NOBODY, name="nobody")
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name="nobody")


def _engine(runtime: RuntimeContext) -> ProcessEngine:
    return ProcessEngine(Path(runtime.state_dir), run_as=call_user())


def _warn(runtime: RuntimeContext, spec: ContainerSpec) -> None:
    _warn_once()


_hooks = container_hooks(_engine, check=_warn)
levers9_container_prepare = _hooks.prepare
levers9_container_start = _hooks.start
levers9_container_state = _hooks.state
levers9_container_kill = _hooks.kill
levers9_container_logs = _hooks.logs
levers9_container_remove = _hooks.remove
levers9_container_list = _hooks.list
