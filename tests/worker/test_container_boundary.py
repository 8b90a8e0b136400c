"""Inside a user's container, levers9 is the runner and what it needs: nothing of the controlplane is there.

Real containers of runc and gVisor, started the way a worker starts them (a :class:`WarmPool` with the
runtime's plugin, the ``host`` image), run a function that tries to import the controlplane's modules and
lists what the worker mounted at ``/opt/levers9/python``. A function pickled by value from a module that
uses ``@levers9.function`` still runs there; one that names a decorated function fails, saying why
(the decision is in :mod:`levers9.worker.warm.launch`'s docstring and docs/security.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import pytest

from levers9.sdk import serialize
from levers9.worker.warm.launch import PYTHON_DIR
from tests.worker.test_pool import ISOLATED, World, _world

#: modules of levers9 that must not be importable (nor present) inside a container
NOT_IN_CONTAINERS = [
    "levers9.controlplane",
    "levers9.state",
    "levers9.services",
    "levers9.scheduler",
    "levers9.hooks",
    "levers9.worker",
    "levers9.agent",
    "levers9.cli",
    "levers9.config",
    "levers9.sdk.functions",
    "levers9.sdk.client",
]


@pytest.fixture(params=ISOLATED)
async def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with _world(request.param, tmp_path) as w:
        yield w


@pytest.fixture
def decorated_module(tmp_path: Path) -> Iterator[ModuleType]:
    """A user's module, importable here only, that imports levers9 and decorates its functions."""
    name = f"boundary_app_{secrets.token_hex(4)}"
    source = tmp_path / "app"
    source.mkdir()
    (source / f"{name}.py").write_text(
        "import levers9\n"
        "\n"
        "@levers9.function()\n"
        "def version_and_ready(x):\n"
        "    return levers9.__version__, levers9.ready(), x + 1\n"
        "\n"
        "@levers9.function()\n"
        "def countdown(n):\n"
        "    return n if n == 0 else countdown.remote(n - 1)\n"
    )
    sys.path.insert(0, str(source))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(source))
        sys.modules.pop(name, None)


async def test_no_controlplane_module_is_importable_or_present_in_a_container(isolated: World) -> None:
    def probe(names: list[str], mounted: str) -> dict[str, Any]:
        import os

        imports = {}
        for name in names:
            try:
                importlib.import_module(name)
                imports[name] = "imported"
            except ModuleNotFoundError as exc:
                imports[name] = f"missing {exc.name}"  # the module itself, not a dependency it needs
        import levers9
        import levers9.payloads
        import levers9.runner.main

        files = sorted(
            os.path.relpath(os.path.join(d, f), mounted)
            for d, _, fs in os.walk(mounted)
            for f in fs
            if not f.endswith(".pyc")
        )
        levers9_dirs = [p for p in sys.path if os.path.isdir(os.path.join(p, "levers9"))]
        return {"imports": imports, "files": files, "levers9": levers9.__file__, "dirs": levers9_dirs}

    seen = await isolated.value(isolated.stub(probe), NOT_IN_CONTAINERS, PYTHON_DIR)
    assert seen["imports"] == {name: f"missing {name}" for name in NOT_IN_CONTAINERS}
    assert seen["levers9"] == f"{PYTHON_DIR}/levers9/__init__.py"
    # the mounted tree comes first on the path: a levers9 the host image's Python has installed is hidden by it
    assert seen["dirs"][0] == PYTHON_DIR
    levers9_files = {f for f in seen["files"] if f.startswith("levers9/")}
    assert {f.split("/")[1] for f in levers9_files} == {"__init__.py", "__about__.py", "payloads.py", "runner", "sdk"}
    assert {f for f in levers9_files if f.startswith("levers9/sdk/")} == {
        "levers9/sdk/__init__.py",
        "levers9/sdk/lifecycle.py",
    }
    assert {f.split("/")[0] for f in seen["files"]} == {"levers9", "cloudpickle"}


async def test_a_function_of_a_module_that_uses_the_decorator_runs_in_a_container(
    isolated: World, decorated_module: ModuleType
) -> None:
    handler = serialize.dumps_function(decorated_module.version_and_ready.fn)
    assert b"levers9" in handler  # pickled by value, with a reference to the module levers9 to import there
    stub = dataclasses.replace(isolated.stub(lambda: None), handler=handler)
    outcome = await isolated.call(stub, 41)
    assert outcome.status == "complete", outcome.error
    version, ready, answer = cloudpickle.loads(outcome.result)
    assert (ready, answer) == (False, 42)  # levers9.ready() works, and says False: not a checkpointed container
    import levers9

    assert version == levers9.__version__


async def test_a_function_that_names_a_decorated_function_fails_saying_why(
    isolated: World, decorated_module: ModuleType
) -> None:
    handler = serialize.dumps_function(decorated_module.countdown.fn)
    stub = dataclasses.replace(isolated.stub(lambda: None), handler=handler)
    outcome = await isolated.call(stub, 3)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ModuleNotFoundError"
    assert outcome.error.message.startswith("loading the function failed: levers9.sdk.")
    assert "is not in containers: a container has only levers9.runner, levers9.payloads and levers9.ready()" in (
        outcome.error.message
    )


async def test_a_call_that_imports_the_sdk_client_fails_saying_why(isolated: World) -> None:
    def client() -> None:
        importlib.import_module("levers9.sdk.client")

    outcome = await isolated.call(isolated.stub(client))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ModuleNotFoundError"
    assert outcome.error.message.startswith("levers9.sdk.client is not in containers: a container has only")
