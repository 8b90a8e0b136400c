"""How isolated a pool's calls are from each other and from their worker, as ``levers9 pools`` shows it.

The answer is the runtime plugin's own declaration, the ``isolation`` of its
:class:`~levers9.hooks.types.RuntimeCapabilities` (``none`` for the process
runtime, ``namespaces`` for runc, ``sandbox`` for gVisor, ``vm``), never a
guess from the runtime's name, so a third-party runtime is described the way
its author declared it. A runtime declares its isolation whether or not its
tools are installed on the controlplane's host, so asking here is sound. The
declaration does not change while a process lives: each runtime is asked
once per plugin set. When the plugin cannot answer, the pool shows
``unknown``, never a reassuring guess.
"""

from __future__ import annotations

import logging
import tempfile
import weakref
from typing import TYPE_CHECKING

from pydantic import BaseModel

from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = ["UNKNOWN", "pool_isolation", "runtime_isolation"]

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
#: seconds a runtime may take to say what it is (it may run its binary's --version)
TIMEOUT_S = 15.0

_answers: weakref.WeakKeyDictionary[Hooks, dict[str, str]] = weakref.WeakKeyDictionary()


async def runtime_isolation(hooks: Hooks, runtime: str, settings: BaseModel | None = None) -> str:
    """``none``, ``namespaces``, ``sandbox``, ``vm`` (or a plugin's own value), or ``unknown``."""
    known = _answers.setdefault(hooks, {})
    if runtime in known:
        return known[runtime]
    with tempfile.TemporaryDirectory(prefix="levers9-isolation-") as scratch:
        context = RuntimeContext(name=runtime, settings=settings, state_dir=scratch)
        try:
            capabilities = await hooks.runtime_capabilities(context, timeout=TIMEOUT_S)
        except Levers9Error as exc:
            log.warning("runtime %r did not say how it isolates calls: %s", runtime, exc)
            return UNKNOWN  # not remembered: the next listing asks again
    known[runtime] = str(capabilities.isolation.value)
    return known[runtime]


async def pool_isolation(services: Services, pool: str, runtime: str) -> str:
    """:func:`runtime_isolation` of a configured pool's runtime, asked with that pool's runtime settings."""
    return await runtime_isolation(services.hooks, runtime, services.loaded.runtime_settings.get(pool))
