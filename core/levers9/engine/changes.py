"""A container's changes as an OCI layer: its overlay upper directory, written as a tar.

A container's root filesystem is an overlay (:mod:`levers9.engine.rootfs`) whose
upper directory holds exactly what the container changed: new and modified
files, a character device 0/0 for each file it deleted, and an ``opaque``
extended attribute on each directory it replaced whole. :func:`write_changes`
writes that directory as the uncompressed layer tar an image lists, in the OCI
form: a deleted ``name`` becomes an empty ``.wh.name``, an opaque directory gets
a ``.wh..wh..opq`` member, and everything else is kept as it is (hard links
within the layer as hard links, symlinks unresolved).

Invariants:

- nothing is followed or resolved: the upper directory belongs to an exited
  container, and a symlink in it is written as a symlink, never read through;
  files are opened with ``O_NOFOLLOW``;
- owners are the container's view: a container in a user namespace wrote
  through ids shifted by its mapping, so ``id_shift``/``id_count`` shift them
  back (uid ``shift + n`` is ``n``; an id outside the mapping, which the
  container saw as its overflow id, is written as 65534);
- members come sorted by path, parents first, so the same upper directory
  gives the same member order;
- the runtime's own mount points (``mount_points``: the container's mount
  destinations) are left out when they are an empty directory or file, which
  is all a runtime makes there: they are not the container's changes;
- only ``user.*`` (but not ``user.overlay.*``) and ``security.capability``
  extended attributes are kept, the ones :mod:`levers9.engine.layers` restores;
  a file capability a container root in a user namespace set (version 3, tied
  to that namespace's root) is written as version 2, tied to no namespace;
- overlayfs features that keep data outside the upper directory (a
  ``redirect`` of a renamed directory, ``metacopy`` files) cannot be written
  as a layer: :class:`ChangesError` says so; levers9 mounts without them;
- device nodes other than whiteouts and sockets are left out (a container has
  no ``CAP_MKNOD``, and an image's devices come from the runtime anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import struct
import tarfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from levers9.hooks.errors import Levers9Error

__all__ = ["OVERFLOW_ID", "ChangesError", "LayerTar", "bundle_changes", "write_changes"]

#: the id a user namespace shows for ids it does not map, and what such an owner is written as
OVERFLOW_ID = 65534
_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
_UNSUPPORTED = (
    "trusted.overlay.redirect",
    "user.overlay.redirect",
    "trusted.overlay.metacopy",
    "user.overlay.metacopy",
)
_CAPABILITY = "security.capability"
# file capabilities (linux/capability.h): the revision lives in the top byte of the first word
_CAP_REVISION_MASK = 0xFF000000
_CAP_REVISION_2 = 0x02000000
_CAP_REVISION_3 = 0x03000000


class ChangesError(Levers9Error):
    """A container's changes could not be written as a layer; the message names the path and why."""


@dataclass(frozen=True)
class LayerTar:
    """A layer tar written by :func:`write_changes`: its ``sha256`` hex digest (the diff id) and size."""

    sha256: str
    size: int


