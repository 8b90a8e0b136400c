"""What every cloud provider plugin object is before its own hooks: a settings model, a context, clients to close.

A cloud plugin (``ec2``, ``oci``, ``lambda_labs``) is one object whose class
derives from :class:`CloudProvider`. The class names its pools' settings model
in :attr:`CloudProvider.settings_model` (``levers9_provider_settings`` declares
it), keeps the :class:`~levers9.hooks.context.PluginContext` that
``levers9_startup`` gave (None until then: tools and tests call hooks without
starting the plugin, so nothing may depend on it but logging), and releases
its clients in :meth:`CloudProvider.close` when ``levers9_shutdown`` comes.
Each plugin still declares its own ``LEVERS9_SPEC_VERSION``: the edition is
the plugin's word, not something it inherits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl

__all__ = ["CloudProvider"]


class CloudProvider(ABC):
    """The lifecycle hooks and the settings hook every cloud provider plugin shares."""

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

    @abstractmethod
    def close(self) -> None:
        """Release what the hooks made (clients, sessions, caches); the object may be started again after."""

    def log_info(self, message: str, *args: object) -> None:
        """Log to the plugin's logger once started; before that (tools, tests) there is none, and nothing is said."""
        if self.ctx is not None:
            self.ctx.log.info(message, *args)
