"""A worker's volume mounts: the file system mounted while a container needs it, and gone when none does.

A stub names volumes and cloud buckets (:class:`VolumeSpec`). Before one of its containers starts,
:meth:`WorkerVolumes.acquire` makes sure each is mounted on the worker and returns the bind mounts the
container gets: a volume is the directory ``/<workspace>/<volume id>`` of the volumes' file system, which
this worker mounts once, itself (``volumes_metadata_url`` from its registration: a pool whose workers the
controlplane lets hold the file system's credentials). The container sees only its own volumes'
directories, never the file system's root, its other directories, or the credentials (they are in the
``juicefs`` process's environment on the worker).

:meth:`WorkerVolumes.release` is called once the container is removed; when no container holds a mount
any more it is unmounted, so no mount outlives the containers that used it. :meth:`WorkerVolumes.close`
unmounts everything; :func:`levers9.volumes.juicefs.sweep` at start removes what a killed worker left.

Failures raise :class:`~levers9.hooks.errors.Levers9Error` naming the volume and what to do; the caller
fails the call with it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import Mount
from levers9.proto.v1 import worker_pb2
from levers9.volumes.juicefs import FileSystem, JuiceFsMount, sweep, volume_dir
from levers9.volumes.paths import DIR_MODE

__all__ = ["VolumeSpec", "WorkerVolumes", "volume_spec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolumeSpec:
    """A volume or cloud bucket as a stub's containers mount it."""

    #: where the container sees it (absolute)
    mount_path: str
    #: a volume's id ("" for a cloud bucket)
    volume_id: str = ""
    #: a cloud bucket's name ("" for a volume)
    bucket: str = ""
    read_only: bool = False
    webdav_url: str = ""


def volume_spec(message: worker_pb2.WorkerVolume) -> VolumeSpec:
    """A stub's volume as the controlplane sends it."""
    return VolumeSpec(
        mount_path=message.mount_path, volume_id=message.volume_id, bucket=message.bucket,
        read_only=message.read_only, webdav_url=message.webdav_url,
    )  # fmt: skip


class WorkerVolumes:
    """The mounts of one worker, held by the containers that use them."""

    def __init__(
        self, state_dir: Path, *, metadata_url: str = "", env: dict[str, str] | None = None, owner: int = 0
    ) -> None:
        self.home = state_dir / "volumes"
        #: the host uid every user is squashed to: the runtime's containers' root (RuntimeCapabilities.root_host_uid)
        self.owner = owner
        self.fs = (
            FileSystem(metadata_url=metadata_url, storage="", bucket="", name="", env=dict(env or {}))
            if metadata_url
            else None
        )
        self._mount: JuiceFsMount | None = None
        #: container id -> what it holds
        self._holders: dict[str, tuple[VolumeSpec, ...]] = {}
        self._lock = asyncio.Lock()
        swept = sweep(self.home)
        if swept:
            log.warning("unmounted %d volume mount(s) a previous worker left: %s", len(swept), ", ".join(swept))

    async def acquire(self, container_id: str, workspace_id: str, volumes: tuple[VolumeSpec, ...]) -> list[Mount]:
        """The bind mounts of ``volumes`` for ``container_id``, mounting what is not mounted yet."""
        if not volumes:
            return []
        async with self._lock:
            mounts = []
            for spec in volumes:
                if spec.bucket:
                    raise Levers9Error(f"cloud bucket {spec.bucket!r}: this worker cannot mount cloud buckets yet")
                mounts.append(await self._volume(workspace_id, spec))
            self._holders[container_id] = volumes
            return mounts

    async def _volume(self, workspace_id: str, spec: VolumeSpec) -> Mount:
        if self.fs is None:
            raise Levers9Error(
                f"a volume mounted at {spec.mount_path}: this worker's pool mounts volumes through the controlplane, "
                "which this worker cannot do yet"
            )
        if self._mount is None or not self._mount.alive:
            if self._mount is not None:
                log.warning("the volumes' mount ended (%s); mounting it again", self._mount.log_tail())
                await asyncio.to_thread(self._mount.stop)
            fs = self.fs
            self._mount = await asyncio.to_thread(
                fs.mount, self.home / "fs", cache_dir=self.home / "cache", owner=self.owner
            )
        directory = self.home / "fs" / volume_dir(workspace_id, spec.volume_id)
        if not await asyncio.to_thread(directory.is_dir):
            await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(directory.chmod, DIR_MODE)
        return Mount(source=str(directory), target=spec.mount_path, read_only=spec.read_only, idmap=False)

    async def release(self, container_id: str) -> None:
        """The container is gone: unmount what no other container holds."""
        async with self._lock:
            if self._holders.pop(container_id, None) is None:
                return
            if self._mount is not None and not any(any(not v.bucket for v in held) for held in self._holders.values()):
                mount, self._mount = self._mount, None
                await asyncio.to_thread(mount.stop)
                log.info("unmounted the volumes' file system: no container uses it")

    async def close(self) -> None:
        async with self._lock:
            self._holders.clear()
            mount, self._mount = self._mount, None
        if mount is not None:
            await asyncio.to_thread(mount.stop)
