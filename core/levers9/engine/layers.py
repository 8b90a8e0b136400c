"""Unpacking one image layer into a directory, safely: layer tarballs come from users.

:func:`extract_layer` streams a layer blob (gzip or uncompressed tar) into an
empty directory and returns two sha256 digests, of the uncompressed tar stream
(the diff id image configs list) and of the blob itself (its name in an OCI
layout), so the caller can check both without reading the blob twice.

Invariants: unpacking never trusts a path: absolute names, ``..`` components,
hard links out of the layer and writes through symlinks are refused, each with
an :class:`ImageError` naming the member. OCI whiteouts become the overlayfs
form the kernel honours (a 0/0 character device, the ``trusted.overlay.opaque``
xattr); device nodes in a layer are skipped; only ``user.*`` and
``security.capability`` xattrs are kept; owners are kept only when running as
root. zstd layers are refused with a message saying which compressions work.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from levers9.engine.image_types import ImageError

__all__ = ["extract_layer"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Extended attributes a layer may carry onto disk; trusted.* would let an image steer overlayfs itself.
_XATTR_ALLOWED = ("user.", "security.capability")


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class _Hashing(io.RawIOBase):
    """Passes a stream through while hashing it, with bytes already read (``head``) put back in front."""

    def __init__(self, source: _Readable, head: bytes = b"") -> None:
        super().__init__()
        self._source = source
        self._head = head
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            data, self._head = self._head[: len(view)], self._head[len(view) :]
        else:
            data = self._source.read(len(view))
        view[: len(data)] = data
        self.sha256.update(data)
        return len(data)


def _drain(stream: IO[bytes]) -> None:
    while stream.read(1 << 20):
        pass


def extract_layer(stream: IO[bytes], dest: Path, what: str) -> tuple[str, str]:
    """Unpack one layer blob into ``dest``; returns the sha256 of its tar stream and of the blob itself."""
    head = stream.read(4)
    if head.startswith(_ZSTD_MAGIC):
        raise ImageError(f"{what} is zstd-compressed, which is not supported; use gzip or uncompressed layers")
    blob = _Hashing(stream, head)
    blob_io = io.BufferedReader(blob, 1 << 20)
    tar_hash, tar_io = blob, blob_io
    if head.startswith(_GZIP_MAGIC):
        tar_hash = _Hashing(gzip.GzipFile(fileobj=blob_io, mode="rb"))
        tar_io = io.BufferedReader(tar_hash, 1 << 20)
    try:
        with tarfile.open(fileobj=tar_io, mode="r|") as tar:
            _Unpacker(dest, what).run(tar)
        _drain(tar_io)  # the digest covers the whole stream, padding after the last member included
        _drain(blob_io)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise ImageError(f"{what} could not be unpacked: {e}") from e
    return tar_hash.sha256.hexdigest(), blob.sha256.hexdigest()


class _Unpacker:
    """Writes a layer's members under ``root`` without ever following a path the layer itself made."""

    def __init__(self, root: Path, what: str) -> None:
        self.root = root
        self.what = what
        self.root.chmod(0o755)
        # Directory modes and times go on last: a read-only directory must still take its contents first.
        self.dirs: list[tuple[Path, tarfile.TarInfo]] = []
        self.preserve_owner = os.geteuid() == 0

    def run(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            self._member(tar, member)
        for path, member in reversed(self.dirs):
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, (member.mtime, member.mtime))

    def _refuse(self, name: str, why: str) -> ImageError:
        return ImageError(f"{self.what}: refused member {name!r}: {why}")

    def _parts(self, name: str) -> list[str]:
        if name.startswith("/"):
            raise self._refuse(name, "absolute paths are not allowed in a layer")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self._refuse(name, "'..' is not allowed in a layer path")
        return parts

    def _walk(self, name: str, parts: Sequence[str], *, create: bool) -> Path:
        """The directory ``parts`` name, checked component by component so no symlink is ever followed."""
        current = self.root
        for part in parts:
            current = current / part
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                if not create:
                    raise self._refuse(name, f"{'/'.join(parts)} does not exist in this layer") from None
                os.mkdir(current, 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise self._refuse(name, "its path goes through a symlink, which could lead out of the layer")
            if not stat.S_ISDIR(st.st_mode):
                raise self._refuse(name, "its parent is not a directory")
        return current

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = self._parts(member.name)
        if not parts:
            if member.isdir():
                self._owner(self.root, member)
                self.dirs.append((self.root, member))
            return
        parent = self._walk(member.name, parts[:-1], create=True)
        base = parts[-1]
        if base.startswith(".wh."):
            self._whiteout(member.name, parent, base)
            return
        path = parent / base
        if member.isdir():
            existing = _lstat(path)
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                _remove(path)
                os.mkdir(path, 0o700)
            self._owner(path, member)
            self._xattrs(path, member)
            self.dirs.append((path, member))
            return
        _remove(path)  # a later member replaces an earlier one of the same name
        if member.isreg():
            source = tar.extractfile(member)
            if source is None:
                raise self._refuse(member.name, "its content cannot be read")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out, source:
                shutil.copyfileobj(source, out, 1 << 20)
            self._owner(path, member)
            os.chmod(path, member.mode & 0o7777)  # after chown, which clears setuid bits
            self._xattrs(path, member)
            os.utime(path, (member.mtime, member.mtime))
        elif member.issym():
            # Symlinks may point anywhere: they are resolved inside the container's root, never here.
            os.symlink(member.linkname, path)
            self._owner(path, member)
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
        elif member.islnk():
            link_parts = self._parts(member.linkname)
            if not link_parts:
                raise self._refuse(member.name, "a hard link to the layer's root")
            target = self._walk(member.name, link_parts[:-1], create=False) / link_parts[-1]
            st = _lstat(target)
            if st is None or stat.S_ISDIR(st.st_mode):
                raise self._refuse(member.name, f"hard link to {member.linkname!r}, which is not a file in this layer")
            os.link(target, path, follow_symlinks=False)
        elif member.isfifo():
            os.mkfifo(path, 0o600)
            self._owner(path, member)
            os.chmod(path, member.mode & 0o7777)
        # Device nodes are skipped: a container gets its devices from the runtime, never from an image.

    def _whiteout(self, name: str, parent: Path, base: str) -> None:
        if base == ".wh..wh..opq":
            os.setxattr(parent, "trusted.overlay.opaque", b"y")
            return
        if base.startswith(".wh..wh."):
            return  # aufs bookkeeping (.wh..wh.plnk and such), meaningless to overlayfs
        hidden = base[len(".wh.") :]
        if hidden in ("", ".", ".."):
            raise self._refuse(name, "a whiteout of nothing")
        path = parent / hidden
        _remove(path)
        os.mknod(path, stat.S_IFCHR, os.makedev(0, 0))

    def _owner(self, path: Path, member: tarfile.TarInfo) -> None:
        if self.preserve_owner:
            os.lchown(path, member.uid, member.gid)

    def _xattrs(self, path: Path, member: tarfile.TarInfo) -> None:
        for key, value in member.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            attr = key[len("SCHILY.xattr.") :]
            if attr.startswith(_XATTR_ALLOWED):
                with contextlib.suppress(OSError):  # a filesystem without xattrs loses them, like docker's does
                    os.setxattr(path, attr, value.encode("utf-8", "surrogateescape"), follow_symlinks=False)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _remove(path: Path) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
