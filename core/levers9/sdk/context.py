"""Client contexts: which controlplane the SDK and the CLI talk to, and with which token.

A user may reach several controlplanes (the one ``levers9 up`` started on this
machine, a team's shared one), so each is a named context in one small YAML
file, ``~/.levers9/config``, and one of them is current. The file holds tokens,
so it is only ever replaced whole (a reader never sees half a file) and only
its owner may read it.

The SDK imports this module inside every user program, so it stays on the
standard library and PyYAML.

Selection, strongest first: an explicit name (``-c NAME``), ``$LEVERS9_CONTEXT``,
the file's ``current``. ``$LEVERS9_GRPC``, ``$LEVERS9_TOKEN``, ``$LEVERS9_CA_FILE``,
``$LEVERS9_ENVIRONMENT`` and ``$LEVERS9_RECONNECT_S`` then override the chosen context's fields, which is
how a CI job or a container points the SDK somewhere without writing a file;
with no file and no selection, ``$LEVERS9_GRPC`` alone is enough.

A context's ``grpc`` may list every replica of one controlplane (a
comma-separated string, or a YAML list, written back as it was read): the SDK
moves to the next one when one cannot be reached, for up to ``reconnect_s``
without reaching any (see :mod:`levers9.sdk.client`). ``ca_file`` is the PEM CA
bundle that verifies a TLS controlplane; empty means the system trust store.
Every value is checked when read, and an error names the file (or variable) and
the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error
from levers9.proto.target import TargetError, parse_targets, split_targets

__all__ = [
    "DEFAULT_RECONNECT_S",
    "ENV_CA_FILE",
    "ENV_CONTEXT",
    "ENV_GRPC",
    "ENV_ONLY_NAME",
    "ENV_RECONNECT_S",
    "ENV_TOKEN",
    "Context",
    "ContextError",
    "ContextFile",
    "check_reconnect_s",
    "config_path",
    "current_context",
    "load_contexts",
    "remove_context",
    "save_context",
    "use_context",
]

ENV_CONTEXT = "LEVERS9_CONTEXT"
ENV_GRPC = "LEVERS9_GRPC"
ENV_TOKEN = "LEVERS9_TOKEN"
ENV_CA_FILE = "LEVERS9_CA_FILE"
ENV_RECONNECT_S = "LEVERS9_RECONNECT_S"
#: the environment to act in; ``levers9 -e NAME`` sets it for one command
ENV_ENVIRONMENT = "LEVERS9_ENVIRONMENT"

#: how long a call keeps trying to reach any replica before it fails, by default
DEFAULT_RECONNECT_S = 120.0

#: the name of the context made from ``$LEVERS9_GRPC`` when no file or selection exists
ENV_ONLY_NAME = "env"

_NO_CONTEXT = "no levers9 context: run `levers9 up` (one machine) or `levers9 context add ...`"
_FIELDS = ("grpc", "http", "token", "workspace", "environment", "ca_file", "reconnect_s")


class ContextError(Levers9Error):
    """No usable context: none configured, an unknown name, or a config file that does not parse."""


@dataclass(frozen=True)
class Context:
    """How to reach one controlplane."""

    name: str
    #: ``host:port``; ``grpcs://host:port`` or ``https://host[:port]`` for TLS; several replicas comma-separated
    grpc: str
    #: the controlplane's HTTP base URL (web endpoints, the API), when known
    http: str = ""
    token: str = field(default="", repr=False)
    #: the workspace the token belongs to; informational, the token decides
    workspace: str = ""
    #: the environment of the workspace commands act in (empty: main); a token issued for one environment
    #: acts only there, whatever this says
    environment: str = ""
    #: PEM CA bundle that verifies a TLS controlplane; empty means the system trust store
    ca_file: str = ""
    #: seconds a call keeps trying to reach any replica before it fails
    reconnect_s: float = DEFAULT_RECONNECT_S
    #: the file wrote ``grpc`` as a YAML list: it is written back as one
    grpc_is_list: bool = field(default=False, repr=False, compare=False)

    def credentials(self) -> tuple[tuple[str, str], ...]:
        """What every request carries, as gRPC metadata or HTTP headers: the bearer token, when there is one,
        and the environment to act in, when it is not main."""
        pairs: list[tuple[str, str]] = []
        if self.token:
            pairs.append(("authorization", f"Bearer {self.token}"))
        if self.environment and self.environment.lower() != "main":
            pairs.append(("x-levers9-environment", self.environment))
        return tuple(pairs)

    @property
    def addresses(self) -> list[str]:
        """Every replica's address, as written, in the order given."""
        return split_targets(self.grpc)

    def as_dict(self) -> dict[str, Any]:
        """The file's entry for this context (its name is the key, so it is not repeated)."""
        entry: dict[str, Any] = {key: getattr(self, key) for key in _FIELDS if getattr(self, key)}
        if self.reconnect_s == DEFAULT_RECONNECT_S:
            entry.pop("reconnect_s", None)
        if self.grpc_is_list:
            entry["grpc"] = self.addresses
        return entry


