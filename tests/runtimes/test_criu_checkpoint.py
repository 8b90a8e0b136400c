"""CRIU's checkpoint report for runc, against the host's real ``criu check`` and against stand-ins."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import levers9_criu
from levers9 import probe
from levers9.hooks.types import CheckpointSupport, RuntimeContext

Context = Callable[..., RuntimeContext]
RunTool = Callable[..., "subprocess.CompletedProcess[str]"]
WriteTool = Callable[[Path, str, str], Path]

#: found before any test narrows PATH
SLEEP = shutil.which("sleep")


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only what the test puts there, for a process that counts as root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(levers9_criu.os, "geteuid", lambda: 0)
    return bin_dir


def test_matches_a_direct_criu_check(
    run_tool: RunTool,
    output_lines: Callable[[subprocess.CompletedProcess[str]], list[str]],
    context: Context,
    require: Callable[[str], str],
) -> None:
    criu_path = require("criu")
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert isinstance(support, CheckpointSupport)
    assert support.mechanism == "criu"
    direct = run_tool(criu_path, "check")
    if direct.returncode == 0:
        assert support.available, support.reason
    else:
        # CRIU cannot work on this kernel (a vDSO it does not understand, say): the reason is its own words
        assert not support.available
        assert support.reason
        assert f"exit status {direct.returncode}" in support.reason
        criu_said = output_lines(direct)
        reported = support.reason.splitlines()[1:]
        assert reported, support.reason
        assert all(line in criu_said for line in reported), (reported, criu_said)


def test_answer_is_cached_until_cleared(
    context: Context, monkeypatch: pytest.MonkeyPatch, require: Callable[[str], str]
) -> None:
    require("criu")
    checks: list[list[str]] = []
    real_run = probe.run

    def counting_run(argv: list[str], timeout: float) -> probe.ProbeResult:
        if argv[1:] == ["check"]:
            checks.append(list(argv))
        return real_run(argv, timeout)

    monkeypatch.setattr(probe, "run", counting_run)
    first = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert len(checks) == 1
    assert levers9_criu.plugin.levers9_checkpoint_support(context("runc")) is first
    assert len(checks) == 1

    levers9_criu.clear_cache()
    assert levers9_criu.plugin.levers9_checkpoint_support(context("runc")) == first
    assert len(checks) == 2


def test_not_root(context: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levers9_criu.os, "geteuid", lambda: 1000)
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert support is not None
    assert not support.available
    assert support.reason
    assert "root" in support.reason
    assert "1000" in support.reason


def test_criu_missing(context: Context, fake_path: Path) -> None:
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert support is not None
    assert not support.available
    assert support.mechanism == "criu"
    assert support.reason
    assert "criu not found on PATH" in support.reason


def test_criu_that_passes(context: Context, fake_path: Path, write_tool: WriteTool) -> None:
    body = 'case "$1" in check) echo "Looks good." ;; --version) echo "Version: 3.19" ;; *) exit 1 ;; esac\n'
    write_tool(fake_path, "criu", body)
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert support is not None
    assert support.available
    assert support.reason
    assert "3.19" in support.reason


def test_criu_that_fails_silently(context: Context, fake_path: Path, write_tool: WriteTool) -> None:
    write_tool(fake_path, "criu", "exit 4\n")
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert support is not None
    assert not support.available
    assert support.reason
    assert "exit status 4" in support.reason
    assert "printed nothing" in support.reason


def test_criu_that_hangs(
    context: Context, fake_path: Path, write_tool: WriteTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levers9_criu, "CHECK_TIMEOUT", 0.3)
    write_tool(fake_path, "criu", f"exec {SLEEP} 30\n")
    support = levers9_criu.plugin.levers9_checkpoint_support(context("runc"))
    assert support is not None
    assert not support.available
    assert support.reason
    assert "did not finish within 0.3 s" in support.reason


@pytest.mark.parametrize("name", ["gvisor", "process", "runsc", "RUNC"])
def test_other_runtimes_are_not_served(name: str, context: Context) -> None:
    assert levers9_criu.plugin.levers9_checkpoint_support(context(name)) is None
