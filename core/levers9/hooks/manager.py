"""Finding, loading and isolating plugins.

Every plugin, built-in or third-party, is an entry point in the ``levers9``
group. Loading is per plugin: one that fails to import, implements a hook that
does not exist, or has a signature the spec does not allow is recorded with its
error and left out, and every other plugin keeps working. Strict mode (config
``plugins.strict`` or ``LEVERS9_PLUGINS_STRICT=1``) turns any such failure into
an error, for CI and for operators who prefer to fail fast.

A plugin is a module of ``levers9_*`` functions or an object whose methods are
named ``levers9_*`` (the built-in plugins are objects: a class whose instance
the entry point names); both register the same way here. Either may declare
the spec edition it was written to as ``LEVERS9_SPEC_VERSION``, read before
the plugin registers: none declared is a second-edition plugin written before
the attribute existed, and loads; :data:`~levers9.hooks.spec.SPEC_VERSION`
loads; a newer edition, a retired one
(:data:`~levers9.hooks.spec.RETIRED_EDITIONS`, refused with what changed
since), any other number or a value that is not an integer fails that plugin
alone, with the plugin named. Then the checks of
:mod:`levers9.hooks.load_checks` (an ``async def`` hook, a first-edition
signature, a settings model with the pool's ``region``) refuse that plugin
alone, each naming what changed. A hookspec marked ``warn_on_impl`` (a hook on
its way out) makes pluggy warn when a plugin implements it; the warning is
re-issued naming the plugin, logged, and kept on the plugin's record.

Hooks declared ``firstresult`` (the checkpoint hooks) are called through
pluggy's own hook caller, which asks each implementation in turn (the plugin
registered last first; ``tryfirst``/``trylast`` move one) and stops at the
first answer that is not None. pluggy does not say which implementation
answered or raised, and the facade must name it when the answer has the wrong
type or the call fails. So when a plugin registers, each of its
implementations of a firstresult hook is wrapped to note its plugin's name in
the :class:`Attribution` of the call running on the current thread, before
it runs: once pluggy's caller returns or raises, the last name noted is the
plugin that answered, raised, or (for a call that ran past its deadline) is
still running. The wrapper changes nothing else: same arguments, same result,
same exceptions. Hook wrappers (``hookwrapper``/``wrapper``) are left as they are.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any, Literal

import pluggy

from levers9.hooks import spec as spec_module
from levers9.hooks.errors import PluginLoadError
from levers9.hooks.load_checks import SPEC_VERSION_DOCS, hook_problems, settings_problem
from levers9.hooks.markers import PROJECT

log = logging.getLogger("levers9.plugins")

ENTRY_POINT_GROUP = "levers9"
HOOK_PREFIX = "levers9_"
ENV_ALLOW = "LEVERS9_PLUGINS_ALLOW"
ENV_BLOCK = "LEVERS9_PLUGINS_BLOCK"
ENV_STRICT = "LEVERS9_PLUGINS_STRICT"

#: hook names of the spec, in the order the spec declares them
HOOK_NAMES: tuple[str, ...] = tuple(
    name for name in vars(spec_module) if name.startswith(HOOK_PREFIX) and callable(getattr(spec_module, name))
)

Status = Literal["loaded", "failed", "blocked"]


@dataclass
class PluginRecord:
    """What ``levers9 plugins`` reports about one plugin."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    status: Status = "loaded"
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    #: the spec edition the plugin declares (``LEVERS9_SPEC_VERSION``), None when it declares none
    spec_version: int | None = None
    #: deprecation warnings its hook implementations raised at registration, each naming the plugin
    warnings: list[str] = field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return self.distribution == "levers9"

    @property
    def roles(self) -> list[str]:
        roles = []
        if "levers9_provider_settings" in self.hooks:
            roles.append("provider")
        if "levers9_runtime_settings" in self.hooks or "levers9_runtime_capabilities" in self.hooks:
            roles.append("runtime")
        if "levers9_checkpoint_support" in self.hooks:
            roles.append("checkpoint")
        if "levers9_gpu_devices" in self.hooks:
            roles.append("gpu-discovery")
        return roles

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": self.module,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "status": self.status,
            "error": self.error,
            "roles": self.roles,
            "hooks": self.hooks,
            "spec_version": self.spec_version,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class PluginPolicy:
    """Which plugins an operator lets load. ``allow=None`` means every installed plugin."""

    allow: frozenset[str] | None = None
    block: frozenset[str] = frozenset()
    strict: bool = False

    def permits(self, name: str) -> bool:
        if name in self.block:
            return False
        return self.allow is None or name in self.allow

    @classmethod
    def from_env(
        cls,
        allow: Iterable[str] | None = None,
        block: Iterable[str] = (),
        strict: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> PluginPolicy:
        """Combine config with the environment: the env allow list replaces config's, block lists add up."""
        env = os.environ if environ is None else environ
        env_allow = _split(env.get(ENV_ALLOW))
        env_block = _split(env.get(ENV_BLOCK))
        env_strict = env.get(ENV_STRICT, "").strip().lower() in {"1", "true", "yes", "on"}
        final_allow = env_allow if env_allow is not None else (None if allow is None else list(allow))
        return cls(
            allow=None if final_allow is None else frozenset(final_allow),
            block=frozenset(block) | frozenset(env_block or ()),
            strict=strict or env_strict,
        )


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


_calling = threading.local()


class Attribution:
    """Which plugin's implementation a pluggy hook call on this thread entered last (see the module docstring)."""

    def __init__(self) -> None:
        self.plugin: str | None = None

    @contextmanager
    def on_this_thread(self) -> Iterator[Attribution]:
        previous = getattr(_calling, "attribution", None)
        _calling.attribution = self
        try:
            yield self
        finally:
            _calling.attribution = previous


def _attributed(function: Callable[..., Any], plugin: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def attributed(*args: Any, **kwargs: Any) -> Any:
        attribution: Attribution | None = getattr(_calling, "attribution", None)
        if attribution is not None:
            attribution.plugin = plugin
        return function(*args, **kwargs)

    return attributed


class _Levers9PluginManager(pluggy.PluginManager):
    """A pluggy manager that also treats unmarked ``levers9_*`` functions as hook implementations.

    A plugin author who forgets ``@hookimpl`` would otherwise have hooks that are
    silently never called; with this, the function still registers and a
    misspelled name is caught by :func:`unknown_hooks`.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(HOOK_PREFIX):
            method = getattr(plugin, name, None)
            if callable(method) and not isinstance(method, type):
                return {}
        return opts


def unknown_hooks(plugin: object, known: tuple[str, ...] = HOOK_NAMES) -> list[str]:
    """Names a plugin defines with the hook prefix that the spec does not know, with a suggestion each."""
    problems = []
    for name in dir(plugin):
        if not name.startswith(HOOK_PREFIX) or name in known:
            continue
        if not callable(getattr(plugin, name, None)):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; known hooks: {', '.join(known)}"
        problems.append(f"implements unknown hook {name}{hint}")
    return problems


SPEC_VERSION_ATTRIBUTE = "LEVERS9_SPEC_VERSION"


def spec_version_problem(plugin: object) -> str | None:
    """Why the edition a plugin declares keeps it from loading, or None when it may load (see the module docstring)."""
    declared = getattr(plugin, SPEC_VERSION_ATTRIBUTE, None)
    if declared is None:
        return None
    current = spec_module.SPEC_VERSION
    if isinstance(declared, bool) or not isinstance(declared, int):
        return (
            f"{SPEC_VERSION_ATTRIBUTE} must be an integer (this levers9 accepts {current}), "
            f"got {type(declared).__name__} {declared!r}"
        )
    if declared == current:
        return None
    if declared > current:
        return (
            f"written to hook spec version {declared}, newer than this levers9 knows: it accepts version {current} "
            f"(and plugins that declare none); upgrade levers9 or install a release of the plugin for version {current}"
        )
    changes = spec_module.RETIRED_EDITIONS.get(declared)
    if changes is not None:
        return (
            f"written to hook spec version {declared}, which this levers9 no longer loads (it accepts {current}): "
            f"{changes}; see {SPEC_VERSION_DOCS}"
        )
    return f"declares hook spec version {declared}, which never existed: this levers9 accepts {current}"


class PluginSet:
    """The loaded plugins and what became of every plugin that was found.

    Owns the pluggy manager; the typed facade (:class:`levers9.hooks.facade.Hooks`)
    is what the rest of the core calls.
    """

    def __init__(self, policy: PluginPolicy | None = None, *, extra_specs: Iterable[ModuleType | type] = ()) -> None:
        """``extra_specs``: more hookspec modules or classes beside the spec (tests of the manager's mechanisms)."""
        self.policy = policy or PluginPolicy()
        self.pm = _Levers9PluginManager(PROJECT)
        self.pm.add_hookspecs(spec_module)
        extra_names: list[str] = []
        for extra in extra_specs:
            self.pm.add_hookspecs(extra)
            extra_names += [n for n in dir(extra) if n.startswith(HOOK_PREFIX) and n not in HOOK_NAMES]
        #: every hook a plugin may implement here: the spec's, then the extra specs'
        self.hook_names: tuple[str, ...] = HOOK_NAMES + tuple(extra_names)
        self.records: dict[str, PluginRecord] = {}

    # ----------------------------------------------------------------- loading

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load every installed plugin the policy permits; see the module docstring for failure handling."""
        seen: set[str] = set()
        for ep in metadata.entry_points(group=group):
            if ep.name in seen:
                # Two distributions claiming one name: the first wins, the second is reported.
                dist = _dist_name(ep)
                self.records[f"{ep.name} ({dist})"] = PluginRecord(
                    name=ep.name,
                    module=ep.value,
                    distribution=dist,
                    version=_dist_version(ep),
                    status="failed",
                    error=f"another installed plugin is already named {ep.name!r}",
                )
                continue
            seen.add(ep.name)
            record = PluginRecord(name=ep.name, module=ep.value, distribution=_dist_name(ep), version=_dist_version(ep))
            self.records[ep.name] = record
            if not self.policy.permits(ep.name):
                record.status = "blocked"
                continue
            try:
                plugin = ep.load()
            except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self._fail(record, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self._register(record, plugin)
        self._finish()

    def add(self, name: str, plugin: object, *, distribution: str | None = None) -> PluginRecord:
        """Register an in-process plugin (tests, embedding); goes through the same checks as entry points."""
        module = plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__qualname__
        record = PluginRecord(name=name, module=module, distribution=distribution)
        self.records[name] = record
        if not self.policy.permits(name):
            record.status = "blocked"
            return record
        self._register(record, plugin)
        self._finish()
        return record

    def _register(self, record: PluginRecord, plugin: object) -> None:
        declared = getattr(plugin, SPEC_VERSION_ATTRIBUTE, None)
        record.spec_version = declared if isinstance(declared, int) and not isinstance(declared, bool) else None
        problem = spec_version_problem(plugin)
        if problem is not None:
            self._fail(record, problem)
            return
        problems = unknown_hooks(plugin, self.hook_names) + hook_problems(plugin, self.hook_names)
        if problems:
            self._fail(record, "; ".join(problems))
            return
        problem = settings_problem(plugin)
        if problem is not None:
            self._fail(record, problem)
            return
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.pm.register(plugin, name=record.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self._fail(record, f"invalid hook implementation: {exc}")
            return
        for caught_warning in caught:
            self._warn(record, caught_warning)
        record.hooks = [
            impl_name
            for impl_name in self.hook_names
            if any(impl.plugin_name == record.name for impl in getattr(self.pm.hook, impl_name).get_hookimpls())
        ]
        for hook_name in record.hooks:
            caller = getattr(self.pm.hook, hook_name)
            if caller.spec is None or not caller.spec.opts.get("firstresult"):
                continue
            for impl in caller.get_hookimpls():
                if impl.plugin_name == record.name and not (impl.hookwrapper or impl.wrapper):
                    impl.function = _attributed(impl.function, record.name)

    def _warn(self, record: PluginRecord, caught: warnings.WarningMessage) -> None:
        """Re-issue a warning raised while ``record``'s plugin registered, naming the plugin."""
        message = f"plugin {record.name!r} ({record.module}): {caught.message}"
        record.warnings.append(message)
        log.warning("%s", message)
        warnings.warn_explicit(
            message, caught.category, caught.filename, caught.lineno, module=record.module, registry={}
        )

    def _fail(self, record: PluginRecord, error: str) -> None:
        record.status = "failed"
        record.error = error
        log.error("plugin %r (%s) not loaded: %s", record.name, record.module, error)

    def _finish(self) -> None:
        failures = [(r.name, r.error or "") for r in self.records.values() if r.status == "failed"]
        if failures and self.policy.strict:
            raise PluginLoadError(failures)

    # ----------------------------------------------------------------- queries

    def loaded(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "loaded"]

    def failures(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "failed"]

    def implementers(self, hook_name: str) -> list[str]:
        """Names of loaded plugins implementing ``hook_name``, in registration order."""
        return [impl.plugin_name for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls())]

    def impl(self, plugin_name: str, hook_name: str) -> pluggy.HookImpl | None:
        impls: list[pluggy.HookImpl] = getattr(self.pm.hook, hook_name).get_hookimpls()
        for impl in impls:
            if impl.plugin_name == plugin_name:
                return impl
        return None


def _dist_name(ep: metadata.EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return None if dist is None else str(dist.metadata["Name"])


def _dist_version(ep: metadata.EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return None if dist is None else str(dist.version)


def load_plugins(policy: PluginPolicy | None = None) -> PluginSet:
    """The usual way in: a plugin set with every permitted installed plugin loaded."""
    plugins = PluginSet(policy or PluginPolicy.from_env())
    plugins.load_entry_points()
    return plugins


__all__ = [
    "ENTRY_POINT_GROUP",
    "HOOK_NAMES",
    "SPEC_VERSION_ATTRIBUTE",
    "Attribution",
    "PluginPolicy",
    "PluginRecord",
    "PluginSet",
    "load_plugins",
    "spec_version_problem",
    "unknown_hooks",
]