@dataclass
class ContextFile:
    """The parsed config file; ``exists`` is false when there was no file to read."""

    path: Path
    current: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)
    exists: bool = True

    def get(self, name: str) -> Context:
        """The context called ``name``; the error lists the ones that exist, since a typo is the usual cause."""
        try:
            return self.contexts[name]
        except KeyError:
            known = ", ".join(sorted(self.contexts)) or "none"
            raise ContextError(f"unknown levers9 context {name!r} in {self.path} (known: {known})") from None

    def to_yaml(self) -> str:
        document: dict[str, Any] = {}
        if self.current is not None:
            document["current"] = self.current
        document["contexts"] = {name: ctx.as_dict() for name, ctx in sorted(self.contexts.items())}
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def config_path() -> Path:
    """``$LEVERS9_HOME/config``, else ``~/.levers9/config``."""
    # Imported here: the config model pulls in pydantic, which a user program that only
    # reads its context should not pay for at import time.
    from levers9.config.model import default_home

    return default_home() / "config"


def load_contexts(path: Path | None = None) -> ContextFile:
    """Read the context file; a missing file is an empty one (``exists`` false), a malformed one an error."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ContextFile(path=path, exists=False)
    except OSError as exc:
        raise ContextError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ContextError(f"{path}{where}: not valid YAML: {problem}") from None
    return _parse(path, document)


def save_context(ctx: Context, make_current: bool = True) -> Path:
    """Add or replace ``ctx`` in the file; it becomes current when asked, or when nothing else is."""
    if not ctx.name.strip():
        raise ContextError("a context needs a name")
    if not ctx.grpc.strip():
        raise ContextError(f"context {ctx.name!r} needs a grpc address (host:port)")
    try:
        parse_targets(ctx.grpc)
    except TargetError as exc:
        raise ContextError(f"context {ctx.name!r}: grpc: {exc}") from None
    check_reconnect_s(ctx.reconnect_s, f"context {ctx.name!r}: reconnect_s")
    contexts = load_contexts()
    contexts.contexts[ctx.name] = ctx
    if make_current or contexts.current not in contexts.contexts:
        contexts.current = ctx.name
    _write(contexts)
    return contexts.path


def use_context(name: str) -> Context:
    """Make ``name`` the current context."""
    contexts = load_contexts()
    if not contexts.exists:
        raise ContextError(_NO_CONTEXT)
    ctx = contexts.get(name)
    contexts.current = name
    _write(contexts)
    return ctx


def remove_context(name: str) -> None:
    """Forget ``name``; removing the current context leaves none current rather than guessing another."""
    contexts = load_contexts()
    if not contexts.exists:
        raise ContextError(_NO_CONTEXT)
    contexts.get(name)
    del contexts.contexts[name]
    if contexts.current == name:
        contexts.current = None
    _write(contexts)


def current_context(name: str | None = None) -> Context:
    """The context to use now: ``name``, else ``$LEVERS9_CONTEXT``, else the file's current; env overrides on top."""
    env = os.environ
    chosen = name or env.get(ENV_CONTEXT) or None
    contexts = load_contexts()
    if chosen is not None:
        if not contexts.exists:
            raise ContextError(f"{_NO_CONTEXT} (asked for {chosen!r}; {contexts.path} does not exist)")
        ctx = contexts.get(chosen)
    elif contexts.current is not None:
        ctx = contexts.get(contexts.current)
    elif env.get(ENV_GRPC):
        ctx = Context(name=ENV_ONLY_NAME, grpc=env[ENV_GRPC].strip())
    elif not contexts.exists:
        raise ContextError(_NO_CONTEXT)
    else:
        known = ", ".join(sorted(contexts.contexts)) or "none"
        raise ContextError(
            f"no current levers9 context in {contexts.path}: run `levers9 context use NAME` (known: {known})"
        )
    overrides = _env_overrides(env)
    return replace(ctx, **overrides) if overrides else ctx


