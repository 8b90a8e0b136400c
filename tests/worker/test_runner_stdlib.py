"""The runner (``levers9.runner``) imports the standard library, itself, ``levers9.payloads`` and cloudpickle only.

It runs inside the user's container, where the image has none of levers9's
dependencies: the worker mounts only the tree :func:`~levers9.worker.warm.launch.container_tree`
makes there (:data:`~levers9.worker.warm.launch.CONTAINER_FILES` of levers9, and cloudpickle).
The source is checked import by import, and the runner is really imported by a
Python that sees nothing but that tree, so an import through another module
(``levers9/__init__.py``, say) fails too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import levers9.payloads
import levers9.runner
from levers9.worker.warm.launch import CONTAINER_FILES, RUNNER_PACKAGES, container_tree

RUNNER_DIR = Path(levers9.runner.__file__).parent
PAYLOADS = Path(levers9.payloads.__file__)
PACKAGE = Path(levers9.__file__).parent


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth, with its line; ``importlib.import_module("x")`` included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, f"levers9.runner.{node.module or ''}"))  # relative: inside the package
            else:
                found.append((node.lineno, node.module or ""))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _not_allowed(path: Path, allowed: tuple[str, ...]) -> list[str]:
    bad = []
    for line, module in _imports(path):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if any(module == a or module.startswith(f"{a}.") for a in allowed):
            continue
        bad.append(f"{path.name}:{line} imports {module}")
    return bad


def test_every_runner_module_imports_only_the_stdlib_the_runner_payloads_and_cloudpickle() -> None:
    modules = sorted(RUNNER_DIR.glob("*.py"))
    assert {m.name for m in modules} >= {"main.py", "serving.py", "frames.py", "__init__.py"}
    bad = [b for m in modules for b in _not_allowed(m, ("levers9.runner", "levers9.payloads", "cloudpickle"))]
    assert not bad, (
        "the runner must import the standard library, levers9.runner, levers9.payloads and cloudpickle only:\n"
        + "\n".join(bad)
    )


def test_levers9_payloads_imports_only_the_stdlib() -> None:
    bad = _not_allowed(PAYLOADS, ())
    assert not bad, "levers9.payloads is imported by the runner and must use the standard library only:\n" + "\n".join(
        bad
    )


def _run_time_imports(path: Path) -> list[tuple[int, str]]:
    """:func:`_imports` less those under ``if TYPE_CHECKING:``, which never run."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    return [
        (line, module)
        for line, module in _imports(path)
        if not any(id(n) in typing_only and getattr(n, "lineno", None) == line for n in ast.walk(tree))
    ]


def test_every_other_file_containers_get_imports_only_the_stdlib_and_what_containers_get() -> None:
    """``levers9/__init__.py``, ``__about__``, ``sdk/__init__`` and ``sdk/lifecycle`` (for ``levers9.ready()``).

    The two ``__init__`` files name the rest of levers9 lazily, by ``importlib.import_module`` on first use
    (``levers9.hookimpl``, ``levers9.function``): in a container those names fail, which is the point.
    """
    files = [PACKAGE / rel for rel in CONTAINER_FILES if (PACKAGE / rel).is_file()]
    assert {str(f.relative_to(PACKAGE)) for f in files} >= {"__init__.py", "__about__.py", "sdk/lifecycle.py"}
    given = ("levers9.__about__", "levers9.payloads", "levers9.runner", "levers9.sdk.lifecycle", "cloudpickle")
    lazy = {"levers9.hooks.markers", "levers9.sdk"}
    bad = [
        f"{f.relative_to(PACKAGE)}:{line} imports {module}"
        for f in files
        for line, module in _run_time_imports(f)
        if module.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
        and module not in lazy
        and not any(module == g or module.startswith(f"{g}.") for g in given)
    ]
    assert not bad, "a file containers get imports what they do not get:\n" + "\n".join(bad)


def test_the_runner_imports_with_only_the_tree_the_worker_mounts(tmp_path: Path) -> None:
    """The tree containers get at PYTHON_DIR, under ``python -I -S``: the runner and ``levers9.ready()`` load."""
    mounted = container_tree(tmp_path / "runner")
    assert sorted(p.name for p in mounted.iterdir()) == sorted(RUNNER_PACKAGES)
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(mounted)!r})\n"
        "import levers9.runner.main, levers9.runner.serving, levers9.runner.frames, levers9.runner.http_errors\n"
        "import levers9.runner.sandbox, levers9.runner.sandbox_wire\n"
        "import levers9\n"
        "assert levers9.ready() is False and levers9.__version__\n"
        f"allowed = set(sys.stdlib_module_names) | {set(RUNNER_PACKAGES)!r} | {{'__main__'}}\n"
        "extra = sorted(m for m in sys.modules if m.split('.')[0] not in allowed)\n"
        "assert not extra, f'modules beyond the standard library and the mounted packages: {extra}'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_worker_mounts_no_package_the_runner_does_not_import() -> None:
    """Every mounted package is one the runner's source imports: nothing rides along unused."""
    imported = {m.split(".")[0] for p in [*RUNNER_DIR.glob("*.py"), PAYLOADS] for _, m in _imports(p)}
    assert set(RUNNER_PACKAGES) <= imported | {"levers9"}, (
        f"mounted but never imported: {set(RUNNER_PACKAGES) - imported}"
    )
