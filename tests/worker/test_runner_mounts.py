"""The runner's Python tree a container is given: a copy of what runs there, in the worker's state directory.

A copy, never the installed package: a package cannot be mounted in part, and a worker in a container of
the worker image has its packages on overlayfs, which cannot be idmapped (a runc container in a user
namespace could then not be given them; tests/e2e/test_agent_blueprints.py shows it on a joined machine).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import cloudpickle

import levers9
from levers9.worker.warm.launch import CONTAINER_FILES, container_tree

PACKAGE = Path(levers9.__file__).parent
CLOUDPICKLE = Path(cloudpickle.__file__).parent


def _tree_files(root: Path) -> set[str]:
    """The sources in the tree (its bytecode, compiled for this Python, is checked apart)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() and p.suffix != ".pyc"}


def test_the_tree_holds_the_runner_what_it_imports_and_cloudpickle_and_nothing_else(tmp_path: Path) -> None:
    tree = container_tree(tmp_path / "runner")
    runner = {f"levers9/runner/{p.name}" for p in (PACKAGE / "runner").glob("*.py")}
    sources = {f"cloudpickle/{p.relative_to(CLOUDPICKLE)}" for p in CLOUDPICKLE.rglob("*.py")}
    expected = runner | {f"levers9/{rel}" for rel in CONTAINER_FILES if rel != "runner"} | sources
    assert _tree_files(tree) == expected
    assert "levers9/runner/main.py" in expected
    assert "cloudpickle/__init__.py" in expected
    assert not (tree / "levers9" / "controlplane").exists()
    for rel in expected:
        copy = tree / rel
        assert not copy.is_symlink(), rel  # a copy: nothing in the container points back into the installation
        assert stat.S_IMODE(copy.stat().st_mode) == 0o644, rel
        source = (PACKAGE / rel.removeprefix("levers9/")) if rel.startswith("levers9/") else CLOUDPICKLE.parent / rel
        assert copy.read_bytes() == source.read_bytes(), rel
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o755 for d in [tree, *tree.rglob("*")] if d.is_dir())
    # every source has its bytecode for this Python beside it, so a container's Python compiles nothing
    tag = sys.implementation.cache_tag
    compiled = {str(p.relative_to(tree)) for p in tree.rglob("*.pyc")}
    assert compiled == {str(Path(rel).parent / "__pycache__" / f"{Path(rel).stem}.{tag}.pyc") for rel in expected}


def test_a_second_start_reuses_the_tree_and_leaves_no_scratch(tmp_path: Path) -> None:
    first = container_tree(tmp_path / "runner")
    made = first.stat().st_mtime_ns
    again = container_tree(tmp_path / "runner")
    assert again == first
    assert again.stat().st_mtime_ns == made
    assert [p.name for p in (tmp_path / "runner").iterdir()] == [first.name]  # no scratch left behind


def test_a_tree_left_by_another_version_is_not_reused(tmp_path: Path) -> None:
    """Named by the digest of what it holds: a tree left by another version is never taken for this one."""
    copies = tmp_path / "runner"
    first = container_tree(copies)
    stale = copies / "0123456789abcdef"
    os.rename(first, stale)
    (stale / "levers9" / "runner" / "main.py").write_text("raise SystemExit('an older runner')\n")
    again = container_tree(copies)
    assert again == first
    assert (again / "levers9" / "runner" / "main.py").read_bytes() == (PACKAGE / "runner" / "main.py").read_bytes()
