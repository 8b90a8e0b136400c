"""What the plugin manager refuses when a plugin loads, beyond its edition and its hook names.

Each check finds a mistake that would otherwise surface only when the hook is
first called (or never, as a setting silently read from the wrong place), and
says what changed and where docs/plugins.md explains it. A plugin with any of
these problems is refused at load like any other plugin that fails to load:
it is reported with the message, and every other plugin keeps loading.

* **An ``async def`` hook.** Hooks are plain functions the core runs on the
  plugin's own threads; an ``async def`` would return a coroutine nobody
  awaits, and fail only when called.
* **A first-edition signature.** A hook taking an argument only the first
  edition of the spec had (:data:`FIRST_EDITION_ARGUMENTS`: the first
  edition's ``levers9_terminate(pool, provider_id)``) is named with its
  second-edition signature, instead of pluggy's bare "argument not in the
  hookspec".
* **A provider settings model with a ``region`` (or ``regions``) field.** A
  pool's region is the pool's own field (``pool.region``, ``pool.regions``),
  which the built-in providers refuse under ``settings:``; a third party's
  model that declares it would take the region from the wrong place. The
  model is read by calling ``levers9_provider_settings`` (which must not
  import the provider's SDK); a model the hook cannot give here is left for
  the config loader to report.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel

#: where docs/plugins.md explains editions and these refusals
SPEC_VERSION_DOCS = "docs/plugins.md, section 'The spec version'"
#: where docs/plugins.md says what a first-edition plugin must change
FIRST_EDITION_DOCS = "docs/plugins.md, section 'Changes from the first edition'"

#: (hook, argument) only the first edition had -> the hook's second-edition signature and what to take instead
FIRST_EDITION_ARGUMENTS: dict[tuple[str, str], str] = {
    ("levers9_terminate", "provider_id"): (
        "levers9_terminate(pool, machine): it takes the Machine levers9_provision returned (as levers9 stored "
        "it: machine.provider_id, machine.provider_data), not the provider_id"
    ),
}

#: settings fields that belong to the pool itself, not to a provider's settings
POOL_FIELDS = ("region", "regions")


def _parameters(function: Any) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def hook_problems(plugin: object, hook_names: tuple[str, ...]) -> list[str]:
    """``async def`` hooks and first-edition signatures among ``plugin``'s hooks (see the module docstring)."""
    problems = []
    for name in hook_names:
        function = getattr(plugin, name, None)
        if not callable(function):
            continue
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            problems.append(
                f"hook {name} is an async def: hooks are plain functions, which levers9 runs on the plugin's own "
                f"threads and which may block; write it as a def (see docs/plugins.md, section 2, 'Rules every "
                f"plugin follows')"
            )
        for argument in _parameters(function):
            second = FIRST_EDITION_ARGUMENTS.get((name, argument))
            if second is not None:
                problems.append(
                    f"hook {name} takes {argument!r}, the first edition's signature: since the second edition it "
                    f"is {second}; see {FIRST_EDITION_DOCS}"
                )
    return problems


def settings_problem(plugin: object) -> str | None:
    """Why ``plugin``'s provider settings model may not load (a pool field in it), or None."""
    declare = getattr(plugin, "levers9_provider_settings", None)
    if not callable(declare):
        return None
    try:
        model = declare()
    except Exception:
        return None  # the config loader reports a settings hook that fails
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    for name, field in model.model_fields.items():
        aliases = (field.alias, field.validation_alias)
        spelled = {name, *(alias for alias in aliases if isinstance(alias, str))}
        moved = sorted(spelled & set(POOL_FIELDS))
        if moved:
            return (
                f"its settings model {model.__name__} has a field {moved[0]!r}: a pool's region is the pool's own "
                f"field (pool.region, pool.regions), which levers9 passes to every hook and refuses under "
                f"settings:; remove the field and read request.region, pool.region or pool.regions; see "
                f"{SPEC_VERSION_DOCS}"
            )
    return None


__all__ = [
    "FIRST_EDITION_ARGUMENTS",
    "FIRST_EDITION_DOCS",
    "POOL_FIELDS",
    "SPEC_VERSION_DOCS",
    "hook_problems",
    "settings_problem",
]
