"""runc's capability report against the host's real runc, and against stand-ins for what it cannot show."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

import levers9_runc
from levers9.hooks.types import Isolation, RuntimeContext

Context = Callable[..., RuntimeContext]
RunTool = Callable[..., "subprocess.CompletedProcess[str]"]
WriteTool = Callable[[Path, str, str], Path]


def test_parse_version() -> None:
    text = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n"
    assert levers9_runc.parse_version(text) == "1.1.5+ds1"
    assert levers9_runc.parse_version("runc version 1.2.0-rc.1\n") == "1.2.0-rc.1"
    assert levers9_runc.parse_version("crun version 1.8\n") is None
    assert levers9_runc.parse_version("") is None


def test_real_runc_is_available_with_its_version(
    run_tool: RunTool, context: Context, require: Callable[[str], str]
) -> None:
    runc_path = require("runc")
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc"))
    assert report.available, report.unavailable_reason
    assert report.unavailable_reason is None
    assert report.isolation is Isolation.NAMESPACES
    first_line = run_tool(runc_path, "--version").stdout.splitlines()[0]
    assert first_line == f"runc version {report.version}"


def test_binary_given_as_a_path(context: Context, require: Callable[[str], str]) -> None:
    runc_path = require("runc")
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": runc_path}))
    assert report.available, report.unavailable_reason


def test_missing_binary_names_the_path(context: Context) -> None:
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": "/opt/nowhere/runc"}))
    assert not report.available
    assert report.unavailable_reason
    assert "/opt/nowhere/runc" in report.unavailable_reason
    assert report.version is None


def test_missing_binary_on_path(context: Context) -> None:
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": "levers9-no-such-runc"}))
    assert not report.available
    assert report.unavailable_reason
    assert "'levers9-no-such-runc' not found on PATH" in report.unavailable_reason


def test_binary_that_fails(tmp_path: Path, write_tool: WriteTool, context: Context) -> None:
    fake = write_tool(tmp_path, "runc", 'echo "runc: broken install" >&2\nexit 3\n')
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": str(fake)}))
    assert not report.available
    assert report.unavailable_reason
    assert "exit status 3" in report.unavailable_reason
    assert "runc: broken install" in report.unavailable_reason


def test_binary_that_is_not_runc(context: Context) -> None:
    true = shutil.which("true")
    assert true
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": true}))
    assert not report.available
    assert report.unavailable_reason
    assert "does not look like runc" in report.unavailable_reason


def test_gpu_follows_the_nvidia_toolkit(
    tmp_path: Path,
    write_tool: WriteTool,
    context: Context,
    monkeypatch: pytest.MonkeyPatch,
    require: Callable[[str], str],
) -> None:
    runc_path = require("runc")
    on_host = any(shutil.which(name) for name in levers9_runc.NVIDIA_HOOKS)
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc"))
    assert report.gpu is on_host

    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bin_dir))
    hook = write_tool(bin_dir, "nvidia-container-runtime-hook", "exit 0\n")
    with_toolkit = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": runc_path}))
    assert with_toolkit.available
    assert with_toolkit.gpu is True
    assert levers9_runc.find_nvidia_hook() == str(hook)

    hook.unlink()
    write_tool(bin_dir, "nvidia-ctk", "exit 0\n")
    assert levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": runc_path})).gpu is True

    (bin_dir / "nvidia-ctk").unlink()
    without = levers9_runc.plugin.levers9_runtime_capabilities(context("runc", {"binary": runc_path}))
    assert without.available
    assert without.gpu is False


def test_checkpointing_points_at_the_criu_plugin(context: Context, require: Callable[[str], str]) -> None:
    require("runc")
    report = levers9_runc.plugin.levers9_runtime_capabilities(context("runc"))
    assert report.checkpoint is False
    assert report.checkpoint_reason
    assert "'criu' plugin" in report.checkpoint_reason


def test_settings_reach_the_hook_as_a_model_or_a_mapping(context: Context) -> None:
    model = levers9_runc.RuncSettings(root="/run/levers9-runc", systemd_cgroup=True)
    assert levers9_runc.RuncSettings.of(context("runc", model)) is model
    assert levers9_runc.RuncSettings.of(context("runc", {"no_new_privileges": False})).no_new_privileges is False
    assert levers9_runc.RuncSettings.of(context("runc")) == levers9_runc.RuncSettings()
    with pytest.raises(ValidationError):
        levers9_runc.RuncSettings.of(context("runc", {"sytemd_cgroup": True}))
