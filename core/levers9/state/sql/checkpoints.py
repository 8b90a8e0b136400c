"""Container checkpoints (CRIU snapshots) and whether they can still be restored.

A checkpoint that failed to restore is kept, marked ``restore_failed``, rather
than deleted: the record says why cold starts happen for that function, and
the scheduler stops offering it.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from sqlalchemy import select

from levers9.state.errors import InvalidTransition
from levers9.state.sql._common import require
from levers9.state.sql.database import Database
from levers9.state.sql.models import Checkpoint, Workspace, new_id, utcnow
from levers9.state.sql.records import CheckpointRecord, CheckpointStatus, parse_enum

C = CheckpointStatus
#: the statuses each status may move to; repeating the current status is always allowed
TRANSITIONS: dict[CheckpointStatus, frozenset[CheckpointStatus]] = {
    C.PENDING: frozenset({C.AVAILABLE, C.FAILED}),
    C.AVAILABLE: frozenset({C.RESTORE_FAILED, C.FAILED}),
    C.RESTORE_FAILED: frozenset({C.FAILED}),
    C.FAILED: frozenset(),
}


def _checkpoint(row: Checkpoint) -> CheckpointRecord:
    return CheckpointRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        stub_id=row.stub_id,
        task_id=row.task_id,
        status=CheckpointStatus(row.status),
        runtime=row.runtime,
        gpu=row.gpu,
        path=row.path,
        size_bytes=row.size_bytes,
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class CheckpointStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        workspace_id: str,
        runtime: str,
        *,
        stub_id: str | None = None,
        task_id: str | None = None,
        gpu: str | None = None,
        path: str | None = None,
    ) -> CheckpointRecord:
        """A checkpoint being taken (status pending) by ``runtime``, of a task of stub ``stub_id``."""
        now = utcnow()
        async with self._db.transaction() as session:
            await require(session, Workspace, workspace_id, "workspace")
            row = Checkpoint(
                id=new_id("ckpt"),
                workspace_id=workspace_id,
                stub_id=stub_id,
                task_id=task_id,
                status=CheckpointStatus.PENDING.value,
                runtime=runtime,
                gpu=gpu,
                path=path,
                size_bytes=None,
                error=None,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            await session.flush()
            return _checkpoint(row)

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Checkpoint, checkpoint_id)
            return None if row is None else _checkpoint(row)

    async def set_status(
        self,
        checkpoint_id: str,
        status: str,
        *,
        path: str | None = None,
        size_bytes: int | None = None,
        error: str | None = None,
    ) -> CheckpointRecord:
        """Move the checkpoint to ``status`` (see :data:`TRANSITIONS`), keeping any of path, size and error given."""
        target = parse_enum(CheckpointStatus, status, "checkpoint status")
        async with self._db.transaction() as session:
            row = await require(session, Checkpoint, checkpoint_id, "checkpoint", lock=True)
            current = CheckpointStatus(row.status)
            if target != current and target not in TRANSITIONS[current]:
                allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing, it is final"
                raise InvalidTransition(
                    f"checkpoint {checkpoint_id} is {current}; it cannot become {target} (from {current}: {allowed})"
                )
            row.status = target.value
            if path is not None:
                row.path = path
            if size_bytes is not None:
                row.size_bytes = size_bytes
            if error is not None:
                row.error = error
            row.updated_at = utcnow()
            return _checkpoint(row)

    async def latest(self, stub_id: str, *, gpu: str | None = None) -> CheckpointRecord | None:
        """The newest available checkpoint of the stub (taken on ``gpu``, when given): what a cold start restores."""
        query = select(Checkpoint).where(
            Checkpoint.stub_id == stub_id, Checkpoint.status == CheckpointStatus.AVAILABLE.value
        )
        if gpu is not None:
            query = query.where(Checkpoint.gpu == gpu)
        async with self._db.transaction() as session:
            row = await session.scalar(query.order_by(Checkpoint.created_at.desc(), Checkpoint.id).limit(1))
            return None if row is None else _checkpoint(row)

    async def list(
        self, workspace_id: str, *, stub_id: str | None = None, statuses: Sequence[str] | None = None
    ) -> builtins.list[CheckpointRecord]:
        """The workspace's checkpoints, newest first."""
        query = select(Checkpoint).where(Checkpoint.workspace_id == workspace_id)
        if stub_id is not None:
            query = query.where(Checkpoint.stub_id == stub_id)
        if statuses is not None:
            wanted = [parse_enum(CheckpointStatus, s, "checkpoint status").value for s in statuses]
            query = query.where(Checkpoint.status.in_(wanted))
        async with self._db.transaction() as session:
            rows = await session.scalars(query.order_by(Checkpoint.created_at.desc(), Checkpoint.id))
            return [_checkpoint(row) for row in rows]


__all__ = ["TRANSITIONS", "CheckpointStore"]
