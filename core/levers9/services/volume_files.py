"""The controlplane's own mount of the volumes' file system, and the directories of each volume in it.

The mount (:class:`VolumeFiles`) is made at first use below ``data_dir/volumes/mnt``
and unmounted by :meth:`VolumeFiles.close`. A volume's directory is made when first
reached, owned by the containers' user and writable by every runtime's containers.
A deleted volume's directory is moved aside at once, to ``.deleted/<id>``, and its
files are then removed in the background; JuiceFS, with its trash off, then deletes
their data from the object store. Removals a stop cut short are finished after the
next start's first mount. The operations on volumes every transport shares are in
:mod:`levers9.services.volumes`, which uses this and is not imported here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

from levers9.state.sql.records import VolumeRecord
from levers9.volumes.juicefs import OWNER, FileSystem, JuiceFsMount, sweep, volume_dir
from levers9.volumes.paths import DIR_MODE, VolumeRoot

__all__ = ["DELETED_DIR", "VolumeFiles"]

log = logging.getLogger(__name__)

#: where deleted volumes' directories wait for their files to be removed
DELETED_DIR = ".deleted"


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
