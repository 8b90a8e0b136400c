"""Files of one volume, reached only beneath its root: every path a user gives is resolved inside it.

A volume is a directory on the host (a JuiceFS mount's subdirectory, :mod:`levers9.volumes.juicefs`).
Users name files in it with paths of their own (``levers9 ls weights:models/a``, the SDK, a worker's
WebDAV mount), and a volume holds whatever its containers wrote, symbolic links included. So:

* a path is normalised lexically first: ``a/./b`` is ``a/b``, a leading ``/`` means the volume's root,
  and a ``..`` that would climb above the root is refused (:class:`PathEscapes`) before anything is
  opened;
* every open then goes through ``openat2(2)`` with ``RESOLVE_BENEATH`` from a descriptor of the root: the
  kernel refuses (``EXDEV``) an absolute symbolic link, or a relative one leading out of the root, at any
  component, with no window between a check and the open. A link that stays inside is followed;
* removing a tree uses descriptors only (``shutil.rmtree(dir_fd=)``), so a link inside it is removed,
  never followed.

Errors are :class:`VolumePathError` subclasses naming the path as the user gave it; nothing here
raises a bare ``OSError`` for a user's mistake. Linux 5.6 or later (openat2); standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "Entry",
    "NotADirectoryInVolume",
    "NotFoundInVolume",
    "PathEscapes",
    "VolumePathError",
    "VolumeRoot",
    "normalise",
]

#: the modes what is created here gets: every container of the workspace may change it, whichever runtime's
#: owner its mount squashes users to (levers9.volumes.juicefs)
FILE_MODE = 0o666
DIR_MODE = 0o777
_SYS_OPENAT2 = 437  # the same number on every architecture (it postdates the per-architecture tables)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


class VolumePathError(ValueError):
    """A path of a volume that cannot be used as asked; the message names it and says why."""


class PathEscapes(VolumePathError):
    """The path leads out of the volume (``..`` above its root, or a symbolic link pointing outside)."""


class NotFoundInVolume(VolumePathError):
    """Nothing is at the path."""


class NotADirectoryInVolume(VolumePathError):
    """The path (or one of its parents) is a file where a directory is needed."""


@dataclass(frozen=True)
class Entry:
    """A file, directory or symbolic link of a volume, as listings show it."""

    #: the path from the volume's root, without a leading slash ("" for the root)
    path: str
    is_dir: bool
    size: int
    #: seconds since the epoch
    mtime: float
    is_link: bool = False

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)


def normalise(path: str) -> str:
    """``path`` relative to the volume's root, lexically clean; raises PathEscapes for a ``..`` above the root."""
    if "\0" in path:
        raise VolumePathError(f"path {path!r}: holds a NUL character")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PathEscapes(f"path {path!r} leads out of the volume ('..' above its root)")
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _openat2(dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


class VolumeRoot:
    """The files beneath ``root``: list, stat, read, write, make directories, move and remove them."""

    def __init__(self, root: str | os.PathLike[str], *, owner: int | None = None) -> None:
        self.root = os.fspath(root)
        #: the uid (and gid) what is made here is given, when not the process's own (see :data:`FILE_MODE`)
        self.owner = owner

    # ----------------------------------------------------------------- opening

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open(self, given: str, rel: str, flags: int, mode: int = 0o644) -> int:
        with self._root_fd() as root:
            try:
                return _openat2(root, rel or ".", flags, mode)
            except OSError as exc:
                raise _translate(exc, given) from None

    # ----------------------------------------------------------------- reading

    def stat(self, path: str) -> Entry:
        """The entry at ``path`` (a link inside the volume is followed to what it names)."""
        rel = normalise(path)
        fd = self._open(path, rel, os.O_PATH)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return _entry(rel, st)

    def list(self, path: str = "") -> list[Entry]:
        """The entries of the directory at ``path``, sorted by name; a file's own entry when it is one."""
        rel = normalise(path)
        fd = self._open(path, rel, os.O_PATH)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return [_entry(rel, st)]
            entries = []
            names = os.listdir(_fd_path(fd))
            for name in sorted(names):
                with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                    child = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    entries.append(_entry(posixpath.join(rel, name), child))
            return entries
        finally:
            os.close(fd)

    def walk(self, path: str = "") -> Iterator[Entry]:
        """Every file beneath ``path`` (depth first, links not followed), or ``path`` itself when it is a file."""
        for entry in self.list(path):
            if entry.is_dir and entry.path != normalise(path):
                yield from self.walk(entry.path)
            elif not entry.is_dir:
                yield entry

    def open_read(self, path: str) -> BinaryIO:
        """``path`` open for reading; raises IsADirectory-style VolumePathError for a directory."""
        rel = normalise(path)
        fd = self._open(path, rel, os.O_RDONLY)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise VolumePathError(f"path {path!r} is a directory; name a file")
        return os.fdopen(fd, "rb")

    # ----------------------------------------------------------------- writing

    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Make the directory ``path`` (and, with ``parents``, those above it); an existing one is fine."""
        rel = normalise(path)
        if not rel:
            return
        parent, name = posixpath.split(rel)
        if parents and parent:
            self.mkdir(parent)
        fd = self._open(path, parent, os.O_PATH | os.O_DIRECTORY)
        try:
            os.mkdir(name, DIR_MODE, dir_fd=fd)
            _share(self._open(path, rel, os.O_RDONLY | os.O_DIRECTORY), DIR_MODE, self.owner)
        except FileExistsError:
            # there already: a directory, or a link resolved beneath the root like any other path
            try:
                os.close(self._open(path, rel, os.O_PATH | os.O_DIRECTORY))
            except NotADirectoryInVolume:
                raise NotADirectoryInVolume(f"path {path!r} exists and is not a directory") from None
        except OSError as exc:
            raise _translate(exc, path) from None
        finally:
            os.close(fd)

    def open_write(self, path: str, *, parents: bool = True) -> BinaryIO:
        """``path`` open for writing from its start, created (with its parent directories) or truncated."""
        rel = normalise(path)
        if not rel:
            raise VolumePathError(f"path {path!r} is the volume's root; name a file")
        parent = posixpath.dirname(rel)
        if parents and parent:
            self.mkdir(parent)
        fd = self._open(path, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        _share(os.dup(fd), FILE_MODE, self.owner)
        return os.fdopen(fd, "wb")

    def open_new(self, path: str) -> BinaryIO:
        """``path`` created for writing; refused when anything is there (a dangling link included: O_EXCL) or
        its parent directory is missing. What a temporary is made with, before it is moved over its target."""
        rel = normalise(path)
        if not rel:
            raise VolumePathError(f"path {path!r} is the volume's root; name a file")
        fd = self._open(path, rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        _share(os.dup(fd), FILE_MODE, self.owner)
        return os.fdopen(fd, "wb")

    def remove(self, path: str, *, recursive: bool = False) -> int:
        """Remove the file, link or (empty, or with ``recursive`` any) directory at ``path``; returns how many
        entries went. The root itself is emptied, never removed."""
        rel = normalise(path)
        parent, name = posixpath.split(rel)
        if not rel:
            if not recursive:
                raise VolumePathError(f"path {path!r} is the volume's root; removing all of it needs recursive")
            return sum(self.remove(entry.path, recursive=True) for entry in self.list(""))
        fd = self._open(path, parent, os.O_PATH | os.O_DIRECTORY)
        try:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _translate(exc, path) from None
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                return 1
            if not recursive:
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ENOTEMPTY:
                        raise VolumePathError(
                            f"path {path!r} is a directory that is not empty; remove it recursively (rm -r)"
                        ) from None
                    raise _translate(exc, path) from None
                return 1
            count = _count(fd, name)
            try:
                shutil.rmtree(name, dir_fd=fd)
            except OSError as exc:
                raise _translate(exc, path) from None
            return count
        finally:
            os.close(fd)

    def move(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` inside the volume, replacing a file there."""
        src, dst = normalise(source), normalise(target)
        if not src or not dst:
            raise VolumePathError("the volume's root cannot be moved, nor anything moved onto it")
        src_fd = self._open(source, posixpath.dirname(src), os.O_PATH | os.O_DIRECTORY)
        try:
            dst_fd = self._open(target, posixpath.dirname(dst), os.O_PATH | os.O_DIRECTORY)
            try:
                os.rename(posixpath.basename(src), posixpath.basename(dst), src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                raise _translate(exc, source) from None
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)


def _share(fd: int, mode: int, owner: int | None) -> None:
    """Give the open file or directory ``fd`` the mode ``mode`` whatever the process's umask, and ``owner`` when
    not None (then close ``fd``); one the caller may not change keeps its mode and owner."""
    try:
        if owner is not None:
            os.fchown(fd, owner, owner)
        os.fchmod(fd, mode)
    except PermissionError:
        pass
    finally:
        os.close(fd)


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _entry(rel: str, st: os.stat_result) -> Entry:
    return Entry(
        path=rel,
        is_dir=stat.S_ISDIR(st.st_mode),
        size=0 if stat.S_ISDIR(st.st_mode) else st.st_size,
        mtime=st.st_mtime,
        is_link=stat.S_ISLNK(st.st_mode),
    )


def _count(parent_fd: int, name: str) -> int:
    """Entries in the tree ``name`` (itself included), links not followed."""
    count = 1
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        for _root, dirs, files, _fd in os.fwalk(".", dir_fd=fd):
            count += len(dirs) + len(files)
    finally:
        os.close(fd)
    return count


def _translate(exc: OSError, path: str) -> VolumePathError:
    """The user's error for an ``OSError`` met at ``path``."""
    if exc.errno == errno.EXDEV:
        return PathEscapes(f"path {path!r} leads out of the volume (a symbolic link pointing outside it)")
    if exc.errno == errno.ELOOP:
        return PathEscapes(f"path {path!r} goes through too many symbolic links")
    if exc.errno == errno.ENOENT:
        return NotFoundInVolume(f"path {path!r}: no such file or directory in the volume")
    if exc.errno == errno.ENOTDIR:
        return NotADirectoryInVolume(f"path {path!r}: a part of it is a file, not a directory")
    if exc.errno == errno.EISDIR:
        return VolumePathError(f"path {path!r} is a directory; name a file")
    if exc.errno == errno.EEXIST:
        return VolumePathError(f"path {path!r} already exists")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return VolumePathError(
            f"path {path!r}: {exc.strerror}; its owner's mode does not let others change it (a container's "
            "umask 000 makes what it writes changeable by every runtime's containers)"
        )
    if exc.errno == errno.ENOSPC:
        return VolumePathError(f"path {path!r}: the volume's storage is full")
    return VolumePathError(f"path {path!r}: {exc.strerror}")
