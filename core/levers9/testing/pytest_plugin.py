"""pytest plugin shipped with levers9 (entry point ``pytest11``): fixtures for testing plugins.

Loaded automatically wherever levers9 is installed, so a plugin author's tests
can ask for ``levers9_plugins`` or ``levers9_hooks`` without any set-up, and
subclass :class:`levers9.testing.ProviderContract` for the provider suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet


@pytest.fixture
def levers9_plugins() -> PluginSet:
    """Every installed plugin, loaded through the entry points as the controlplane does (strict off)."""
    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    return plugins


@pytest.fixture
def levers9_hooks(levers9_plugins: PluginSet) -> Iterator[Hooks]:
    """The typed facade over :func:`levers9_plugins`, started as the controlplane starts it (each plugin's
    ``levers9_startup`` with a context that has no agent hub) and shut down after the test."""
    hooks = Hooks(levers9_plugins)
    asyncio.run(hooks.startup())
    yield hooks
    asyncio.run(hooks.shutdown())
