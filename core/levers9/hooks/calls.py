"""The calling machinery under the typed facade: lanes, deadlines, health, lifecycle, result checks.

:class:`PluginCalls` is the base of :class:`levers9.hooks.facade.Hooks`; the
facade adds one typed method per hook and the rules of each hook's answer.
What is here is the same for every hook:

* ``_one(plugin, hook, ...)`` runs one plugin's implementation on that
  plugin's own lane of threads (:mod:`levers9.hooks.executors`): every plugin
  has its own (``provider_threads``, 4 by default, for a provider; ``threads``,
  16, for any other plugin; ``plugin_threads`` overrides per plugin), so a
  plugin whose threads are all stuck queues only its own calls. Provider and
  runtime hooks are dispatched this way, to the one plugin a pool or runtime
  names (pluggy has no "call only plugin X", and a subset caller per call
  would rebuild what ``impl.function`` already is).
* ``_first(hook, ...)`` runs a firstresult hook (the checkpoint hooks) through
  pluggy's own hook caller, which asks each implementation and stops at the
  first answer that is not None. One pluggy call may enter several plugins,
  so these hooks share one lane; :class:`~levers9.hooks.manager.Attribution`
  names the plugin that answered, raised, or was still running at the deadline.
* A deadline counts from when the hook starts running. A call that waited a
  whole deadline for a free thread is withdrawn unrun and reported as
  :class:`~levers9.hooks.health.PluginQueueTimeout` (a ``PluginTimeout`` saying
  the plugin's threads were busy); one that ran past it as ``PluginTimeout``.
* Health (:mod:`levers9.hooks.health`): a provider that times out
  ``unhealthy_after`` times in a row (3), or whose ``levers9_startup`` failed,
  is unhealthy; its provider hooks then fail at once with
  :class:`~levers9.hooks.health.ProviderUnhealthy` (a ``PluginError``, which the
  scheduler treats as "pool unavailable"), except one probe every
  ``probe_every_s`` (30). :meth:`PluginCalls.health` reports every plugin.
* Lifecycle: :meth:`PluginCalls.startup` gives each loaded plugin its
  :class:`~levers9.hooks.context.PluginContext` and calls ``levers9_startup``
  where implemented, all at once, each on its own lane with the deadline; one
  that raises or times out is marked unhealthy with the error and the others
  start. :meth:`PluginCalls.shutdown` calls ``levers9_shutdown`` on every
  plugin that started (errors logged, never raised), then closes the lanes.
  :meth:`PluginCalls.close` closes the lanes without calling any hook (tools).

What a hook raises reaches the caller as: the typed errors of
:mod:`levers9.hooks.errors` unchanged (a ``ProviderError`` gains the plugin's
name); anything else as :class:`~levers9.hooks.errors.PluginError` naming the
plugin and the hook; an answer of the wrong type as a ``PluginError`` saying
what was expected and where it differed.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import logging
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from levers9.hooks.context import AgentHub, PluginContext, PluginMetrics
from levers9.hooks.errors import Levers9Error, PluginError, PluginTimeout, ProviderError, UnknownPlugin
from levers9.hooks.executors import HookRaisedBase, NeverStarted, PluginLane, RanPastDeadline
from levers9.hooks.health import (
    DEFAULT_PROBE_EVERY_S,
    DEFAULT_UNHEALTHY_AFTER,
    HealthBook,
    PluginHealth,
    PluginQueueTimeout,
    ProviderUnhealthy,
)
from levers9.hooks.manager import Attribution, PluginSet

__all__ = [
    "DEFAULT_TIMEOUT",
    "FIRSTRESULT_LANE",
    "OTHER_THREADS",
    "PROVIDER_HOOKS",
    "PROVIDER_THREADS",
    "PluginCalls",
    "check_result",
]

log = logging.getLogger("levers9.plugins")

DEFAULT_TIMEOUT = 30.0
#: threads of one provider plugin's lane, and of any other plugin's
PROVIDER_THREADS = 4
OTHER_THREADS = 16
#: the hooks refused while their provider is unhealthy
PROVIDER_HOOKS = frozenset(
    {"levers9_gpu_offers", "levers9_provision", "levers9_terminate", "levers9_list_machines", "levers9_check"}
)
#: the lane of the firstresult checkpoint hooks (not a possible entry-point name)
FIRSTRESULT_LANE = "<firstresult>"


@functools.cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


class PluginCalls:
    """Isolated, checked calls into loaded plugins (see the module docstring)."""

    def __init__(
        self,
        plugins: PluginSet,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        provider_threads: int = PROVIDER_THREADS,
        threads: int = OTHER_THREADS,
        plugin_threads: Mapping[str, int] | None = None,
        unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER,
        probe_every_s: float = DEFAULT_PROBE_EVERY_S,
    ) -> None:
        self.plugins = plugins
        self.timeout = timeout
        self.provider_threads = provider_threads
        self.threads = threads
        self.plugin_threads = dict(plugin_threads or {})
        self._lanes: dict[str, PluginLane] = {}
        self._health = HealthBook(unhealthy_after=unhealthy_after, probe_every_s=probe_every_s)
        self._contexts: dict[str, PluginContext] = {}
        #: the loop startup ran on, where the agent hub lives (``PluginContext.send_order`` calls into it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agents: AgentHub | None = None
        self._metrics: Callable[[str], PluginMetrics] | None = None
        #: plugins whose start succeeded (or that have no levers9_startup); None until startup()
        self._started: set[str] | None = None
        self._closed = False

    def close(self) -> None:
        """Close every plugin's threads without calling any hook; threads inside a hook leave when it returns."""
        self._closed = True
        for lane in self._lanes.values():
            lane.close()

    def _lane(self, name: str) -> PluginLane:
        if self._closed:
            raise RuntimeError(f"plugin {name!r} cannot be called: the hooks were closed")
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = PluginLane(name, self._lane_size(name))
        return lane

    def _lane_size(self, name: str) -> int:
        if name in self.plugin_threads:
            return self.plugin_threads[name]
        if self.plugins.impl(name, "levers9_provider_settings") is not None:
            return self.provider_threads
        return self.threads

    # ----------------------------------------------------------------- health and lifecycle

    def health(self) -> dict[str, PluginHealth]:
        """Every loaded plugin's health and threads (a snapshot)."""
        out: dict[str, PluginHealth] = {}
        for record in self.plugins.loaded():
            health = replace(self._health.get(record.name))
            lane = self._lanes.get(record.name)
            health.threads = self._lane_size(record.name)
            if lane is not None:
                stats = lane.stats()
                health.running, health.queued = stats.running, stats.queued
            out[record.name] = health
        return out

    def context(self, name: str) -> PluginContext:
        """Plugin ``name``'s context: the one :meth:`startup` gave it, or a bare one before that."""
        context = self._contexts.get(name)
        if context is None:
            self._require("plugin", name, [r.name for r in self.plugins.loaded()])
            context = self._contexts[name] = self._new_context(name)
        return context

    def _new_context(self, name: str) -> PluginContext:
        context = PluginContext.bare(name)
        context.agents = self._agents
        context.loop = self._loop
        if self._metrics is not None:
            context.metrics = self._metrics(name)
        return context

    async def startup(
        self, *, agents: AgentHub | None = None, metrics: Callable[[str], PluginMetrics] | None = None
    ) -> None:
        """Give each loaded plugin its context and call ``levers9_startup`` where implemented (once)."""
        if self._started is not None:
            log.warning("plugins were already started; startup() ignored")
            return
        self._agents, self._metrics = agents, metrics
        self._loop = asyncio.get_running_loop()
        for record in self.plugins.loaded():
            self._contexts[record.name] = self._new_context(record.name)
        hook = "levers9_startup"
        starting = self.plugins.implementers(hook)
        self._started = {r.name for r in self.plugins.loaded() if r.name not in starting}
        results = await asyncio.gather(*(self._start(name) for name in starting), return_exceptions=True)
        for name, result in zip(starting, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.error("plugin %r did not start; its pools are skipped until it does: %s", name, result)
                self._health.failed_to_start(name, _plain(result))

    async def _start(self, name: str) -> None:
        await self._one(name, "levers9_startup", None, None, ctx=self.context(name))
        assert self._started is not None
        self._started.add(name)
        self._health.started(name)

    async def shutdown(self) -> None:
        """Call ``levers9_shutdown`` on every started plugin (errors logged, never raised), then close."""
        try:
            if self._started is not None:
                hook = "levers9_shutdown"
                names = [n for n in self.plugins.implementers(hook) if n in self._started]
                results = await asyncio.gather(
                    *(self._one(n, hook, None, None, ctx=self.context(n)) for n in names), return_exceptions=True
                )
                for name, result in zip(names, results, strict=True):
                    if isinstance(result, Exception):
                        log.error("plugin %r failed to shut down: %s", name, result)
                    elif isinstance(result, BaseException):
                        raise result
        finally:
            self.close()

    # ----------------------------------------------------------------- names

    def _require(self, kind: str, name: str, known: list[str]) -> None:
        if name in known:
            return
        record = self.plugins.records.get(name)
        if record is not None and record.status != "loaded":
            why = "is blocked by the plugin policy" if record.status == "blocked" else f"failed: {record.error}"
            raise UnknownPlugin(f"{kind} {name!r} is installed but not loaded: it {why}")
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listing = ", ".join(known) if known else "none"
        raise UnknownPlugin(f"unknown {kind} {name!r}.{hint} Installed {kind}s: {listing}")

    # ----------------------------------------------------------------- calling

    async def _first(self, hook: str, result_type: Any, timeout: float | None, **kwargs: Any) -> Any:
        """A firstresult hook through pluggy's caller: the first answer that is not None, or None."""
        caller = getattr(self.plugins.pm.hook, hook)
        if not caller.get_hookimpls():
            return None
        attribution = Attribution()

        def call() -> Any:
            with attribution.on_this_thread():
                return caller(**kwargs)

        deadline = self.timeout if timeout is None else timeout
        lane = self._lane(FIRSTRESULT_LANE)
        try:
            result = await lane.run(call, deadline)
        except NeverStarted as exc:
            log.error("hook %s never started: the %d checkpoint threads were busy", hook, exc.threads)
            raise PluginQueueTimeout(", ".join(self.plugins.implementers(hook)), hook, deadline, exc.threads) from None
        except RanPastDeadline:
            plugin = attribution.plugin or "?"
            log.error("plugin %r hook %s timed out after %g s", plugin, hook, deadline)
            raise PluginTimeout(plugin, hook, deadline) from None
        except Exception as exc:
            raise _translate(attribution.plugin or "?", hook, exc) from _cause(exc)
        if result is None:
            return None
        return check_result(attribution.plugin or "?", hook, result, result_type)

    async def _one(self, plugin: str, hook: str, result_type: Any, timeout: float | None, **kwargs: Any) -> Any:
        impl = self.plugins.impl(plugin, hook)
        if impl is None:
            record = self.plugins.records.get(plugin)
            if record is None or record.status != "loaded":
                self._require("plugin", plugin, [r.name for r in self.plugins.loaded()])
            raise PluginError(plugin, hook, "is not implemented by this plugin")
        args = {name: kwargs[name] for name in (*impl.argnames, *getattr(impl, "kwargnames", ())) if name in kwargs}
        deadline = self.timeout if timeout is None else timeout
        call: Callable[[], Any] = functools.partial(impl.function, **args)
        probe = self._health.admit(plugin, hook) if hook in PROVIDER_HOOKS else False
        if probe and self._health.get(plugin).cause == "startup":
            await self._restart(plugin, hook)
        health = self._health
        lane = self._lane(plugin)
        try:
            result = await lane.run(call, deadline)
        except NeverStarted as exc:
            health.timed_out(plugin, hook, deadline, probe=probe)
            log.error("plugin %r hook %s never started: its %d threads were busy", plugin, hook, exc.threads)
            raise PluginQueueTimeout(plugin, hook, deadline, exc.threads) from None
        except RanPastDeadline:
            health.timed_out(plugin, hook, deadline, probe=probe)
            log.error("plugin %r hook %s timed out after %g s", plugin, hook, deadline)
            raise PluginTimeout(plugin, hook, deadline) from None
        except Exception as exc:
            health.answered(plugin, probe=probe)
            raise _translate(plugin, hook, exc) from _cause(exc)
        except BaseException:
            health.abandoned(plugin, probe=probe)
            raise
        health.answered(plugin, probe=probe)
        return check_result(plugin, hook, result, result_type)

    async def _restart(self, plugin: str, hook: str) -> None:
        """The probe of a plugin that failed to start: start it again first (see :mod:`levers9.hooks.health`)."""
        try:
            await self._start(plugin)
        except Exception as exc:
            self._health.abandoned(plugin, probe=True)
            self._health.failed_to_start(plugin, _plain(exc))
            raise ProviderUnhealthy(
                plugin, hook, self._health.get(plugin).reason or "", self._health.probe_every_s
            ) from exc
        except BaseException:
            self._health.abandoned(plugin, probe=True)  # cancelled: the next caller may probe
            raise


def _translate(plugin: str, hook: str, exc: Exception) -> Exception:
    """What the caller sees of an exception a hook raised: typed errors pass, anything else names the plugin."""
    if isinstance(exc, ProviderError):
        if exc.plugin is None:
            exc.plugin = plugin
        return exc
    if isinstance(exc, Levers9Error):
        return exc
    original = exc.original if isinstance(exc, HookRaisedBase) else exc
    return PluginError(plugin, hook, f"raised {type(original).__name__}: {original}")


def _cause(exc: Exception) -> BaseException | None:
    """The ``from`` of a translated exception: the hook's own, unless it passes through unchanged."""
    if isinstance(exc, Levers9Error):
        return exc.__cause__
    return exc.original if isinstance(exc, HookRaisedBase) else exc


def _plain(exc: BaseException) -> str:
    """An error for a health reason: PluginError's own words without the 'plugin X, hook Y:' prefix."""
    return exc.message if isinstance(exc, PluginError) else str(exc)


def check_result(plugin: str, hook: str, result: Any, result_type: Any) -> Any:
    """``result`` as ``result_type``, or a ``PluginError`` saying what was returned, what was expected, and where.

    Models must be returned as models: a dict where a model is expected is refused even when its keys
    would validate, since the spec's types are the contract and a dict skips the model's own checks
    at the plugin's side.
    """
    if result_type is None:
        if result is not None:
            raise PluginError(plugin, hook, f"returned {type(result).__name__}, expected None")
        return None
    loose = _dict_for_model(result, result_type, ())
    if loose is not None:
        path, model = loose
        detail = f" at {'.'.join(map(str, path))}" if path else ""
        raise PluginError(
            plugin,
            hook,
            f"returned {_describe(result)}, expected {_type_name(result_type)}{detail}: a dict where a "
            f"{model.__name__} is expected; return {model.__module__}.{model.__name__}(...) instead",
        )
    try:
        return _adapter(result_type).validate_python(result, strict=True)
    except ValidationError as exc:
        expected = _type_name(result_type)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        detail = f" at {where}" if where else ""
        raise PluginError(
            plugin,
            hook,
            f"returned {_describe(result)}, expected {expected}{detail}: {first['msg']}",
        ) from None


def _dict_for_model(value: Any, tp: Any, where: tuple[int, ...]) -> tuple[tuple[int, ...], type[BaseModel]] | None:
    """Where ``value`` holds a dict in place of a model of ``tp`` (models, lists of them, optional ones)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = _dict_for_model(value, arg, where)
            if found is not None:
                return found
        return None
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp)
        for index, element in enumerate(value):
            found = _dict_for_model(element, item, (*where, index))
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(value, dict):
        return where, tp
    return None


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if not args:
        return getattr(tp, "__name__", str(tp))
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"


def _describe(value: Any) -> str:
    if isinstance(value, list):
        inner = {type(v).__name__ for v in value}
        return f"list[{' | '.join(sorted(inner)) or '...'}]"
    return type(value).__name__
