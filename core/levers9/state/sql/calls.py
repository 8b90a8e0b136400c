"""The data path of calls: arguments out to workers, results and output back, in batches.

A map of ten thousand calls must not become forty thousand transactions, so
every method here takes many tasks at once; the worker session batches what
its worker reports, and these turn each batch into one transaction.

Results are accepted only from the worker a task is assigned to: a worker that
was presumed dead (and whose task was requeued and placed elsewhere) and then
reports late does not overwrite the attempt that replaced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Select, Table, bindparam, func, insert, select, update

from levers9.state.sql.database import Database
from levers9.state.sql.models import Stub, Task, TaskIO, TaskLog, utcnow
from levers9.state.sql.records import TaskStatus

__all__ = ["CallResult", "CallStore", "Dispatch", "Finish"]

_UNFINISHED = (TaskStatus.PENDING.value, TaskStatus.RUNNING.value)
# Core tables for executemany updates: the ORM's bulk update does not take a WHERE with many parameter sets.
_TASKS = cast(Table, Task.__table__)
_TASK_IO = cast(Table, TaskIO.__table__)
_TASK_LOGS = cast(Table, TaskLog.__table__)
# compiled once per process, not per batch
_FINISH = (
    update(_TASKS)
    .where(_TASKS.c.id == bindparam("tid"))
    .values(
        status=bindparam("st"),
        error=bindparam("err"),
        finished_at=bindparam("now"),
        updated_at=bindparam("now"),
        started_at=func.coalesce(_TASKS.c.started_at, bindparam("now")),
        container_id=func.coalesce(bindparam("cid"), _TASKS.c.container_id),
        worker_id=func.coalesce(_TASKS.c.worker_id, bindparam("wid")),
    )
)
_FINISH_IO = (
    update(_TASK_IO)
    .where(_TASK_IO.c.task_id == bindparam("tid"))
    .values(result=bindparam("res"), error_type=bindparam("et"), traceback=bindparam("tb"))
)


def _locked_states(ids: Sequence[str]) -> Select[str, str, str | None]:
    """Status and worker of ``ids``, locked in id order (PostgreSQL) so two batches cannot deadlock."""
    return (
        select(_TASKS.c.id, _TASKS.c.status, _TASKS.c.worker_id)
        .where(_TASKS.c.id.in_(ids))
        .order_by(_TASKS.c.id)
        .with_for_update()
    )


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What a worker needs to run one placed task."""

    task_id: str
    workspace_id: str
    stub_id: str | None
    args: bytes
    attempts: int
    status: str


@dataclass(frozen=True, slots=True)
class Finish:
    task_id: str
    #: complete, error, cancelled or timeout
    status: str
    result: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    #: where it ran, when the start was not stored separately (a call that started and ended in one report)
    container_id: str | None = None


@dataclass(frozen=True, slots=True)
class CallResult:
    task_id: str
    workspace_id: str
    status: str
    result: bytes | None
    error: str | None
    error_type: str | None
    traceback: str | None
    attempts: int


class CallStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def dispatch(self, task_ids: Sequence[str]) -> list[Dispatch]:
        """The tasks with their arguments, in the order asked; unknown ids are left out."""
        if not task_ids:
            return []
        query = (
            select(_TASKS.c.id, _TASKS.c.workspace_id, _TASKS.c.stub_id, _TASK_IO.c.args, _TASKS.c.attempts,
                   _TASKS.c.status)
            .join(_TASK_IO, _TASK_IO.c.task_id == _TASKS.c.id, isouter=True)
            .where(_TASKS.c.id.in_(task_ids))
        )  # fmt: skip

        def work(connection: Connection) -> dict[str, Dispatch]:
            rows = connection.execute(query)
            return {row[0]: Dispatch(row[0], row[1], row[2], row[3] or b"", row[4], row[5]) for row in rows}

        found = await self._db.run(work)
        return [found[t] for t in task_ids if t in found]

    async def start_many(self, worker_id: str, started: Sequence[tuple[str, str]]) -> list[str]:
        """Mark ``(task_id, container_id)`` pairs running on ``worker_id``; returns the ids that changed."""
        if not started:
            return []
        ids = sorted({task_id for task_id, _ in started})
        now = utcnow()

        def work(connection: Connection) -> list[dict[str, Any]]:
            current = {row[0]: (row[1], row[2]) for row in connection.execute(_locked_states(ids))}
            changes = [
                {"tid": task_id, "cid": container_id, "wid": worker_id, "now": now}
                for task_id, container_id in started
                if current.get(task_id, ("", None))[0] == TaskStatus.PENDING.value
                and current[task_id][1] in (None, worker_id)
            ]
            if changes:
                connection.execute(
                    update(_TASKS)
                    .where(_TASKS.c.id == bindparam("tid"))
                    .values(
                        status=TaskStatus.RUNNING.value,
                        container_id=bindparam("cid"),
                        worker_id=bindparam("wid"),
                        started_at=bindparam("now"),
                        updated_at=bindparam("now"),
                    ),
                    changes,
                )
            return changes

        return [str(c["tid"]) for c in await self._db.run(work)]

    async def finish_many(self, finishes: Sequence[Finish], *, worker_id: str | None = None) -> list[str]:
        """Store outcomes of unfinished tasks (assigned to ``worker_id`` when given); returns the ids stored.

        A task that already finished, or that now belongs to another worker, is
        skipped: finishing is idempotent and a late report cannot overwrite.
        """
        if not finishes:
            return []
        for f in finishes:
            if not TaskStatus(f.status).terminal:
                raise ValueError(f"task {f.task_id}: finish needs a terminal status, got {f.status!r}")
        ids = sorted({f.task_id for f in finishes})
        now = utcnow()

        def work(connection: Connection) -> list[Finish]:
            current = {row[0]: (row[1], row[2]) for row in connection.execute(_locked_states(ids))}
            accepted: list[Finish] = []
            seen: set[str] = set()
            for f in finishes:
                status, owner = current.get(f.task_id, ("", None))
                if f.task_id in seen or status not in _UNFINISHED:
                    continue
                if worker_id is not None and owner not in (None, worker_id):
                    continue
                seen.add(f.task_id)
                accepted.append(f)
            if not accepted:
                return []
            connection.execute(
                _FINISH,
                [
                    {"tid": f.task_id, "st": f.status, "err": f.error, "now": now, "cid": f.container_id,
                     "wid": worker_id}
                    for f in accepted
                ],
            )  # fmt: skip
            connection.execute(
                _FINISH_IO,
                [{"tid": f.task_id, "res": f.result, "et": f.error_type, "tb": f.traceback} for f in accepted],
            )
            return accepted

        return [f.task_id for f in await self._db.run(work)]

    async def results(self, task_ids: Sequence[str], *, workspace_id: str | None = None) -> list[CallResult]:
        """Outcomes of the finished tasks among ``task_ids`` (of ``workspace_id`` when given)."""
        if not task_ids:
            return []
        query = (
            select(
                Task.id,
                Task.workspace_id,
                Task.status,
                TaskIO.result,
                Task.error,
                TaskIO.error_type,
                TaskIO.traceback,
                Task.attempts,
            )
            .join(TaskIO, TaskIO.task_id == Task.id, isouter=True)
            .where(Task.id.in_(task_ids), Task.status.not_in(_UNFINISHED))
        )
        if workspace_id is not None:
            query = query.where(Task.workspace_id == workspace_id)
        return await self._db.run(lambda connection: [CallResult(*row) for row in connection.execute(query)])

    async def owned(self, workspace_id: str, task_ids: Sequence[str]) -> set[str]:
        """Which of ``task_ids`` exist in ``workspace_id``: a workspace never learns of another's tasks."""
        if not task_ids:
            return set()
        query = select(_TASKS.c.id).where(_TASKS.c.id.in_(task_ids), _TASKS.c.workspace_id == workspace_id)
        return await self._db.run(lambda connection: set(connection.scalars(query)))

    async def append_logs(self, chunks: Sequence[tuple[str, bytes]]) -> None:
        """Append output chunks; chunks of tasks that no longer exist are dropped."""
        chunks = [(t, d) for t, d in chunks if d]
        if not chunks:
            return
        now = utcnow()

        def work(connection: Connection) -> None:
            known = set(connection.scalars(select(_TASKS.c.id).where(_TASKS.c.id.in_({t for t, _ in chunks}))))
            rows: list[dict[str, Any]] = [{"task_id": t, "at": now, "data": d} for t, d in chunks if t in known]
            if rows:
                connection.execute(insert(_TASK_LOGS), rows)

        await self._db.run(work)

    async def logs(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        """Output chunks of ``task_id`` after chunk id ``after``, oldest first, as ``(id, data)``."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(TaskLog.id, TaskLog.data)
                .where(TaskLog.task_id == task_id, TaskLog.id > after)
                .order_by(TaskLog.id)
                .limit(limit)
            )
            return [(row[0], row[1]) for row in rows]

    async def handler(self, stub_id: str) -> bytes | None:
        async with self._db.transaction() as session:
            value: bytes | None = await session.scalar(select(Stub.handler).where(Stub.id == stub_id))
            return value

    async def set_handler(self, stub_id: str, handler: bytes) -> None:
        async with self._db.transaction() as session:
            await session.execute(
                update(Stub).where(Stub.id == stub_id, Stub.handler.is_(None)).values(handler=handler)
            )
