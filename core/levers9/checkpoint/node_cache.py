"""The node's own copies of checkpoint images: bounded, least-recently-used out, shared by worker processes.

A second start of the same function on the same node restores from here
instead of downloading the image again. Several worker processes may share one
cache directory, so every change to an entry is made under a lock on that
entry's lock file (see :class:`NodeCache`); an image being read by a restore is
never evicted under it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from levers9.checkpoint.storage import _SEGMENT, CheckpointMissing, CheckpointStorage, _check_segment

__all__ = ["NodeCache"]

log = logging.getLogger(__name__)


class NodeCache:
    """The images this node holds, ``<root>/<checkpoint id>/``, bounded to ``max_bytes`` by least-recent use.

    Several worker processes may share one cache, so every change to an entry
    happens under an ``flock`` on ``<root>/.locks/<id>.lock``: an exclusive lock
    to download, adopt or evict, a shared one while an image is only being read
    (:meth:`hold`). The lock file's modification time records the last use;
    access times are useless for that on ``noatime``/``relatime`` mounts.
    Unfinished downloads live under ``.<id>.*`` names, invisible as entries, and
    are cleared by the next download of the same id.
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("the checkpoint cache size cannot be negative")
        self.root = root
        self.max_bytes = max_bytes
        self._locks = root / ".locks"
        self._locks.mkdir(parents=True, exist_ok=True)

    def path_for(self, checkpoint_id: str) -> Path:
        return self.root / _check_segment(checkpoint_id, "checkpoint id")

    def has(self, checkpoint_id: str) -> bool:
        return self.path_for(checkpoint_id).is_dir()

    @contextlib.contextmanager
    def _locked(self, checkpoint_id: str, operation: int) -> Iterator[int | None]:
        """Hold the id's lock, yielding its descriptor, or None when ``LOCK_NB`` was asked and it is taken.

        Eviction deletes lock files (else one would stay per checkpoint ever
        seen); a lock taken on a file that was deleted meanwhile protects
        nothing, so the file is checked to still be the one at the path.
        """
        path = self._locks / f"{_check_segment(checkpoint_id, 'checkpoint id')}.lock"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, operation)
            except BlockingIOError:
                os.close(fd)
                yield None
                return
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == os.fstat(fd).st_ino:
                break
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _touch(fd: int) -> None:
        # the clock, not the kernel's coarse file timestamps: two uses a millisecond apart must still be ordered
        now = time.time_ns()
        os.utime(fd, ns=(now, now))

    def _clear_unfinished(self, checkpoint_id: str) -> None:
        """Leftovers of a download or copy that died; only called with the id's exclusive lock held."""
        for leftover in self.root.glob(f".{checkpoint_id}.*"):
            shutil.rmtree(leftover, ignore_errors=True)

    @contextlib.contextmanager
    def hold(self, checkpoint_id: str) -> Iterator[Path]:
        """Keep the image from eviction while it is read (a restore); many may hold it at once."""
        with self._locked(checkpoint_id, fcntl.LOCK_SH) as fd:
            assert fd is not None
            path = self.path_for(checkpoint_id)
            if not path.is_dir():
                raise CheckpointMissing(f"checkpoint {checkpoint_id} is not in the node cache {self.root}")
            self._touch(fd)
            yield path

    def adopt(self, checkpoint_id: str, source: Path) -> Path:
        """Take a freshly dumped image into the cache: a rename on the same filesystem, else a copy."""
        if not source.is_dir():
            raise NotADirectoryError(f"checkpoint image {source} is not a directory")
        with self._locked(checkpoint_id, fcntl.LOCK_EX) as fd:
            assert fd is not None
            dest = self.path_for(checkpoint_id)
            if dest.exists():
                raise FileExistsError(f"checkpoint {checkpoint_id} is already in the node cache at {dest}")
            self._clear_unfinished(checkpoint_id)
            try:
                os.rename(source, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                staging = Path(tempfile.mkdtemp(prefix=f".{checkpoint_id}.", dir=self.root))
                try:
                    shutil.copytree(source, staging, symlinks=True, dirs_exist_ok=True)
                    os.rename(staging, dest)
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
                shutil.rmtree(source, ignore_errors=True)
            self._touch(fd)
            return dest

    def fetch(self, checkpoint_id: str, storage: CheckpointStorage, key: str) -> Path:
        """The cached image, downloading it first when absent; one download per node however many ask at once."""
        with self._locked(checkpoint_id, fcntl.LOCK_SH) as fd:
            assert fd is not None
            if self.has(checkpoint_id):
                self._touch(fd)
                return self.path_for(checkpoint_id)
        with self._locked(checkpoint_id, fcntl.LOCK_EX) as fd:
            assert fd is not None
            dest = self.path_for(checkpoint_id)
            if not dest.is_dir():  # someone else may have downloaded it while this waited for the lock
                self._clear_unfinished(checkpoint_id)
                storage.get_dir(key, dest)
            self._touch(fd)
            return dest

    def remove(self, checkpoint_id: str) -> bool:
        """Drop one image (a checkpoint that will never be restored); False when it was absent."""
        with self._locked(checkpoint_id, fcntl.LOCK_EX) as fd:
            assert fd is not None
            path = self.path_for(checkpoint_id)
            self._clear_unfinished(checkpoint_id)
            if not path.is_dir():
                return False
            shutil.rmtree(path)
            return True

    def _entries(self) -> list[tuple[int, str, Path]]:
        """(last use in ns, id, path) of every image, least recently used first."""
        entries = []
        for path in self.root.iterdir():
            if path.name.startswith(".") or not _SEGMENT.fullmatch(path.name) or not path.is_dir():
                continue
            try:
                used = (self._locks / f"{path.name}.lock").stat().st_mtime_ns
            except FileNotFoundError:
                used = path.stat().st_mtime_ns
            entries.append((used, path.name, path))
        return sorted(entries)

    def size_bytes(self) -> int:
        """The bytes the cached images take."""
        return sum(_tree_size(path) for _, _, path in self._entries())

    def evict(self, keep: int = 0) -> list[str]:
        """Remove least recently used images until the cache fits in ``max_bytes``; returns the ids removed.

        The ``keep`` most recently used images are never removed (the one just
        fetched, say, even when it alone is over the limit), nor is any image
        whose lock is held: it is being downloaded, adopted or read.
        """
        entries = self._entries()
        candidates = entries[: max(len(entries) - keep, 0)]
        sizes = {name: _tree_size(path) for _, name, path in entries}
        total = sum(sizes.values())
        evicted: list[str] = []
        for _, name, path in candidates:
            if total <= self.max_bytes:
                break
            with self._locked(name, fcntl.LOCK_EX | fcntl.LOCK_NB) as fd:
                if fd is None:
                    continue
                try:
                    shutil.rmtree(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("could not evict checkpoint %s from %s: %s", name, self.root, exc)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._locks / f"{name}.lock")
                total -= sizes[name]
                evicted.append(name)
        if evicted:
            log.info("evicted %d checkpoint(s) from %s: %s", len(evicted), self.root, ", ".join(evicted))
        return evicted

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free


def _tree_size(path: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total
