"""Local files a copy step adds to an image, as a deterministic tar and its digest.

A :class:`LocalFiles` maps names (paths relative to the copy step's
destination, ``src/app.py``) to local paths; a directory brings everything
below it. :meth:`LocalFiles.write` writes them as a tar whose bytes depend on
the names, the contents, the file types, the ``rwx`` bits and symlink
targets only, and :meth:`LocalFiles.digest` is the ``sha256:<hex>`` of those
bytes: the copy step's ``content``, and so part of its key.

Invariants of the tar:

- members sorted by name (compared as path components), each name once (a
  later entry for the same name replaces an earlier one, as a later COPY
  source does); a name's parent directories are members too, before it;
- every member has mtime 0, uid and gid 0, empty uname and gname, and its
  mode's ``rwx`` bits only (no setuid, setgid or sticky);
- regular files, directories and symlinks only: a symlink stays a symlink
  (its target as written, not followed); a device, FIFO or socket is refused
  with :class:`~levers9.blueprints.spec.BlueprintError` naming it, as is a
  path that is missing or cannot be read;
- PAX format, UTF-8 names. The bytes are what this Python's :mod:`tarfile`
  writes; another version writing them differently only costs a cache miss.

The digest is of the files as they are when it is taken: a file changed
before :meth:`~LocalFiles.write` makes a tar of another digest, which a
receiver that checks what it stores refuses.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from levers9.blueprints.spec import BlueprintError, Step

__all__ = ["LocalCopy", "LocalFiles"]


def check_name(origin: str, name: str) -> str:
    """``name`` when it is a relative, normalized POSIX path inside its destination, else BlueprintError."""
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        raise BlueprintError(origin, f"{name!r} is not a path inside the destination (relative, no '.' or '..')")
    if "\0" in name or "\n" in name:
        raise BlueprintError(origin, f"{name!r} holds a NUL or newline")
    return name


@dataclass(frozen=True)
class _Member:
    name: str
    path: Path | None  # None: a parent directory only implied by a deeper name
    st: os.stat_result | None


@dataclass(frozen=True)
class LocalFiles:
    """Local paths under the names they take in the image; ``origin`` names who asked, for errors."""

    origin: str
    entries: tuple[tuple[str, Path], ...]

    def __post_init__(self) -> None:
        for name, _ in self.entries:
            check_name(self.origin, name)

    def _lstat(self, path: Path) -> os.stat_result:
        try:
            return path.lstat()
        except FileNotFoundError:
            raise BlueprintError(self.origin, f"{path} does not exist") from None
        except OSError as e:
            raise BlueprintError(self.origin, f"cannot read {path}: {e.strerror}") from None

    def _walk(self, name: str, path: Path) -> Iterator[_Member]:
        st = self._lstat(path)
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            yield _Member(name, path, st)
        elif stat.S_ISDIR(st.st_mode):
            yield _Member(name, path, st)
            try:
                children = sorted(os.listdir(path))
            except OSError as e:
                raise BlueprintError(self.origin, f"cannot list {path}: {e.strerror}") from None
            for child in children:
                yield from self._walk(f"{name}/{child}", path / child)
        else:
            raise BlueprintError(
                self.origin,
                f"{path} is not a regular file, directory or symlink (a device, FIFO or socket): "
                "remove it or name only what the image needs",
            )

    def members(self) -> list[_Member]:
        """Every member of the tar, in order, stat'ed now."""
        by_name: dict[str, _Member] = {}
        for name, path in self.entries:
            for member in self._walk(name, path):
                by_name[member.name] = member
        for name in list(by_name):
            for parent in PurePosixPath(name).parents:
                key = str(parent)
                if key != "." and key not in by_name:
                    by_name[key] = _Member(key, None, None)
        return [by_name[n] for n in sorted(by_name, key=lambda n: n.split("/"))]

    def write(self, out: IO[bytes]) -> None:
        """Write the deterministic tar of these files to ``out``."""
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
            for member in self.members():
                info = tarfile.TarInfo(member.name)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if member.st is None or member.path is None:
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                    continue
                info.mode = stat.S_IMODE(member.st.st_mode) & 0o777
                if stat.S_ISDIR(member.st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISLNK(member.st.st_mode):
                    info.type = tarfile.SYMTYPE
                    try:
                        info.linkname = os.readlink(member.path)
                    except OSError as e:
                        raise BlueprintError(self.origin, f"cannot read {member.path}: {e.strerror}") from None
                    tar.addfile(info)
                else:
                    self._add_file(tar, info, member.path)

    def _add_file(self, tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path) -> None:
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                info.size = size
                tar.addfile(info, _Exactly(f, size, path, self.origin))
        except OSError as e:
            raise BlueprintError(self.origin, f"cannot read {path}: {e.strerror}") from None

    def tar(self) -> bytes:
        """The tar, in memory."""
        buffer = io.BytesIO()
        self.write(buffer)
        return buffer.getvalue()

    def digest(self) -> str:
        """``sha256:<hex>`` of the tar, computed as it is written (nothing held in memory)."""
        sink = _Hashing()
        self.write(sink)  # type: ignore[arg-type]
        return "sha256:" + sink.hash.hexdigest()


class _Exactly:
    """A file read as exactly ``size`` bytes: one that changed size while being read is an error, not a bad tar."""

    def __init__(self, f: IO[bytes], size: int, path: Path, origin: str) -> None:
        self._f, self._left, self._path, self._origin = f, size, path, origin

    def read(self, n: int = -1) -> bytes:
        want = self._left if n < 0 else min(n, self._left)
        data = self._f.read(want)
        if len(data) < want:
            raise BlueprintError(self._origin, f"{self._path} shrank while it was being read; try again")
        self._left -= len(data)
        return data


class _Hashing:
    """A write-only file that hashes what it is given."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


@dataclass(frozen=True)
class LocalCopy:
    """A copy step before its digest is taken: local files, and the image directory they land in."""

    dest: str
    files: LocalFiles

    def step(self) -> Step:
        """The copy step, its content the digest of the files as they are now."""
        try:
            return Step("copy", (self.dest,), content=self.files.digest())
        except BlueprintError as e:
            if e.field == self.files.origin:
                raise
            raise BlueprintError(self.files.origin, f"destination {e.problem}") from None
