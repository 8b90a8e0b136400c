"""Blobs: big payloads stored in chunks, per workspace, readable only once whole."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from levers9.payloads import CHUNK_BYTES, PayloadTooLarge, chunks
from levers9.state.errors import NotFound
from levers9.state.sql.blobs import BlobStore, IncompleteBlob
from levers9.state.sql.database import Database
from levers9.state.sql.models import Blob, BlobChunk, new_id, utcnow
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.workspaces import WorkspaceStore


async def _pieces(data: bytes) -> AsyncIterator[bytes]:
    for piece in chunks(data, CHUNK_BYTES):
        yield bytes(piece)


async def _rows(db: Database) -> tuple[int, int]:
    async with db.sessions() as session:
        blobs = (await session.execute(select(func.count()).select_from(Blob))).scalar_one()
        parts = (await session.execute(select(func.count()).select_from(BlobChunk))).scalar_one()
    return blobs, parts


async def test_a_blob_of_many_chunks_reads_back_whole_and_in_order(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlobStore(db)
    data = os.urandom(CHUNK_BYTES * 19 + 12345)  # more chunks than one write or read step holds
    blob_id = await store.put(workspace.id, _pieces(data), size=len(data), cap=1 << 30)
    assert (await store.info(blob_id, workspace.id)).size_bytes == len(data)
    assert await store.read_all(blob_id, workspace.id) == data
    assert await _rows(db) == (1, 20)


async def test_another_workspace_reads_nothing(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlobStore(db)
    other = await WorkspaceStore(db).create("team-b")
    blob_id = await store.put(workspace.id, _pieces(b"secret"), size=6, cap=1 << 20)
    with pytest.raises(NotFound):
        await store.info(blob_id, other.id)
    with pytest.raises(NotFound):
        await store.read_all(blob_id, other.id)


async def test_over_the_cap_fails_before_anything_is_stored(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlobStore(db)
    with pytest.raises(PayloadTooLarge, match=r"is 2,000 bytes .* over the cap of 1,000 bytes"):
        await store.put(workspace.id, _pieces(b"x" * 2000), size=2000, cap=1000, what="the result")
    assert await _rows(db) == (0, 0)


@pytest.mark.parametrize("sent", [b"x" * 10, b"x" * 30])
async def test_an_upload_that_does_not_add_up_leaves_nothing(
    db: Database, workspace: WorkspaceRecord, sent: bytes
) -> None:
    store = BlobStore(db)
    with pytest.raises(IncompleteBlob):
        await store.put(workspace.id, _pieces(sent), size=20, cap=1 << 20)
    assert await _rows(db) == (0, 0)


async def test_unfinished_blobs_left_by_a_crash_are_removed(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlobStore(db)
    kept = await store.put(workspace.id, _pieces(b"done"), size=4, cap=1 << 20)
    async with db.transaction() as session:  # as a controlplane killed mid-upload leaves it
        session.add(
            Blob(id=new_id("blob"), workspace_id=workspace.id, size_bytes=9, created_at=utcnow() - timedelta(hours=2))
        )
    async with db.sessions() as session:
        crashed = (await session.execute(select(Blob.id).where(Blob.finished_at.is_(None)))).scalar_one()
    with pytest.raises(NotFound):  # not readable meanwhile
        await store.info(crashed, workspace.id)
    assert await store.delete_unfinished(timedelta(hours=1)) == 1
    assert await store.read_all(kept, workspace.id) == b"done"
    assert await _rows(db) == (1, 1)
