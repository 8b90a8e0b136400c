"""The build spec of a blueprint: a base and ordered steps, their canonical JSON, and their content keys.

A :class:`BuildSpec` is what the SDK sends and the controlplane and the
builder read: a :class:`Base` (a Debian root filesystem with a chosen Python,
or an image in an OCI registry) and :class:`Step` s run in order on it, each
of which becomes one layer of the image. Everything here is frozen, pure
data: no I/O, no clock, no randomness.

Invariants:

- A :class:`Base`, :class:`Step` or :class:`BuildSpec` that exists is valid:
  the constructors check every field and raise :class:`BlueprintError`
  naming it (``op``, ``args[2]``) and what would be accepted.
  :meth:`BuildSpec.from_json` checks the JSON types first and names fields by
  their place in the document (``steps[3].op``, ``base.ref``), since that text
  comes over the wire from users.
- :meth:`BuildSpec.to_json` is canonical: sorted keys, no whitespace, ASCII
  only, fields left out when they hold their default. The same spec gives the
  same text in every process and on every Python, and a field added later
  with a default leaves every existing spec's text, and so its keys, as they
  were. ``from_json(s.to_json()) == s``.
- Keys (``"sha256:<64 hex>"``): the base's key is the SHA-256 of
  ``levers9-blueprint-v1`` and the base's canonical JSON *without* its
  credentials (they say how to fetch the image, not what it holds); each
  step's key is the SHA-256 of its parent's key, a newline and the step's
  canonical JSON, which holds a copy step's content digest. So a step's key
  names everything below it: change one step and its key and every key after
  it change, those before do not. :func:`keys` gives them all; the last one
  names the image. A registry base named by tag keys the tag, not what it
  points at: pin a digest (``@sha256:...``) to rebuild when it moves.
  Secrets enter a key by name only: a new value of a secret rebuilds nothing.

Limits (what :class:`BlueprintError` refuses):

- ``Base.kind``: ``debian`` (``python_version`` required, no ``ref`` nor
  ``credentials``) or ``registry`` (``ref`` required, ``python_version``
  optional: the interpreter the image's functions run with).
- ``python_version``: ``3.N`` (``3.11``); which ones a builder has a Debian
  release for is the builder's to say.
- ``ref``: ``host[:port]/path/name`` then ``:tag``, ``@sha256:<64 hex>`` or
  both; the host must look like one (a dot, a port or ``localhost``): nothing
  is pulled from an implied Docker Hub. At most 512 characters.
- secret names (``credentials``, ``secrets``): environment variable names,
  ``[A-Za-z_][A-Za-z0-9_]*``, at most 255 characters, no repeats; at most
  16 credentials and 64 secrets a step; ``secrets`` only on ``run``, ``pip``
  and ``apt`` steps.
- ``apt``: 1 to 1,000 Debian package names ``[a-z0-9][a-z0-9+.-]+``,
  optionally ``=version`` (``[0-9][A-Za-z0-9.+~:-]*``), 500 characters each.
- ``pip``: 1 to 1,000 requirement strings of at most 500 characters, with no
  NUL, newline or carriage return, no leading or trailing whitespace, not
  starting with ``-`` (they are never pip options: an index is
  ``index_url``); ``index_url`` an ``http(s)://`` URL of at most 2,048
  characters with no whitespace or control characters.
- ``run``: exactly one shell command, not blank, no NUL, at most 64 KiB as
  UTF-8.
- ``env``: 1 to 1,000 pairs, names ``[A-Za-z_][A-Za-z0-9_]*`` (255 at
  most), values with no NUL, newline or carriage return, 64 KiB at most.
- ``workdir`` and ``copy``: exactly one destination path: absolute,
  normalized (``/app``, not ``/app/`` nor ``/a/../app``), no NUL or newline,
  4,096 characters at most. ``copy`` needs ``content``: ``sha256:<64 hex>``.
- At most 200 steps; ``from_json`` reads at most 16 MiB of text.
- Every string must be valid Unicode (no lone surrogates).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from levers9.hooks.errors import Levers9Error

__all__ = [
    "MAX_COMMAND_BYTES",
    "MAX_STEPS",
    "Base",
    "BlueprintError",
    "BuildSpec",
    "Step",
    "base_key",
    "check_path",
    "check_python_version",
    "check_ref",
    "keys",
    "step_key",
]

BaseKind = Literal["debian", "registry"]
Op = Literal["apt", "pip", "run", "env", "workdir", "copy"]
BASE_KINDS: tuple[str, ...] = get_args(BaseKind)
OPS: tuple[str, ...] = get_args(Op)

#: the version every key starts from: a change to what a key means changes it
KEY_VERSION = "levers9-blueprint-v1"
MAX_STEPS = 200
MAX_COMMAND_BYTES = 64 * 1024
MAX_PACKAGES = 1000
MAX_PACKAGE_CHARS = 500
MAX_ENV_PAIRS = 1000
MAX_ENV_VALUE_BYTES = 64 * 1024
MAX_NAME_CHARS = 255
MAX_SECRETS = 64
MAX_CREDENTIALS = 16
MAX_PATH_CHARS = 4096
MAX_REF_CHARS = 512
MAX_URL_CHARS = 2048
MAX_SPEC_BYTES = 16 * 1024 * 1024

_PYTHON = re.compile(r"3\.(?:0|[1-9][0-9]?)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_APT = re.compile(r"[a-z0-9][a-z0-9+.-]+(?:=[0-9][A-Za-z0-9.+~:-]*)?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_URL = re.compile(r"https?://[^\s\x00-\x1f\x7f]+")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REF = re.compile(
    rf"(?P<host>{_HOST})(?P<path>(?:/{_COMPONENT})+)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


class BlueprintError(Levers9Error, ValueError):
    """A blueprint, its spec or a Dockerfile it is read from holds something that cannot be built.

    It is a ValueError too: what a user passed to a :class:`~levers9.sdk.blueprint.Blueprint` was wrong.

    ``field`` names where (``steps[3].op``, ``python_version``, ``Dockerfile line 4 (ADD)``);
    ``problem`` says what is wrong and what would be accepted.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def under(self, prefix: str) -> BlueprintError:
        """The same error, its field named inside ``prefix`` (``steps[3]`` + ``op`` -> ``steps[3].op``)."""
        joined = f"{prefix}{self.field}" if self.field.startswith("[") else f"{prefix}.{self.field}"
        return BlueprintError(joined, self.problem)


