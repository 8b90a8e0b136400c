"""``levers9 volume create/list/delete``, ``levers9 ls``, ``levers9 cp`` and ``levers9 rm``: a workspace's volumes.

A remote path is ``VOLUME:PATH`` (``weights:models/a.bin``; ``weights:`` or ``weights`` alone for the
root in ``ls``); anything else given to ``cp`` is a local path (write ``./a:b`` for a local file whose name
has a colon). ``cp`` copies both ways, a directory with ``-r``, each file whole or not at all (written to a
temporary and renamed), with a progress bar on stderr for files of :data:`PROGRESS_BYTES` or more. The
work is the SDK's (:class:`levers9.sdk.volumes.VolumeFiles`); errors exit 1 with the controlplane's words.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from levers9.cli.client_cmds import context_option, when
from levers9.cli.output import Col, err, failed, iso, out, print_json, print_table

if TYPE_CHECKING:
    from levers9.sdk.volumes import VolumeFiles

__all__ = ["app", "cp", "ls", "rm"]

#: files this big or bigger get a progress bar
PROGRESS_BYTES = 16 * 1024 * 1024
_REMOTE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62}):(.*)$", re.S)

T = TypeVar("T")
Progress = Callable[[int, int], None] | None

app = typer.Typer(
    help="Volumes: persistent files shared by a workspace's containers (see `levers9 ls`, `cp`, `rm`).",
    no_args_is_help=True,
)


def _guarded(action: Callable[[], T]) -> T:
    """``action``'s result; the SDK's errors (not found, refused, invalid, unreachable) exit 1, explained."""
    from levers9.sdk.errors import ControlPlaneError, InvalidFunction

    try:
        return action()
    except (FileNotFoundError, PermissionError, ValueError, InvalidFunction, ControlPlaneError) as exc:
        raise failed(str(exc)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _files(name: str, context: str | None) -> VolumeFiles:
    from levers9.sdk.volumes import VolumeFiles

    return _guarded(lambda: VolumeFiles(name, context=context))


def _remote(spec: str) -> tuple[str, str] | None:
    """(volume, path) of ``VOLUME:PATH``, or None for a local path."""
    found = _REMOTE.match(spec)
    if found is None or spec.startswith(("./", "/")):
        return None
    return found.group(1), found.group(2) or "/"


@app.command("create")
def create(name: str = typer.Argument(..., metavar="NAME"), context: str | None = context_option()) -> None:
    """Create a volume (a volume that exists is left as it is)."""
    files = _files(name, context)
    _guarded(files.get_or_create)
    out.print(f"volume {name} is ready", markup=False, highlight=False)


@app.command("list")
def list_(
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per volume."),
) -> None:
    """List the workspace's volumes."""
    from levers9.sdk.volumes import list_volumes

    found = _guarded(lambda: list_volumes(context))
    if as_json:
        print_json([{"name": name, "created_at": iso(created)} for name, created in found])
        return
    if not found:
        err.print("no volumes in this workspace (create one with `levers9 volume create NAME`)", markup=False)
        return
    now = time.time()
    print_table([Col("name"), Col("created")], ([name, when(created, now)] for name, created in found))


@app.command("delete")
def delete(
    name: str = typer.Argument(..., metavar="NAME"),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; delete the volume and every file in it."),
    context: str | None = context_option(),
) -> None:
    """Delete a volume and every file in it (the files are removed in the background)."""
    if not yes and not typer.confirm(f"delete volume {name} and every file in it?", err=True):
        raise typer.Exit(1)
    files = _files(name, context)
    _guarded(files.delete)
    out.print(f"deleted volume {name}", markup=False, highlight=False)


