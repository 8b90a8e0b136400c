"""A worker's volume mounts: the file system mounted while a container needs it, and gone when none does.

A stub names volumes and cloud buckets (:class:`VolumeSpec`). Before one of its containers starts,
:meth:`WorkerVolumes.acquire` makes sure each is mounted on the worker and returns the bind mounts the
container gets, one per volume, each mount made once and shared by the containers that hold it:

- a volume on a worker the controlplane lets mount the volumes' file system (``volumes_metadata_url``
  from its registration; ``local`` pools): the directory ``/<workspace>/<volume id>`` of the worker's one
  JuiceFS mount;
- a volume on any other worker: an ``rclone`` mount of that one volume over the controlplane's WebDAV,
  with a token that opens it alone, for this worker while it is registered
  (:mod:`levers9.services.volume_access`);
- a cloud bucket: an ``rclone`` mount of the bucket with the keys from the workspace's secrets.

The container sees only its own volumes, never the file system's root, its other directories, or any
credential (they are in the environment of the ``juicefs`` or ``rclone`` process on the worker).

:meth:`WorkerVolumes.release` is called once the container is removed; when no container holds a mount
any more it is unmounted, so no mount outlives the containers that used it. :meth:`WorkerVolumes.close`
unmounts everything; :func:`levers9.volumes.juicefs.sweep` at start removes what a killed worker left.

Failures raise :class:`~levers9.hooks.errors.Levers9Error` naming the volume and what to do; the caller
fails the call with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import Mount
from levers9.proto.v1 import worker_pb2
from levers9.volumes import rclone
from levers9.volumes.juicefs import FileSystem, JuiceFsMount, sweep, volume_dir
from levers9.volumes.paths import DIR_MODE

__all__ = ["VolumeSpec", "WorkerVolumes", "volume_spec"]

log = logging.getLogger(__name__)

#: the longest a call's outcome waits for its closed files to be uploaded (then it is reported anyway, logged)
SETTLE_S = 600.0


@dataclass(frozen=True)
class VolumeSpec:
    """A volume or cloud bucket as a stub's containers mount it."""

    #: where the container sees it (absolute)
    mount_path: str
    #: a volume's id ("" for a cloud bucket)
    volume_id: str = ""
    #: a volume's name in its workspace (what messages call it; "" when not known)
    volume_name: str = ""
    #: a cloud bucket's name ("" for a volume)
    bucket: str = ""
    read_only: bool = False
    #: a volume this worker mounts through the controlplane: its WebDAV URL and this worker's token for it
    webdav_url: str = ""
    webdav_token: str = field(default="", repr=False)
    #: a cloud bucket's store and keys
    endpoint: str = ""
    region: str = ""
    force_path_style: bool = False
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)

    @property
    def key(self) -> str:
        """What one mount on the worker serves: the file system, one volume over WebDAV, or one bucket as given."""
        if self.bucket:
            parts = [
                self.bucket,
                self.endpoint,
                self.region,
                str(self.force_path_style),
                str(self.read_only),
                self.access_key_id,
                self.secret_access_key,
            ]
            return "s3-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        if self.webdav_url:
            return f"dav-{self.volume_id}-{'ro' if self.read_only else 'rw'}"
        return "fs"


def volume_spec(message: worker_pb2.WorkerVolume) -> VolumeSpec:
    """A stub's volume as the controlplane sends it."""
    return VolumeSpec(
        mount_path=message.mount_path,
        volume_id=message.volume_id,
        volume_name=message.volume_name,
        bucket=message.bucket,
        read_only=message.read_only,
        webdav_url=message.webdav_url,
        webdav_token=message.webdav_token,
        endpoint=message.endpoint,
        region=message.region,
        force_path_style=message.force_path_style,
        access_key_id=message.access_key_id,
        secret_access_key=message.secret_access_key,
    )


