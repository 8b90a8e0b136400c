"""What every provider plugin object is before its own hooks: a settings model, a context, something to close.

A provider plugin is one object (docs/plugins.md §2). The built-in ones derive
from :class:`ProviderPlugin`, which a third party may use too: the class names
its pools' settings model in :attr:`ProviderPlugin.settings_model`
(``levers9_provider_settings`` declares it), keeps the
:class:`~levers9.hooks.context.PluginContext` that ``levers9_startup`` gave
(None until then: tools and tests call hooks without starting the plugin, so
nothing may depend on it but logging and what says it needs a controlplane),
and releases its clients in :meth:`ProviderPlugin.close` when
``levers9_shutdown`` comes. A subclass that needs more at startup overrides
``levers9_startup`` (marked with ``@hookimpl`` again) and calls this one.

Each plugin still declares its own ``LEVERS9_SPEC_VERSION``: the edition is
the plugin's word, not something it inherits.

Invariants: the three hooks here do nothing but what they say (no I/O), so a
plugin that is never started still answers ``levers9_provider_settings``; the
manager collects them from the subclass through ``dir()``, like any method.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl

__all__ = ["ProviderPlugin"]


class ProviderPlugin:
    """The lifecycle hooks and the settings hook every provider plugin object shares."""

    #: the pydantic model a pool's ``settings:`` is validated with (what ``levers9_provider_settings`` declares)
    settings_model: ClassVar[type[BaseModel]]

    def __init__(self) -> None:
        self.ctx: PluginContext | None = None

    @hookimpl
    def levers9_provider_settings(self) -> type[BaseModel]:
        return self.settings_model

    @hookimpl
    def levers9_startup(self, ctx: PluginContext) -> None:
        self.ctx = ctx

    @hookimpl
    def levers9_shutdown(self, ctx: PluginContext) -> None:
        self.close()

    def close(self) -> None:
        """Release what the hooks made (clients, sessions, caches); the object may be started again after.

        Nothing by default: a provider whose answers are read afresh each time holds nothing to release.
        """

    def log_info(self, message: str, *args: object) -> None:
        """Log to the plugin's logger once started; before that (tools, tests) there is none, and nothing is said."""
        if self.ctx is not None:
            self.ctx.log.info(message, *args)
