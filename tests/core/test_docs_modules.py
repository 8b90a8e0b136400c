"""Every module, package, file and attribute that docs/*.md (and the READMEs) name exists in the code.

Names are found three ways: dotted names (``levers9.worker.warm.launch``,
``levers9_ec2.prices``, ``levers9.gpu.from_k8s_labels``: the longest prefix
that is a module must exist, and the rest must be its attributes), paths in
backticks (``core/levers9/services/tunnels.py``, ``services/tunnels.py``,
``tests/e2e/test_flood.py``; in a table row that starts with a directory,
``tasks.py`` is a file of that directory), and the lines of
docs/architecture.md's layering block (``state.sql.records`` is
``levers9.state.sql.records``). A failure lists each name that does not
exist, with the document and line that names it: fix the document, or the
name in it when the code moved.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))]
#: where a path in the docs may be relative to, besides the directory of its table row
BASES = [
    ROOT,
    ROOT / "core",
    ROOT / "core" / "levers9",
    *sorted(ROOT.glob("plugins/*")),
    *sorted(ROOT.glob("runtimes/*")),
]
#: the repository's own directories: a path starting with one of them is the repository's, and must exist
TOP_DIRS = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
#: dotted names in the docs that are not modules: Docker and Kubernetes labels of the workers a machine's agent
#: runs (docs/agents.md, docs/architecture.md §5)
NOT_MODULES = {"levers9.pool", "levers9.workspace", "levers9.gpus"}
#: a file name, not a module: ``levers9.yaml``, ``levers9.db``
FILE_SUFFIXES = {"yaml", "yml", "db", "json", "toml", "log", "key", "service", "sock", "tar", "whl"}

DOTTED = re.compile(r"(?<![\w/.-])(levers9(?:_\w+)?(?:\.\w+)+)")
BACKTICKED = re.compile(r"`([^`\s]+)`")
ROW_DIR = re.compile(r"^\|\s*`((?:core|plugins|runtimes|tests|examples|scripts|bench)/[^`]*)`")


def _package_dir(top: str) -> Path | None:
    if top == "levers9":
        return ROOT / "core" / "levers9"
    found = [d / top for d in [*ROOT.glob("plugins/*"), *ROOT.glob("runtimes/*")] if (d / top).is_dir()]
    return found[0] if found else None


def _dotted_problem(name: str) -> str | None:
    """Why ``name`` (a module, or a module and attributes) does not exist; None when it does."""
    parts = name.split(".")
    path = _package_dir(parts[0])
    if path is None:
        return f"{parts[0]}: no such package"
    depth = 1
    while depth < len(parts) and path.is_dir():
        step = parts[depth]
        if (path / step / "__init__.py").is_file():
            path = path / step
        elif (path / f"{step}.py").is_file():
            path = path / f"{step}.py"
        else:
            break
        depth += 1
    module, rest = ".".join(parts[:depth]), parts[depth:]
    if not rest:
        return None
    try:
        obj: object = importlib.import_module(module)
    except ImportError as exc:  # a module that exists but cannot be imported here: say so, not "missing"
        return f"{module} cannot be imported: {exc}"
    for attr in rest:
        if not hasattr(obj, attr):
            kind = "module or attribute" if isinstance(obj, type(importlib)) else "attribute"
            return f"{module} has no {kind} {'.'.join(rest)}"
        obj = getattr(obj, attr)
    return None


def _dotted_names(line: str) -> list[str]:
    names = []
    for match in DOTTED.finditer(line):
        name, after = match.group(1), line[match.end() : match.end() + 2]
        if after[:1] == "-" or after in (".<", ".*"):
            continue  # a label (``levers9.machine-id``) or a pattern (``levers9.plugin.<name>``)
        if name in NOT_MODULES or name.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            continue
        names.append(name)
    return names


class Row:
    """Where a table row's bare file names are: the row's own directory, and those it names inside it.

    ``| `core/levers9/worker/` | ... `warm/` is ...: `pool.py` |``: in core/levers9/worker or its warm/.
    ``| `plugins/<name>/levers9_<name>/` | ... `settings.py` |``: in every directory that matches.
    """

    def __init__(self, line: str, doc_dir: Path = ROOT) -> None:
        #: a document's own directory: a path may be relative to it (``tests/test_contract.py`` in an example's README)
        self.doc_dir = doc_dir
        row = ROW_DIR.match(line)
        self.roots: list[Path] = []
        self.dirs: list[Path] = []
        self.every = False
        if row is None:
            return
        first = row.group(1) if row.group(1).endswith("/") else str(Path(row.group(1)).parent) + "/"
        pattern = re.sub(r"<[^>]*>", "*", first)
        self.every = "*" in pattern
        self.roots = sorted(ROOT.glob(pattern)) if self.every else [ROOT / first]
        inner = [t for t in BACKTICKED.findall(line)[1:] if t.endswith("/") and not t.startswith("/")]
        self.dirs = self.roots + [d / t for d in self.roots for t in inner if (d / t).is_dir()]

    def problem(self, token: str) -> str | None:
        """Why ``token`` is not a file of the repository; None when it is."""
        if "/" not in token and self.dirs:
            if self.every:  # in each directory the pattern matches (or in a subdirectory of it the row names)
                where = [
                    r for r in self.roots if not any((d / token).exists() for d in self.dirs if d.is_relative_to(r))
                ]
            else:
                where = [] if any((d / token).exists() for d in self.dirs) else self.dirs
            if not where:
                return None
            return f"{token}: no such file in {', '.join(str(d.relative_to(ROOT)) + '/' for d in where)}"
        if any((base / token).exists() for base in [*self.dirs, self.doc_dir, *BASES]):
            return None
        return f"{token}: no such file or directory"

    def paths(self, line: str) -> list[str]:
        """Backticked paths of the repository that ``line`` names (not URLs, not paths on a machine)."""
        found = []
        for raw in BACKTICKED.findall(line):
            token = raw.rstrip(",;:")
            if token.startswith(("/", "~", "http", ".")) or any(c in token for c in "<>*{}$=:"):
                continue
            first = token.split("/")[0]
            is_py = token.endswith(".py")
            in_repo = "/" in token and (first in TOP_DIRS or (ROOT / "core" / "levers9" / first).is_dir())
            if (is_py and ("/" in token or bool(self.dirs))) or in_repo:
                found.append(token)
        return found


def _layering_names(text: str) -> list[tuple[int, str]]:
    """The module names of docs/architecture.md's layering block, with their line numbers."""
    lines = text.splitlines()
    start = lines.index("<!-- layering -->") + 2
    names = []
    for number, line in enumerate(lines[start:], start + 1):
        if line.startswith("```"):
            break
        rule = line.split("#", 1)[0].strip()
        if not rule:
            continue
        module, _, deps = rule.partition(":")
        for name in [module, *deps.split(",")]:
            name = name.strip()
            if name and name not in ("*", "plugins", "__init__", "__main__"):
                names.append((number, name))
    return names


