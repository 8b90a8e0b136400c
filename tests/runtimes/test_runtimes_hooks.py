"""The runtime plugins as the core sees them: through their entry points and the hook spec."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from importlib.metadata import entry_points

import pluggy
import pytest
from pydantic import BaseModel, ValidationError

import levers9_criu
import levers9_gvisor
import levers9_process
import levers9_runc
from levers9.hooks.types import CheckpointSupport, Isolation, RuntimeCapabilities, RuntimeContext

Context = Callable[..., RuntimeContext]
RunTool = Callable[..., "subprocess.CompletedProcess[str]"]

PLUGINS = {"runc": levers9_runc, "gvisor": levers9_gvisor, "criu": levers9_criu, "process": levers9_process}


def test_entry_points_load_the_runtime_plugins() -> None:
    found = {ep.name: ep for ep in entry_points(group="levers9")}
    for name, module in PLUGINS.items():
        assert name in found, f"no levers9 entry point named {name!r}"
        assert found[name].load() is module.plugin


def test_hook_levers9_runtime_settings(plugin_manager: pluggy.PluginManager) -> None:
    models = plugin_manager.hook.levers9_runtime_settings()
    expected = {levers9_runc.RuncSettings, levers9_gvisor.GvisorSettings, levers9_process.ProcessSettings}
    assert set(models) == expected, "runc, gvisor and process declare settings; criu is not a runtime"
    assert not hasattr(levers9_criu.plugin, "levers9_runtime_settings")
    for model in models:
        assert issubclass(model, BaseModel)
        with pytest.raises(ValidationError, match="typo_field"):
            model.model_validate({"typo_field": 1})
        model.model_validate({})

    runc = levers9_runc.RuncSettings()
    assert (runc.binary, runc.root) == ("runc", None)
    assert (runc.systemd_cgroup, runc.no_new_privileges) == (False, True)
    gvisor = levers9_gvisor.GvisorSettings()
    assert (gvisor.binary, gvisor.platform, gvisor.network) == ("runsc", "auto", "auto")
    assert (gvisor.nvproxy, gvisor.root) == (False, None)
    with pytest.raises(ValidationError):
        levers9_gvisor.GvisorSettings.model_validate({"platform": "hypervisor"})
    with pytest.raises(ValidationError):
        levers9_gvisor.GvisorSettings.model_validate({"network": "bridge"})
    with pytest.raises(ValidationError):
        levers9_runc.RuncSettings.model_validate({"binary": ""})


def test_hook_levers9_runtime_capabilities(run_tool: RunTool, context: Context, require: Callable[[str], str]) -> None:
    runsc_path = require("runsc")
    runc_path = require("runc")
    runc = levers9_runc.plugin.levers9_runtime_capabilities(context("runc"))
    assert isinstance(runc, RuntimeCapabilities)
    assert runc.available, runc.unavailable_reason
    assert runc.isolation is Isolation.NAMESPACES
    assert runc.version
    assert re.match(r"\d+\.\d+", runc.version)
    assert f"runc version {runc.version}" in run_tool(runc_path, "--version").stdout

    gvisor = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"platform": "ptrace"}))
    assert gvisor.available, gvisor.unavailable_reason
    assert gvisor.isolation is Isolation.SANDBOX
    assert gvisor.checkpoint is True
    assert gvisor.gpu is False, "no nvproxy, no GPUs"
    assert gvisor.version
    assert f"runsc version {gvisor.version}" in run_tool(runsc_path, "--version").stdout

    process = levers9_process.plugin.levers9_runtime_capabilities(context("process"))
    assert process.available
    assert process.isolation is Isolation.NONE
    assert process.gpu is True
    assert process.checkpoint is False

    for name in ("runc", "gvisor"):
        missing = "/nonexistent/levers9-test/bin-" + name
        report = PLUGINS[name].plugin.levers9_runtime_capabilities(context(name, {"binary": missing}))
        assert not report.available
        assert report.unavailable_reason
        assert missing in report.unavailable_reason


def test_runtimes_report_how_the_worker_reaches_their_containers(
    context: Context, require: Callable[[str], str]
) -> None:
    """The worker decides from these, never from a runtime's name (see levers9.worker.warm.launch)."""
    require("runc")
    require("runsc")
    runc = levers9_runc.plugin.levers9_runtime_capabilities(context("runc"))
    gvisor = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"platform": "ptrace"}))
    for isolated in (runc, gvisor):
        assert (isolated.host_filesystem, isolated.host_network) == (False, False)
        assert isolated.cgroup_parent == "/levers9"
    under_systemd = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"systemd_cgroup": True}))
    assert under_systemd.cgroup_parent is None, "systemd names the cgroup, not levers9"
    process = levers9_process.plugin.levers9_runtime_capabilities(context("process"))
    assert (process.host_filesystem, process.host_network, process.cgroup_parent) == (True, True, None)


def test_a_runtime_that_reports_none_of_the_newer_fields_still_validates() -> None:
    """A third-party plugin written before host_filesystem, host_network and cgroup_parent: treated as isolated."""
    report = RuntimeCapabilities.model_validate({"available": True, "isolation": "vm"})
    assert (report.host_filesystem, report.host_network, report.cgroup_parent) == (False, False, None)
    with pytest.raises(ValidationError, match="cgroup_parent"):
        RuntimeCapabilities(available=True, isolation=Isolation.VM, cgroup_parent="levers9")


def test_hook_levers9_checkpoint_support(
    plugin_manager: pluggy.PluginManager,
    run_tool: RunTool,
    output_lines: Callable[[subprocess.CompletedProcess[str]], list[str]],
    context: Context,
    require: Callable[[str], str],
) -> None:
    criu_path = require("criu")
    require("runsc")
    # the first plugin that answers wins: CRIU for runc, runsc for gVisor, nobody for the rest
    runc = plugin_manager.hook.levers9_checkpoint_support(runtime=context("runc"))
    assert isinstance(runc, CheckpointSupport)
    assert runc.mechanism == "criu"
    direct = run_tool(criu_path, "check")
    assert runc.available is (direct.returncode == 0), runc.reason
    if not runc.available:
        assert runc.reason
        own_words = set(output_lines(direct)) & set(runc.reason.splitlines())
        assert own_words, f"the reason must quote criu check: {runc.reason!r}"

    gvisor = plugin_manager.hook.levers9_checkpoint_support(runtime=context("gvisor"))
    assert isinstance(gvisor, CheckpointSupport)
    assert gvisor.available, gvisor.reason
    assert gvisor.mechanism == "runsc"

    for name in ("process", "kata", "docker"):
        assert plugin_manager.hook.levers9_checkpoint_support(runtime=context(name)) is None

    # and each plugin stays silent about runtimes it does not serve
    assert levers9_criu.plugin.levers9_checkpoint_support(context("gvisor")) is None
    assert levers9_criu.plugin.levers9_checkpoint_support(context("process")) is None
    assert levers9_gvisor.plugin.levers9_checkpoint_support(context("runc")) is None
    assert levers9_gvisor.plugin.levers9_checkpoint_support(context("process")) is None
