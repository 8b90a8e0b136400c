"""Volumes: each workspace's named, persistent files, and the operations on them every transport shares.

A volume belongs to one workspace (:class:`~levers9.state.sql.volumes.VolumeStore`): every operation here
takes the caller's workspace from its token, finds the volume by (workspace, name), and reaches its files
only through :class:`~levers9.volumes.paths.VolumeRoot` rooted at the volume's own directory, so a path
can never lead into another volume (``..`` and links leading out are refused, :class:`PermissionDenied`).
Another workspace's volume answers exactly like a missing one.

The controlplane reaches the files through its own mount of the volumes' file system
(:class:`~levers9.services.volume_files.VolumeFiles`, which says how deleted volumes' files go).
Deleting a volume removes its row at once (the name is free again), then hands its files to that mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO, TypeVar

from levers9.services.access import own_workspace
from levers9.services.auth import PermissionDenied, Principal
from levers9.services.volume_files import VolumeFiles
from levers9.state.errors import NotFound
from levers9.state.sql.records import VolumeRecord
from levers9.state.sql.volumes import VolumeStore, check_volume_name
from levers9.volumes.paths import Entry, NotFoundInVolume, PathEscapes, VolumePathError, normalise

__all__ = [
    "CHUNK_BYTES",
    "delete_volume",
    "get_or_create_volume",
    "list_path",
    "list_volumes",
    "read_file",
    "remove_path",
    "resolve_volumes",
    "write_file",
]

#: the pieces a file is read and written in
CHUNK_BYTES = 1024 * 1024

T = TypeVar("T")


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