class _Hashing:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._out = os.fdopen(fd, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self._out.write(data)

    def close(self) -> None:
        self._out.close()


def write_changes(
    upper: Path,
    dest: Path,
    *,
    id_shift: int = 0,
    id_count: int = 0,
    mount_points: Collection[str] = (),
) -> LayerTar:
    """Write the overlay upper directory ``upper`` as an OCI layer tar at ``dest`` (which must not exist).

    ``id_shift`` and ``id_count``: the host ids the container's ids 0.. were (its user namespace's
    mapping); 0 when it had none. ``mount_points``: the container's mount destinations (absolute paths).
    """
    if not upper.is_dir():
        raise ChangesError(f"{upper} is not a directory: the container has no writable layer to read")
    skip = {p.strip("/") for p in mount_points if p.strip("/")}
    out = _Hashing(dest)
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            writer = _Writer(upper, tar, id_shift, id_count, skip)
            for rel in writer.walk(""):
                writer.add(rel)
    except BaseException:
        out.close()
        dest.unlink(missing_ok=True)
        raise
    out.close()
    return LayerTar(sha256=out.sha256.hexdigest(), size=out.size)


def bundle_changes(container_dir: Path, user_namespace: Mapping[str, Any] | None, dest: Path) -> LayerTar:
    """The changes of the OCI engine's container in ``container_dir`` (its ``upper/`` and ``bundle/config.json``).

    ``user_namespace``: the container's mapping as the engine records it (``host_id``, ``size``), or None.
    Raises :class:`ChangesError` when the bundle cannot be read, ``dest`` exists or writing fails.
    """
    try:
        config = json.loads((container_dir / "bundle" / "config.json").read_text())
        mount_points = [str(m["destination"]) for m in config.get("mounts") or []]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ChangesError(f"{container_dir}: the bundle's config.json is unreadable: {exc}") from exc
    if dest.exists():
        raise ChangesError(f"{dest} exists; a container's changes are written to a new file")
    mapping = user_namespace or {}
    try:
        return write_changes(
            container_dir / "upper",
            dest,
            id_shift=int(mapping.get("host_id") or 0),
            id_count=int(mapping.get("size") or 0),
            mount_points=mount_points,
        )
    except OSError as exc:
        raise ChangesError(f"writing the changes in {container_dir} to {dest} failed: {exc}") from exc


class _Writer:
    def __init__(self, root: Path, tar: tarfile.TarFile, shift: int, count: int, skip: set[str]) -> None:
        self.root = root
        self.tar = tar
        self.shift = shift
        self.count = count
        self.skip = skip
        self.links: dict[tuple[int, int], str] = {}

    def walk(self, rel: str) -> Iterator[str]:
        """Every path below ``rel`` (relative to the root), sorted, each directory before what it holds."""
        directory = self.root / rel if rel else self.root
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise ChangesError(f"cannot list {directory}: {exc.strerror}") from exc
        for name in names:
            child = f"{rel}/{name}" if rel else name
            if self._is_mount_point(child):
                continue
            yield child
            st = os.lstat(self.root / child)
            if stat.S_ISDIR(st.st_mode):
                yield from self.walk(child)

    def _is_mount_point(self, rel: str) -> bool:
        if rel not in self.skip:
            return False
        st = os.lstat(self.root / rel)
        if stat.S_ISDIR(st.st_mode):
            return not os.listdir(self.root / rel)
        return stat.S_ISREG(st.st_mode) and st.st_size == 0

    def _id(self, value: int) -> int:
        if not self.count:
            return value
        return value - self.shift if self.shift <= value < self.shift + self.count else OVERFLOW_ID

    def _info(self, rel: str, st: os.stat_result) -> tarfile.TarInfo:
        info = tarfile.TarInfo(rel)
        info.mode = stat.S_IMODE(st.st_mode)
        info.uid = self._id(st.st_uid)
        info.gid = self._id(st.st_gid)
        info.uname = info.gname = ""
        info.mtime = int(st.st_mtime)
        return info

    def add(self, rel: str) -> None:
        path = self.root / rel
        st = os.lstat(path)
        mode = st.st_mode
        parent, _, name = rel.rpartition("/")
        if stat.S_ISCHR(mode) and st.st_rdev == os.makedev(0, 0):
            whiteout = tarfile.TarInfo(f"{parent}/.wh.{name}" if parent else f".wh.{name}")
            whiteout.mtime = int(st.st_mtime)
            self.tar.addfile(whiteout)
            return
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            return
        self._refuse_unsupported(rel, path)
        info = self._info(rel, st)
        info.pax_headers = self._xattrs(path)
        if stat.S_ISDIR(mode):
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
            if self._opaque(path):
                opaque = tarfile.TarInfo(f"{rel}/.wh..wh..opq")
                opaque.mtime = int(st.st_mtime)
                self.tar.addfile(opaque)
        elif stat.S_ISLNK(mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(path)
            self.tar.addfile(info)
        elif stat.S_ISFIFO(mode):
            info.type = tarfile.FIFOTYPE
            self.tar.addfile(info)
        elif stat.S_ISREG(mode):
            first = self.links.get((st.st_dev, st.st_ino)) if st.st_nlink > 1 else None
            if first is not None:
                info.type = tarfile.LNKTYPE
                info.linkname = first
                self.tar.addfile(info)
                return
            if st.st_nlink > 1:
                self.links[(st.st_dev, st.st_ino)] = rel
            info.size = st.st_size
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                self.tar.addfile(info, _Exact(f, st.st_size, rel))

    def _xattrs(self, path: Path) -> dict[str, str]:
        found: dict[str, str] = {}
        try:
            names = os.listxattr(path, follow_symlinks=False)
        except OSError:
            return found  # a file system without xattrs, or a symlink on one that has none for links
        for key in sorted(names):
            keep = (key.startswith("user.") and not key.startswith("user.overlay.")) or key == _CAPABILITY
            if not keep:
                continue
            with contextlib.suppress(OSError):
                value = os.getxattr(path, key, follow_symlinks=False)
                if key == _CAPABILITY:
                    value = _namespaceless_capability(value)
                found[f"SCHILY.xattr.{key}"] = value.decode("utf-8", "surrogateescape")
        return found

    @staticmethod
    def _opaque(path: Path) -> bool:
        for key in _OPAQUE:
            with contextlib.suppress(OSError):
                if os.getxattr(path, key, follow_symlinks=False) == b"y":
                    return True
        return False

    @staticmethod
    def _refuse_unsupported(rel: str, path: Path) -> None:
        for key in _UNSUPPORTED:
            try:
                os.getxattr(path, key, follow_symlinks=False)
            except OSError:
                continue
            raise ChangesError(
                f"/{rel} carries the overlayfs attribute {key}: its data lives outside the container's writable "
                "layer, so it cannot be written as an image layer (mount overlays without redirect_dir and metacopy)"
            )


def _namespaceless_capability(value: bytes) -> bytes:
    """A version 3 file capability (bound to one user namespace's root) as version 2, which binds to none."""
    if len(value) != 24:
        return value
    (magic,) = struct.unpack_from("<I", value)
    if magic & _CAP_REVISION_MASK != _CAP_REVISION_3:
        return value
    return struct.pack("<I", (magic & ~_CAP_REVISION_MASK) | _CAP_REVISION_2) + value[4:20]


class _Exact:
    """A file read as exactly ``size`` bytes: one that changed since it was measured is an error, not a bad tar."""

    def __init__(self, f: IO[bytes], size: int, rel: str) -> None:
        self._f = f
        self._left = size
        self._rel = rel

    def read(self, n: int = -1) -> bytes:
        want = self._left if n < 0 else min(n, self._left)
        data = self._f.read(want) if want else b""
        if len(data) < want:
            raise ChangesError(f"/{self._rel} shrank while it was being read; the container must have exited")
        self._left -= len(data)
        return data
