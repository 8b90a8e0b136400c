"""Shared test fixtures: fake installed plugin distributions and CLI runs in subprocesses; the run's order.

Order: the end-to-end tests (tests/e2e) run first, then the other slow ones
(the tiers, below), the rest after them in collection order. scripts/test runs xdist with ``--dist worksteal``: the tests
are split between the workers up front, and a worker that runs out takes half
of another's queue, so with the long tests first the short ones fill the gaps
at the end instead of one worker running minutes-long tests alone while the
other idles. (With xdist's default ``load`` this order is worse: it hands the
first quarter of the tests out at once and never moves them, so one worker
kept its share of the end-to-end tests for the last 15 minutes of a 50-minute
run while the other sat idle.) Nothing may depend on this order; it only
changes how long a run takes.

Tiers: every test under tests/e2e is marked ``e2e`` (by its path), and every
test that tests/slow_tests.txt names (a file, or one test in it) is marked
``slow``; ``scripts/test --fast`` deselects both. The list comes from a
recorded run's durations: a test that takes more than about 5 s on 2 cores,
or a file whose tests take seconds each, belongs there. After a run the terminal summary lists the tests that took
longer than that without either mark, so the list can be kept up to date
(tests/test_tiers.py fails on an entry that names no test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.browser import browser, output_dir, page, pages, screenshot, viewport  # noqa: F401
from tests.fixtures.debian_base import debian_base, debian_bases  # noqa: F401
from tests.fixtures.dockerd import dockerd, tiny_image  # noqa: F401
from tests.fixtures.levers9_up import levers9_up, shared_up  # noqa: F401
from tests.fixtures.oidc_provider import oidc_provider  # noqa: F401
from tests.fixtures.postgres import database_url, postgres_server, postgres_url  # noqa: F401
from tests.fixtures.redis import redis_factory, redis_server, redis_url  # noqa: F401
from tests.fixtures.registry import registry, registry_factory  # noqa: F401
from tests.fixtures.replicas import replicas  # noqa: F401
from tests.fixtures.sshd import sshd, sshd_factory  # noqa: F401
from tests.fixtures.tiers import SLOW_S, TESTS, is_slow, slow_entries
from tests.fixtures.volume_stores import moto_s3, postgres_password_database  # noqa: F401
from tests.fixtures.worker_image import worker_image, worker_image_cache  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tiers (``e2e`` by path, ``slow`` from the list), then the end-to-end tests first (see above)."""
    e2e = TESTS / "e2e"
    entries = slow_entries()
    for item in items:
        if item.path.is_relative_to(e2e):
            item.add_marker(pytest.mark.e2e)
        elif is_slow(item.nodeid, entries):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2)


_unmarked_slow: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds up each test's setup, call and teardown, for the tests with neither tier mark (see the summary)."""
    if "slow" in report.keywords or "e2e" in report.keywords:
        return
    _unmarked_slow[report.nodeid] = _unmarked_slow.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Names the unmarked tests that took longer than :data:`SLOW_S`, to be added to tests/slow_tests.txt."""
    over = sorted(((s, n) for n, s in _unmarked_slow.items() if s > SLOW_S), reverse=True)
    if over:
        terminalreporter.section(
            f"tests over {SLOW_S:g} s marked neither slow nor e2e (add them to tests/slow_tests.txt)"
        )
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")


@dataclass
class Installed:
    """A directory that, on sys.path or PYTHONPATH, makes Python see extra installed distributions."""

    root: Path

    def add(self, dist: str, plugins: dict[str, str], modules: dict[str, str]) -> None:
        """Install distribution ``dist`` with entry points ``plugins`` (name -> module) and module sources."""
        info = self.root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "\n".join(f"{name} = {module}" for name, module in plugins.items())
        (info / "entry_points.txt").write_text(f"[levers9]\n{lines}\n")
        for module, source in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Installed]:
    """Extra plugin distributions, visible to this process and to subprocesses run with ``cli``."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    yield Installed(root)
    for name in list(sys.modules):
        module = sys.modules[name]
        if (getattr(module, "__file__", None) or "").startswith(str(root)):
            del sys.modules[name]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., Result]:
    """Run the installed ``levers9`` command in a subprocess, with an empty levers9 home."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
        full_env = {**os.environ, "LEVERS9_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"}
        for key in ("LEVERS9_CONFIG", "LEVERS9_PLUGINS_ALLOW", "LEVERS9_PLUGINS_BLOCK", "LEVERS9_PLUGINS_STRICT"):
            full_env.pop(key, None)
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "levers9.cli.main", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=tmp_path,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests never see the developer's own config or plugin policy."""
    for key in ("LEVERS9_CONFIG", "LEVERS9_PLUGINS_ALLOW", "LEVERS9_PLUGINS_BLOCK", "LEVERS9_PLUGINS_STRICT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path / "levers9-home"))


@pytest.fixture
def write_tool() -> Callable[[Path, str, str], Path]:
    """Write an executable shell script that stands in for a tool: ``write_tool(directory, name, body)``."""

    def write(directory: Path, name: str, body: str) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    return write