def _show(value: object) -> str:
    """``value`` quoted for a message, cut short: a refused value may be 64 KiB of shell."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _text(field: str, value: object, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise BlueprintError(field, f"must be a string, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BlueprintError(field, "is not valid Unicode text (it holds a lone surrogate)") from None
    if not empty and not value:
        raise BlueprintError(field, "is empty")
    return value


def _strings(field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple):
        raise BlueprintError(field, f"must be a tuple of strings, not {type(value).__name__}")
    for i, item in enumerate(value):
        _text(f"{field}[{i}]", item)
    return cast(tuple[str, ...], value)


def _names(field: str, value: object, most: int) -> tuple[str, ...]:
    names = _strings(field, value)
    if len(names) > most:
        raise BlueprintError(field, f"{len(names)} names; at most {most} are accepted")
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not _NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
            raise BlueprintError(
                f"{field}[{i}]",
                f"{_show(name)} is not a secret name: 1-{MAX_NAME_CHARS} letters, digits and underscores, "
                "not starting with a digit (a secret is an environment variable of that name)",
            )
        if name in seen:
            raise BlueprintError(f"{field}[{i}]", f"{name!r} is named twice")
        seen.add(name)
    return names


def check_path(field: str, value: object) -> str:
    """``value`` when it is an absolute, normalized path in the image, else BlueprintError naming ``field``."""
    path = _text(field, value)
    if "\0" in path or "\n" in path or "\r" in path:
        raise BlueprintError(field, f"{_show(path)} holds a NUL or newline; a path cannot")
    if len(path) > MAX_PATH_CHARS:
        raise BlueprintError(field, f"{len(path)} characters; at most {MAX_PATH_CHARS} are accepted")
    if not path.startswith("/"):
        raise BlueprintError(field, f"{_show(path)} is not absolute: a path in the image starts with '/'")
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal != path:
        raise BlueprintError(field, f"{_show(path)} is not normalized: write {normal!r}")
    return path


def check_python_version(field: str, value: object) -> str:
    """``value`` when it is a ``3.N`` Python version, else :class:`BlueprintError` naming ``field``."""
    version = _text(field, value)
    if not _PYTHON.fullmatch(version):
        raise BlueprintError(field, f"{_show(version)} is not a Python version: write it as 3.N, e.g. '3.11'")
    return version


def check_ref(field: str, value: object) -> str:
    """``value`` when it is a registry image reference with a host and a tag or digest, else BlueprintError."""
    ref = _text(field, value)
    if len(ref) > MAX_REF_CHARS:
        raise BlueprintError(field, f"{len(ref)} characters; at most {MAX_REF_CHARS} are accepted")
    match = _REF.fullmatch(ref)
    example = "e.g. 'registry.example:5000/team/python:3.11' or '...@sha256:<64 hex>'"
    if match is None and _REF.fullmatch("registry.example/" + ref):
        raise BlueprintError(
            field,
            f"{_show(ref)} names no registry host: nothing is pulled from an implied Docker Hub, "
            f"so name the registry, {example}",
        )
    if match is None:
        raise BlueprintError(
            field,
            f"{_show(ref)} is not an image reference: write host[:port]/path/name:tag or with @sha256:<digest>, "
            f"lowercase path components, {example}",
        )
    host = match["host"]
    if "." not in host and ":" not in host and host != "localhost":
        raise BlueprintError(
            field,
            f"{_show(ref)} names no registry host ({host!r} is taken as the first path component): "
            f"nothing is pulled from an implied Docker Hub, so name the registry, {example}",
        )
    if match["tag"] is None and match["digest"] is None:
        raise BlueprintError(field, f"{_show(ref)} has neither a tag nor a digest: add ':latest' if that is meant")
    return ref


@dataclass(frozen=True)
class Base:
    """What the first layer comes from: a Debian root filesystem with Python, or a registry's image.

    ``credentials`` are the names of workspace secrets holding what the
    registry asks for (never their values); they are not part of the key.
    """

    kind: BaseKind
    python_version: str | None = None
    ref: str | None = None
    credentials: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in BASE_KINDS:
            raise BlueprintError("kind", f"{_show(self.kind)} is not a base kind: one of {', '.join(BASE_KINDS)}")
        if self.python_version is not None:
            check_python_version("python_version", self.python_version)
        _names("credentials", self.credentials, MAX_CREDENTIALS)
        if self.kind == "debian":
            if self.python_version is None:
                raise BlueprintError("python_version", "a debian base needs one, e.g. '3.11'")
            if self.ref is not None:
                raise BlueprintError("ref", "only a registry base names an image; a debian base has none")
            if self.credentials:
                raise BlueprintError("credentials", "only a registry base has credentials; a debian base has none")
        else:
            if self.ref is None:
                raise BlueprintError("ref", "a registry base needs an image reference, e.g. 'registry.example/x:1'")
            check_ref("ref", self.ref)

    def canonical(self, *, credentials: bool = True) -> dict[str, Any]:
        """The JSON object of this base, fields at their default left out (and credentials unless asked)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.python_version is not None:
            out["python_version"] = self.python_version
        if self.ref is not None:
            out["ref"] = self.ref
        if credentials and self.credentials:
            out["credentials"] = list(self.credentials)
        return out


