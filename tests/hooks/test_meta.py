"""Meta-tests: the hook spec, its documentation and its tests must not drift apart.

A hook that is not documented cannot be implemented by a third party, and a
hook without a test can silently stop being called. Each hook in the spec must
have a docstring saying when it is called, a section in docs/plugins.md, and a
test function named ``test_hook_<hook name>`` somewhere under tests/.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import levers9.hooks.spec as spec
from levers9.hooks.manager import HOOK_NAMES

REPO = Path(__file__).resolve().parents[2]


def _test_function_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        names.update(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    return names


DOCUMENTED = set(re.findall(r"^### `?(levers9_\w+)", (REPO / "docs" / "plugins.md").read_text(), re.M))
TESTED = _test_function_names()


@pytest.mark.parametrize("hook", HOOK_NAMES)
def test_hook_is_documented_in_docs(hook: str) -> None:
    assert hook in DOCUMENTED, f"docs/plugins.md has no '### {hook}' section"


@pytest.mark.parametrize("hook", HOOK_NAMES)
def test_hook_has_a_test(hook: str) -> None:
    assert f"test_hook_{hook}" in TESTED, f"no test named test_hook_{hook} under tests/"


@pytest.mark.parametrize("hook", HOOK_NAMES)
def test_hook_spec_is_typed_and_explained(hook: str) -> None:
    function = getattr(spec, hook)
    doc = inspect.getdoc(function) or ""
    assert len(doc.split()) >= 15, f"{hook} needs a docstring saying when it is called and what it returns"
    annotations = function.__annotations__
    assert "return" in annotations, f"{hook} has no return annotation"
    parameters = inspect.signature(function).parameters
    assert all(name in annotations for name in parameters), f"{hook} has untyped parameters"


def test_docs_describe_no_hook_that_does_not_exist() -> None:
    assert set(HOOK_NAMES) >= DOCUMENTED, f"documented but not in the spec: {DOCUMENTED - set(HOOK_NAMES)}"
