"""Plugin loading: entry points, isolation of broken plugins, policy, strict mode."""

from __future__ import annotations

import pytest

from levers9.hooks.errors import PluginLoadError
from levers9.hooks.manager import HOOK_NAMES, PluginPolicy, PluginSet, load_plugins
from tests.conftest import Installed

BUILTIN_PROVIDERS = {"local", "local_k8s", "attached_cluster", "ec2", "oci", "lambda_labs", "agent_machine"}
BUILTIN_RUNTIMES = {"runc", "gvisor", "process"}

GOOD = """
from levers9 import hookimpl
from levers9.hooks.types import GpuDevice

@hookimpl
def levers9_gpu_devices():
    return [GpuDevice(index=0, uuid="GPU-good", model="NVIDIA L4", gpu="L4", memory_mib=23034)]
"""


def test_builtins_load_through_entry_points() -> None:
    plugins = load_plugins(PluginPolicy())
    builtin = {r.name: r for r in plugins.records.values() if r.builtin}
    assert BUILTIN_PROVIDERS | BUILTIN_RUNTIMES | {"criu", "nvidia_smi"} <= set(builtin)
    assert all(r.status == "loaded" for r in builtin.values()), [r.error for r in builtin.values() if r.error]
    for name in BUILTIN_PROVIDERS:
        assert "provider" in builtin[name].roles, name
    for name in BUILTIN_RUNTIMES:
        assert "runtime" in builtin[name].roles, name


def test_plugin_that_raises_on_import_is_isolated(installed: Installed) -> None:
    installed.add(
        "levers9-broken",
        {"broken": "l9_broken"},
        {"l9_broken": "raise RuntimeError('boom at import')\n"},
    )
    installed.add("levers9-good", {"good": "l9_good"}, {"l9_good": GOOD})
    plugins = load_plugins(PluginPolicy())
    broken = plugins.records["broken"]
    assert broken.status == "failed"
    assert broken.distribution == "levers9-broken"
    assert "RuntimeError: boom at import" in (broken.error or "")
    assert plugins.records["good"].status == "loaded"
    assert "good" in plugins.implementers("levers9_gpu_devices")


def test_strict_mode_fails_on_any_broken_plugin(installed: Installed, monkeypatch: pytest.MonkeyPatch) -> None:
    installed.add("levers9-broken", {"broken": "l9_broken"}, {"l9_broken": "import no_such_module_anywhere\n"})
    monkeypatch.setenv("LEVERS9_PLUGINS_STRICT", "1")
    with pytest.raises(PluginLoadError, match=r"broken: import failed: ModuleNotFoundError"):
        load_plugins()


def test_misspelled_hook_names_plugin_and_hook(installed: Installed) -> None:
    installed.add(
        "levers9-typo",
        {"typo": "l9_typo"},
        {"l9_typo": "from levers9 import hookimpl\n@hookimpl\ndef levers9_provison(request):\n    return None\n"},
    )
    record = load_plugins(PluginPolicy()).records["typo"]
    assert record.status == "failed"
    assert "levers9_provison" in (record.error or "")
    assert "did you mean levers9_provision?" in (record.error or "")


def test_unmarked_hook_function_still_registers() -> None:
    class Plugin:
        def levers9_gpu_devices(self) -> list[object]:
            return []

    plugins = PluginSet()
    record = plugins.add("unmarked", Plugin())
    assert record.status == "loaded"
    assert record.hooks == ["levers9_gpu_devices"]


def test_hook_with_argument_the_spec_lacks_is_rejected() -> None:
    class Plugin:
        def levers9_terminate(self, pool: object, machine: object, force: bool) -> None:
            return None

    record = PluginSet().add("badargs", Plugin())
    assert record.status == "failed"
    assert "force" in (record.error or "")


def test_policy_allow_block_and_env(installed: Installed, monkeypatch: pytest.MonkeyPatch) -> None:
    installed.add("levers9-good", {"good": "l9_good"}, {"l9_good": GOOD})
    plugins = load_plugins(PluginPolicy(block=frozenset({"good"})))
    assert plugins.records["good"].status == "blocked"
    assert "good" not in plugins.implementers("levers9_gpu_devices")

    monkeypatch.setenv("LEVERS9_PLUGINS_ALLOW", "good,runc")
    policy = PluginPolicy.from_env(allow=["ec2"])  # the env replaces config's allow list
    plugins = load_plugins(policy)
    loaded = {r.name for r in plugins.loaded()}
    assert loaded == {"good", "runc"}

    monkeypatch.delenv("LEVERS9_PLUGINS_ALLOW")
    monkeypatch.setenv("LEVERS9_PLUGINS_BLOCK", "ec2")
    policy = PluginPolicy.from_env(block=["oci"])  # block lists add up
    assert policy.block == {"ec2", "oci"}


def test_two_distributions_claiming_one_name(installed: Installed) -> None:
    installed.add("levers9-first", {"twin": "l9_first"}, {"l9_first": GOOD})
    installed.add("levers9-second", {"twin": "l9_second"}, {"l9_second": GOOD})
    plugins = load_plugins(PluginPolicy())
    assert plugins.records["twin"].status == "loaded"
    clashes = [r for r in plugins.records.values() if r.name == "twin" and r.status == "failed"]
    assert len(clashes) == 1
    assert "already named 'twin'" in (clashes[0].error or "")


def test_hook_names_match_the_spec_module() -> None:
    import levers9.hooks.spec as spec

    assert set(HOOK_NAMES) == {n for n in dir(spec) if n.startswith("levers9_")}
    assert len(HOOK_NAMES) == 24