def check_reconnect_s(value: Any, where: str) -> float:
    """``value`` as a number of seconds above 0; ContextError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContextError(f"{where}: expected a number of seconds above 0, got {_kind(value)}")
    if not value > 0 or value != value or value == float("inf"):
        raise ContextError(f"{where}: expected a number of seconds above 0, got {value!r}")
    return float(value)


def _env_overrides(env: Any) -> dict[str, Any]:
    """The context fields the ``$LEVERS9_*`` variables set, each checked; errors name the variable."""
    overrides: dict[str, Any] = {}
    if env.get(ENV_GRPC, "").strip():
        grpc = env[ENV_GRPC].strip()
        try:
            parse_targets(grpc)
        except TargetError as exc:
            raise ContextError(f"${ENV_GRPC}: {exc}") from None
        overrides.update(grpc=grpc, grpc_is_list=False)
    if env.get(ENV_TOKEN):
        overrides["token"] = env[ENV_TOKEN]
    if env.get(ENV_CA_FILE):
        overrides["ca_file"] = env[ENV_CA_FILE]
    if env.get(ENV_ENVIRONMENT, "").strip():
        overrides["environment"] = env[ENV_ENVIRONMENT].strip()
    if env.get(ENV_RECONNECT_S, "").strip():
        raw = env[ENV_RECONNECT_S].strip()
        try:
            number = float(raw)
        except ValueError:
            raise ContextError(f"${ENV_RECONNECT_S}: expected a number of seconds above 0, got {raw!r}") from None
        overrides["reconnect_s"] = check_reconnect_s(number, f"${ENV_RECONNECT_S}")
    return overrides


def _parse(path: Path, document: Any) -> ContextFile:
    """Check the file's shape by hand; every message names the file and the key at fault."""
    if document is None:
        return ContextFile(path=path)
    if not isinstance(document, dict):
        raise ContextError(f"{path}: expected a mapping with 'current' and 'contexts', got {_kind(document)}")
    unknown = sorted(str(k) for k in document if k not in ("current", "contexts"))
    if unknown:
        raise ContextError(f"{path}: {unknown[0]}: unknown key (expected 'current' and 'contexts')")
    current = document.get("current")
    if current is not None and not isinstance(current, str):
        raise ContextError(f"{path}: current: expected a context name, got {_kind(current)}")
    raw = document.get("contexts") or {}
    if not isinstance(raw, dict):
        raise ContextError(f"{path}: contexts: expected a mapping of name to context, got {_kind(raw)}")
    contexts: dict[str, Context] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not name:
            raise ContextError(f"{path}: contexts.{name}: a context name must be a non-empty string")
        contexts[name] = _parse_context(path, name, entry)
    # A ``current`` naming no context is left for current_context to report, so that
    # `levers9 context use` and `add` can still repair the file.
    return ContextFile(path=path, current=current, contexts=contexts)


def _parse_context(path: Path, name: str, entry: Any) -> Context:
    """One entry of ``contexts``, checked; every message names the file and ``contexts.NAME.KEY``."""
    where = f"contexts.{name}"
    if not isinstance(entry, dict):
        raise ContextError(f"{path}: {where}: expected a mapping with grpc, token, http, workspace")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key not in _FIELDS:
            raise ContextError(f"{path}: {where}.{key}: unknown key (expected one of {', '.join(_FIELDS)})")
        if value is None:
            continue
        if key == "reconnect_s":
            values[key] = check_reconnect_s(value, f"{path}: {where}.reconnect_s")
            continue
        if key == "grpc" and isinstance(value, list):
            if not value or not all(isinstance(v, str) for v in value):
                raise ContextError(f"{path}: {where}.grpc: expected addresses (strings), got {value!r}")
            values.update(grpc=", ".join(v.strip() for v in value), grpc_is_list=True)
            continue
        if not isinstance(value, str):
            # A token of digits would otherwise arrive as a number, or worse as an octal one.
            raise ContextError(f"{path}: {where}.{key}: expected a string, got {_kind(value)} (quote it)")
        values[key] = value
    if not values.get("grpc"):
        raise ContextError(f"{path}: {where}.grpc: missing (the controlplane's host:port)")
    try:
        parse_targets(values["grpc"])
    except TargetError as exc:
        raise ContextError(f"{path}: {where}.grpc: {exc}") from None
    return Context(name=name, **values)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _write(contexts: ContextFile) -> None:
    """Replace the file in one rename, created 0600 from the start so the token is never readable by others."""
    path = contexts.path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, contexts.to_yaml(), mode=0o600, durable=True)
    contexts.exists = True
