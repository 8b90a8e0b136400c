"""``levers9.Blueprint``: the image a function runs in, written as a base and the steps built on it.

    image = (
        levers9.Blueprint(python_version="3.11")
        .apt_install(["jq"])
        .add_python_packages(["six"])
        .add_commands(["echo hi > /built"])
    )

A blueprint only describes: :meth:`Blueprint.spec` gives the
:class:`~levers9.blueprints.spec.BuildSpec` (whose keys name each layer) and
:meth:`Blueprint.local_files` the tars of the local files its copy steps add.
Nothing here talks to a controlplane.

Invariants:

- Steps run in the order they were added; the constructor adds its
  ``env_vars``, then its ``python_packages``, then its ``commands``. Every
  method returns the blueprint, so calls chain; each changes it in place.
- Everything is checked when it is given: a bad argument raises
  :class:`~levers9.blueprints.spec.BlueprintError` (a ``ValueError``) naming
  the argument (``python_packages[2]``, ``env_vars['1A=x']``) and what is
  accepted, at the line that passed it. A requirements file, a Dockerfile or
  a local path that is missing or unreadable is named in the error.
- Local files are read when :meth:`~Blueprint.spec`, :meth:`~Blueprint.key`
  or :meth:`~Blueprint.local_files` is asked for, so their key follows their
  content at that moment (and not their mtime). Which files a pattern
  matches is decided when :meth:`~Blueprint.add_local_path` is called; a
  directory it matched brings what it holds when the spec is made.
- Secrets are names of workspace secrets: :meth:`~Blueprint.with_secrets`
  makes them visible to every later ``run``, ``pip`` and ``apt`` step while
  it runs, ``add_commands(..., secrets=)`` to those commands alone; their
  values are never in the image, nor in the key.
- Environment variables are taken literally (``$PATH`` is not expanded): they
  are set for the steps after them and in the running container.
- Without a base image the base is Debian with the chosen Python
  (``"python3"``, the default, means 3.11); with one, it is that registry
  image, and ``python_version`` names the interpreter it holds, if given.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath

from levers9.blueprints.context import LocalCopy, LocalFiles
from levers9.blueprints.dockerfile import parse_dockerfile
from levers9.blueprints.spec import (
    Base,
    BlueprintError,
    BuildSpec,
    Step,
    check_path,
    check_python_version,
    check_ref,
    keys,
)

__all__ = ["DEFAULT_PYTHON", "DEFAULT_REMOTE_PATH", "Blueprint", "BlueprintError", "PythonVersion"]

#: the Python of a Debian base when none is named ("python3"): Debian 12's
DEFAULT_PYTHON = "3.11"
#: where add_local_path puts files when no remote_path is given
DEFAULT_REMOTE_PATH = "/app"


class PythonVersion(StrEnum):
    """The Python versions by name; any ``"3.N"`` or ``"python3.N"`` string is accepted as well."""

    Python3 = "python3"
    Python38 = "python3.8"
    Python39 = "python3.9"
    Python310 = "python3.10"
    Python311 = "python3.11"
    Python312 = "python3.12"
    Python313 = "python3.13"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REQUIREMENT_OPTION = re.compile(r"(?:^|\s)(-{1,2}[A-Za-z][A-Za-z-]*)")


def _python(field: str, value: object) -> str | None:
    """``"3.N"`` from the forms a user may write; None for "whatever python3 the image has"."""
    if isinstance(value, PythonVersion):
        value = value.value
    if not isinstance(value, str):
        raise BlueprintError(field, f"must be a string such as '3.11' or 'python3.11', not {type(value).__name__}")
    text = value.strip()
    if text in ("python3", "3"):
        return None
    try:
        return check_python_version(field, text.removeprefix("python"))
    except BlueprintError:
        raise BlueprintError(
            field, f"{value!r} is not a Python version: write '3.11', 'python3.11' or 'python3' (the default)"
        ) from None


def _strings(field: str, value: object, what: str) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise BlueprintError(field, f"must be a list of {what}, not {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise BlueprintError(f"{field}[{i}]", f"must be a string, not {type(item).__name__}")
    return list(value)


def _relabel(error: BlueprintError, field: str, *, one: bool = False) -> BlueprintError:
    """A step's own error (``args[2]``) named as the caller's argument (``python_packages[2]``).

    ``one``: the step holds one argument only (a command), which ``field`` names already.
    """
    if error.field == "args" or (one and error.field.startswith("args")):
        return BlueprintError(field, error.problem)
    if error.field.startswith("args["):
        return BlueprintError(field + error.field[4:], error.problem)
    return BlueprintError(f"{field}: {error.field}", error.problem)


def _env_pairs(field: str, env_vars: object) -> list[tuple[str, str]]:
    """(name, value) pairs from a ``"K=V"`` string, a list of them or a mapping, each checked."""
    items: list[tuple[str, object, object]] = []
    if isinstance(env_vars, Mapping):
        items = [(f"{field}[{k!r}]", k, v) for k, v in env_vars.items()]
    else:
        texts = [env_vars] if isinstance(env_vars, str) else _strings(field, env_vars, "'NAME=value' strings")
        for text in texts:
            where = f"{field}[{text!r}]" if len(text) <= 80 else f"{field}[{text[:77]!r}...]"
            name, sep, value = text.partition("=")
            if not sep:
                raise BlueprintError(where, "has no '=': write NAME=value")
            items.append((where, name, value))
    pairs: list[tuple[str, str]] = []
    for where, key, raw in items:
        if not isinstance(key, str) or not isinstance(raw, str):
            raise BlueprintError(where, "names and values must be strings")
        name, value = key, raw
        if not _NAME.fullmatch(name):
            raise BlueprintError(
                where, f"{name!r} is not a variable name: letters, digits and underscores, not starting with a digit"
            )
        if "\0" in value or "\n" in value or "\r" in value:
            raise BlueprintError(where, f"the value of {name} holds a NUL or newline, which an image's variable cannot")
        pairs.append((name, value))
    return pairs


def _secret_names(field: str, names: object) -> list[str]:
    if names is None:
        return []
    texts = [names] if isinstance(names, str) else _strings(field, names, "secret names")
    for i, name in enumerate(texts):
        if not _NAME.fullmatch(name) or len(name) > 255:
            raise BlueprintError(
                f"{field}[{i}]",
                f"{name!r} is not a secret name: 1-255 letters, digits and underscores, not starting with a digit",
            )
    return texts


def read_requirements(path: Path, field: str = "python_packages") -> tuple[list[str], str | None]:
    """The requirements in a requirements file and the index it names (``-i``), following ``-r`` includes.

    Comments, blank lines and ``\\`` continuations are handled as pip does;
    any other pip option is refused naming the file and line.
    """
    requirements: list[str] = []
    index: list[str | None] = [None]
    _read_requirements(path, field, requirements, index, seen=set())
    return requirements, index[0]


def _read_requirements(path: Path, field: str, out: list[str], index: list[str | None], seen: set[Path]) -> None:
    resolved = path.resolve()
    if resolved in seen:
        raise BlueprintError(field, f"{path} includes itself (through -r)")
    seen.add(resolved)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BlueprintError(field, f"the requirements file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise BlueprintError(field, f"cannot read the requirements file {path}: {why}") from None
    joined = re.sub(r"\\\r?\n", "", text)
    for number, raw in enumerate(joined.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        where = f"{field}: {path} line {number}"
        option, _, value = line.partition(" ")
        if option.startswith("-") and "=" in option:
            option, _, value = line.partition("=")
        value = value.strip()
        if option in ("-r", "--requirement"):
            if not value:
                raise BlueprintError(where, f"{option} names no file")
            _read_requirements(path.parent / value, field, out, index, seen)
        elif option in ("-i", "--index-url"):
            if not value:
                raise BlueprintError(where, f"{option} names no index")
            if index[0] is not None and index[0] != value:
                raise BlueprintError(where, f"a second index {value!r}: one pip step uses one index ({index[0]!r})")
            index[0] = value
        elif line.startswith("-"):
            raise BlueprintError(
                where,
                f"{option} is not supported in a blueprint's requirements: requirements, -r FILE and "
                "-i/--index-url URL are (add an apt or run step for what the option did)",
            )
        else:
            inline = _REQUIREMENT_OPTION.search(line)
            if inline is not None:
                raise BlueprintError(
                    where, f"{inline[1]} after a requirement is not supported: write the requirement alone"
                )
            out.append(line)


@dataclass(frozen=True)
class _PendingCopy:
    """An ``add_local_path`` whose pattern is matched when the blueprint is resolved (built), not when added."""

    dest: str
    pattern: str
    posix: PurePosixPath
    root: Path

    def resolve(self) -> LocalCopy:
        posix = PurePosixPath("*") if str(self.posix) == "." else self.posix
        if glob.has_magic(str(posix)):
            found = sorted(glob.glob(str(posix), root_dir=self.root, recursive=True))
        else:
            found = [str(posix)] if (self.root / posix).exists() or (self.root / posix).is_symlink() else []
        if not found:
            raise BlueprintError("pattern", f"{self.pattern!r} matches nothing in {self.root}")
        entries = tuple((PurePosixPath(Path(f).as_posix()).as_posix(), self.root / f) for f in found)
        return LocalCopy(self.dest, LocalFiles(f"add_local_path({self.pattern!r})", entries))


class Blueprint:
    """A container image: a base (Debian with Python, or a registry's image) and steps run on it in order."""

    def __init__(
        self,
        python_version: str | PythonVersion = PythonVersion.Python3,
        python_packages: Sequence[str] | str = (),
        commands: Sequence[str] = (),
        base_image: str | None = None,
        base_image_creds: Sequence[str] | None = None,
        env_vars: str | Sequence[str] | Mapping[str, str] | None = None,
    ) -> None:
        """``python_packages`` is a list of requirements or the path of a requirements file;
        ``base_image`` a registry reference (``registry.example:5000/team/python:3.11``);
        ``base_image_creds`` the names of workspace secrets holding its registry credentials;
        ``env_vars`` a ``"NAME=value"`` string, a list of them or a mapping."""
        self._python = _python("python_version", python_version)
        self._ref: str | None = None
        self._credentials: tuple[str, ...] = ()
        self._steps: list[Step | LocalCopy | _PendingCopy] = []
        self._secrets: list[str] = []
        if base_image is not None:
            self._ref = check_ref("base_image", base_image)
        if base_image_creds is not None:
            if isinstance(base_image_creds, Mapping):
                raise BlueprintError(
                    "base_image_creds",
                    "takes the names of workspace secrets, not values: create them with "
                    "`levers9 secret create NAME` and pass the names",
                )
            if self._ref is None:
                raise BlueprintError("base_image_creds", "only a base_image has registry credentials")
            self._credentials = tuple(_secret_names("base_image_creds", base_image_creds))
        self._base()  # checks the base as a whole (credentials' count, repeats)
        if env_vars is not None:
            self._add_env(_env_pairs("env_vars", env_vars))
        if isinstance(python_packages, str):
            self._add_requirements_file("python_packages", python_packages)
        else:
            self._add_pip("python_packages", _strings("python_packages", python_packages, "requirements"), None)
        self._add_commands("commands", commands, ())

    # the base

    def _base(self) -> Base:
        try:
            if self._ref is None:
                return Base("debian", python_version=self._python or DEFAULT_PYTHON)
            return Base("registry", python_version=self._python, ref=self._ref, credentials=self._credentials)
        except BlueprintError as e:
            field = e.field.replace("credentials", "base_image_creds", 1)
            raise BlueprintError(field, e.problem) from None

    @classmethod
    def from_registry(cls, ref: str, credentials: Sequence[str] | None = None) -> Blueprint:
        """A blueprint on the image ``ref`` of a registry; ``credentials`` names the secrets that log in to it."""
        return cls(base_image=ref, base_image_creds=credentials)

    @classmethod
    def from_dockerfile(
        cls, path: str | os.PathLike[str], context_dir: str | os.PathLike[str] | None = None
    ) -> Blueprint:
        """A blueprint read from a Dockerfile (the subset :mod:`levers9.blueprints.dockerfile` lists).

        COPY sources are read from ``context_dir``, the Dockerfile's directory by default.
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise BlueprintError("path", f"the Dockerfile {file} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
            raise BlueprintError("path", f"cannot read the Dockerfile {file}: {why}") from None
        context = Path(context_dir) if context_dir is not None else file.parent
        if not context.is_dir():
            raise BlueprintError("context_dir", f"{context} is not a directory")
        base, steps = parse_dockerfile(text, context, name=str(file))
        blueprint = cls(base_image=base.ref)
        blueprint._steps.extend(steps)
        return blueprint

    def add_python_version(self, python_version: str | PythonVersion) -> Blueprint:
        """Use this Python: ``"3.11"``, ``"python3.11"`` or :class:`PythonVersion`."""
        self._python = _python("python_version", python_version)
        return self

    # steps

    def _add(self, step: Step) -> None:
        self._steps.append(step)

    def _step_secrets(self, extra: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(set(self._secrets) | set(extra)))

    def _add_pip(self, field: str, packages: list[str], index_url: str | None) -> None:
        packages = [p.strip() for p in packages]
        if not packages:
            return
        try:
            self._add(Step("pip", tuple(packages), secrets=self._step_secrets(()), index_url=index_url))
        except BlueprintError as e:
            raise _relabel(e, field) from None

    def _add_requirements_file(self, field: str, path: str) -> None:
        packages, index_url = read_requirements(Path(path), field)
        self._add_pip(field, packages, index_url)

    def _add_commands(self, field: str, commands: Sequence[str] | str, secrets: Sequence[str]) -> None:
        texts = [commands] if isinstance(commands, str) else _strings(field, commands, "shell commands")
        for i, command in enumerate(texts):
            try:
                self._add(Step("run", (command,), secrets=self._step_secrets(secrets)))
            except BlueprintError as e:
                raise _relabel(e, f"{field}[{i}]", one=True) from None

    def _add_env(self, pairs: list[tuple[str, str]]) -> None:
        if pairs:
            self._add(Step("env", env=tuple(pairs)))

    def add_python_packages(self, packages: Sequence[str] | str) -> Blueprint:
        """Install these requirements with pip (one step), or those of the requirements file at this path."""
        if isinstance(packages, str):
            self._add_requirements_file("packages", packages)
        else:
            self._add_pip("packages", _strings("packages", packages, "requirements"), None)
        return self

    def add_commands(self, commands: Sequence[str] | str, secrets: Sequence[str] | None = None) -> Blueprint:
        """Run these shell commands, one step each; ``secrets`` are seen by these commands alone."""
        self._add_commands("commands", commands, _secret_names("secrets", secrets))
        return self

    def apt_install(self, packages: Sequence[str] | str) -> Blueprint:
        """Install these Debian packages with apt (one step)."""
        names = [packages] if isinstance(packages, str) else _strings("packages", packages, "Debian packages")
        if names:
            try:
                self._add(Step("apt", tuple(n.strip() for n in names), secrets=self._step_secrets(())))
            except BlueprintError as e:
                raise _relabel(e, "packages") from None
        return self

    def with_envs(self, env_vars: str | Sequence[str] | Mapping[str, str], clear: bool = False) -> Blueprint:
        """Set variables for the steps after this one and in the running container.

        ``clear=True`` drops every variable set so far by this blueprint (its
        earlier env steps, wherever they were): they no longer apply to any
        step nor to the container.
        """
        pairs = _env_pairs("env_vars", env_vars)
        if clear:
            self._steps = [s for s in self._steps if not (isinstance(s, Step) and s.op == "env")]
        self._add_env(pairs)
        return self

    def with_secrets(self, secrets: Sequence[str] | str) -> Blueprint:
        """Let every later run, pip and apt step see these workspace secrets while it runs."""
        for name in _secret_names("secrets", secrets):
            if name not in self._secrets:
                self._secrets.append(name)
        return self

    def add_local_path(self, pattern: str = "*", remote_path: str | None = None) -> Blueprint:
        """Copy the local files matching ``pattern`` into the image under ``remote_path`` (``/app``).

        ``pattern`` is a glob relative to the current directory (``**`` spans
        directories); a matched file keeps its path relative to it
        (``src/a.py`` lands at ``/app/src/a.py``), a matched directory
        brings everything below it. As in a shell, ``*`` matches no name
        starting with ``.``: name those explicitly. The files are looked for
        when the blueprint is built, not here, so a module that makes its
        blueprint where they are not (a container importing it) does not fail.
        """
        dest = DEFAULT_REMOTE_PATH if remote_path is None else remote_path
        check_path("remote_path", dest)
        if not isinstance(pattern, str) or not pattern:
            raise BlueprintError("pattern", "must be a non-empty glob, e.g. '*' or 'src/**/*.py'")
        posix = PurePosixPath(Path(pattern).as_posix())
        if posix.is_absolute() or ".." in posix.parts:
            raise BlueprintError("pattern", f"{pattern!r} must be relative to the current directory and inside it")
        self._steps.append(_PendingCopy(dest, pattern, posix, Path.cwd()))
        return self

    # what it makes

    def _resolve(self) -> tuple[BuildSpec, dict[str, LocalFiles]]:
        steps: list[Step] = []
        files: dict[str, LocalFiles] = {}
        for item in self._steps:
            if isinstance(item, _PendingCopy):
                item = item.resolve()
            if isinstance(item, LocalCopy):
                step = item.step()
                assert step.content is not None
                files[step.content] = item.files
                steps.append(step)
            else:
                steps.append(item)
        return BuildSpec(self._base(), tuple(steps)), files

    def spec(self) -> BuildSpec:
        """The build spec, local files read now for their digests."""
        return self._resolve()[0]

    def local_files(self) -> dict[str, LocalFiles]:
        """The files of each copy step by their content digest: ``files.write(out)`` or ``files.tar()`` gives
        the bytes to upload, which hash to that digest while the files stay as they are."""
        return self._resolve()[1]

    @property
    def key(self) -> str:
        """The image's key: the last of :func:`~levers9.blueprints.spec.keys` of the spec."""
        return keys(self.spec())[-1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Blueprint):
            return NotImplemented
        return self.spec() == other.spec()

    __hash__ = None  # type: ignore[assignment]  # it changes in place

    def __repr__(self) -> str:
        base = self._ref or f"debian, python {self._python or DEFAULT_PYTHON}"
        return f"Blueprint({base}, {len(self._steps)} steps)"

    def __str__(self) -> str:
        return repr(self)
