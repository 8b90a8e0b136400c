"""`levers9 run FILE[::FUNCTION] [ARGS...]`: starting a user's app the way `python FILE` would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from levers9.cli.main import app
from levers9.sdk.context import Context, save_context
from tests.conftest import Result as ProcResult

runner = CliRunner()

PROBE = """
import os, sys
import helper
print("name", __name__)
print("argv", sys.argv[1:])
print("context", os.environ.get("LEVERS9_CONTEXT"))
print("helper", helper.VALUE)
"""


@pytest.fixture(autouse=True)
def _restore_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """`levers9 run` changes sys.path, sys.argv, sys.modules and the environment: put them back after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("LEVERS9_CONTEXT", "")  # remembers it was unset, so the test's value is undone
    monkeypatch.delenv("LEVERS9_CONTEXT")
    for key in ("LEVERS9_TOKEN", "LEVERS9_GRPC"):
        monkeypatch.delenv(key, raising=False)
    yield
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    path = tmp_path / "myapp"
    path.mkdir()
    (path / "helper.py").write_text("VALUE = 42\n")
    return path


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def invoke(*argv: str) -> Result:
    return runner.invoke(app, ["run", *argv])


def test_runs_the_file_as_main_with_its_directory_on_the_path(app_dir: Path) -> None:
    path = write(app_dir, "probe.py", PROBE)
    result = invoke(str(path), "x", "--epochs", "3", "--flag=1", "-v")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "name __main__",
        "argv ['x', '--epochs', '3', '--flag=1', '-v']",
        "context None",
        "helper 42",
    ]
    assert sys.path[0] == str(app_dir.resolve())


def test_context_option_is_checked_and_handed_to_the_app(app_dir: Path) -> None:
    save_context(Context(name="team", grpc="h:1", token="t"))
    save_context(Context(name="local", grpc="h:2", token="t"))
    path = write(app_dir, "probe.py", PROBE)
    result = invoke(str(path), "-c", "team", "a")
    assert result.exit_code == 0, result.output
    assert "context team" in result.stdout
    assert "argv ['a']" in result.stdout

    result = invoke(str(path), "a", "--", "-c", "mine")
    assert result.exit_code == 0, result.output
    assert "argv ['a', '-c', 'mine']" in result.stdout

    result = invoke("--context", "nope", str(path))
    assert result.exit_code == 1
    assert "unknown levers9 context 'nope'" in result.stderr
    assert "name __main__" not in result.stdout, "the app does not start"


def test_calls_a_function_with_string_arguments(app_dir: Path) -> None:
    path = write(
        app_dir,
        "tool.py",
        """
        import asyncio
        import helper

        def greet(name, punctuation="!"):
            return f"hello {name}{punctuation} {type(name).__name__} {helper.VALUE}"

        async def later(n):
            await asyncio.sleep(0)
            return int(n) * 2

        def quiet():
            print("said nothing")

        if __name__ == "__main__":
            raise SystemExit("the main block must not run")
        """,
    )
    result = invoke(f"{path}::greet", "world", "?")
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello world? str 42\n"

    assert invoke(f"{path}::later", "21").stdout == "42\n"
    assert invoke(f"{path}::quiet").stdout == "said nothing\n", "None is not printed"


def test_arguments_are_python_literals_text_for_str_and_name_value_for_keywords(app_dir: Path) -> None:
    path = write(
        app_dir,
        "typed.py",
        """
        def show(a, b, code: str, *rest, flag=False):
            return repr((a, b, code, rest, flag))
        """,
    )
    result = invoke(f"{path}::show", "7", "[1, 'x']", "007", "2.5", "hello world", "None", "flag=True")
    assert result.exit_code == 0, result.output
    assert result.stdout == "(7, [1, 'x'], '007', (2.5, 'hello world', None), True)\n"
    # NAME=VALUE is a keyword only when NAME is a parameter; otherwise it is text like any other
    result = invoke(f"{path}::show", "x=1", "b", "c")
    assert result.stdout == "('x=1', 'b', 'c', (), False)\n"


def test_wrong_arguments_show_the_signature(app_dir: Path) -> None:
    path = write(app_dir, "tool.py", "def greet(name, punctuation='!'):\n    return name\n")
    result = invoke(f"{path}::greet", "a", "b", "c")
    assert result.exit_code == 1
    assert "greet(name, punctuation='!'): too many positional arguments (given 3: a b c)" in result.stderr


def test_missing_file_and_function(app_dir: Path) -> None:
    result = invoke(str(app_dir / "nope.py"))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: no such file: {app_dir / 'nope.py'}"

    result = invoke(f"{app_dir / 'nope.py'}::main")
    assert result.exit_code == 1
    assert "no such file" in result.stderr

    path = write(
        app_dir, "tool.py", "import os\nfrom helper import VALUE\ndef train(): ...\ndef serve(): ...\nLIMIT = 3\n"
    )
    result = invoke(f"{path}::trian")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {path} has no function 'trian' (functions: serve, train)"

    result = invoke(f"{path}::LIMIT")
    assert result.exit_code == 1
    assert "'LIMIT' is a int, not a function" in result.stderr


def test_an_exception_in_the_app_prints_its_traceback_and_exits_1(app_dir: Path) -> None:
    path = write(
        app_dir,
        "boom.py",
        """
        def inner():
            raise ValueError("bad input")

        def main():
            inner()

        if __name__ == "__main__":
            main()
        """,
    )
    for argv in ([str(path)], [f"{path}::main"]):
        result = invoke(*argv)
        assert result.exit_code == 1, argv
        assert result.stderr.startswith("Traceback (most recent call last):\n"), result.stderr
        assert f'File "{path}", line 3, in inner' in result.stderr
        assert result.stderr.rstrip().endswith("ValueError: bad input")
        assert "run_cmd.py" not in result.stderr, "the command's own frames are left out"
        assert "runpy" not in result.stderr


def test_an_app_that_fails_to_import(app_dir: Path) -> None:
    path = write(app_dir, "broken.py", "x = (\n")
    for argv in ([str(path)], [f"{path}::main"]):
        result = invoke(*argv)
        assert result.exit_code == 1
        assert "SyntaxError" in result.stderr
        assert str(path) in result.stderr


def test_the_apps_exit_status_is_kept(app_dir: Path) -> None:
    path = write(app_dir, "exits.py", "import sys\nsys.exit(3)\n")
    assert invoke(str(path)).exit_code == 3


def test_a_file_named_like_a_loaded_module_is_refused(app_dir: Path) -> None:
    path = write(app_dir, "json.py", "def f():\n    return 1\n")
    result = invoke(f"{path}::f")
    assert result.exit_code == 1
    assert "module name 'json' is already taken" in result.stderr


def test_functions_travel_by_value(app_dir: Path, tmp_path: Path, cli: Callable[..., ProcResult]) -> None:
    """A worker cannot import the app's module, so its functions must pickle by value, as __main__'s do."""
    path = write(
        app_dir,
        "tool.py",
        """
        import sys
        import cloudpickle

        def square(x):
            return x * x

        def dump(out):
            with open(out, "wb") as handle:
                handle.write(cloudpickle.dumps(square))
        """,
    )
    pickled = tmp_path / "square.pkl"
    result = cli("run", f"{path}::dump", str(pickled))
    assert result.returncode == 0, result.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load = f"import cloudpickle; print(cloudpickle.loads(open({str(pickled)!r}, 'rb').read())(7))"
    proc = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=elsewhere, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "49"