def ls(
    target: str = typer.Argument(..., metavar="VOLUME[:PATH]", help="A volume, or a path in one: weights:models"),
    recursive: bool = typer.Option(False, "--recursive", "-r", help="Every file below the path."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per entry."),
    context: str | None = context_option(),
) -> None:
    """List the files of a volume."""
    volume, path = _remote(target) or (target, "/")
    files = _files(volume, context)
    entries = _guarded(lambda: files.listdir(path, recursive=recursive))
    if as_json:
        print_json([{"path": e.path, "is_dir": e.is_dir, "size": e.size, "mtime": iso(e.mtime)} for e in entries])
        return
    now = time.time()
    print_table(
        [Col("path"), Col("size", justify="right"), Col("modified")],
        ([e.path + ("/" if e.is_dir else ""), "" if e.is_dir else str(e.size), when(e.mtime, now)] for e in entries),
    )


def rm(
    target: str = typer.Argument(..., metavar="VOLUME:PATH"),
    recursive: bool = typer.Option(False, "--recursive", "-r", help="Remove a directory and everything below it."),
    context: str | None = context_option(),
) -> None:
    """Remove a file or directory of a volume."""
    remote = _remote(target)
    if remote is None or remote[1] in ("", "/"):
        raise failed(
            f"{target!r}: name a path in a volume, VOLUME:PATH (removing a whole volume is `volume delete`)", 2
        )
    files = _files(remote[0], context)
    removed = _guarded(lambda: files.remove(remote[1], recursive=recursive))
    out.print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {target}", markup=False, highlight=False)


def cp(
    source: str = typer.Argument(..., metavar="SOURCE", help="A local path, or VOLUME:PATH"),
    destination: str = typer.Argument(..., metavar="DESTINATION", help="A local path, or VOLUME:PATH"),
    recursive: bool = typer.Option(False, "--recursive", "-r", help="Copy a directory and everything below it."),
    context: str | None = context_option(),
) -> None:
    """Copy files between this machine and a volume, either way: `cp a.bin weights:models/`, `cp weights:x .`"""
    src, dst = _remote(source), _remote(destination)
    if (src is None) == (dst is None):
        raise failed("one of SOURCE and DESTINATION must be a volume's path (VOLUME:PATH) and the other local", 2)
    if dst is not None:
        _upload(Path(source), dst[0], dst[1], recursive, context)
    else:
        assert src is not None
        _download(src[0], src[1], Path(destination), recursive, context)


def _upload(local: Path, volume: str, path: str, recursive: bool, context: str | None) -> None:
    if not local.exists():
        raise failed(f"{local}: no such file or directory")
    files = _files(volume, context)
    into_dir = path.endswith("/") or path in ("", "/")
    if local.is_dir():
        if not recursive:
            raise failed(f"{local} is a directory; copy it with -r", 2)
        base = path.rstrip("/") + "/" + local.name if into_dir else path
        pairs = [(f, f"{base}/{f.relative_to(local).as_posix()}") for f in sorted(local.rglob("*")) if f.is_file()]
    else:
        pairs = [(local, path.rstrip("/") + "/" + local.name if into_dir else path)]
    total = 0
    for file, remote_path in pairs:
        with _progress(file.name, file.stat().st_size) as update:

            def send(f: Path = file, r: str = remote_path, u: Progress = update) -> int:
                return files.upload(f, r, progress=u)

            total += _guarded(send)
    out.print(f"copied {len(pairs)} file(s), {total} bytes, to {volume}:{path}", markup=False, highlight=False)


def _download(volume: str, path: str, local: Path, recursive: bool, context: str | None) -> None:
    files = _files(volume, context)
    top = _guarded(lambda: files.listdir(path))
    single = len(top) == 1 and not top[0].is_dir and top[0].path == path.strip("/")
    if single:
        target = local / top[0].name if local.is_dir() else local
        pairs = [(top[0].path, target, top[0].size)]
    else:
        if not recursive:
            raise failed(f"{volume}:{path} is a directory; copy it with -r", 2)
        entries = _guarded(lambda: files.listdir(path, recursive=True))
        prefix = path.strip("/")
        base = local / (Path(prefix).name or volume) if local.is_dir() else local
        pairs = [(e.path, base / e.path[len(prefix) :].lstrip("/"), e.size) for e in entries]
    total = 0
    for remote_path, target, size in pairs:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _progress(target.name, size) as update:

            def fetch(r: str = remote_path, t: Path = target, u: Progress = update) -> int:
                return files.download(r, t, progress=u)

            total += _guarded(fetch)
    out.print(f"copied {len(pairs)} file(s), {total} bytes, to {local}", markup=False, highlight=False)


@contextmanager
def _progress(name: str, size: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for a big file; None (no bar) for a small one."""
    if size < PROGRESS_BYTES:
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=False,
    ) as bar:
        task = bar.add_task(name, total=size)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)

        yield update


def register(root: Any) -> None:
    """Add ``ls``, ``cp`` and ``rm`` to the top-level app (``volume`` is added as a group)."""
    root.command("ls")(ls)
    root.command("cp")(cp)
    root.command("rm")(rm)
