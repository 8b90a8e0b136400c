"""Volumes: each workspace's named, persistent files, and the operations on them every transport shares.

A volume belongs to one workspace (:class:`~levers9.state.sql.volumes.VolumeStore`): every operation here
takes the caller's workspace from its token, finds the volume by (workspace, name), and reaches its files
only through :class:`~levers9.volumes.paths.VolumeRoot` rooted at the volume's own directory, so a path
can never lead into another volume (``..`` and links leading out are refused, :class:`PermissionDenied`).
Another workspace's volume answers exactly like a missing one.

The controlplane reaches the files through its own mount of the volumes' file system
(:class:`VolumeFiles`), made at first use below ``data_dir/volumes/mnt`` and unmounted by
:meth:`VolumeFiles.close`. Deleting a volume removes its row at once (the name is free again) and moves
its directory aside, to ``.deleted/<id>``, whose files are then removed in the background; JuiceFS, with
its trash off, then deletes their data from the object store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from levers9.services.access import own_workspace
from levers9.services.auth import PermissionDenied, Principal
from levers9.state.errors import NotFound
from levers9.state.sql.records import VolumeRecord
from levers9.state.sql.volumes import VolumeStore, check_volume_name
from levers9.volumes.juicefs import OWNER, FileSystem, JuiceFsMount, sweep, volume_dir
from levers9.volumes.paths import DIR_MODE, Entry, NotFoundInVolume, PathEscapes, VolumePathError, VolumeRoot, normalise

__all__ = [
    "CHUNK_BYTES",
    "VolumeFiles",
    "delete_volume",
    "get_or_create_volume",
    "list_path",
    "list_volumes",
    "read_file",
    "remove_path",
    "resolve_volumes",
    "write_file",
]

log = logging.getLogger(__name__)

#: the pieces a file is read and written in
CHUNK_BYTES = 1024 * 1024
#: where deleted volumes' directories wait for their files to be removed
DELETED_DIR = ".deleted"

T = TypeVar("T")


class VolumeFiles:
    """The controlplane's own mount of the volumes' file system, made at first use; the files of each volume."""

    def __init__(self, fs: FileSystem, home: Path) -> None:
        self.fs = fs
        self.home = home
        self._mount: JuiceFsMount | None = None
        self._lock = threading.Lock()
        self._removals: set[asyncio.Task[None]] = set()
        #: what deleted volumes left (a removal a stop cut short) is removed once, after the first mount
        self._purged = False

    @property
    def mountpoint(self) -> Path:
        return self.home / "mnt"

    def _mounted(self) -> Path:
        """The mount point, mounting first when needed (in a worker thread: it takes about half a second)."""
        with self._lock:
            if self._mount is None or not self._mount.alive:
                if self._mount is not None:
                    log.warning("the volumes' file system mount ended (%s); mounting it again", self._mount.log_tail())
                    self._mount.stop()
                sweep(self.mountpoint)  # what a killed controlplane left
                self.fs.format()
                # as root, squashing no one: the controlplane may remove whatever any container made
                self._mount = self.fs.mount(self.mountpoint, cache_dir=self.home / "cache", owner=0)
            return self.mountpoint

    async def root(self, volume: VolumeRecord) -> VolumeRoot:
        """The volume's files, its directory made when missing."""

        def make() -> VolumeRoot:
            directory = self._mounted() / volume_dir(volume.workspace_id, volume.id)
            if not directory.is_dir():
                directory.mkdir(parents=True, exist_ok=True)
                os.chown(directory, OWNER, OWNER)
                directory.chmod(DIR_MODE)  # every runtime's containers may write in it (levers9.volumes.juicefs)
            return VolumeRoot(directory, owner=OWNER)

        root = await asyncio.to_thread(make)
        if not self._purged:
            self._purged = True
            self._track(asyncio.create_task(self.purge_deleted()))
        return root

    def _track(self, task: asyncio.Task[None]) -> None:
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def remove(self, volume: VolumeRecord) -> None:
        """Move the volume's directory aside at once, then remove its files in the background."""

        def move_aside() -> Path | None:
            base = self._mounted()
            source = base / volume_dir(volume.workspace_id, volume.id)
            if not source.exists():
                return None
            aside = base / DELETED_DIR / volume.id
            aside.parent.mkdir(exist_ok=True, mode=0o700)
            os.rename(source, aside)
            return aside

        aside = await asyncio.to_thread(move_aside)
        if aside is not None:
            self._track(asyncio.create_task(self._remove_tree(aside)))

    async def _remove_tree(self, aside: Path) -> None:
        try:
            await asyncio.to_thread(VolumeRoot(aside.parent).remove, aside.name, recursive=True)
        except Exception as exc:
            log.warning("removing the files of deleted volume %s failed (retried at next start): %s", aside.name, exc)

    async def purge_deleted(self) -> None:
        """Remove what deleted volumes left (a removal a stop cut short): after each start's first mount."""

        def names() -> list[str]:
            deleted = self._mounted() / DELETED_DIR
            return sorted(os.listdir(deleted)) if deleted.is_dir() else []

        for name in await asyncio.to_thread(names):
            await self._remove_tree(self.mountpoint / DELETED_DIR / name)

    async def drain(self) -> None:
        """Wait for the background removals under way (and those they start)."""
        while self._removals:
            await asyncio.gather(*list(self._removals), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        with self._lock:
            mount, self._mount = self._mount, None
        if mount is not None:
            await asyncio.to_thread(mount.stop)


async def get_or_create_volume(
    store: VolumeStore, files: VolumeFiles, principal: Principal, name: str
) -> tuple[VolumeRecord, bool]:
    """The caller's workspace's volume ``name``, made when it has none; and whether it was made now.

    Its directory is made too (formatting the file system first, the first time): a worker that mounts the
    file system itself may be asked to mount it before anything else reached it.
    """
    record, created = await store.get_or_create(own_workspace(principal, "use volumes"), name)
    await files.root(record)
    return record, created


async def list_volumes(store: VolumeStore, principal: Principal) -> list[VolumeRecord]:
    return await store.list(own_workspace(principal, "list volumes"))


async def _volume(store: VolumeStore, principal: Principal, name: str) -> VolumeRecord:
    check_volume_name(name)
    found = await store.get(own_workspace(principal, "use volumes"), name)
    if found is None:
        raise NotFound("volume", name)
    return found


async def delete_volume(store: VolumeStore, files: VolumeFiles, principal: Principal, name: str) -> VolumeRecord:
    """Delete the caller's volume ``name`` and (in the background) its files; NotFound when it has none."""
    check_volume_name(name)
    record = await store.delete(own_workspace(principal, "delete volumes"), name)
    await files.remove(record)
    return record


async def resolve_volumes(store: VolumeStore, workspace_id: str, names: list[str]) -> dict[str, VolumeRecord]:
    """The workspace's volumes named in ``names``; ValueError naming the first it has none of."""
    found = await store.by_names(workspace_id, names)
    missing = [name for name in names if name not in found]
    if missing:
        raise ValueError(
            f"volume {missing[0]!r} does not exist in this workspace; create it with `levers9 volume create "
            f"{missing[0]}` (the SDK's levers9.Volume creates it on first use)"
        )
    return found


async def _in_volume(call: Callable[[], T], volume: str, path: str) -> T:
    """Run a file operation off the event loop, answering its path errors in the services' terms."""
    try:
        return await asyncio.to_thread(call)
    except PathEscapes as exc:
        raise PermissionDenied(f"volume {volume!r}: {exc}") from None
    except NotFoundInVolume:
        raise NotFound("path", f"{volume}:{path}") from None


async def list_path(
    store: VolumeStore, files: VolumeFiles, principal: Principal, volume: str, path: str, *, recursive: bool = False
) -> list[Entry]:
    """The entries at ``path`` of the caller's volume (every file below it with ``recursive``)."""
    root = await files.root(await _volume(store, principal, volume))
    if recursive:
        return await _in_volume(lambda: list(root.walk(path)), volume, path)
    return await _in_volume(lambda: root.list(path), volume, path)


async def remove_path(
    store: VolumeStore, files: VolumeFiles, principal: Principal, volume: str, path: str, *, recursive: bool
) -> int:
    """Remove ``path`` of the caller's volume; how many entries went."""
    root = await files.root(await _volume(store, principal, volume))
    return await _in_volume(lambda: root.remove(path, recursive=recursive), volume, path)


async def read_file(
    store: VolumeStore, files: VolumeFiles, principal: Principal, volume: str, path: str
) -> tuple[int, AsyncIterator[bytes]]:
    """The size of the file at ``path`` and its bytes in pieces of :data:`CHUNK_BYTES`."""
    root = await files.root(await _volume(store, principal, volume))
    handle = await _in_volume(lambda: root.open_read(path), volume, path)
    size = os.fstat(handle.fileno()).st_size

    async def pieces() -> AsyncIterator[bytes]:
        try:
            while piece := await asyncio.to_thread(handle.read, CHUNK_BYTES):
                yield piece
        finally:
            handle.close()

    return size, pieces()


async def write_file(
    store: VolumeStore, files: VolumeFiles, principal: Principal, volume: str, path: str, pieces: AsyncIterator[bytes]
) -> int:
    """Write ``pieces`` to ``path`` of the caller's volume, whole or not at all; the bytes written.

    The bytes go to a hidden file beside the target, renamed over it once all have arrived (and been
    closed, so other mounts see the whole file); an upload cut short leaves the target as it was.
    """
    root = await files.root(await _volume(store, principal, volume))
    clean = await _in_volume(lambda: _normalised(path), volume, path)
    parent, _, name = clean.rpartition("/")
    hidden = f".{name}.l9-upload-{os.urandom(6).hex()}"
    temporary = f"{parent}/{hidden}" if parent else hidden
    handle: BinaryIO = await _in_volume(lambda: root.open_write(temporary), volume, path)
    written = 0
    try:
        async for piece in pieces:
            await asyncio.to_thread(handle.write, piece)
            written += len(piece)
        await asyncio.to_thread(handle.close)
        await _in_volume(lambda: root.move(temporary, clean), volume, path)
    except BaseException:
        handle.close()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(root.remove, temporary)
        raise
    return written


def _normalised(path: str) -> str:
    clean = normalise(path)
    if not clean:
        raise VolumePathError(f"path {path!r} is the volume's root; name a file")
    return clean
