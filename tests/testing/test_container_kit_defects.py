"""The kit's container boot fails a container provider that breaks its promises, each in podmarket's own code.

As tests/testing/test_kit_defects.py does for toycloud: each case plants one
defect into a copy of the container example's plugin module
(``levers9_podmarket``, examples/provider-container), a textual replacement
that must match exactly once; the copy is registered as the plugin
``podmarket`` and the example's own contract class (with its conftest's fake
marketplace and private dockerd) runs its boot check,
``test_the_bootstrap_boots``, against it in a separate pytest session. The
unplanted copy must pass; each planted one must fail with a message naming
the promise and the fix:

* no ``provider_data["reachable"] = False`` on a pod nothing can dial into;
* the join token in the pod's plain environment instead of its secret;
* a command the worker image cannot run: the container exits, and the
  failure says so with its exit code and log at once (the boot timeout is an
  hour, so only the exit can end the wait).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "provider-container" / "tests"

DEFECTS: dict[str, tuple[tuple[str, str], str]] = {
    "reachable_not_declared": (
        (
            'provider_data={"reachable": False, "secret": pod["secret_env"].get("LEVERS9_TOKEN", "")},',
            'provider_data={"secret": pod["secret_env"].get("LEVERS9_TOKEN", "")},',
        ),
        "is listed with no address and without provider_data['reachable'] = False",
    ),
    "token_in_plain_env": (
        ('"env": spec.env,', '"env": {**spec.env, **spec.secret_env},'),
        "the join token is in env['LEVERS9_TOKEN'] of the container",
    ),
    "command_the_image_cannot_run": (
        ('"command": spec.command,', '"command": [*spec.command, "--no-such-option"],'),
        "(container boot: the container exited with code 2)",
    ),
}

SUPPORT = '''
"""Loads a planted copy of levers9_podmarket and the example's contract class, and joins them."""
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


fixtures = load("podmarket_conftest", {conftest!r})
example = load("podmarket_example_contract", {example!r})


def planted(path):
    copy = load(path.rsplit("/", 1)[-1].removesuffix(".py"), path)

    class Planted(example.TestPodMarketContract):
        boot_timeout = 3600.0  # only a container's exit (or a registration) may end the wait

        @pytest.fixture
        def levers9_plugin_set(self):
            plugins = PluginSet(PluginPolicy(block=frozenset({{"podmarket"}})))
            plugins.load_entry_points()
            del plugins.records["podmarket"]
            plugins.policy = PluginPolicy()
            plugins.add("podmarket", copy.plugin)
            return plugins

    return Planted
'''


@pytest.fixture(scope="module")
def boots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """The boot check of every planted copy (and the unplanted one) in one pytest session: outcome and text."""
    found = importlib.util.find_spec("levers9_podmarket")
    if found is None or found.origin is None:
        pytest.fail("examples/provider-container (levers9_podmarket) is not installed: scripts/setup installs it")
    source = Path(found.origin).read_text()
    where = tmp_path_factory.mktemp("container-defects")
    (where / "planting.py").write_text(
        SUPPORT.format(conftest=str(EXAMPLE / "conftest.py"), example=str(EXAMPLE / "test_contract.py"))
    )
    cases = {"unplanted": source}
    for case, ((old, new), _) in DEFECTS.items():
        assert source.count(old) == 1, f"the planted text must occur once in levers9_podmarket: {old!r}"
        cases[case] = source.replace(old, new)
    for case, text in cases.items():
        (where / f"podmarket_{case}.py").write_text(text)
        (where / f"test_{case}.py").write_text(
            textwrap.dedent(f"""
                from planting import planted
                from podmarket_conftest import api_key, docker_host, market  # noqa: F401  the example's fixtures
                TestPlanted = planted({str(where / f"podmarket_{case}.py")!r})
            """)
        )
    report = where / "report.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "bootstrap_boots",
            f"--junitxml={report}",
        ],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert report.exists(), f"the kit's pytest session wrote no report:\n{done.stdout}\n{done.stderr}"
    outcomes: dict[str, tuple[str, str]] = {}
    for testcase in ElementTree.parse(report).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = testcase.find(kind)
            if element is not None:
                outcome, text = kind, f"{element.get('message', '')}\n{element.text or ''}"
        outcomes[testcase.get("classname", "").split(".")[0].removeprefix("test_")] = (outcome, text)
    assert set(outcomes) == set(cases), f"{sorted(outcomes)}:\n{done.stdout[-3000:]}"
    return outcomes


def test_the_unplanted_example_boots(boots: dict[str, tuple[str, str]]) -> None:
    assert boots["unplanted"] == ("passed", "")


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_the_boot_check_fails_the_planted_defect(boots: dict[str, tuple[str, str]], case: str) -> None:
    outcome, text = boots[case]
    assert outcome == "failure", f"{case}: {outcome}, not a failure:\n{text}"
    assert "provider 'podmarket'" in text
    assert DEFECTS[case][1] in text, text
