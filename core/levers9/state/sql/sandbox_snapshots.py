"""Each workspace's stored sandbox snapshots (issue 39): listed, found and deleted by (workspace, id) only.

A snapshot is recorded once its worker stored it (the object is in the checkpoint storage under its ``key``
before the row exists), and its row is deleted only after the object is: a row is never left naming nothing
the caller was not told about, and an object whose deletion failed keeps its row, so it can be deleted again.
No query crosses workspaces: another workspace's snapshot is not found, as one that does not exist.
"""

from __future__ import annotations

import builtins
from typing import Any

from sqlalchemy import delete, select

from levers9.state.errors import NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.models import SandboxSnapshot, Workspace, utcnow
from levers9.state.sql.records import SandboxSnapshotRecord

__all__ = ["SandboxSnapshotStore"]


def _record(row: SandboxSnapshot) -> SandboxSnapshotRecord:
    return SandboxSnapshotRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        sandbox_id=row.sandbox_id,
        pool=row.pool,
        runtime=row.runtime,
        key=row.key,
        size_bytes=row.size_bytes,
        info=dict(row.info),
        created_at=row.created_at,
    )


class SandboxSnapshotStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self,
        workspace_id: str,
        snapshot_id: str,
        *,
        sandbox_id: str,
        pool: str,
        runtime: str,
        key: str,
        size_bytes: int,
        info: dict[str, Any],
    ) -> SandboxSnapshotRecord:
        async with self._db.transaction() as session:
            if await session.get(Workspace, workspace_id) is None:
                raise NotFound("workspace", workspace_id)
            row = SandboxSnapshot(
                id=snapshot_id,
                workspace_id=workspace_id,
                sandbox_id=sandbox_id,
                pool=pool,
                runtime=runtime,
                key=key,
                size_bytes=size_bytes,
                info=info,
                created_at=utcnow(),
            )
            session.add(row)
            await session.flush()
            return _record(row)

    async def get(self, workspace_id: str, snapshot_id: str) -> SandboxSnapshotRecord:
        """NotFound for an id of another workspace too."""
        async with self._db.transaction() as session:
            row = await session.get(SandboxSnapshot, snapshot_id)
            if row is None or row.workspace_id != workspace_id:
                raise NotFound("sandbox snapshot", snapshot_id)
            return _record(row)

    async def list(self, workspace_id: str) -> builtins.list[SandboxSnapshotRecord]:
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(SandboxSnapshot)
                .where(SandboxSnapshot.workspace_id == workspace_id)
                .order_by(SandboxSnapshot.created_at, SandboxSnapshot.id)
            )
            return [_record(row) for row in rows]

    async def delete(self, workspace_id: str, snapshot_id: str) -> bool:
        async with self._db.transaction() as session:
            result = await session.execute(
                delete(SandboxSnapshot).where(
                    SandboxSnapshot.workspace_id == workspace_id, SandboxSnapshot.id == snapshot_id
                )
            )
            return bool(getattr(result, "rowcount", 0))
