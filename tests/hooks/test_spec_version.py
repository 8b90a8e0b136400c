"""The spec edition a plugin declares, both plugin shapes through entry points, and deprecated hooks.

Every plugin here is installed as a distribution with an entry point and
loaded through :func:`load_plugins`, the path ``levers9 up`` takes.
"""

from __future__ import annotations

import types
import warnings

import pytest

from levers9.hooks.manager import PluginPolicy, PluginSet, load_plugins
from levers9.hooks.markers import hookimpl, hookspec
from levers9.hooks.spec import SPEC_VERSION
from tests.conftest import Installed

MODULE_PLUGIN = """
from levers9 import hookimpl
from levers9.hooks.types import GpuDevice
{declaration}

@hookimpl
def levers9_gpu_devices():
    return [GpuDevice(index=0, uuid="GPU-module", model="NVIDIA L4", gpu="L4", memory_mib=23034)]
"""

OBJECT_PLUGIN = """
from levers9 import hookimpl
from levers9.hooks.types import GpuDevice


class Discovery:
    {declaration}

    @hookimpl
    def levers9_gpu_devices(self):
        return [GpuDevice(index=1, uuid="GPU-object", model="NVIDIA L4", gpu="L4", memory_mib=23034)]


plugin = Discovery()
"""


def _install_object(installed: Installed, name: str, declaration: str) -> None:
    module = f"l9_{name}"
    source = OBJECT_PLUGIN.format(declaration=declaration or "pass")
    installed.add(f"levers9-{name}", {name: f"{module}:plugin"}, {module: source})


def _install_module(installed: Installed, name: str, declaration: str) -> None:
    module = f"l9_{name}"
    installed.add(f"levers9-{name}", {name: module}, {module: MODULE_PLUGIN.format(declaration=declaration)})


def test_module_and_object_plugins_load_through_the_same_entry_point_path(installed: Installed) -> None:
    _install_module(installed, "functions", "")  # a second-edition third party's module, as written today
    _install_object(installed, "instance", f"LEVERS9_SPEC_VERSION = {SPEC_VERSION}")
    plugins = load_plugins(PluginPolicy())
    functions, instance = plugins.records["functions"], plugins.records["instance"]
    assert (functions.status, functions.error, functions.spec_version) == ("loaded", None, None)
    assert (instance.status, instance.error, instance.spec_version) == ("loaded", None, SPEC_VERSION)
    assert functions.hooks == instance.hooks == ["levers9_gpu_devices"]
    answers = plugins.pm.hook.levers9_gpu_devices()
    assert {device.uuid for answer in answers for device in answer} == {"GPU-module", "GPU-object"}


def test_builtin_providers_and_runtimes_declare_the_current_edition() -> None:
    plugins = load_plugins(PluginPolicy())
    builtin = {r.name: r for r in plugins.records.values() if r.builtin}
    objects = {name for name, r in builtin.items() if r.module.endswith(":plugin")}
    # every provider and runtime is one object; GPU discovery (nvidia_smi) stays a module of functions
    assert objects == set(builtin) - {"nvidia_smi"}
    assert {(name, builtin[name].status, builtin[name].spec_version) for name in objects} == {
        (name, "loaded", SPEC_VERSION) for name in objects
    }


@pytest.mark.parametrize("shape", [_install_module, _install_object])
def test_newer_edition_is_refused_naming_plugin_and_versions(installed: Installed, shape: object) -> None:
    assert callable(shape)
    shape(installed, "future", f"LEVERS9_SPEC_VERSION = {SPEC_VERSION + 1}")
    _install_module(installed, "bystander", "")
    plugins = load_plugins(PluginPolicy())
    record = plugins.records["future"]
    assert record.status == "failed"
    assert f"version {SPEC_VERSION + 1}" in (record.error or "")
    assert f"accepts version {SPEC_VERSION}" in (record.error or "")
    assert "future" not in plugins.implementers("levers9_gpu_devices")
    assert plugins.records["bystander"].status == "loaded"  # one refused plugin takes no other down


def test_first_edition_is_refused_saying_what_changed(installed: Installed) -> None:
    _install_module(installed, "old", "LEVERS9_SPEC_VERSION = 1")
    record = load_plugins(PluginPolicy()).records["old"]
    assert record.status == "failed"
    error = record.error or ""
    assert "version 1" in error
    assert "levers9_terminate takes the Machine (not its provider_id)" in error
    assert "docs/plugins.md" in error
    assert "The spec version" in error


@pytest.mark.parametrize(
    ("declaration", "expected"),
    [
        ('LEVERS9_SPEC_VERSION = "2"', "LEVERS9_SPEC_VERSION must be an integer (this levers9 accepts 2), got str '2'"),
        (
            "LEVERS9_SPEC_VERSION = 2.0",
            "LEVERS9_SPEC_VERSION must be an integer (this levers9 accepts 2), got float 2.0",
        ),
        (
            "LEVERS9_SPEC_VERSION = True",
            "LEVERS9_SPEC_VERSION must be an integer (this levers9 accepts 2), got bool True",
        ),
        ("LEVERS9_SPEC_VERSION = 0", "declares hook spec version 0, which never existed: this levers9 accepts 2"),
    ],
)
def test_bad_edition_value_names_the_plugin(installed: Installed, declaration: str, expected: str) -> None:
    _install_object(installed, "odd", declaration)
    plugins = load_plugins(PluginPolicy())
    record = plugins.records["odd"]
    assert (record.status, record.error) == ("failed", expected)
    assert [f.name for f in plugins.failures() if not f.builtin] == ["odd"]


def test_docs_have_the_section_refusals_point_at() -> None:
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text()
    assert "### The spec version" in docs


class _RetiringSpec:
    """A spec with one hook on its way out, as the real spec would mark one."""

    @hookspec(warn_on_impl=DeprecationWarning("levers9_old_offers is deprecated: implement levers9_gpu_offers"))
    def levers9_old_offers(self, pool: object) -> list[object]:
        raise NotImplementedError


def test_deprecated_hook_warns_naming_the_plugin() -> None:
    uses_it = types.ModuleType("l9_uses_old_hook")

    @hookimpl
    def levers9_old_offers(pool: object) -> list[object]:
        return []

    uses_it.levers9_old_offers = levers9_old_offers  # type: ignore[attr-defined]

    class Current:
        LEVERS9_SPEC_VERSION = SPEC_VERSION

        @hookimpl
        def levers9_gpu_devices(self) -> list[object]:
            return []

    plugins = PluginSet(extra_specs=[_RetiringSpec])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = plugins.add("oldtimer", uses_it)
        current = plugins.add("current", Current())
    assert old.status == "loaded"
    assert old.hooks == ["levers9_old_offers"]
    assert old.warnings == [
        "plugin 'oldtimer' (l9_uses_old_hook): levers9_old_offers is deprecated: implement levers9_gpu_offers"
    ]
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == old.warnings
    assert current.warnings == []
