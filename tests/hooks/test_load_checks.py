"""Mistakes a plugin is refused for when it loads (levers9.hooks.load_checks), each naming what changed.

Every plugin here is installed as a distribution with an entry point and
loaded through :func:`load_plugins`, as ``levers9 up`` loads a third party's
plugin; a well-formed bystander installed beside it must keep loading.
"""

from __future__ import annotations

import pytest

from levers9.hooks.manager import PluginPolicy, PluginSet, load_plugins
from tests.conftest import Installed

PROVIDER = """
from pydantic import BaseModel, ConfigDict, Field
from levers9 import hookimpl


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: str = "p"
{fields}


class Provider:
    LEVERS9_SPEC_VERSION = 2

    @hookimpl
    def levers9_provider_settings(self):
        return Settings

    @hookimpl
    {terminate}

    @hookimpl
    def levers9_list_machines(self, pool):
        return []


plugin = Provider()
"""

WELL_FORMED_TERMINATE = "def levers9_terminate(self, pool, machine):\n        return None"


def _install(installed: Installed, name: str, *, fields: str = "", terminate: str = WELL_FORMED_TERMINATE) -> None:
    module = f"l9_{name}"
    source = PROVIDER.format(fields=fields, terminate=terminate)
    installed.add(f"levers9-{name}", {name: f"{module}:plugin"}, {module: source})


def _load(installed: Installed, name: str, **shape: str) -> tuple[PluginSet, str]:
    _install(installed, name, **shape)
    _install(installed, "bystander")
    plugins = load_plugins(PluginPolicy())
    record = plugins.records[name]
    assert record.status == "failed", record
    assert name not in plugins.implementers("levers9_list_machines")
    assert plugins.records["bystander"].status == "loaded"  # one refused plugin takes no other down
    return plugins, record.error or ""


def test_a_well_formed_provider_loads(installed: Installed) -> None:
    _install(installed, "fine")
    record = load_plugins(PluginPolicy()).records["fine"]
    assert (record.status, record.error) == ("loaded", None)


def test_an_async_hook_is_refused_at_load(installed: Installed) -> None:
    _, error = _load(
        installed, "eager", terminate="async def levers9_terminate(self, pool, machine):\n        return None"
    )
    assert "hook levers9_terminate is an async def" in error
    assert "hooks are plain functions" in error
    assert "write it as a def" in error
    assert "docs/plugins.md, section 2" in error


def test_a_first_edition_terminate_is_refused_naming_the_second_editions(installed: Installed) -> None:
    """No LEVERS9_SPEC_VERSION, as first-edition plugins were written: the signature gives it away."""
    source = "def levers9_terminate(self, pool, provider_id):\n        return None"
    _, error = _load(installed, "old", terminate=source)
    assert "hook levers9_terminate takes 'provider_id', the first edition's signature" in error
    assert "since the second edition it is levers9_terminate(pool, machine)" in error
    assert "docs/plugins.md, section 'Changes from the first edition'" in error
    assert "can not be found in the hookspec" not in error  # not pluggy's bare message


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ('    region: str = Field("eu-1", description="the region")', "region"),
        ("    regions: list[str] = []", "regions"),
        ('    where: str = Field("eu-1", alias="region")', "region"),
    ],
)
def test_a_settings_model_with_the_pools_region_is_refused(installed: Installed, fields: str, named: str) -> None:
    _, error = _load(installed, "regional", fields=fields)
    assert f"its settings model Settings has a field {named!r}" in error
    assert "a pool's region is the pool's own field (pool.region, pool.regions)" in error
    assert "docs/plugins.md, section 'The spec version'" in error


def test_a_settings_hook_that_fails_is_left_to_the_config_loader(installed: Installed) -> None:
    """The load check reads the model by calling the hook; a hook that raises is not refused here."""
    module = "l9_shaky"
    source = PROVIDER.format(fields="", terminate=WELL_FORMED_TERMINATE).replace(
        "        return Settings", "        raise RuntimeError('not yet')"
    )
    installed.add("levers9-shaky", {"shaky": f"{module}:plugin"}, {module: source})
    record = load_plugins(PluginPolicy()).records["shaky"]
    assert (record.status, record.error) == ("loaded", None)


def test_the_checks_apply_to_in_process_plugins_too() -> None:
    """PluginSet.add, as tests and embedders register plugins, goes through the same checks."""

    class Eager:
        async def levers9_list_machines(self, pool: object) -> list[object]:
            return []

    plugins = PluginSet(PluginPolicy())
    record = plugins.add("eager", Eager())
    assert record.status == "failed"
    assert "hook levers9_list_machines is an async def" in (record.error or "")
