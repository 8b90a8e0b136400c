"""How isolated a pool's calls are from each other and from their worker, as ``levers9 pools`` shows it.

The answer is the runtime plugin's own declaration, the ``isolation`` of its
:class:`~levers9.hooks.types.RuntimeCapabilities` (``none`` for the process
runtime, ``namespaces`` for runc, ``sandbox`` for gVisor, ``vm``), never a
guess from the runtime's name, so a third-party runtime is described the way
its author declared it. A runtime declares its isolation whether or not its
tools are installed on the controlplane's host, so asking here is sound. The
declaration does not change while a process lives: each runtime is asked
once per process (per plugin module and settings). When the plugin cannot answer, the pool shows
``unknown``, never a reassuring guess.
"""

from __future__ import annotations

import logging
import tempfile
import weakref
from typing import TYPE_CHECKING

from pydantic import BaseModel

from levers9.config.load import ConfigIssue, LoadedConfig
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = [
    "AS_WORKER",
    "UNKNOWN",
    "builds_without_capture",
    "pool_isolation",
    "runtime_isolation",
    "shared_without_isolation",
]

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
#: added to the isolation of a pool whose calls run as the worker's own user
AS_WORKER = "as the worker's user"
#: seconds a runtime may take to say what it is (it may run its binary's --version)
TIMEOUT_S = 15.0

#: answers per runtime plugin's hook function (one per imported plugin module, whatever plugin set holds it)
_answers: weakref.WeakKeyDictionary[object, dict[str, str]] = weakref.WeakKeyDictionary()


async def runtime_isolation(hooks: Hooks, runtime: str, settings: BaseModel | None = None) -> str:
    """``none``, ``namespaces``, ``sandbox``, ``vm`` (or a plugin's own value), or ``unknown``.

    ``none, as the worker's user`` when, with these settings, calls run as the worker's own user (the process
    runtime's opt-in for a single-user machine, where calls cannot run as nobody).
    """
    impl = hooks.plugins.impl(runtime, "levers9_runtime_capabilities")
    known = _answers.setdefault(impl.function if impl is not None else hooks, {})
    key = f"{runtime}\0{settings.model_dump_json() if settings is not None else ''}"
    if key in known:
        return known[key]
    with tempfile.TemporaryDirectory(prefix="levers9-isolation-") as scratch:
        context = RuntimeContext(name=runtime, settings=settings, state_dir=scratch)
        try:
            capabilities = await hooks.runtime_capabilities(context, timeout=TIMEOUT_S)
        except Levers9Error as exc:
            log.warning("runtime %r did not say how it isolates calls: %s", runtime, exc)
            return UNKNOWN  # not remembered: the next listing asks again
    isolation = str(capabilities.isolation.value)
    known[key] = f"{isolation}, {AS_WORKER}" if capabilities.calls_as_worker_user else isolation
    return known[key]


async def shared_without_isolation(loaded: LoadedConfig) -> list[ConfigIssue]:
    """The configured pools whose runtime isolates nothing (``none``) and that name no ``workspace``.

    Calls on such a pool share the worker's user, files and processes: one workspace's call could read
    another's arguments, secrets and results. So such a pool serves one workspace, and a config without it
    is refused when the controlplane starts (asking a runtime how it isolates may run its binary, too slow
    for every command that reads the config). A runtime that cannot say is let through: its pool's
    workers will not start either, and ``levers9 check`` says why.
    """
    issues: list[ConfigIssue] = []
    for name, pool in loaded.config.pools.items():
        if pool.workspace:
            continue
        isolation = await runtime_isolation(loaded.hooks, pool.runtime, loaded.runtime_settings.get(name))
        if isolation.split(",")[0] == "none":
            issues.append(
                ConfigIssue(
                    loaded.file or "config",
                    None,
                    f"pools.{name}.workspace",
                    f"runtime {pool.runtime!r} isolates nothing, so pool {name!r} serves one workspace: name it "
                    "(workspace: NAME), or use runtime runc or gvisor to share the pool between workspaces",
                )
            )
    return issues


def builds_without_capture(loaded: LoadedConfig) -> list[ConfigIssue]:
    """The configured pools set to build images (``builds: true``) whose runtime cannot capture a container's changes.

    A build's step is a container whose filesystem changes become the step's layer
    (``levers9_container_changes``); a runtime that does not implement it (the ``process`` runtime) could take
    builds only to fail every one. Refused with the pool's other start-time issues. A runtime no plugin
    provides is left to the loader's own error.
    """
    issues: list[ConfigIssue] = []
    for name, pool in loaded.config.pools.items():
        if not pool.builds or pool.runtime not in loaded.hooks.runtimes():
            continue
        with tempfile.TemporaryDirectory(prefix="levers9-builds-") as scratch:
            context = RuntimeContext(name=pool.runtime, settings=loaded.runtime_settings.get(name), state_dir=scratch)
            if loaded.hooks.captures_changes(context):
                continue
        issues.append(
            ConfigIssue(
                loaded.file or "config",
                None,
                f"pools.{name}.builds",
                f"runtime {pool.runtime!r} cannot capture a container's changes, so pool {name!r} cannot build "
                "images: builds need runtime runc or gvisor (or drop builds: true)",
            )
        )
    return issues


async def pool_isolation(services: Services, pool: str, runtime: str) -> str:
    """:func:`runtime_isolation` of a configured pool's runtime, asked with that pool's runtime settings."""
    return await runtime_isolation(services.hooks, runtime, services.loaded.runtime_settings.get(pool))
