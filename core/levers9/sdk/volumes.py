"""Volumes and cloud buckets: persistent files a function's containers mount, with the published SDK's names.

``levers9.Volume(name="weights", mount_path="./weights")`` in ``volumes=[...]`` of any kind mounts the
workspace's volume ``weights`` in each container (made on the first call or deploy that names it).
``levers9.CloudBucket(name, mount_path, config=levers9.CloudBucketConfig(...))`` mounts an S3 bucket, its
keys read from workspace secrets named in the config, read-only or read-write.

Outside a container the same object reaches the volume's files through the controlplane:
:meth:`Volume.listdir`, :meth:`Volume.read`, :meth:`Volume.write`, :meth:`Volume.upload`,
:meth:`Volume.download`, :meth:`Volume.remove`. Paths are inside the volume (``/`` is its root); one that
leads out (``..`` above the root, a link pointing outside) is refused by the controlplane
(:class:`PermissionError`), a missing one is :class:`FileNotFoundError`.

Invariants: every option is checked here, on the user's machine (names, mount paths; a bad one raises
:class:`~levers9.sdk.errors.InvalidFunction` naming it); a volume's :meth:`Volume.export` is plain JSON,
part of the function's config hash.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from levers9.proto.v1 import volume_pb2, volume_pb2_grpc
from levers9.sdk.client import Client, client_for
from levers9.sdk.errors import ControlPlaneError, InvalidFunction

__all__ = [
    "CHUNK_BYTES",
    "CloudBucket",
    "CloudBucketConfig",
    "Volume",
    "VolumeEntry",
    "create_volumes",
    "volume_configs",
]

#: the pieces files are sent and received in
CHUNK_BYTES = 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SECRET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: where a relative mount path is, in the container: the runner's working directory
CONTAINER_WORKDIR = "/"

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class VolumeEntry:
    """A file or directory of a volume, as :meth:`Volume.listdir` lists it."""

    #: from the volume's root, without a leading slash
    path: str
    is_dir: bool
    size: int
    #: seconds since the epoch
    mtime: float
    is_link: bool = False

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)


def _mount_path(kind: str, name: str, mount_path: object) -> str:
    if not isinstance(mount_path, str) or not mount_path.strip() or "\0" in mount_path:
        raise InvalidFunction(f"{kind} {name!r}: mount_path {mount_path!r} is not a path; use './weights' or '/data'")
    absolute = posixpath.normpath(posixpath.join(CONTAINER_WORKDIR, mount_path))
    if absolute == "/" or absolute.split("/")[1] in ("proc", "sys", "dev", "opt", "etc", "usr", "bin", "lib"):
        raise InvalidFunction(
            f"{kind} {name!r}: mount_path {mount_path!r} would cover {absolute}, which the container needs; "
            "mount it below a directory of its own (./weights, /data/weights, /mnt/weights)"
        )
    return absolute


class VolumeFiles:
    """The files of the workspace's volume ``name``, reached through the controlplane of ``context`` (the current
    one when None)."""

    def __init__(self, name: str, *, context: str | None = None) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidFunction(
                f"volume name {name!r} is not valid: use 1-63 letters, digits, '.', '_' and '-', starting with a "
                "letter or digit (for example model-weights)"
            )
        self.name = name
        self._context = context

    # ------------------------------------------------------------------ the controlplane

    def _client(self) -> Client:
        return client_for(self._context)

    def _run(self, op: Callable[[volume_pb2_grpc.VolumesStub, Metadata], Any]) -> Any:
        client = self._client()
        return client.run(_call(client, op, self.name))

    def get_or_create(self) -> bool:
        """Make the volume when the workspace has none of its name; True once it exists."""
        info = self._run(
            lambda stub, md: stub.GetOrCreateVolume(volume_pb2.GetOrCreateVolumeRequest(name=self.name), metadata=md)
        )
        self.volume_id, self.ready = info.id, True
        return True

    def delete(self) -> None:
        """Delete the volume and its files (removed in the background); FileNotFoundError when there is none."""
        self._run(lambda stub, md: stub.DeleteVolume(volume_pb2.DeleteVolumeRequest(name=self.name), metadata=md))

    def listdir(self, path: str = "/", *, recursive: bool = False) -> list[VolumeEntry]:
        """The entries of the directory ``path`` (a file's own entry when it is one); every file below it
        with ``recursive``."""
        answer = self._run(
            lambda stub, md: stub.ListPath(
                volume_pb2.ListPathRequest(volume=self.name, path=path, recursive=recursive), metadata=md
            )
        )
        return [VolumeEntry(e.path, e.is_dir, e.size, e.mtime, e.is_link) for e in answer.entries]

    def remove(self, path: str, *, recursive: bool = False) -> int:
        """Remove a file, a link or a directory (a non-empty one with ``recursive``); how many entries went."""
        answer = self._run(
            lambda stub, md: stub.RemovePath(
                volume_pb2.RemovePathRequest(volume=self.name, path=path, recursive=recursive), metadata=md
            )
        )
        return int(answer.removed)

    def read(self, path: str) -> bytes:
        """The whole file at ``path``."""
        return b"".join(self.read_chunks(path))

    def read_chunks(self, path: str, progress: Callable[[int, int], None] | None = None) -> Iterator[bytes]:
        """The file at ``path`` in pieces; ``progress(done, total)`` after each."""
        client = self._client()
        chunks: list[bytes] = []

        async def fetch(stub: volume_pb2_grpc.VolumesStub, md: Metadata) -> None:
            chunks.clear()
            total, done = 0, 0
            async for chunk in stub.ReadFile(volume_pb2.ReadFileRequest(volume=self.name, path=path), metadata=md):
                total = chunk.total_bytes or total
                done += len(chunk.data)
                chunks.append(chunk.data)
                if progress is not None:
                    progress(done, total)

        client.run(_call(client, fetch, self.name))
        yield from chunks

    def download(
        self, path: str, local_path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Copy the file at ``path`` to ``local_path`` (written whole: to a temporary, then renamed); its size."""
        client = self._client()
        target = Path(local_path)
        temporary = target.with_name(f".{target.name}.l9-download-{os.getpid()}")

        async def fetch(stub: volume_pb2_grpc.VolumesStub, md: Metadata) -> int:
            total, done = 0, 0
            with open(temporary, "wb") as out:
                async for chunk in stub.ReadFile(volume_pb2.ReadFileRequest(volume=self.name, path=path), metadata=md):
                    total = chunk.total_bytes or total
                    out.write(chunk.data)
                    done += len(chunk.data)
                    if progress is not None:
                        progress(done, total)
            return done

        try:
            size: int = client.run(_call(client, fetch, self.name))
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        return size

    def write(self, path: str, data: bytes) -> int:
        """Write ``data`` to the file at ``path`` (its parent directories made), whole or not at all."""
        return self._upload(
            path,
            len(data),
            lambda: iter([data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]),
        )

    def upload(
        self, local_path: str | os.PathLike[str], path: str, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Copy the local file ``local_path`` to ``path`` in the volume, whole or not at all; its size."""
        source = Path(local_path)
        size = source.stat().st_size

        def pieces() -> Iterator[bytes]:
            done = 0
            with open(source, "rb") as f:
                while piece := f.read(CHUNK_BYTES):
                    done += len(piece)
                    yield piece
                    if progress is not None:
                        progress(done, size)

        return self._upload(path, size, pieces)

    def _upload(self, path: str, size: int, pieces: Callable[[], Iterator[bytes]]) -> int:
        async def send(stub: volume_pb2_grpc.VolumesStub, md: Metadata) -> int:
            async def chunks() -> AsyncIterator[volume_pb2.FileChunk]:
                first = True
                for piece in pieces():
                    if first:
                        yield volume_pb2.FileChunk(volume=self.name, path=path, total_bytes=size, data=piece)
                        first = False
                    else:
                        yield volume_pb2.FileChunk(data=piece)
                if first:
                    yield volume_pb2.FileChunk(volume=self.name, path=path, total_bytes=0)

            answer = await stub.WriteFile(chunks(), metadata=md)
            return int(answer.bytes)

        client = self._client()
        written: int = client.run(_call(client, send, self.name))
        return written


class Volume(VolumeFiles):
    """A workspace's volume, mounted at ``mount_path`` in the containers of the functions that list it."""

    def __init__(self, name: str, mount_path: str) -> None:
        super().__init__(name)
        self.mount_path = mount_path
        self.container_path = _mount_path("volume", name, mount_path)
        self.volume_id: str | None = None
        self.ready = False

    def __repr__(self) -> str:
        return f"<levers9.Volume {self.name} at {self.mount_path}>"

    def export(self) -> dict[str, Any]:
        """What the function's config holds of it (JSON)."""
        return {"name": self.name, "mount_path": self.container_path}


@dataclass
class CloudBucketConfig:
    """How to reach a cloud bucket: ``access_key`` and ``secret_key`` name the workspace secrets holding its keys."""

    read_only: bool = False
    force_path_style: bool = False
    access_key: str | None = None
    secret_key: str | None = None
    endpoint: str | None = None
    region: str | None = None


class CloudBucket(Volume):
    """An S3 (or S3-compatible) bucket mounted at ``mount_path``; ``name`` is the bucket's own name."""

    def __init__(self, name: str, mount_path: str, config: CloudBucketConfig | None = None) -> None:
        if not isinstance(name, str) or not _BUCKET.fullmatch(name):
            raise InvalidFunction(
                f"cloud bucket name {name!r} is not a bucket name: 3-63 lowercase letters, digits, '.' and '-'"
            )
        config = config if config is not None else CloudBucketConfig()
        if not isinstance(config, CloudBucketConfig):
            raise InvalidFunction(f"cloud bucket {name!r}: config must be a levers9.CloudBucketConfig, got {config!r}")
        for field in ("access_key", "secret_key"):
            value = getattr(config, field)
            if value is not None and not _SECRET.fullmatch(value):
                raise InvalidFunction(
                    f"cloud bucket {name!r}: config.{field} names a workspace secret ({value!r} is not a secret's "
                    "name); create one with `levers9 secret create NAME VALUE` and give its name"
                )
        if (config.access_key is None) != (config.secret_key is None):
            raise InvalidFunction(f"cloud bucket {name!r}: give both access_key and secret_key, or neither")
        if config.endpoint is not None and not re.match(r"^https?://[^/\s]+", config.endpoint):
            raise InvalidFunction(f"cloud bucket {name!r}: endpoint {config.endpoint!r} is not http(s)://HOST[:PORT]")
        self.name = name
        self._context = None
        self.mount_path = mount_path
        self.container_path = _mount_path("cloud bucket", name, mount_path)
        self.config = config
        self.volume_id = None
        self.ready = True

    def __repr__(self) -> str:
        return f"<levers9.CloudBucket {self.name} at {self.mount_path}>"

    def get_or_create(self) -> bool:
        return True

    def export(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "mount_path": self.container_path,
            "bucket": {
                "read_only": c.read_only,
                "force_path_style": c.force_path_style,
                "access_key": c.access_key or "",
                "secret_key": c.secret_key or "",
                "endpoint": c.endpoint or "",
                "region": c.region or "",
            },
        }


def volume_configs(where: str, volumes: object) -> list[dict[str, Any]]:
    """``volumes=`` of a decorator, checked: Volume and CloudBucket objects, no two at one mount path."""
    if volumes is None:
        return []
    if isinstance(volumes, Volume) or not isinstance(volumes, list | tuple):
        raise InvalidFunction(f"{where}: volumes must be a list of levers9.Volume or levers9.CloudBucket")
    seen: dict[str, str] = {}
    configs = []
    for volume in volumes:
        if not isinstance(volume, Volume):
            raise InvalidFunction(f"{where}: volumes: {volume!r} is not a levers9.Volume or levers9.CloudBucket")
        path = volume.container_path
        for other, name in seen.items():
            if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                raise InvalidFunction(f"{where}: volumes {name!r} and {volume.name!r} both mount at or below {other}")
        seen[path] = volume.name
        configs.append(volume.export())
    return configs


def list_volumes(context: str | None = None) -> list[tuple[str, float]]:
    """The workspace's volumes: (name, created_at seconds since the epoch), by name."""
    client = client_for(context)
    answer = client.run(
        _call(client, lambda stub, md: stub.ListVolumes(volume_pb2.ListVolumesRequest(), metadata=md), "(any)")
    )
    return [(v.name, v.created_at) for v in answer.volumes]


async def create_volumes(client: Client, configs: Iterable[dict[str, Any]]) -> None:
    """Make the volumes (not the cloud buckets) among a function's ``configs`` that the workspace lacks."""
    for config in configs:
        if "bucket" not in config:
            request = volume_pb2.GetOrCreateVolumeRequest(name=config["name"])

            def make(stub: Any, md: Metadata, request: volume_pb2.GetOrCreateVolumeRequest = request) -> Any:
                return stub.GetOrCreateVolume(request, metadata=md)

            await _call(client, make, request.name)


async def _call(client: Client, op: Callable[[volume_pb2_grpc.VolumesStub, Metadata], Any], volume: str) -> Any:
    """``op`` on a replica that answers (again on the next one while it is unreachable), errors translated."""

    async def attempt(channel: grpc.aio.Channel) -> Any:
        factory: Any = volume_pb2_grpc.VolumesStub  # generated, unannotated
        return await op(factory(channel), client.metadata)

    try:
        return await client.on_channel(attempt)
    except grpc.aio.AioRpcError as exc:
        raise _translate(exc, volume) from None


def _translate(exc: grpc.aio.AioRpcError, volume: str) -> Exception:
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.NOT_FOUND:
        return FileNotFoundError(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionError(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(details)
    return ControlPlaneError(f"volume {volume!r}: {code.name}: {details}")
