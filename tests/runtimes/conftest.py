"""Fixtures for the runtime plugins' tests.

These tests ask the real runc, runsc and CRIU of the machine they run on:
capability detection is only worth something against the real tools. A
missing tool therefore fails the test that needs it, naming the command that
installs it, instead of skipping it and letting CI pass without checking.
Helpers are fixtures (not an importable module) so the tests work under any
pytest import mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

import levers9_criu
import levers9_gvisor
import levers9_process
import levers9_runc
from levers9.hooks import spec
from levers9.hooks.markers import PROJECT
from levers9.hooks.types import RuntimeContext

INSTALL = "apt-get install -y runc runsc criu"

RunTool = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def require() -> Callable[[str], str]:
    """``require("runc")``: the tool's path, failing the calling test (never skipping it) when it is missing.

    Called from the test body rather than done in a fixture, so a missing tool
    reads as a failed test, not as a set-up error.
    """

    def find(tool: str) -> str:
        path = shutil.which(tool)
        if path is None:
            pytest.fail(
                f"{tool} not found on PATH ({os.environ.get('PATH', '')}); install the runtime tools with: {INSTALL}"
            )
        return path

    return find


@pytest.fixture
def run_tool() -> RunTool:
    """Run a tool directly, as an operator would, to compare its answer with a plugin's."""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)

    return run


@pytest.fixture
def output_lines() -> Callable[[subprocess.CompletedProcess[str]], list[str]]:
    """The non-blank lines a tool printed, stderr and stdout together."""

    def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
        return [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]

    return lines


@pytest.fixture
def context(tmp_path: Path) -> Callable[..., RuntimeContext]:
    """Build the RuntimeContext a worker passes for runtime ``name`` with ``settings``."""

    def make(name: str, settings: Any = None) -> RuntimeContext:
        return RuntimeContext(name=name, settings=settings, state_dir=str(tmp_path / "state"))

    return make


@pytest.fixture
def plugin_manager() -> pluggy.PluginManager:
    """The hook spec and the four runtime plugins under their entry point names; registering checks hooks."""
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(spec)
    plugins = [levers9_runc, levers9_gvisor, levers9_criu, levers9_process]
    for module in plugins:
        name = module.__name__.removeprefix("levers9_")
        manager.register(module.plugin, name=name)
    manager.check_pending()
    return manager


@pytest.fixture(autouse=True)
def _fresh_criu_answer() -> Iterator[None]:
    levers9_criu.clear_cache()
    yield
    levers9_criu.clear_cache()