def _problems(doc: Path) -> list[str]:
    text = doc.read_text()
    where = doc.relative_to(ROOT)
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        row = Row(line, doc.parent)
        for name in _dotted_names(line):
            problem = _dotted_problem(name)
            if problem is not None:
                problems.append(f"{where}:{number}: {name}: {problem}")
        for token in row.paths(line):
            problem = row.problem(token)
            if problem is not None:
                problems.append(f"{where}:{number}: {problem}")
    if doc.name == "architecture.md":
        for number, name in _layering_names(text):
            problem = _dotted_problem(f"levers9.{name}")
            if problem is not None:
                problems.append(f"{where}:{number} (layering): {name}: {problem}")
    return problems


def test_the_docs_name_only_modules_and_files_that_exist() -> None:
    assert any(doc.name == "architecture.md" for doc in DOCS)
    problems = [p for doc in DOCS for p in _problems(doc)]
    assert not problems, "docs name what does not exist:\n" + "\n".join(problems)


def test_a_name_that_does_not_exist_is_reported() -> None:
    """The checks themselves: each kind of name, one that exists and one that does not."""
    assert _dotted_problem("levers9.worker.warm.launch") is None
    assert _dotted_problem("levers9.gpu.from_k8s_labels") is None
    assert _dotted_problem("levers9.ready") is None
    assert _dotted_problem("levers9.worker.warm.lunch") == "levers9.worker.warm has no module or attribute lunch"
    assert _dotted_problem("levers9_nowhere.provider") == "levers9_nowhere: no such package"
    assert _dotted_names("labels `levers9.machine-id`, `levers9.pool`; logger `levers9.plugin.<name>`") == []
    assert _dotted_names("see `levers9.yaml` and levers9.runner.main") == ["levers9.runner.main"]
    line = "| `core/levers9/services/` | `tasks.py` (list), `no_such.py`, `services/reach.py`, `/v2/`, `upper/` |"
    row = Row(line)
    assert row.paths(line) == ["core/levers9/services/", "tasks.py", "no_such.py", "services/reach.py"]
    assert [row.problem(t) for t in row.paths(line)] == [
        None,
        None,
        "no_such.py: no such file in core/levers9/services/",
        None,
    ]
    plugins = "| `plugins/<name>/levers9_<name>/` | each has `__init__.py` and `no_such.py` |"
    assert Row(plugins).problem("__init__.py") is None
    assert (Row(plugins).problem("no_such.py") or "").startswith("no_such.py: no such file in plugins/")
