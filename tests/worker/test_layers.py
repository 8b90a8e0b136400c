"""The worker and the checkpoint code stay on their side of the trust boundary.

A worker runs on a machine that runs people's code: it speaks the wire
protocol and nothing else of the controlplane, so neither it nor the
checkpoint code it uses imports the database layer (``levers9.state``) or the
SDK (``levers9.sdk``); and runtime differences come from the runtime's
capabilities, so neither reads the OCI engine's internals (``levers9.engine``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import levers9.checkpoint
import levers9.worker

FORBIDDEN = ("levers9.state", "levers9.sdk", "levers9.engine")


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_worker_and_the_checkpoint_code_import_no_database_sdk_or_engine_module() -> None:
    roots = [Path(levers9.worker.__file__).parent, Path(levers9.checkpoint.__file__).parent]
    modules = [path for root in roots for path in sorted(root.rglob("*.py"))]
    assert any(path.parent.name == "warm" for path in modules)
    bad = [
        f"{path.relative_to(path.parents[2])}:{line} imports {module}"
        for path in modules
        for line, module in _imports(path)
        if any(module == f or module.startswith(f"{f}.") for f in FORBIDDEN)
    ]
    assert not bad, "the worker side must not import " + ", ".join(FORBIDDEN) + ":\n" + "\n".join(bad)