class WorkerVolumes:
    """The mounts of one worker, each held by the containers that use it and unmounted when none does."""

    def __init__(
        self,
        state_dir: Path,
        *,
        metadata_url: str = "",
        env: dict[str, str] | None = None,
        owner: int = 0,
        ca_file: str | None = None,
    ) -> None:
        self.home = state_dir / "volumes"
        #: the host uid that owns what containers do on a mount: their root (RuntimeCapabilities.root_host_uid)
        self.owner = owner
        #: the controlplane's CA, for WebDAV over TLS with a CA of its own
        self.ca_file = ca_file
        self.fs = (
            FileSystem(metadata_url=metadata_url, storage="", bucket="", name="", env=dict(env or {}))
            if metadata_url
            else None
        )
        #: mounts by key (VolumeSpec.key), and the containers holding each
        self._mounts: dict[str, JuiceFsMount | rclone.RcloneMount] = {}
        self._holders: dict[str, set[str]] = {}
        self._lock = asyncio.Lock()
        swept = [str(p) for p in rclone.sweep(self.home)] + sweep(self.home)
        if swept:
            log.warning("unmounted %d volume mount(s) a previous worker left: %s", len(swept), ", ".join(swept))

    async def acquire(self, container_id: str, workspace_id: str, volumes: tuple[VolumeSpec, ...]) -> list[Mount]:
        """The bind mounts of ``volumes`` for ``container_id``, mounting what is not mounted yet; Levers9Error
        naming the volume when one cannot be (what this call mounted is released again)."""
        if not volumes:
            return []
        async with self._lock:
            binds = []
            held: set[str] = set()
            try:
                for spec in volumes:
                    source = await self._mounted(spec, workspace_id)
                    held.add(spec.key)
                    self._holders.setdefault(spec.key, set()).add(container_id)
                    binds.append(Mount(source=source, target=spec.mount_path, read_only=spec.read_only, idmap=False))
            except BaseException:
                await self._drop(container_id, held)
                raise
            return binds

    async def _mounted(self, spec: VolumeSpec, workspace_id: str) -> str:
        """The host directory that is ``spec``'s, its mount made when missing (or dead)."""
        key = spec.key
        mount = self._mounts.get(key)
        alive = mount is not None and (mount.alive if isinstance(mount, JuiceFsMount) else mount.process.poll() is None)
        if not alive:
            if mount is not None:
                log.warning("the mount %s ended; mounting it again", key)
                await asyncio.to_thread(_stop, mount)
            self._mounts[key] = mount = await asyncio.to_thread(self._mount, spec)
        assert mount is not None
        if key != "fs":
            return str(mount.target)
        directory = self.home / "fs" / volume_dir(workspace_id, spec.volume_id)
        if not await asyncio.to_thread(directory.is_dir):
            await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(directory.chmod, DIR_MODE)
        return str(directory)

    def _mount(self, spec: VolumeSpec) -> JuiceFsMount | rclone.RcloneMount:
        target, cache = self.home / spec.key, self.home / "cache" / spec.key
        try:
            if spec.bucket:
                return rclone.mount_s3(
                    spec.bucket,
                    target,
                    access_key=spec.access_key_id,
                    secret_key=spec.secret_access_key,
                    endpoint=spec.endpoint or None,
                    region=spec.region or None,
                    force_path_style=spec.force_path_style,
                    read_only=spec.read_only,
                    cache_dir=cache,
                    owner_uid=self.owner,
                    owner_gid=self.owner,
                )
            if spec.webdav_url:
                return rclone.mount_webdav(
                    spec.webdav_url,
                    spec.webdav_token,
                    target,
                    read_only=spec.read_only,
                    cache_dir=cache,
                    owner_uid=self.owner,
                    owner_gid=self.owner,
                    ca_file=self.ca_file,
                )
        except rclone.RcloneError as exc:
            what = f"cloud bucket {spec.bucket!r}" if spec.bucket else f"volume {spec.volume_name or spec.volume_id!r}"
            raise Levers9Error(f"mounting {what} at {spec.mount_path} failed: {exc}") from None
        if self.fs is None:
            raise Levers9Error(
                f"a volume at {spec.mount_path}: the controlplane gave this worker neither the volumes' file "
                "system nor a WebDAV URL for it"
            )
        return self.fs.mount(self.home / "fs", cache_dir=self.home / "cache" / "fs", owner=self.owner)

    async def settle(self, container_id: str, timeout_s: float = SETTLE_S) -> None:
        """Wait until what the container closed on its rclone mounts (volumes over WebDAV, cloud buckets) is
        uploaded: a call's files are on the volume or in the bucket when its outcome is reported, as they are
        on a mount of the file system itself."""
        mounts = [
            mount
            for key, mount in self._mounts.items()
            if container_id in self._holders.get(key, ()) and isinstance(mount, rclone.RcloneMount)
        ]
        for mount in mounts:
            await asyncio.to_thread(rclone.wait_uploaded, mount, timeout_s)

    async def release(self, container_id: str) -> None:
        """The container is gone: unmount what no other container holds."""
        async with self._lock:
            await self._drop(container_id, set(self._holders))

    async def _drop(self, container_id: str, keys: set[str]) -> None:
        for key in keys:
            holders = self._holders.get(key)
            if holders is None:
                continue
            holders.discard(container_id)
            if not holders:
                del self._holders[key]
                mount = self._mounts.pop(key, None)
                if mount is not None:
                    await asyncio.to_thread(_stop, mount)
                    log.info("unmounted %s: no container uses it", key)

    async def close(self) -> None:
        async with self._lock:
            self._holders.clear()
            mounts, self._mounts = list(self._mounts.values()), {}
        for mount in mounts:
            await asyncio.to_thread(_stop, mount)


def _stop(mount: JuiceFsMount | rclone.RcloneMount) -> None:
    if isinstance(mount, JuiceFsMount):
        mount.stop()
    else:
        rclone.unmount(mount)
