"""The worker image's root filesystem as data: its entries, their digest, and the tarball written from them.

:class:`Entry` is one path of the image (a directory, a host file copied as it
is, generated contents, a link, or the compiled ``.pyc`` of a host ``.py``);
:func:`digest` hashes a list of them without reading a file's contents (paths,
modes, link targets, generated contents, each source file's size and
modification time), so an unchanged installation gives the same digest;
:func:`write` streams them as a tar archive, compiling each ``.pyc`` (an
unchecked hash-based one: the image is immutable) through a cache kept by
content hash (:func:`default_cache_dir`, pruned to the last build's files).
What goes in is planned by :mod:`levers9.images.rootfs`.

Invariant: the archive holds exactly the entries given, in their order; a
``.py`` that does not compile gets no ``.pyc`` (the interpreter compiles it at
import, as it would anyway). A cache directory that cannot be written is not
used, and nothing fails for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

__all__ = ["Entry", "default_cache_dir", "digest", "write"]


@dataclass(frozen=True)
class Entry:
    """One path of the image (relative, no leading slash)."""

    path: str
    kind: Literal["dir", "file", "link"]
    mode: int = 0o755
    #: a host file copied as it is
    source: str | None = None
    #: generated contents
    data: bytes | None = None
    #: a symlink's target
    target: str = ""
    #: a host ``.py`` file this entry is the compiled ``.pyc`` of
    compile_from: str | None = None


def digest(entries: Iterable[Entry], extra: Iterable[str] = ()) -> str:
    """``sha256:<hex>`` of the plan: paths, kinds, modes, targets, generated contents, sources' sizes and mtimes."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\0{importlib.util.MAGIC_NUMBER.hex()}\0".encode())
    for item in extra:
        h.update(item.encode() + b"\0")
    for e in entries:
        h.update(f"{e.path}\0{e.kind}\0{e.mode:o}\0{e.target}\0".encode())
        if e.data is not None:
            h.update(hashlib.sha256(e.data).digest())
        for source in (e.source, e.compile_from):
            if source is not None:
                st = os.stat(source)
                h.update(f"{source}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return "sha256:" + h.hexdigest()


def _pyc(source: str, path: str, cache: _PycCache | None = None) -> bytes | None:
    """The unchecked hash-based ``.pyc`` of ``source`` as the image's ``/path``; None when it does not compile.

    Compiling takes most of a build's time, so each result is kept in ``cache`` under the hash of the
    interpreter's magic number, the path and the source: a rebuild compiles only what changed.
    """
    raw = Path(source).read_bytes()
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + path.encode() + b"\0" + raw).hexdigest()
    if cache is not None:
        found = cache.get(key)
        if found is not None:
            return found or None
    try:
        code = compile(raw, "/" + path, "exec", dont_inherit=True, optimize=0)
        flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
        data = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(raw) + marshal.dumps(code)
    except (SyntaxError, ValueError):
        data = b""  # a template or a file for another Python: imported by nobody here
    if cache is not None:
        cache.put(key, data)
    return data or None


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/levers9/worker-image-pyc`` (``~/.cache`` without it): compiled files kept between builds."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "levers9" / "worker-image-pyc"


class _PycCache:
    """Compiled files by content hash in one directory (:func:`default_cache_dir`); pruned to one build's set.

    Best effort: an unwritable cache only makes the build slower, and an entry that vanishes is compiled again.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_cache_dir()
        self.used: set[str] = set()
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.usable = os.access(self.root, os.W_OK)
        except OSError:
            self.usable = False

    def get(self, key: str) -> bytes | None:
        self.used.add(key)
        try:
            return (self.root / key).read_bytes() if self.usable else None
        except OSError:
            return None

    def put(self, key: str, data: bytes) -> None:
        if not self.usable:
            return
        scratch = self.root / f".{key}.{os.getpid()}"
        try:
            scratch.write_bytes(data)
            scratch.replace(self.root / key)
        except OSError:
            scratch.unlink(missing_ok=True)

    def prune(self) -> None:
        """Remove what this build did not use (an installation's old versions)."""
        if not self.usable:
            return
        for entry in self.root.iterdir():
            if entry.name not in self.used and not entry.name.startswith("."):
                entry.unlink(missing_ok=True)


def write(entries: Iterable[Entry], out: BinaryIO, cache_dir: Path | None = None) -> int:
    """Stream ``entries`` as a tar archive to ``out`` (not closed); answers the bytes of file contents written.

    ``cache_dir``: where compiled files are kept between builds (default: :func:`default_cache_dir`).
    """
    total = 0
    cache = _PycCache(cache_dir)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = e.mode
            if e.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = e.target
                tar.addfile(info)
            elif e.compile_from is not None:
                py_path = e.path.replace("/__pycache__/", "/").rsplit(".", 2)[0] + ".py"
                data = _pyc(e.compile_from, py_path, cache)
                if data is None:
                    continue
                info.size, info.mtime = len(data), int(os.stat(e.compile_from).st_mtime)
                tar.addfile(info, _Bytes(data))
                total += len(data)
            elif e.data is not None:
                info.size = len(e.data)
                tar.addfile(info, _Bytes(e.data))
                total += len(e.data)
            else:
                assert e.source is not None
                with open(e.source, "rb") as f:
                    st = os.fstat(f.fileno())
                    info.size, info.mtime = st.st_size, int(st.st_mtime)
                    tar.addfile(info, f)
                    total += st.st_size
    cache.prune()
    return total


class _Bytes:
    """A minimal readable file over bytes (tarfile reads ``size`` bytes from it)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._at + n
        chunk, self._at = self._data[self._at : end], min(end, len(self._data))
        return chunk
