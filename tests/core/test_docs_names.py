"""Every levers9 type, field, function, module, hook and metric the docs and READMEs name exists.

tests/core/test_docs_modules.py checks that modules and files exist; this test
checks the names inside them, which is what a third party writing a plugin
from the docs alone relies on (issue 38: the docs named
``ProvisionRequest.controlplane_ca``, which is
``request.bootstrap.controlplane_ca``). It reads what the documents put in
backticks, and the code of their ``python`` blocks:

- a dotted name starting with ``levers9.`` is a module, then attributes of it:
  a module's attributes and submodules, a class's attributes (methods,
  properties, class variables, annotated and ``self.``-assigned instance
  attributes) and a pydantic model's or dataclass's fields, following a
  field's type to the next name (``levers9.hooks.types.ProvisionRequest.bootstrap.token``);
- ``Type.name...`` where ``Type`` is a class levers9 defines
  (``WorkerBootstrap.controlplane_ca``, ``AgentHub.send``), resolved the same way;
- ``request.bootstrap.token``, ``pool.regions``, ``ctx.send_order``: a hook's
  argument as the spec names it (``levers9_provision(request: ProvisionRequest)``),
  resolved through its type, so the names follow the spec's own signatures;
- a bare ``levers9_*`` name is a hook of the spec (levers9.hooks.spec), an
  importable package (``levers9_ec2``), a field of a hook type
  (``levers9_version``) or a metric the controlplane exports
  (levers9.services.metrics, levers9.services.cluster_series), and the labels
  written after a metric (``levers9_workers_lost_total{pool,reason}``) are
  its labels;
- in a ``python`` block, ``from levers9... import a, b`` imports names that
  exist, and attribute chains on hook arguments resolve as above.

Not checked: names of other projects, placeholders (``levers9_plugin_<name>``,
``levers9.plugin.<name>``), labels (``levers9.pool``) and file names
(``levers9.yaml``), and a ``python`` block whose first line is the comment
``# first edition``: code that shows what a plugin looked like before, on
purpose. A failure lists each name that does not resolve, with the document,
the line and why: fix the document (or, where the code is what is wrong, the
code).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pydantic
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "levers9"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))]

#: dotted names that are labels of the workers' containers and pods, not modules (docs/agents.md, architecture.md §5)
LABELS = {"levers9.pool", "levers9.workspace", "levers9.gpus", "levers9.machine", "levers9.worker"}
#: the last part of a name that is a file's, not an attribute's (``levers9.yaml``, ``spec.py``)
FILE_SUFFIXES = {"yaml", "yml", "db", "json", "toml", "log", "key", "service", "sock", "tar", "whl", "py", "md", "txt"}
#: packages the docs invent for their examples, which no one installs
EXAMPLE_PACKAGES = {"levers9_mycloud"}
#: hook arguments whose names the docs also use for other systems' objects (Docker's ``container.stop``, an EC2
#: ``image.family``): ``container.x`` and ``image.x`` are not read as PreparedContainer's and CheckpointImage's
OTHER_SYSTEMS_WORDS = {"container", "image"}

NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*```")
METRIC_LABELS = re.compile(r"\{([^}]*)\}")
CLASS = re.compile(r"^class (\w+)\b", re.MULTILINE)
FUNCTION = re.compile(r"^\s*(?:async\s+)?def (levers9_\w+)\(", re.MULTILINE)


# --------------------------------------------------------------------------- what levers9 defines


@cache
def _classes() -> dict[str, list[str]]:
    """Every class levers9 defines at a module's top level: its name -> the modules defining one of that name."""
    found: dict[str, list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        if "__pycache__" in path.parts or "kubernetes_manifests" in path.parts:
            continue
        parts = path.relative_to(CORE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name in CLASS.findall(path.read_text()):
            found.setdefault(name, []).append(module)
    return found


@cache
def _functions() -> set[str]:
    """Every ``levers9_*`` function or method levers9 defines (the hooks' implementations, the kit's fixtures)."""
    found: set[str] = set()
    for path in sorted(CORE.rglob("*.py")):
        found.update(FUNCTION.findall(path.read_text()))
    return found


@cache
def _hooks() -> dict[str, dict[str, Any]]:
    """The spec's hooks and their arguments' types (the spec imports them only for type checkers: resolved here)."""
    spec = importlib.import_module("levers9.hooks.spec")
    names: dict[str, Any] = {"BaseModel": pydantic.BaseModel}
    for module in ("levers9.hooks.types", "levers9.hooks.context"):
        names.update(vars(importlib.import_module(module)))
    return {
        name: typing.get_type_hints(fn, localns=names)
        for name, fn in vars(spec).items()
        if name.startswith("levers9_") and inspect.isfunction(fn)
    }


@cache
def _arguments() -> dict[str, type]:
    """A hook argument's name -> its type, as the spec writes them (``request`` -> ``ProvisionRequest``)."""
    found: dict[str, type] = {}
    for hints in _hooks().values():
        for argument, annotation in hints.items():
            kind = _class_of(annotation)
            if argument != "return" and argument not in OTHER_SYSTEMS_WORDS and kind is not None:
                assert found.setdefault(argument, kind) is kind, f"{argument}: two types in the spec"
    return found


@cache
def _metrics() -> dict[str, frozenset[str]]:
    """Every series name the controlplane exports (as scraped: ``_total``, ``_bucket``...) -> its label names."""
    from prometheus_client import Counter, Gauge, Histogram

    from levers9.services.cluster_series import ClusterSeries, ClusterSnapshot
    from levers9.services.metrics import Metrics

    found: dict[str, frozenset[str]] = {}
    for metric in vars(Metrics()).values():
        if isinstance(metric, Counter | Gauge | Histogram):
            labels = frozenset(metric._labelnames)
            suffixes = {"counter": ["_total"], "histogram": ["", "_bucket", "_count", "_sum"]}.get(metric._type, [""])
            found.update({metric._name + suffix: labels for suffix in suffixes})
    cluster = ClusterSeries()
    cluster.snapshot = ClusterSnapshot()
    for family in cluster.collect():
        found[family.name] = frozenset(getattr(family, "_labelnames", ()))
    return found


@cache
def _type_fields() -> set[str]:
    """The field names of the hook types (``levers9_version`` is WorkerBootstrap's)."""
    found: set[str] = set()
    for module in ("levers9.hooks.types", "levers9.hooks.context"):
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, type) and issubclass(value, pydantic.BaseModel):
                found.update(value.model_fields)
    return found


# --------------------------------------------------------------------------- resolving a name


def _class_of(annotation: Any) -> type | None:
    """The class a value of ``annotation`` is, where one class stands out (``GpuOffer | None`` -> GpuOffer)."""
    if isinstance(annotation, type) and annotation.__module__ != "builtins":
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        classes = [c for c in map(_class_of, typing.get_args(annotation)) if c is not None]
        return classes[0] if len(classes) == 1 else None
    if origin is typing.Annotated:
        return _class_of(typing.get_args(annotation)[0])
    return None


def _instance_attributes(cls: type) -> set[str]:
    """Attributes a class's instances get: annotated in a class body, or assigned to ``self.`` in a method."""
    found: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        found.update(getattr(klass, "__annotations__", {}))
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
                found.add(node.attr)
    return found


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _field_type(cls: type, name: str) -> tuple[bool, Any]:
    """Whether ``cls`` has a field or attribute ``name``, and what to resolve a next part on (None: stop there)."""
    if issubclass(cls, pydantic.BaseModel) and name in cls.model_fields:
        return True, _class_of(cls.model_fields[name].annotation)
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        if name in {f.name for f in dataclasses.fields(cls)}:
            return True, _class_of(hints.get(name))
    if hasattr(cls, name):
        value = inspect.getattr_static(cls, name)
        if isinstance(value, property) and value.fget is not None:
            hints = typing.get_type_hints(value.fget)
            return True, _class_of(hints.get("return"))
        return True, value if isinstance(value, type) else None
    if name in _instance_attributes(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a forward reference only a type checker resolves
            hints = {}
        return True, _class_of(hints.get(name))
    return False, None


def _resolve(start: object, parts: list[str], shown: str) -> str | None:
    """Why ``parts`` are not attributes of ``start`` one after the other; None when they are."""
    current: object = start
    for i, part in enumerate(parts):
        if current is None:
            return None  # a value whose type the code does not pin down: nothing further to check
        if isinstance(current, types.ModuleType):
            if hasattr(current, part):
                current = getattr(current, part)
                if not isinstance(current, type | types.ModuleType):
                    current = None  # a function or a constant: what follows it is its own business
                continue
            try:
                current = importlib.import_module(f"{current.__name__}.{part}")
                continue
            except ModuleNotFoundError:
                return f"{current.__name__} has no {part}"
        assert isinstance(current, type)
        found, following = _field_type(current, part)
        if not found:
            where = ".".join([shown, *parts[:i]])
            fields = ", ".join(sorted(current.model_fields)) if issubclass(current, pydantic.BaseModel) else ""
            return f"{where} has no {part}" + (f" ({current.__name__}'s fields: {fields})" if fields else "")
        current = following
    return None


def _module_name(name: str) -> tuple[types.ModuleType | None, list[str], str | None]:
    """The longest importable module ``name`` starts with, and the parts after it (or why none imports)."""
    parts = name.split(".")
    for depth in range(len(parts), 0, -1):
        module = ".".join(parts[:depth])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:
            continue
        try:
            return importlib.import_module(module), parts[depth:], None
        except ImportError as exc:
            return None, [], f"{module} cannot be imported: {exc}"
    return None, [], f"{parts[0]}: no such module"


def name_problem(name: str) -> str | None:
    """Why a dotted name the docs write does not exist; None when it does (or is not levers9's to check)."""
    parts = name.split(".")
    first, rest = parts[0], parts[1:]
    if len(parts) > 1 and parts[-1] in FILE_SUFFIXES:
        return None  # a file: levers9.yaml, spec.py
    if first == "levers9" and rest:
        if name in LABELS:
            return None
        module, after, why = _module_name(name)
        if module is None:
            return why
        return _resolve(module, after, module.__name__)
    if first.startswith("levers9_"):
        if rest:
            return None  # another package's module (levers9_ec2.identity): tests/core/test_docs_modules.py
        return _bare_problem(first)
    if rest and first in _classes():
        problems = []
        for module in _classes()[first]:
            problem = _resolve(getattr(importlib.import_module(module), first), rest, first)
            if problem is None:
                return None
            problems.append(problem)
        return problems[0]
    if rest and first in _arguments():
        kind = _arguments()[first]
        return _resolve(kind, rest, first)
    return None


def _bare_problem(name: str) -> str | None:
    """Why ``levers9_<something>`` alone is none of a hook, a package, a hook type's field, a metric, or a function
    levers9 defines (the contract kit's fixtures ``levers9_docker_host``...)."""
    if name in _hooks() or name in _metrics() or name in _type_fields() or name in EXAMPLE_PACKAGES:
        return None
    if name in _functions():
        return None
    if importlib.util.find_spec(name) is not None:
        return None
    close = [n for n in [*_hooks(), *_metrics()] if n.startswith(name) or name.startswith(n)]
    hint = f"; did you mean {' or '.join(sorted(close)[:3])}?" if close else ""
    return f"no hook, package, hook type's field, metric or levers9 function is named {name}{hint}"


def metric_labels_problem(token: str) -> str | None:
    """A metric written with labels (``levers9_x_total{a,b}``): each label is one the series has."""
    name = NAME.match(token)
    labels = METRIC_LABELS.search(token)
    if name is None or labels is None or name.group(0) not in _metrics():
        return None
    written = {re.split(r"[=!~]", label.strip())[0].strip() for label in labels.group(1).split(",") if label.strip()}
    unknown = sorted(written - _metrics()[name.group(0)])
    if unknown:
        return f"{name.group(0)} has no label {', '.join(unknown)}; its labels: {', '.join(sorted(_metrics()[name.group(0)]))}"
    return None


# --------------------------------------------------------------------------- reading the documents


def inline_names(line: str) -> Iterator[tuple[str, str]]:
    """``(token, name)`` for each backticked span of ``line`` that starts with a name."""
    for token in INLINE.findall(line):
        token = token.strip()
        match = NAME.match(token)
        if match is None:
            continue
        after = token[match.end() : match.end() + 1]
        if after in ("-", "<", "/", ":", "*") or (after == "." and token[match.end() + 1 : match.end() + 2] in "<*"):
            continue  # a label (levers9.machine-id), a placeholder (levers9_plugin_<name>), a path, a pattern
        yield token, match.group(0)


def _fences(lines: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """``(first line number, info string, body lines)`` of each fenced block."""
    start, info, body = 0, "", []
    inside = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            if inside:
                yield start, info, body
                inside = False
            else:
                inside, start, info, body = True, number + 1, line.strip().strip("`").strip(), []
        elif inside:
            body.append(line)


def _rebound(tree: ast.AST) -> set[str]:
    """Names a block assigns itself (``spec = container_spec(...)``), or takes as an argument of another type."""
    found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        is_argument = isinstance(node, ast.arg) and node.arg in _arguments() and node.annotation is not None
        if is_argument and ast.unparse(node.annotation).split(".")[-1] != _arguments()[node.arg].__name__:
            found.add(node.arg)
    return found


def _python_problems(start: int, body: list[str]) -> Iterator[tuple[int, str, str]]:
    """``(line, name, problem)`` for what a ``python`` block imports from levers9 or reads off a hook argument."""
    try:
        tree = ast.parse(textwrap.dedent("\n".join(body)))
    except SyntaxError:
        return  # a fragment (a signature, an elided body): its inline names are still checked
    rebound = _rebound(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "levers9":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                problem = name_problem(name)
                if problem is not None:
                    yield start + node.lineno - 1, name, problem
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            chain = []
            current: ast.expr = node
            while isinstance(current, ast.Attribute):
                chain.append(current.attr)
                current = current.value
            if isinstance(current, ast.Name) and current.id in _arguments() and current.id not in rebound:
                name = ".".join([current.id, *reversed(chain)])
                problem = name_problem(name)
                if problem is not None:
                    yield start + node.lineno - 1, name, problem


def problems_in(text: str, where: str) -> list[str]:
    """Every name ``text`` (a document at ``where``) writes that does not exist, one line each."""
    lines = text.splitlines()
    fenced: set[int] = set()
    found: list[str] = []
    for start, info, body in _fences(lines):
        fenced.update(range(start - 1, start + len(body) + 1))
        if info.split()[:1] == ["python"] and (not body or body[0].strip() != "# first edition"):
            seen = set()
            for number, name, problem in _python_problems(start, body):
                if (name, number) not in seen:
                    seen.add((name, number))
                    found.append(f"{where}:{number}: `{name}`: {problem}")
    for number, line in enumerate(lines, 1):
        if number in fenced:
            continue
        for token, name in inline_names(line):
            problem = name_problem(name) or metric_labels_problem(token)
            if problem is not None:
                found.append(f"{where}:{number}: `{token}`: {problem}")
    return found


def test_the_docs_name_only_types_fields_hooks_and_metrics_that_exist() -> None:
    problems = [p for doc in DOCS for p in problems_in(doc.read_text(), str(doc.relative_to(ROOT)))]
    assert not problems, "the docs name what levers9 does not have:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        # issue 38: the name config.md and architecture.md gave for the CA
        ("ProvisionRequest.controlplane_ca", "ProvisionRequest has no controlplane_ca (ProvisionRequest's fields: "),
        ("request.controlplane_ca", "request has no controlplane_ca (ProvisionRequest's fields: bootstrap, "),
        ("levers9.hooks.types.ProvisionRequest.token", "levers9.hooks.types.ProvisionRequest has no token ("),
        ("request.bootstrap.ca", "request.bootstrap has no ca (WorkerBootstrap's fields: "),
        ("levers9.gpu.catalog.memory_of", "levers9.gpu.catalog has no memory_of"),
        (
            "levers9_provison",
            "no hook, package, hook type's field, metric or levers9 function is named levers9_provison",
        ),
        (
            "levers9_placements",
            "no hook, package, hook type's field, metric or levers9 function is named levers9_placements; did",
        ),
        ("AgentHub.dispatch", "AgentHub has no dispatch"),
    ],
)
def test_a_name_that_does_not_exist_is_reported(name: str, problem: str) -> None:
    assert (name_problem(name) or "").startswith(problem)


@pytest.mark.parametrize(
    "name",
    [
        "request.bootstrap.controlplane_ca",
        "levers9.hooks.types.ProvisionRequest.bootstrap.controlplane_ca",
        "WorkerBootstrap.controlplane_ca",
        "GpuOffer.key",
        "pool.regions",
        "machine.provider_data",
        "ctx.log",
        "levers9.gpu.catalog.gpu_memory_mib",
        "levers9_provision",
        "levers9_ec2",
        "levers9_version",
        "levers9_placements_total",
        "levers9_provisioning_seconds_bucket",
        "levers9.yaml",
        "levers9.pool",
        "spec.py",
    ],
)
def test_a_name_that_exists_is_not_reported(name: str) -> None:
    assert name_problem(name) is None


def test_a_document_is_read_inline_and_in_its_python_blocks() -> None:
    text = "\n".join(
        [
            "The CA is `ProvisionRequest.controlplane_ca`, see `levers9_plugin_<name>` and `levers9.plugin.<name>`.",
            "Counted as `levers9_workers_lost_total{pool,reason}` and `levers9_workers_lost_total{zone}`.",
            "```python",
            "from levers9.hooks.types import Machine, ProvisionRequst",
            "ca = request.bootstrap.controlplane_ca + request.token",
            "```",
            "```python",
            "def provision(request: ProvisionRequest, pool: str) -> None:",
            "    spec = container_spec(request.bootstrap)",
            "    print(spec.secret_env, pool.upper(), request.bootstrap.tokn)",
            "```",
            "```python",
            "# first edition",
            "token = request.token",
            "```",
        ]
    )
    # each problem, up to the list of fields (which grows with the types)
    found = [problem.split(" (")[0] if "'s fields: " in problem else problem for problem in problems_in(text, "doc.md")]
    assert found == [
        "doc.md:4: `levers9.hooks.types.ProvisionRequst`: levers9.hooks.types has no ProvisionRequst",
        "doc.md:5: `request.token`: request has no token",
        "doc.md:10: `request.bootstrap.tokn`: request.bootstrap has no tokn",
        "doc.md:1: `ProvisionRequest.controlplane_ca`: ProvisionRequest has no controlplane_ca",
        "doc.md:2: `levers9_workers_lost_total{zone}`: levers9_workers_lost_total has no label zone; its labels: "
        "pool, reason, replica",
    ]
