"""Blobs: call payloads too big to travel inside a message, stored in chunks (see :mod:`levers9.payloads`).

Invariants:

* a blob belongs to one workspace; reading it through another workspace is
  :class:`NotFound`, exactly like a blob that does not exist;
* a blob is readable only once finished: every chunk stored and their sizes
  adding up to the size declared when it was begun. A writer that stops half
  way (its stream broke) leaves nothing behind: :meth:`BlobStore.put` deletes
  what it wrote, and :meth:`BlobStore.delete_unfinished` removes what a
  crashed controlplane left;
* chunks are written a few per transaction and read a few per query, so a
  gigabyte never sits in memory on the controlplane at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update

from levers9.payloads import PayloadTooLarge
from levers9.state.errors import NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.models import Blob, BlobChunk, new_id, utcnow

__all__ = ["BlobInfo", "BlobStore", "IncompleteBlob"]

#: chunks written per transaction and read per query
_ROWS_PER_STEP = 8


class IncompleteBlob(ValueError):
    """The uploaded bytes do not add up to the size declared at the start."""


@dataclass(frozen=True)
class BlobInfo:
    id: str
    workspace_id: str
    size_bytes: int
    finished: bool


class BlobStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(
        self, workspace_id: str, pieces: AsyncIterable[bytes], *, size: int, cap: int, what: str = "a payload"
    ) -> str:
        """Store ``pieces`` (``size`` bytes in all, at most ``cap``) as a finished blob; its id.

        Raises :class:`PayloadTooLarge` before storing anything when ``size`` is over ``cap``, and
        :class:`IncompleteBlob` when the pieces do not add up to ``size``; either way nothing is kept.
        """
        if size > cap:
            raise PayloadTooLarge(what, size, cap)
        if size < 0:
            raise IncompleteBlob(f"a blob's size must be at least 0, got {size}")
        blob_id = new_id("blob")
        async with self._db.transaction() as session:
            session.add(Blob(id=blob_id, workspace_id=workspace_id, size_bytes=size, created_at=utcnow()))
        stored = 0
        seq = 0
        rows: list[BlobChunk] = []
        try:
            async for piece in pieces:
                if not piece:
                    continue
                stored += len(piece)
                if stored > size:
                    raise IncompleteBlob(f"the upload sent more than the {size} bytes it declared")
                rows.append(BlobChunk(blob_id=blob_id, seq=seq, data=bytes(piece)))
                seq += 1
                if len(rows) >= _ROWS_PER_STEP:
                    await self._write(rows)
                    rows = []
            if stored != size:
                raise IncompleteBlob(f"the upload ended after {stored} of the {size} bytes it declared")
            await self._write(rows)
            async with self._db.transaction() as session:
                await session.execute(update(Blob).where(Blob.id == blob_id).values(finished_at=utcnow()))
        except BaseException:
            await self.delete([blob_id])
            raise
        return blob_id

    async def _write(self, rows: list[BlobChunk]) -> None:
        if rows:
            async with self._db.transaction() as session:
                session.add_all(rows)

    async def info(self, blob_id: str, workspace_id: str) -> BlobInfo:
        """A finished blob of ``workspace_id``; NotFound for anything else (missing, another's, unfinished)."""
        async with self._db.sessions() as session:
            row = await session.get(Blob, blob_id)
        if row is None or row.workspace_id != workspace_id or row.finished_at is None:
            raise NotFound("blob", blob_id)
        return BlobInfo(row.id, row.workspace_id, row.size_bytes, True)

    async def read(self, blob_id: str, workspace_id: str) -> AsyncIterator[bytes]:
        """The blob's chunks in order (NotFound, before the first, as :meth:`info` says)."""
        await self.info(blob_id, workspace_id)
        seq = 0
        while True:
            async with self._db.sessions() as session:
                found = (
                    await session.execute(
                        select(BlobChunk.data)
                        .where(BlobChunk.blob_id == blob_id, BlobChunk.seq >= seq)
                        .order_by(BlobChunk.seq)
                        .limit(_ROWS_PER_STEP)
                    )
                ).scalars()
                data = list(found)
            for piece in data:
                yield piece
            if len(data) < _ROWS_PER_STEP:
                return
            seq += len(data)

    async def read_all(self, blob_id: str, workspace_id: str) -> bytes:
        return b"".join([piece async for piece in self.read(blob_id, workspace_id)])

    async def delete(self, blob_ids: list[str]) -> None:
        if blob_ids:
            async with self._db.transaction() as session:
                await session.execute(delete(BlobChunk).where(BlobChunk.blob_id.in_(blob_ids)))
                await session.execute(delete(Blob).where(Blob.id.in_(blob_ids)))

    async def delete_unfinished(self, older_than: timedelta) -> int:
        """Remove blobs whose upload began before ``older_than`` ago and never finished; how many."""
        cutoff: datetime = utcnow() - older_than
        async with self._db.sessions() as session:
            ids = list(
                (
                    await session.execute(select(Blob.id).where(Blob.finished_at.is_(None), Blob.created_at < cutoff))
                ).scalars()
            )
        await self.delete(ids)
        return len(ids)
