"""A blueprint read from a Dockerfile: the subset of instructions that map onto build steps.

Supported, each becoming what a blueprint method would make:

- ``FROM ref [AS name]``: a registry base (``ref`` as :func:`~levers9.blueprints.spec.check_ref`
  accepts it: a registry host and a tag or digest). Exactly one, before anything else; ``FROM scratch``,
  ``--platform`` and a second ``FROM`` (multi-stage builds) are refused.
- ``RUN cmd`` (shell form) and ``RUN ["prog", "arg"]`` (exec form, run as the
  shell-quoted command, so nothing in it is expanded): a run step. ``RUN``
  flags (``--mount``, ``--network``) are refused.
- ``ENV K=V K2="V 2"`` and the legacy ``ENV K V``: one env step for the
  instruction, in order.
- ``WORKDIR path``: a workdir step, a relative path taken from the one before
  (``/`` at first).
- ``COPY src... dest`` (also the JSON form): a copy step of local files, the
  sources relative to the context directory (globs as in ``*.py``, hidden
  files included), ``dest`` relative to the current workdir. As Docker does:
  a directory source brings its contents; one file to a ``dest`` not ending
  in ``/`` takes that name; several sources need a directory ``dest``.
  ``--from``, ``--chown`` and other flags are refused, as is a source outside
  the context directory or matching nothing.

``$NAME`` and ``${NAME}`` in ENV, WORKDIR and COPY are replaced by what an
earlier ENV of the same Dockerfile set; a variable it did not set (one of the
base image's, like ``PATH``) is refused rather than left to mean something
else, and so are ``${NAME:-default}`` forms. Quotes and backslashes group and
escape as in Docker; single quotes expand nothing. RUN commands are left to
the shell.

Lines: ``#`` comments, blank lines, ``\\`` line continuations (a comment or
blank line inside one is skipped, the backslash and newline removed);
instruction names in any case; a ``# escape=`` directive other than ``\\``
is refused. A context directory holding a ``.dockerignore`` is refused when
a COPY reads it: that file is not read here, and what it kept out (``.env``,
keys) must not reach an image by surprise.

Everything else (ADD, ARG, CMD, ENTRYPOINT, USER, EXPOSE, VOLUME, LABEL,
HEALTHCHECK, ONBUILD, SHELL, STOPSIGNAL, MAINTAINER) is refused with a
:class:`~levers9.blueprints.spec.BlueprintError` naming the line, the
instruction and what is supported: nothing in a Dockerfile is silently
dropped.
"""

from __future__ import annotations

import glob
import json
import posixpath
import re
import shlex
from pathlib import Path

from levers9.blueprints.context import LocalCopy, LocalFiles
from levers9.blueprints.spec import Base, BlueprintError, Step

__all__ = ["SUPPORTED", "parse_dockerfile"]

SUPPORTED = ("FROM", "RUN", "ENV", "WORKDIR", "COPY")
_KNOWN = (
    "ADD",
    "ARG",
    "CMD",
    "ENTRYPOINT",
    "USER",
    "EXPOSE",
    "VOLUME",
    "LABEL",
    "HEALTHCHECK",
    "ONBUILD",
    "SHELL",
    "STOPSIGNAL",
    "MAINTAINER",
)
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIRECTIVE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")


def _lines(text: str) -> list[tuple[int, str]]:
    """The logical lines: (first physical line number, text with continuations joined), comments dropped."""
    out: list[tuple[int, str]] = []
    physical = text.splitlines()
    start = 0
    pending: list[str] = []
    directives_open = True
    for number, raw in enumerate(physical, start=1):
        stripped = raw.strip()
        if directives_open and not pending:
            directive = _DIRECTIVE.fullmatch(stripped)
            if directive and directive[1].lower() == "escape":
                if directive[2] != "\\":
                    raise BlueprintError(
                        f"Dockerfile line {number}",
                        f"the escape directive {directive[2]!r} is not supported: only the default '\\'",
                    )
                continue
            if directive and directive[1].lower() in ("syntax", "check"):
                continue
            directives_open = False
        if stripped.startswith("#") or (pending and not stripped):
            continue
        if not stripped:
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        out.append((start, "".join(pending).strip()))
        pending = []
    if pending:
        out.append((start, "".join(pending).strip()))
    return out


