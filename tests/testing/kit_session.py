"""The contract kit run as its users run it: in a pytest session of its own, on plugins with planted defects.

:func:`run_session` runs pytest in a directory of test modules written for the
case at hand and reads its JUnit report: one outcome per test, keyed by module
and test name, with the report's text (the kit's failure message). One session
holds every case, since starting pytest with this environment's plugins costs
far more than the kit's tests. :func:`plant` makes a defect in a copy of an
example plugin's source; :data:`PLANTING` is the start of a module for that
session which loads such a copy and registers it under the real plugin's name.

Failures: a session that writes no report fails the calling test with the
session's output; a planted text that does not occur exactly once fails it too,
so a change to the example that moves the planted line fails loudly rather than
testing nothing.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from levers9.testing import ProviderContract

__all__ = ["KIT_TESTS", "PLANTING", "Outcome", "plant", "run_session"]

#: every test of the contract kit: a session's class must report each one (none collected silently less)
KIT_TESTS = frozenset(name for name in dir(ProviderContract) if name.startswith("test_"))

#: ("passed" | "failed" | "error" | "skipped", the report's text)
Outcome = tuple[str, str]

#: the start of the session's planting module: ``load(name, path)`` imports a file as a module, and
#: ``swapped(name, plugin)`` is every installed plugin, with ``plugin`` registered as ``name`` in place of the real one
PLANTING = """
import importlib.util
import sys

import pytest

from levers9.hooks.manager import PluginPolicy, PluginSet


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def swapped(name, plugin):
    plugins = PluginSet(PluginPolicy(block=frozenset({name})))
    plugins.load_entry_points()
    del plugins.records[name]
    plugins.policy = PluginPolicy()
    plugins.add(name, plugin)
    return plugins
"""


def plant(source: str, replacements: list[tuple[str, str]], module: str) -> str:
    """``source`` with each ``(old, new)`` replaced; each ``old`` must occur exactly once in it."""
    for old, new in replacements:
        found = source.count(old)
        assert found == 1, f"the planted text must occur once in {module}, it occurs {found} times: {old!r}"
        source = source.replace(old, new)
    return source


def run_session(where: Path, *args: str, spread: int | str = 0, timeout: float = 1200) -> dict[str, dict[str, Outcome]]:
    """Run pytest in ``where`` with ``args``, over ``spread`` xdist workers (a count or ``auto``) if xdist is here.

    Returns ``{module: {test: outcome}}`` from its JUnit report; a failure's outcome is ``failed``.
    """
    report = where / "report.xml"
    workers = ["-n", str(spread)] if spread and importlib.util.find_spec("xdist") is not None else []
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *args, f"--junitxml={report}"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if not report.exists():
        pytest.fail(f"the kit's pytest session wrote no report:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    outcomes: dict[str, dict[str, Outcome]] = {}
    for testcase in ElementTree.parse(report).getroot().iter("testcase"):
        module = testcase.get("classname", "").split(".")[0]
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = testcase.find(kind)
            if element is not None:
                outcome = "failed" if kind == "failure" else kind
                text = f"{element.get('message', '')}\n{element.text or ''}"
        outcomes.setdefault(module, {})[testcase.get("name", "")] = (outcome, text)
    return outcomes
