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
import textwrap
from pathlib import Path

import pytest

from tests.testing.kit_session import PLANTING, Outcome, plant, run_session

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

#: the planting module's end: the example's contract class on a planted copy (its fixtures and class loaded before)
PLANTED = """
def planted(path):
    copy = load(path.rsplit("/", 1)[-1].removesuffix(".py"), path)

    class Planted(example.TestPodMarketContract):
        boot_timeout = 3600.0  # only a container's exit (or a registration) may end the wait

        @pytest.fixture
        def levers9_plugin_set(self):
            return swapped("podmarket", copy.plugin)  # every installed plugin, this copy in the real one's place

    return Planted
"""


@pytest.fixture(scope="module")
def boots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """The boot check of every planted copy (and the unplanted one) in one pytest session: outcome and text."""
    found = importlib.util.find_spec("levers9_podmarket")
    if found is None or found.origin is None:
        pytest.fail("examples/provider-container (levers9_podmarket) is not installed: scripts/setup installs it")
    source = Path(found.origin).read_text()
    where = tmp_path_factory.mktemp("container-defects")
    loads = (
        f"\nfixtures = load('podmarket_conftest', {str(EXAMPLE / 'conftest.py')!r})"
        f"\nexample = load('podmarket_example_contract', {str(EXAMPLE / 'test_contract.py')!r})\n"
    )
    (where / "planting.py").write_text(PLANTING + loads + PLANTED)
    cases = {"unplanted": source}
    for case, (replacement, _) in DEFECTS.items():
        cases[case] = plant(source, [replacement], "levers9_podmarket")
    for case, text in cases.items():
        (where / f"podmarket_{case}.py").write_text(text)
        (where / f"test_{case}.py").write_text(
            textwrap.dedent(f"""
                from planting import planted
                from podmarket_conftest import api_key, docker_host, market  # noqa: F401  the example's fixtures
                TestPlanted = planted({str(where / f"podmarket_{case}.py")!r})
            """)
        )
    outcomes = {
        module.removeprefix("test_"): tests["test_the_bootstrap_boots"]
        for module, tests in run_session(where, "-k", "bootstrap_boots").items()
    }
    assert set(outcomes) == set(cases), sorted(outcomes)
    return outcomes


def test_the_unplanted_example_boots(boots: dict[str, Outcome]) -> None:
    assert boots["unplanted"] == ("passed", "")


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_the_boot_check_fails_the_planted_defect(boots: dict[str, Outcome], case: str) -> None:
    outcome, text = boots[case]
    assert outcome == "failed", f"{case}: {outcome}, not a failure:\n{text}"
    assert "provider 'podmarket'" in text
    assert DEFECTS[case][1] in text, text