def _words(where: str, text: str, env: dict[str, str]) -> list[str]:
    """``text`` split into words as Docker does, quotes removed and earlier ENV variables substituted."""
    words: list[str] = []
    word: list[str] = []
    in_word = False
    quote: str | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote is None and c.isspace():
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            i += 1
            continue
        in_word = True
        if c == "\\" and quote != "'" and i + 1 < len(text):
            word.append(text[i + 1])
            i += 2
        elif c in "\"'" and quote in (None, c):
            quote = None if quote == c else c
            i += 1
        elif c == "$" and quote != "'":
            value, i = _expand(where, text, i, env)
            word.append(value)
        else:
            word.append(c)
            i += 1
    if quote is not None:
        raise BlueprintError(where, f"a {quote} quote is not closed")
    if in_word:
        words.append("".join(word))
    return words


def _expand(where: str, text: str, i: int, env: dict[str, str]) -> tuple[str, int]:
    """The value of the variable named at ``text[i]`` (a ``$``) and the index after it."""
    if text.startswith("${", i):
        end = text.find("}", i)
        name = text[i + 2 : end] if end >= 0 else text[i + 2 :]
        after = end + 1
        if end < 0 or not _VAR.fullmatch(name):
            raise BlueprintError(
                where, f"'${{{name}' is not supported: only $NAME and ${{NAME}} of a variable an earlier ENV set"
            )
    else:
        match = _VAR.match(text, i + 1)
        if match is None:
            return "$", i + 1
        name, after = match[0], match.end()
    if name not in env:
        raise BlueprintError(
            where,
            f"${name} is not set by an earlier ENV of this Dockerfile; variables of the base image are not "
            "expanded here, so write the value out",
        )
    return env[name], after


def _json_form(text: str) -> list[str] | None:
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return value
    return None


def _flags(where: str, text: str, instruction: str) -> None:
    if text.startswith("--"):
        flag = text.split(None, 1)[0].split("=", 1)[0]
        raise BlueprintError(where, f"{instruction} {flag} is not supported: {instruction} takes no flags here")


def parse_dockerfile(text: str, context_dir: Path, name: str = "Dockerfile") -> tuple[Base, list[Step | LocalCopy]]:
    """The base and the steps ``text`` describes; COPY sources are read from ``context_dir``.

    ``name`` is how messages call the file. A copy step comes back as a
    :class:`~levers9.blueprints.context.LocalCopy` (its digest is taken when the spec is made).
    """
    base: Base | None = None
    steps: list[Step | LocalCopy] = []
    env: dict[str, str] = {}
    workdir = "/"
    for number, line in _lines(text):
        keyword, _, rest = line.replace("\t", " ").partition(" ")
        rest = line[len(keyword) :].strip()
        instruction = keyword.upper()
        where = f"{name} line {number} ({instruction})"
        if instruction not in SUPPORTED:
            known = "" if instruction in _KNOWN else " (not a Dockerfile instruction)"
            raise BlueprintError(
                where, f"{instruction}{known} is not supported: a blueprint's Dockerfile may use {', '.join(SUPPORTED)}"
            )
        if base is None and instruction != "FROM":
            raise BlueprintError(where, "the first instruction must be FROM")
        if not rest:
            raise BlueprintError(where, f"{instruction} needs an argument")
        try:
            if instruction == "FROM":
                if base is not None:
                    raise BlueprintError(where, "a second FROM: multi-stage builds are not supported")
                base = _from(where, rest)
            elif instruction == "RUN":
                _flags(where, rest, "RUN")
                argv = _json_form(rest)
                if argv is not None and not argv:
                    raise BlueprintError(where, "the exec form names no program")
                steps.append(Step("run", (shlex.join(argv) if argv is not None else rest,)))
            elif instruction == "ENV":
                pairs = _env(where, rest, env)
                env.update(pairs)
                steps.append(Step("env", env=tuple(pairs)))
            elif instruction == "WORKDIR":
                words = _words(where, rest, env)
                if len(words) != 1:
                    raise BlueprintError(where, f"WORKDIR takes one path, not {len(words)}")
                workdir = _absolute(workdir, words[0])
                steps.append(Step("workdir", (workdir,)))
            else:
                steps.append(_copy(where, rest, env, workdir, context_dir))
        except BlueprintError as e:
            if e.field.startswith(where):
                raise
            raise BlueprintError(where, f"{e.field}: {e.problem}") from None
    if base is None:
        raise BlueprintError(name, "has no FROM instruction: a blueprint's Dockerfile starts with FROM <image>")
    return base, steps


