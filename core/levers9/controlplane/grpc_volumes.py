"""The Volumes gRPC service (SDK and CLI): each method authenticates, calls one service, renders the answer.

Every method takes a user token bound to a workspace and acts on that workspace's volumes only
(:mod:`levers9.services.volumes`). Reads and writes stream in pieces of
:data:`~levers9.services.volumes.CHUNK_BYTES` and hold the token's guard while they stream: a revoked
token ends them with UNAUTHENTICATED. A write is whole or nothing: one cut short leaves the file as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from levers9.controlplane.grpc_auth import user_principal
from levers9.controlplane.grpc_errors import streaming, unary
from levers9.proto.v1 import volume_pb2, volume_pb2_grpc
from levers9.services import volumes
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import Role, VolumeRecord
from levers9.volumes.paths import Entry

__all__ = ["VolumesService"]

Context = grpc.aio.ServicerContext[Any, Any]


def _info(record: VolumeRecord, created: bool = False) -> volume_pb2.VolumeInfo:
    return volume_pb2.VolumeInfo(
        id=record.id, name=record.name, created_at=record.created_at.timestamp(), created=created
    )


def _entry(entry: Entry) -> volume_pb2.PathEntry:
    return volume_pb2.PathEntry(
        path=entry.path, is_dir=entry.is_dir, size=entry.size, mtime=entry.mtime, is_link=entry.is_link
    )


class VolumesService(volume_pb2_grpc.VolumesServicer):
    def __init__(self, services: Services) -> None:
        self.services = services

    async def _user(self, context: Context, needed: Role) -> Principal:
        return await user_principal(self.services, context.invocation_metadata(), needed)

    @unary
    async def GetOrCreateVolume(
        self, request: volume_pb2.GetOrCreateVolumeRequest, context: Context
    ) -> volume_pb2.VolumeInfo:
        record, created = await volumes.get_or_create_volume(
            self.services.volumes, self.services.volume_files, await self._user(context, Role.MEMBER), request.name
        )
        return _info(record, created)

    @unary
    async def ListVolumes(
        self, request: volume_pb2.ListVolumesRequest, context: Context
    ) -> volume_pb2.ListVolumesResponse:
        found = await volumes.list_volumes(self.services.volumes, await self._user(context, Role.VIEWER))
        return volume_pb2.ListVolumesResponse(volumes=[_info(r) for r in found])

    @unary
    async def DeleteVolume(
        self, request: volume_pb2.DeleteVolumeRequest, context: Context
    ) -> volume_pb2.DeleteVolumeResponse:
        principal = await self._user(context, Role.MEMBER)
        await volumes.delete_volume(self.services.volumes, self.services.volume_files, principal, request.name)
        return volume_pb2.DeleteVolumeResponse()

    @unary
    async def ListPath(self, request: volume_pb2.ListPathRequest, context: Context) -> volume_pb2.ListPathResponse:
        principal = await self._user(context, Role.VIEWER)
        found = await volumes.list_path(
            self.services.volumes,
            self.services.volume_files,
            principal,
            request.volume,
            request.path,
            recursive=request.recursive,
        )
        return volume_pb2.ListPathResponse(entries=[_entry(e) for e in found])

    @unary
    async def RemovePath(
        self, request: volume_pb2.RemovePathRequest, context: Context
    ) -> volume_pb2.RemovePathResponse:
        principal = await self._user(context, Role.MEMBER)
        removed = await volumes.remove_path(
            self.services.volumes,
            self.services.volume_files,
            principal,
            request.volume,
            request.path,
            recursive=request.recursive,
        )
        return volume_pb2.RemovePathResponse(removed=removed)

    @streaming
    async def ReadFile(
        self, request: volume_pb2.ReadFileRequest, context: Context
    ) -> AsyncIterator[volume_pb2.FileChunk]:
        principal = await self._user(context, Role.VIEWER)
        with self.services.auth.streams.open(principal.token_id) as guard:
            size, pieces = await guard.wait(
                volumes.read_file(
                    self.services.volumes, self.services.volume_files, principal, request.volume, request.path
                )
            )
            first = True
            async for piece in guard.iterate(pieces):
                yield volume_pb2.FileChunk(total_bytes=size if first else 0, data=piece)
                first = False
            if first:  # an empty file: one chunk still says its size
                yield volume_pb2.FileChunk(total_bytes=0)

    @unary
    async def WriteFile(
        self, request_iterator: AsyncIterator[volume_pb2.FileChunk], context: Context
    ) -> volume_pb2.WriteFileResponse:
        principal = await self._user(context, Role.MEMBER)
        with self.services.auth.streams.open(principal.token_id) as guard:
            first = await guard.wait(anext(request_iterator, None))
            if first is None:
                raise ValueError("a write needs at least one chunk, the first naming volume and path")

            async def pieces() -> AsyncIterator[bytes]:
                if first.data:
                    yield first.data
                async for chunk in request_iterator:
                    yield chunk.data

            written = await guard.wait(
                volumes.write_file(
                    self.services.volumes, self.services.volume_files, principal, first.volume, first.path, pieces()
                )
            )
            if first.total_bytes and written != first.total_bytes:
                raise ValueError(
                    f"the write carried {written} bytes, but its first chunk announced {first.total_bytes}"
                )
        return volume_pb2.WriteFileResponse(bytes=written)
