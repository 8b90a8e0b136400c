"""No module of levers9 imports itself again through others: the import graph has no circles.

The graph is built statically, from the source of every module of
``core/levers9``, of each plugin under ``plugins/`` and of each runtime under
``runtimes/`` (generated ``*_pb2*.py`` left out: they import only protobuf and
each other). An edge ``a -> b`` is a statement of ``a`` that imports ``b``:

* ``import x.y`` and ``from x.y import z`` name ``x.y``, or ``x.y.z`` where
  that is a module (``from levers9.sdk import kinds`` imports the module);
  relative imports are resolved against the importing module's package;
* ``importlib.import_module("x.y")`` with a literal name counts as ``import
  x.y`` (a lazy ``__getattr__`` that imports a sibling is a circle all the same);
* an import inside a function or method counts: it is the same dependency,
  made later, and deferring an import is how a circle usually hides (the two
  modules still cannot be read, tested or moved apart);
* an import under ``if TYPE_CHECKING:`` does not: it never runs, and naming a
  type for the checker ties no module's loading or behaviour to another's.

Importing ``x.y`` also runs the package ``x``'s ``__init__``; that implied
edge is left out, so a package whose ``__init__`` re-exports its submodules is
no circle with each submodule that imports a sibling by its full name. A
module that imports its own package's ``__init__`` by name does get the edge.

The test fails listing every circle (each strongly connected component of
more than one module), with one path round it and the line of each import.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")


@dataclass(frozen=True)
class Source:
    module: str
    path: Path

    @property
    def package(self) -> str:
        """The package relative imports in this module are resolved against."""
        return self.module if self.path.name == "__init__.py" else self.module.rpartition(".")[0]


def _sources() -> dict[str, Source]:
    """Every module of levers9 and of the bundled plugins and runtimes, by dotted name."""
    roots = [ROOT / "core", *sorted(p for d in ("plugins", "runtimes") for p in (ROOT / d).iterdir() if p.is_dir())]
    found: dict[str, Source] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if not parts[0].startswith("levers9") or GENERATED.search(path.name):
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Source(name, path)
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except what sits under ``if TYPE_CHECKING:`` (its ``else`` does run)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking_only(child):
            for other in child.orelse:
                yield other
                yield from _statements(other)
            continue
        yield child
        yield from _statements(child)


def _import_module_literal(node: ast.AST) -> str | None:
    """The name in ``importlib.import_module("x.y")`` (or ``import_module("x.y")``), when it is a literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    first = node.args[0]
    if called == "import_module" and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _imported(source: Source, node: ast.AST, modules: dict[str, Source]) -> Iterator[str]:
    """The dotted names ``node`` imports (modules where they are modules, else the package they come from)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = source.package.split(".")
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        for alias in node.names:
            dotted = f"{base}.{alias.name}"
            yield dotted if dotted in modules else base
    else:
        literal = _import_module_literal(node)
        if literal is not None:
            yield literal


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of the first such import}, over levers9's own modules only."""
    modules = _sources()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, source in modules.items():
        tree = ast.parse(source.path.read_text(), filename=str(source.path))
        for node in _statements(tree):
            for target in _imported(source, node, modules):
                if target in modules and target != name:
                    graph[name].setdefault(target, getattr(node, "lineno", 0))
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _path_round(component: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """One circle through the component's first module, each step written 'a (line n) -> b'."""
    members = set(component)
    start = component[0]
    # breadth-first from start back to start, inside the component
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target not in members or target in previous:
                    continue
                previous[target] = node
                following.append(target)
        if start in previous:
            break
        frontier = following
    steps = [start]
    while steps[-1] != start or len(steps) == 1:
        steps.append(previous[steps[-1]])
    steps.reverse()
    return [f"{a} (line {graph[a][b]}) -> {b}" for a, b in itertools.pairwise(steps)]


def test_circles_are_found_with_the_lines_that_close_them() -> None:
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7, "d": 1}, "d": {}, "e": {"e": 1}}
    assert circles(graph) == [["a", "b", "c"]]
    assert _path_round(["a", "b", "c"], graph) == ["a (line 3) -> b", "b (line 5) -> c", "c (line 7) -> a"]


def test_imports_are_read_as_the_module_docstring_says(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "from . import sibling\n"
        "from .pkg import name\n"
        "if TYPE_CHECKING:\n"
        "    import levers9.typed\n"
        "else:\n"
        "    import levers9.untyped\n"
        "def later():\n"
        "    import levers9.deferred\n"
        "    return importlib.import_module('levers9.lazy')\n"
    )
    source = Source("levers9.x.mod", path)
    modules = {m: source for m in ("levers9.x.sibling", "levers9.x.pkg")}
    names = [n for node in _statements(ast.parse(path.read_text())) for n in _imported(source, node, modules)]
    assert "levers9.typed" not in names
    assert set(names) >= {"levers9.x.sibling", "levers9.x.pkg", "levers9.untyped", "levers9.deferred", "levers9.lazy"}


def test_levers9_has_no_import_circles() -> None:
    graph = import_graph()
    assert len(graph) > 300, f"only {len(graph)} modules found under core/, plugins/ and runtimes/"
    found = circles(graph)
    report = "\n".join(
        f"circle of {len(c)}: {', '.join(c)}\n    " + "\n    ".join(_path_round(c, graph)) for c in found
    )
    assert not found, f"{len(found)} import circle(s) among levers9's modules:\n{report}"
