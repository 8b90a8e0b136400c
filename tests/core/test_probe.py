"""The probe helper plugins use: a missing, broken or hung tool is an answer, never an exception."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import levers9.probe

WriteTool = Callable[[Path, str, str], Path]

PROBES = [levers9.probe]
SLEEP = shutil.which("sleep")


@pytest.fixture(params=PROBES, ids=lambda module: module.__name__)
def probe(request: pytest.FixtureRequest) -> ModuleType:
    module: ModuleType = request.param
    return module


def test_runs_a_command(probe: ModuleType, tmp_path: Path, write_tool: WriteTool) -> None:
    tool = write_tool(tmp_path, "tool", 'echo out; echo err >&2; echo "lang=$LC_ALL"; exit 3\n')
    result = probe.run([str(tool)], timeout=10)
    rc, stdout, stderr = result
    assert (rc, stdout, stderr) == (3, "out\nlang=C\n", "err\n")
    assert not result.ok
    assert result.output_lines() == ["err", "out", "lang=C"]


def test_missing_binary(probe: ModuleType) -> None:
    result = probe.run(["/nonexistent/levers9-tool", "--version"], timeout=10)
    assert result.rc == probe.NOT_FOUND
    assert "/nonexistent/levers9-tool" in result.stderr
    assert probe.which("/nonexistent/levers9-tool") is None
    assert probe.which("sh") == shutil.which("sh")


def test_not_executable(probe: ModuleType, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    result = probe.run([str(plain)], timeout=10)
    assert result.rc == probe.NOT_EXECUTABLE
    assert str(plain) in result.stderr


def test_timeout(probe: ModuleType, tmp_path: Path, write_tool: WriteTool) -> None:
    tool = write_tool(tmp_path, "slow", f"echo started\nexec {SLEEP} 30\n")
    result = probe.run([str(tool)], timeout=0.5)
    assert result.rc == probe.TIMED_OUT
    assert result.stdout == "started\n"
    assert "did not finish within 0.5 s" in result.stderr


def test_timeout_kills_the_helpers_too(probe: ModuleType, tmp_path: Path, write_tool: WriteTool) -> None:
    # a helper forked in the background keeps the output pipe open; the probe must not wait for it
    tool = write_tool(tmp_path, "forks", f"{SLEEP} 30 &\nwait\n")
    started = time.monotonic()
    result = probe.run([str(tool)], timeout=0.5)
    assert result.rc == probe.TIMED_OUT
    assert time.monotonic() - started < 10