#: which fields each op may have set beyond ``op``, and how many ``args`` it takes (None: a list of packages)
_ALLOWED: dict[str, frozenset[str]] = {
    "apt": frozenset({"args", "secrets"}),
    "pip": frozenset({"args", "secrets", "index_url"}),
    "run": frozenset({"args", "secrets"}),
    "env": frozenset({"env"}),
    "workdir": frozenset({"args"}),
    "copy": frozenset({"args", "content"}),
}


@dataclass(frozen=True)
class Step:
    """One step of a build, and so one layer of the image.

    ``args``: apt and pip: the packages; run: ``(command,)``; workdir and
    copy: ``(destination path,)``. ``env``: the variables an env step sets,
    in order. ``secrets``: workspace secrets this step alone sees while it
    runs (never written into the image). ``content``: a copy step's
    ``sha256:<hex>`` of the deterministic tar of the files it adds
    (:mod:`levers9.blueprints.context`): its members are named relative to
    the destination, which the step creates (root's, mode 0755) where the
    image has no such directory, and extracts them into.
    ``index_url``: a pip step's index, else the build machine's own.
    """

    op: Op
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[str, ...] = ()
    content: str | None = None
    index_url: str | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise BlueprintError("op", f"{_show(self.op)} is not a step: one of {', '.join(OPS)}")
        self._check_fields_of_op()
        args = _strings("args", self.args)
        _names("secrets", self.secrets, MAX_SECRETS)
        self._check_env()
        if self.op == "apt":
            self._check_apt(args)
        elif self.op == "pip":
            self._check_pip(args)
        elif self.op == "run":
            self._check_run(args)
        elif self.op in ("workdir", "copy"):
            self._check_path_step(args)
        elif self.op == "env" and not self.env:
            raise BlueprintError("env", "an env step sets at least one variable")

    def _check_fields_of_op(self) -> None:
        """A field this step's op does not take is at its default."""
        allowed = _ALLOWED[self.op]
        for name, default in (("args", ()), ("env", ()), ("secrets", ()), ("content", None), ("index_url", None)):
            if name not in allowed and getattr(self, name) != default:
                where = ", ".join(op for op, fields in _ALLOWED.items() if name in fields)
                raise BlueprintError(name, f"{self.op} steps have none (only {where} steps do)")

    def _check_apt(self, args: tuple[str, ...]) -> None:
        self._check_packages(args, "Debian package names")
        for i, name in enumerate(args):
            if not _APT.fullmatch(name):
                raise BlueprintError(
                    f"args[{i}]",
                    f"{_show(name)} is not a Debian package: [a-z0-9][a-z0-9+.-]+, optionally =version "
                    "(e.g. 'jq' or 'jq=1.6-2.1')",
                )

    def _check_pip(self, args: tuple[str, ...]) -> None:
        self._check_packages(args, "requirements")
        for i, req in enumerate(args):
            if "\0" in req or "\n" in req or "\r" in req:
                raise BlueprintError(f"args[{i}]", f"{_show(req)} holds a NUL or newline: one requirement each")
            if req != req.strip():
                raise BlueprintError(f"args[{i}]", f"{_show(req)} has leading or trailing whitespace")
            if req.startswith("-"):
                raise BlueprintError(
                    f"args[{i}]",
                    f"{_show(req)} is a pip option, not a requirement: name an index with index_url",
                )
        if self.index_url is not None:
            url = _text("index_url", self.index_url)
            if len(url) > MAX_URL_CHARS or not _URL.fullmatch(url):
                raise BlueprintError(
                    "index_url",
                    f"{_show(url)} is not an http(s):// URL of at most {MAX_URL_CHARS} characters without whitespace",
                )

    def _check_run(self, args: tuple[str, ...]) -> None:
        if len(args) != 1:
            raise BlueprintError("args", f"a run step takes exactly one shell command, not {len(args)}")
        command = args[0]
        if not command.strip():
            raise BlueprintError("args[0]", "the command is blank")
        if "\0" in command:
            raise BlueprintError("args[0]", "the command holds a NUL character, which no shell can run")
        size = len(command.encode("utf-8"))
        if size > MAX_COMMAND_BYTES:
            raise BlueprintError("args[0]", f"{size} bytes; a command is at most {MAX_COMMAND_BYTES} (UTF-8)")

    def _check_path_step(self, args: tuple[str, ...]) -> None:
        """A workdir or copy step: one path; a copy step also its content digest."""
        if len(args) != 1:
            raise BlueprintError("args", f"a {self.op} step takes exactly one path, not {len(args)}")
        check_path("args[0]", args[0])
        if self.op == "copy":
            if self.content is None:
                raise BlueprintError("content", "a copy step needs the sha256:<64 hex> digest of its files")
            digest = _text("content", self.content)
            if not _DIGEST.fullmatch(digest):
                raise BlueprintError("content", f"{_show(digest)} is not a digest: sha256:<64 lowercase hex>")

    def _check_packages(self, args: tuple[str, ...], what: str) -> None:
        if not args:
            raise BlueprintError("args", f"{self.op} steps name at least one package")
        if len(args) > MAX_PACKAGES:
            raise BlueprintError("args", f"{len(args)} {what}; at most {MAX_PACKAGES} a step")
        for i, name in enumerate(args):
            if len(name) > MAX_PACKAGE_CHARS:
                raise BlueprintError(f"args[{i}]", f"{len(name)} characters; at most {MAX_PACKAGE_CHARS}")

    def _check_env(self) -> None:
        if not isinstance(self.env, tuple):
            raise BlueprintError("env", f"must be a tuple of (name, value) pairs, not {type(self.env).__name__}")
        if len(self.env) > MAX_ENV_PAIRS:
            raise BlueprintError("env", f"{len(self.env)} variables; at most {MAX_ENV_PAIRS} a step")
        for i, pair in enumerate(self.env):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise BlueprintError(f"env[{i}]", "must be a (name, value) pair")
            name = _text(f"env[{i}][0]", pair[0])
            value = _text(f"env[{i}][1]", pair[1], empty=True)
            if not _NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
                raise BlueprintError(
                    f"env[{i}][0]",
                    f"{_show(name)} is not a variable name: 1-{MAX_NAME_CHARS} letters, digits and underscores, "
                    "not starting with a digit",
                )
            if "\0" in value or "\n" in value or "\r" in value:
                raise BlueprintError(f"env[{i}][1]", f"the value of {name} holds a NUL or newline; it cannot")
            if len(value.encode("utf-8")) > MAX_ENV_VALUE_BYTES:
                raise BlueprintError(f"env[{i}][1]", f"the value of {name} is over {MAX_ENV_VALUE_BYTES} bytes")

    def canonical(self) -> dict[str, Any]:
        """The JSON object of this step, fields at their default left out."""
        out: dict[str, Any] = {"op": self.op}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = [list(pair) for pair in self.env]
        if self.secrets:
            out["secrets"] = list(self.secrets)
        if self.content is not None:
            out["content"] = self.content
        if self.index_url is not None:
            out["index_url"] = self.index_url
        return out


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass(frozen=True)
class BuildSpec:
    """A base and the steps run on it, in order."""

    base: Base
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.base, Base):
            raise BlueprintError("base", f"must be a Base, not {type(self.base).__name__}")
        if not isinstance(self.steps, tuple) or not all(isinstance(s, Step) for s in self.steps):
            raise BlueprintError("steps", "must be a tuple of Step")
        if len(self.steps) > MAX_STEPS:
            raise BlueprintError("steps", f"{len(self.steps)} steps; at most {MAX_STEPS} are accepted")

    def to_json(self) -> str:
        """The canonical JSON text: sorted keys, no whitespace, defaults left out, ASCII only."""
        return _dumps({"base": self.base.canonical(), "steps": [step.canonical() for step in self.steps]})

    @classmethod
    def from_json(cls, text: str) -> BuildSpec:
        """The spec ``text`` holds, every field checked; BlueprintError names the first one that is not right."""
        if not isinstance(text, str):
            raise BlueprintError("spec", f"must be JSON text (str), not {type(text).__name__}")
        if len(text) > MAX_SPEC_BYTES:
            raise BlueprintError("spec", f"{len(text)} characters; at most {MAX_SPEC_BYTES} are accepted")
        try:
            document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except BlueprintError:
            raise
        except (ValueError, RecursionError) as e:
            raise BlueprintError("spec", f"is not JSON: {e}") from None
        top = _object("spec", document, required={"base", "steps"}, optional=set())
        base = _base_from(top["base"])
        raw_steps = top["steps"]
        if not isinstance(raw_steps, list):
            raise BlueprintError("steps", f"must be a list, not {_json_type(raw_steps)}")
        if len(raw_steps) > MAX_STEPS:
            raise BlueprintError("steps", f"{len(raw_steps)} steps; at most {MAX_STEPS} are accepted")
        steps = tuple(_step_from(f"steps[{i}]", raw) for i, raw in enumerate(raw_steps))
        return cls(base=base, steps=steps)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BlueprintError("spec", f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise BlueprintError("spec", f"{name} is not JSON")


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _object(field: str, value: object, *, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BlueprintError(field, f"must be an object, not {_json_type(value)}")
    for key in sorted(value):
        if key not in required and key not in optional:
            accepted = ", ".join(sorted(required | optional))
            raise BlueprintError(f"{field}.{key}" if field != "spec" else key, f"is not a field: one of {accepted}")
    for key in sorted(required):
        if key not in value:
            raise BlueprintError(f"{field}.{key}" if field != "spec" else key, "is missing")
    return value


def _str_list(field: str, value: object) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise BlueprintError(field, f"must be a list of strings, not {_json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise BlueprintError(f"{field}[{i}]", f"must be a string, not {_json_type(item)}")
    return tuple(value)


def _opt_str(field: str, value: object) -> Any:
    if value is not None and not isinstance(value, str):
        raise BlueprintError(field, f"must be a string, not {_json_type(value)}")
    return value


def _base_from(raw: object) -> Base:
    fields = _object("base", raw, required={"kind"}, optional={"python_version", "ref", "credentials"})
    kind = fields["kind"]
    if not isinstance(kind, str):
        raise BlueprintError("base.kind", f"must be a string, not {_json_type(kind)}")
    python_version = _opt_str("base.python_version", fields.get("python_version"))
    ref = _opt_str("base.ref", fields.get("ref"))
    credentials = _str_list("base.credentials", fields.get("credentials", []))
    try:
        return Base(kind=cast(BaseKind, kind), python_version=python_version, ref=ref, credentials=credentials)
    except BlueprintError as e:
        raise e.under("base") from None


def _step_from(field: str, raw: object) -> Step:
    fields = _object(field, raw, required={"op"}, optional={"args", "env", "secrets", "content", "index_url"})
    op = fields["op"]
    if not isinstance(op, str):
        raise BlueprintError(f"{field}.op", f"must be a string, not {_json_type(op)}")
    raw_env = fields.get("env", [])
    if not isinstance(raw_env, list):
        raise BlueprintError(f"{field}.env", f"must be a list of [name, value] pairs, not {_json_type(raw_env)}")
    env: list[tuple[str, str]] = []
    for i, pair in enumerate(raw_env):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise BlueprintError(f"{field}.env[{i}]", "must be a [name, value] pair of strings")
        env.append((pair[0], pair[1]))
    args = _str_list(f"{field}.args", fields.get("args", []))
    secrets = _str_list(f"{field}.secrets", fields.get("secrets", []))
    content = _opt_str(f"{field}.content", fields.get("content"))
    index_url = _opt_str(f"{field}.index_url", fields.get("index_url"))
    try:
        return Step(op=cast(Op, op), args=args, env=tuple(env), secrets=secrets, content=content, index_url=index_url)
    except BlueprintError as e:
        raise e.under(field) from None


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def base_key(base: Base) -> str:
    """The key of the base layer: ``sha256:<hex>`` of the key version and the base without its credentials."""
    return _sha256(KEY_VERSION + "\n" + _dumps(base.canonical(credentials=False)))


def step_key(parent_key: str, step: Step) -> str:
    """The key of ``step`` run on the layer keyed ``parent_key``."""
    if not isinstance(parent_key, str) or not _DIGEST.fullmatch(parent_key):
        raise BlueprintError("parent_key", f"{_show(parent_key)} is not a key: sha256:<64 lowercase hex>")
    return _sha256(parent_key + "\n" + _dumps(step.canonical()))


def keys(spec: BuildSpec) -> tuple[str, ...]:
    """The base's key, then one per step in order; the last one is the image's."""
    out = [base_key(spec.base)]
    for step in spec.steps:
        out.append(step_key(out[-1], step))
    return tuple(out)
