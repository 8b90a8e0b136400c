"""Values of the config file taken from the environment or from files, so the file itself holds no secret.

One config file can then be shared by every replica and committed, while the
database and Redis passwords come from a secrets manager, a systemd credential
or a Kubernetes secret. Two forms, both resolved when the file is read, before
its structure is validated:

- ``${NAME}`` inside the value of one of the fields in :data:`SUBSTITUTED` is
  replaced by the environment variable ``NAME``; ``$$`` is a literal ``$``; any
  other ``$`` stays as written. Only those fields: they are where levers9's own
  secrets and key paths sit, and every other value (a pool's provider settings,
  labels, an image name) keeps the meaning it had, ``$`` included, so no file
  that worked changes meaning.
- a ``_file`` twin of a field in :data:`FILE_TWINS` (``state.database_url_file:
  /run/secrets/db``) names a file whose content is the field's value, trailing
  newlines stripped. The twin's own value may use ``${NAME}`` (e.g.
  ``${CREDENTIALS_DIRECTORY}/db``).

Invariants: a resolved value never appears in a problem, a log line or an
exception message (only the field, the variable's name or the file's path
do). Each problem names the field, the variable or path, and comes with the
line of the field. A field and its ``_file`` twin both set is a problem, not a
precedence rule. What each problem means:

- *variable not set*: the process was started without it (a systemd unit's
  ``Environment=``/``EnvironmentFile=``, a container's ``env``);
- *cannot read the file*: missing, not readable by the server's user, or not UTF-8;
- *the file is empty*: an empty secret is never what was meant.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FILE_TWINS", "SUBSTITUTED", "Resolved", "resolve_external"]

#: a path of keys into the config file's mapping
Loc = tuple[str | int, ...]

#: the fields whose values may hold ``${NAME}``
SUBSTITUTED: tuple[Loc, ...] = (
    ("state", "database_url"),
    ("state", "database_url_file"),
    ("state", "redis_url"),
    ("state", "redis_url_file"),
    ("state", "secret_key_file"),
    ("listen", "tls", "cert_file"),
    ("listen", "tls", "key_file"),
    ("listen", "tls", "ca_file"),
    ("auth", "oidc", "client_secret"),
    ("auth", "oidc", "client_secret_file"),
)
#: the fields that may instead be read from the file their ``_file`` twin names
FILE_TWINS: tuple[Loc, ...] = (("state", "database_url"), ("state", "redis_url"), ("auth", "oidc", "client_secret"))

#: ``$$`` or ``${...}``; a lone ``$`` is not matched and stays as written
_REFERENCE = re.compile(r"\$(?:\$|\{([^}]*)\})")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Resolved:
    """The mapping with every reference resolved, the problems found, and where each resolved value came from."""

    mapping: Mapping[str, Any]
    #: (the path to report the problem at, what is wrong); never a resolved value
    problems: list[tuple[Loc, str]] = field(default_factory=list)
    #: a field whose value was not written in the file -> (the path written in the file, where it came from,
    #: the value: only to be hidden from a message that would quote it)
    origins: dict[Loc, tuple[Loc, str, str]] = field(default_factory=dict)


def resolve_external(mapping: Mapping[str, Any], environ: Mapping[str, str]) -> Resolved:
    """Resolve ``${NAME}`` and the ``_file`` twins in a copy of ``mapping`` (the file's parsed YAML)."""
    data = copy.deepcopy(dict(mapping))
    out = Resolved(data)
    for loc in SUBSTITUTED:
        value = _get(data, loc)
        if not isinstance(value, str) or "$" not in value:
            continue
        names: list[str] = []
        text = _substitute(value, environ, loc, out, names)
        if text is not None:
            _set(data, loc, text)
            if names:
                out.origins[loc] = (loc, "from " + ", ".join(f"${{{n}}}" for n in names), text)
    for loc in FILE_TWINS:
        twin: Loc = (*loc[:-1], f"{loc[-1]}_file")
        path = _get(data, twin)
        if path is None:
            continue
        if _get(data, loc) is not None:
            out.problems.append((twin, f"set either {_dotted(loc)} or {_dotted(twin)}, not both"))
            continue
        if not isinstance(path, str) or not path:
            out.problems.append((twin, "must be the path of a file holding the value"))
            continue
        text = _read(path, twin, out)
        if text is not None:
            _pop(data, twin)
            _set(data, loc, text)
            out.origins[loc] = (twin, f"read from {path}", text)
    return out


def _substitute(value: str, environ: Mapping[str, str], loc: Loc, out: Resolved, names: list[str]) -> str | None:
    failed = False

    def one(match: re.Match[str]) -> str:
        nonlocal failed
        name = match.group(1)
        if name is None:  # $$
            return "$"
        if not _NAME.match(name):
            hint = "a name is letters, digits and _; write $$ for a literal $"
            out.problems.append((loc, f"${{{name}}} is not an environment variable reference: {hint}"))
            failed = True
            return ""
        if name not in environ:
            out.problems.append((loc, f"environment variable {name} is not set (referenced as ${{{name}}})"))
            failed = True
            return ""
        names.append(name)
        return environ[name]

    text = _REFERENCE.sub(one, value)
    return None if failed else text


def _read(path: str, twin: Loc, out: Resolved) -> str | None:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        out.problems.append((twin, f"cannot read {path}: no such file"))
        return None
    except PermissionError:
        out.problems.append((twin, f"cannot read {path}: permission denied (the server's user must be able to)"))
        return None
    except IsADirectoryError:
        out.problems.append((twin, f"cannot read {path}: it is a directory, not a file"))
        return None
    except UnicodeDecodeError:
        out.problems.append((twin, f"cannot read {path}: not UTF-8 text"))
        return None
    except OSError as exc:
        out.problems.append((twin, f"cannot read {path}: {exc.strerror or exc}"))
        return None
    text = text.rstrip("\r\n")
    if not text:
        out.problems.append((twin, f"{path} is empty"))
        return None
    return text


def _get(data: Mapping[str, Any], loc: Loc) -> Any:
    node: Any = data
    for key in loc:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _set(data: dict[str, Any], loc: Loc, value: str) -> None:
    node: Any = data
    for key in loc[:-1]:
        node = node[key]
    node[loc[-1]] = value


def _pop(data: dict[str, Any], loc: Loc) -> None:
    node: Any = data
    for key in loc[:-1]:
        node = node[key]
    del node[loc[-1]]


def _dotted(loc: Loc) -> str:
    return ".".join(str(k) for k in loc)
