"""Every migration's ``upgrade`` only expands the schema, so two releases can run on it at once.

A rolling upgrade (docs/deploy.md, section 10) runs the new release's migrations while the previous release
still serves from the other replicas. That is safe only when ``upgrade`` adds and never takes away: no
dropped or renamed table or column, no altered column, and every added column nullable or with a server
default (old code inserts rows without it). A release that must remove something does it in a later
release, once no supported release uses it, and says so with a ``contract:`` line in ``upgrade``'s
docstring; this test then lets that migration through.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).parents[2] / "core" / "levers9" / "state" / "migrations" / "versions"
#: operations that take something away from the schema older code relies on
CONTRACTING = {"drop_table", "drop_column", "alter_column", "rename_table", "drop_constraint", "drop_index"}


def _upgrade(path: Path) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "upgrade":
            return node
    raise AssertionError(f"{path.name}: no upgrade()")


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def problems(path: Path) -> list[str]:
    """What in ``path``'s upgrade() would break the previous release running beside it."""
    upgrade = _upgrade(path)
    if "contract:" in (ast.get_docstring(upgrade) or ""):
        return []
    found = []
    for node in ast.walk(upgrade):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        operation = node.func.attr
        if operation in CONTRACTING:
            found.append(f"{path.name}:{node.lineno}: {operation} in upgrade()")
        if operation == "add_column":
            column = next((a for a in node.args if isinstance(a, ast.Call)), None)
            if column is None:
                continue
            nullable = _keyword(column, "nullable")
            default = _keyword(column, "server_default")
            not_null = isinstance(nullable, ast.Constant) and nullable.value is False
            if not_null and default is None:
                found.append(f"{path.name}:{node.lineno}: add_column NOT NULL without a server_default")
    return found


@pytest.mark.parametrize("path", sorted(VERSIONS.glob("*.py")), ids=lambda p: p.name)
def test_upgrade_only_expands(path: Path) -> None:
    assert problems(path) == []


def test_the_check_catches_a_dropped_column_and_a_not_null_column(tmp_path: Path) -> None:
    bad = tmp_path / "0099_bad.py"
    bad.write_text(
        "def upgrade():\n"
        "    with op.batch_alter_table('tasks') as batch:\n"
        "        batch.drop_column('worker_id')\n"
        "        batch.add_column(sa.Column('owner', sa.String(64), nullable=False))\n"
        "        batch.add_column(sa.Column('kind', sa.String(64), nullable=False, server_default='call'))\n",
        encoding="utf-8",
    )
    assert problems(bad) == [
        "0099_bad.py:3: drop_column in upgrade()",
        "0099_bad.py:4: add_column NOT NULL without a server_default",
    ]
    allowed = tmp_path / "0100_contract.py"
    allowed.write_text(
        'def upgrade():\n    """contract: drops tasks.worker_id, unused since 0.4."""\n    op.drop_column("tasks", "x")\n',
        encoding="utf-8",
    )
    assert problems(allowed) == []