def _from(where: str, rest: str) -> Base:
    _flags(where, rest, "FROM")
    words = rest.split()
    if len(words) == 3 and words[1].upper() == "AS":
        words = words[:1]
    if len(words) != 1:
        raise BlueprintError(where, "write FROM <image> or FROM <image> AS <name>")
    if words[0] == "scratch":
        raise BlueprintError(where, "FROM scratch is not supported: start from an image with a shell")
    return Base("registry", ref=words[0])


def _env(where: str, rest: str, env: dict[str, str]) -> list[tuple[str, str]]:
    first = rest.split(None, 1)[0]
    if "=" not in first:
        # the legacy form: ENV NAME the rest of the line
        key = first
        value = rest[len(first) :].strip()
        if not value:
            raise BlueprintError(where, f"ENV {key} has no value: write ENV {key}=value")
        pairs = [(key, " ".join(_words(where, value, env)))]
    else:
        # as in Docker, a variable set earlier in the same ENV is not seen by those after it
        pairs = []
        for word in _words(where, rest, env):
            key, sep, value = word.partition("=")
            if not sep:
                raise BlueprintError(where, f"{word!r} is not NAME=value: in one ENV, every word is")
            pairs.append((key, value))
    for key, _ in pairs:
        if not _VAR.fullmatch(key):
            raise BlueprintError(where, f"{key!r} is not a variable name: letters, digits and underscores")
    return pairs


def _absolute(workdir: str, path: str) -> str:
    joined = posixpath.normpath(posixpath.join(workdir, path))
    return "/" + joined.lstrip("/")


def _copy(where: str, rest: str, env: dict[str, str], workdir: str, context_dir: Path) -> LocalCopy:
    if rest.startswith("--"):
        flag = rest.split(None, 1)[0].split("=", 1)[0]
        why = {
            "--from": "copying from another stage or image is not supported",
            "--chown": "files are added owned by root; change their owner in a RUN after",
            "--chmod": "files keep their local modes; change them in a RUN after",
        }.get(flag, "COPY takes no flags here")
        raise BlueprintError(where, f"COPY {flag} is not supported: {why}")
    argv = _json_form(rest)
    words = argv if argv is not None else _words(where, rest, env)
    if len(words) < 2:
        raise BlueprintError(where, "write COPY <source>... <destination>")
    *sources, dest = words
    if (context_dir / ".dockerignore").exists():
        raise BlueprintError(
            where,
            f"{context_dir / '.dockerignore'} exists and is not read here: COPY would add what it keeps out. "
            "Remove it, or use a context directory without one",
        )
    root = context_dir.resolve()
    matched: list[Path] = []
    for source in sources:
        relative = posixpath.normpath(source.lstrip("/")) if source.strip("/") else "."
        if relative == ".." or relative.startswith("../"):
            raise BlueprintError(where, f"{source!r} is outside the context directory {context_dir}")
        if glob.has_magic(relative):
            found = sorted(glob.glob(relative, root_dir=root, include_hidden=True))
            if not found:
                raise BlueprintError(where, f"{source!r} matches nothing in the context directory {context_dir}")
            matched.extend(root / f for f in found)
        else:
            path = root / relative if relative != "." else root
            if not path.exists() and not path.is_symlink():
                raise BlueprintError(where, f"{source!r} does not exist in the context directory {context_dir}")
            matched.append(path)
    for path in matched:
        # a source is read through no symlink that leads out of the context (one it names is copied as a link)
        if not _inside(root, path.parent.resolve() if path.is_symlink() else path.resolve()):
            raise BlueprintError(where, f"{path} leads outside the context directory {context_dir}")
    as_directory = dest.endswith("/") or len(matched) > 1 or (len(matched) == 1 and _is_dir(matched[0]))
    target = _absolute(workdir, dest)
    entries: list[tuple[str, Path]] = []
    if not as_directory:
        target, file_name = posixpath.split(target)
        target = target or "/"
        if not file_name:
            raise BlueprintError(where, f"{dest!r} names no file to copy {sources[0]!r} to")
        entries.append((file_name, matched[0]))
    else:
        for path in matched:
            if _is_dir(path):
                entries.extend((child.name, child) for child in sorted(path.iterdir()))
            else:
                entries.append((path.name, path))
    return LocalCopy(target, LocalFiles(where, tuple(entries)))


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def _is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()
