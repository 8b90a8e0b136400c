"""Tasks and their placement history: the one writer of the ``tasks`` table, and what the scheduler rebuilds from.

Redis holds the scheduler's working queues; this table holds what must
survive the controlplane: every task that is not finished is read back by
:meth:`TaskStore.unfinished` at start.

**One writer.** Every write to ``tasks`` (and to ``task_io``'s arguments and
results) goes through :class:`TaskStore`; :class:`~levers9.state.sql.calls.CallStore`
only reads them. Who moves a task, and by which method:

* created ``pending`` (with its arguments): :meth:`TaskStore.create_many`, by
  :meth:`Scheduler.submit_many <levers9.scheduler.service.Scheduler.submit_many>`
  (the data plane's submit), before the request is put on the Redis backlog;
* where it was placed (worker, pool, GPU; no change of status):
  :meth:`TaskStore.record`, by the scheduler's history writer
  (:mod:`levers9.scheduler.history`), behind the placement Redis made;
* ``pending`` -> ``running``: :meth:`TaskStore.start_many`, by the data plane's
  report path (:mod:`levers9.services.worker_reports`), for the starts Redis
  says are placed on the reporting worker;
* ``pending``/``running`` -> a terminal status: :meth:`TaskStore.finish_many`
  (a worker's outcomes, once Redis freed them from that worker),
  :meth:`TaskStore.cancel` (a user, through the scheduler's ``cancel``),
  :meth:`TaskStore.finish` (the scheduler alone: a request that gave up, one
  no pool fits any more, a stored request that cannot be read after a restart);
* ``pending``/``running`` -> ``pending`` again: :meth:`TaskStore.requeue`, by the
  scheduler alone (a failed attempt retried, a worker or machine lost, a
  worker a restart lost track of), which counts an attempt.

Status changes follow one rule set: terminal statuses (complete, error,
cancelled, timeout) never change again; finishing twice with the same status
is accepted, so a retried RPC is harmless; a worker's start or outcome is
stored only for a task that is unfinished and on that worker or on none (a
late report cannot overwrite the attempt that replaced it).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import JSON, Connection, Select, Table, Text, bindparam, column, func, insert, select, update
from sqlalchemy import cast as cast_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.selectable import TableValuedAlias

from levers9.state.errors import AlreadyExists, InvalidTransition, NotFound
from levers9.state.sql import direct
from levers9.state.sql._common import require
from levers9.state.sql.database import Database
from levers9.state.sql.models import Stub, Task, TaskIO, TaskPlacement, Workspace, new_id, utcnow
from levers9.state.sql.records import PlacementEvent, PlacementOutcome, TaskRecord, TaskStatus, parse_enum

_UNFINISHED = (TaskStatus.PENDING.value, TaskStatus.RUNNING.value)
_TASKS = cast(Table, Task.__table__)
_TASK_IO = cast(Table, TaskIO.__table__)
_PLACEMENTS = cast(Table, TaskPlacement.__table__)
_WORKSPACES = cast(Table, Workspace.__table__)
_OUTCOME_MAX = 32


def _recordset(name: str, table: Table, columns: Sequence[str]) -> TableValuedAlias:
    """``json_to_recordset(:name) AS name(c1 type1, ...)``: PostgreSQL rows from one JSON array of objects.

    A whole batch is then one statement with one parameter, serialized by the C JSON encoder,
    instead of a statement (or an array element adapted in Python) per row; the rows come out
    in the array's order. The types are ``table``'s, so a value too long for its column is
    refused as it would be by an insert.
    """
    rows = func.json_to_recordset(cast_(bindparam(name, type_=Text()), JSON()))
    return rows.table_valued(*[column(c, table.c[c].type) for c in columns]).render_derived(name=name, with_types=True)


def _json(rows: Sequence[Any]) -> str:
    """``rows`` as JSON text, timestamps as ISO 8601 (each distinct one formatted once: a batch shares a few)."""
    seen: dict[object, str] = {}

    def timestamp(value: object) -> str:
        text = seen.get(value)
        if text is None:
            text = seen[value] = _utc_iso(value)
        return text

    return json.dumps(rows, default=timestamp, separators=(",", ":"))


def _utc_iso(value: object) -> str:
    """A timestamp as JSON carries it: aware UTC only, as :class:`UtcDateTime` requires of every timestamp."""
    if not isinstance(value, datetime):
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"timestamp {value.isoformat()} has no time zone; pass an aware UTC datetime")
    return value.astimezone(UTC).isoformat()


#: a placement history row's columns
_HISTORY_COLUMNS = ("task_id", "attempt", "at", "outcome", "pool", "gpu", "region", "worker_id", "reason")
# PostgreSQL's statements for a batch of placement history: each takes one JSON parameter, whatever the batch's size
_pg_ids = select(func.json_array_elements_text(cast_(bindparam("ids", type_=Text()), JSON())))
_PG_LOCK = (
    select(_TASKS.c.id, _TASKS.c.attempts, _TASKS.c.status)
    .where(_TASKS.c.id.in_(_pg_ids.scalar_subquery()))
    .order_by(_TASKS.c.id)
    .with_for_update()
)
_pg_history = _recordset("history", _PLACEMENTS, _HISTORY_COLUMNS)
_PG_HISTORY = insert(_PLACEMENTS).from_select(_HISTORY_COLUMNS, select(*[_pg_history.c[c] for c in _HISTORY_COLUMNS]))
_pg_placed = _recordset("placed", _TASKS, ("id", "worker_id", "pool", "gpu"))
_PG_PLACED = (
    update(_TASKS)
    .where(_TASKS.c.id == _pg_placed.c.id)
    .values(worker_id=_pg_placed.c.worker_id, pool=_pg_placed.c.pool, gpu=_pg_placed.c.gpu, updated_at=bindparam("now"))
)


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


def _task(row: Task) -> TaskRecord:
    return TaskRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        stub_id=row.stub_id,
        status=TaskStatus(row.status),
        attempts=row.attempts,
        request=dict(row.request),
        container_id=row.container_id,
        worker_id=row.worker_id,
        pool=row.pool,
        gpu=row.gpu,
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _record(row: dict[str, Any]) -> TaskRecord:
    """A record of a row just inserted, built from the values themselves."""
    return TaskRecord(
        id=row["id"],
        workspace_id=row["workspace_id"],
        stub_id=row["stub_id"],
        status=TaskStatus(row["status"]),
        attempts=row["attempts"],
        request=dict(row["request"]),
        container_id=None,
        worker_id=None,
        pool=None,
        gpu=None,
        error=None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=None,
        finished_at=None,
    )


def _event(row: TaskPlacement) -> PlacementEvent:
    return PlacementEvent(
        task_id=row.task_id,
        outcome=row.outcome,
        pool=row.pool,
        gpu=row.gpu,
        region=row.region,
        worker_id=row.worker_id,
        reason=row.reason,
        attempt=row.attempt,
        at=row.at,
    )


def _history(
    events: Sequence[PlacementEvent], found: dict[str, tuple[int, str]], now: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The history rows of ``events`` whose task is in ``found`` (id: attempts, status), and where each went.

    The second list has one entry per placed task, its last placement in ``events``; a task cancelled
    while it was being placed never ran, so it has none.
    """
    history: list[dict[str, Any]] = []
    placed: dict[str, dict[str, Any]] = {}
    for event in events:
        task = found.get(event.task_id)
        if task is None:
            continue
        attempts, status = task
        history.append(
            {
                "task_id": event.task_id,
                "attempt": attempts if event.attempt is None else event.attempt,
                "at": now if event.at is None else event.at,
                "outcome": event.outcome,
                "pool": event.pool,
                "gpu": event.gpu,
                "region": event.region,
                "worker_id": event.worker_id,
                "reason": event.reason,
            }
        )
        # where it ran is kept even when the call finished before this was written (it is fast)
        if event.outcome == PlacementOutcome.PLACED and status != TaskStatus.CANCELLED.value:
            placed[event.task_id] = {
                "id": event.task_id,
                "worker_id": event.worker_id,
                "pool": event.pool,
                "gpu": event.gpu,
            }
    return history, list(placed.values())


class TaskStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, workspace_id: str, request: dict[str, Any], *, stub_id: str | None = None, task_id: str | None = None
    ) -> TaskRecord:
        """A new pending task; ``task_id`` lets the caller choose the id (made here when None)."""
        [record] = await self.create_many(
            workspace_id, [request if task_id is None else (task_id, request)], stub_id=stub_id
        )
        return record

    async def create_many(
        self,
        workspace_id: str,
        requests: Sequence[dict[str, Any] | tuple[str, dict[str, Any]]],
        *,
        stub_id: str | None = None,
        args: Sequence[bytes] | None = None,
        records: bool = True,
    ) -> list[TaskRecord]:
        """Many pending tasks in one transaction (a ``map`` over inputs): all are stored, or none.

        Each item is a request (its task id is made here) or a ``(task_id,
        request)`` pair, for a scheduler that names its requests itself.
        ``args``, when given, holds each call's serialized arguments, in order.
        ``records=False``: return nothing (an empty list), for a caller that
        named the tasks itself and would build thousands of records for nothing.
        """
        if args is not None and len(args) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(args)} argument payloads")
        now = utcnow()
        rows: list[dict[str, Any]] = []
        chosen: list[str] = []
        for item in requests:
            if isinstance(item, tuple):
                task_id, request = item
                chosen.append(task_id)
            else:
                task_id, request = new_id("task"), item
            rows.append(
                {
                    "id": task_id,
                    "workspace_id": workspace_id,
                    "stub_id": stub_id,
                    "status": TaskStatus.PENDING.value,
                    "attempts": 0,
                    "request": request,
                    "container_id": None,
                    "worker_id": None,
                    "pool": None,
                    "gpu": None,
                    "error": None,
                    "created_at": now,
                    "updated_at": now,
                    "started_at": None,
                    "finished_at": None,
                }
            )
        if not rows:
            return []
        io_rows = (
            None if args is None else [{"task_id": row["id"], "args": a} for row, a in zip(rows, args, strict=True)]
        )

        def work(connection: Connection) -> None:
            if connection.scalar(select(_WORKSPACES.c.id).where(_WORKSPACES.c.id == workspace_id)) is None:
                raise NotFound("workspace", workspace_id)
            # Core inserts on the tables, in one executemany each: a map of thousands of calls is one
            # round trip, and no ORM object is built per row.
            connection.execute(insert(_TASKS), rows)
            if io_rows is not None:
                connection.execute(insert(_TASK_IO), io_rows)

        def direct_work(connection: sqlite3.Connection) -> None:
            if not direct.workspace_exists(connection, workspace_id):
                raise NotFound("workspace", workspace_id)
            direct.insert_tasks(connection, rows, io_rows)

        try:
            if self._db.direct:
                await self._db.run_direct(direct_work)
            else:
                await self._db.run(work)
        except (IntegrityError, sqlite3.IntegrityError):
            # The workspace was checked above, so a violated constraint is a reused id or a missing stub.
            shown = ", ".join(chosen[:5]) + ("..." if len(chosen) > 5 else "")
            raise AlreadyExists(
                f"a task id given ({shown or 'none'}) already exists, or stub {stub_id!r} does not; nothing was stored"
            ) from None
        return [_record(row) for row in rows] if records else []

    async def get(self, task_id: str) -> TaskRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Task, task_id)
            return None if row is None else _task(row)

    async def get_many(self, task_ids: Sequence[str]) -> list[TaskRecord]:
        """The tasks of ``task_ids`` that exist, in no particular order."""
        if not task_ids:
            return []
        async with self._db.transaction() as session:
            rows = await session.scalars(select(Task).where(Task.id.in_(list(task_ids))))
            return [_task(row) for row in rows]

    async def unfinished(self) -> list[TaskRecord]:
        """Every pending and running task, oldest first: what a restarted controlplane must pick up again."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Task).where(Task.status.in_(_UNFINISHED)).order_by(Task.created_at, Task.id)
            )
            return [_task(row) for row in rows]

    async def unfinished_of_kinds(self, kinds: Sequence[str], *, created_before: datetime) -> list[TaskRecord]:
        """Pending and running tasks of stubs of these kinds created before a time (the gateway's containers)."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Task)
                .join(Stub, Stub.id == Task.stub_id)
                .where(Task.status.in_(_UNFINISHED), Stub.kind.in_(list(kinds)), Task.created_at < created_before)
                .order_by(Task.created_at, Task.id)
            )
            return [_task(row) for row in rows]

    async def for_workspace(
        self, workspace_id: str, *, statuses: Sequence[str] | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """A workspace's tasks, newest first."""
        query = select(Task).where(Task.workspace_id == workspace_id)
        if statuses is not None:
            query = query.where(Task.status.in_([parse_enum(TaskStatus, s, "task status").value for s in statuses]))
        async with self._db.transaction() as session:
            rows = await session.scalars(query.order_by(Task.created_at.desc(), Task.id).limit(limit))
            return [_task(row) for row in rows]

    async def record(self, events: Sequence[PlacementEvent], *, skip_missing: bool = False) -> list[str]:
        """Append placement history for many tasks in one transaction (the scheduler's history writer batches it).

        A ``placed`` event also stores where the task went (worker, pool, GPU)
        on the task itself, even when it already finished (a fast call may end
        before its history is written), but not when it was cancelled while the
        scheduler was placing it. Unknown task ids fail the whole batch, or
        with ``skip_missing`` their events are left out and the ids returned
        (a task deleted with its workspace has nowhere to keep history).

        Whatever the batch's size, each table is written by one statement: an
        executemany on SQLite, which runs in the database's own thread, and on
        PostgreSQL one statement over the whole batch passed as one JSON parameter
        (``json_to_recordset``), so a batch is a few round trips, none per row.
        """
        if not events:
            return []
        for event in events:
            if not event.outcome or len(event.outcome) > _OUTCOME_MAX:
                raise ValueError(f"placement outcome {event.outcome!r} must be 1-{_OUTCOME_MAX} characters")
        now = utcnow()
        ids = sorted({event.task_id for event in events})

        def history_of(
            found: dict[str, tuple[int, str]],
        ) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
            missing = [task_id for task_id in ids if task_id not in found]
            if missing and not skip_missing:
                raise NotFound("task", ", ".join(missing))
            return missing, *_history(events, found, now)

        def direct_work(connection: sqlite3.Connection) -> list[str]:
            missing, history, placed = history_of(direct.attempts_and_status(connection, ids))
            if history:
                direct.insert_history(connection, history)
            if placed:
                direct.set_placed(connection, placed, now)
            return missing

        def work(connection: Connection) -> list[str]:  # PostgreSQL: SQLite runs direct_work
            # Locked in id order, so two batches touching the same tasks cannot deadlock.
            locking = connection.execute(_PG_LOCK, {"ids": _json(ids)})
            missing, history, placed = history_of({row[0]: (row[1], row[2]) for row in locking})
            if history:
                connection.execute(_PG_HISTORY, {"history": _json(history)})
            if placed:
                connection.execute(_PG_PLACED, {"placed": _json(placed), "now": now})
            return missing

        return await (self._db.run_direct(direct_work) if self._db.direct else self._db.run(work))

    async def set_running(self, task_id: str, worker_id: str, container_id: str) -> TaskRecord:
        """The task's container started on ``worker_id``; only a pending task can start.

        Repeating the call for the same worker and container returns the task
        unchanged, so a worker that retries its report is not refused.
        """
        now = utcnow()
        async with self._db.transaction() as session:
            row = await require(session, Task, task_id, "task", lock=True)
            if row.status == TaskStatus.RUNNING and (row.worker_id, row.container_id) == (worker_id, container_id):
                return _task(row)
            if row.status != TaskStatus.PENDING:
                raise InvalidTransition(
                    f"task {task_id} is {row.status}"
                    + (
                        f" in container {row.container_id} on {row.worker_id}"
                        if row.status == TaskStatus.RUNNING
                        else ""
                    )
                    + "; only a pending task can start running"
                )
            row.status = TaskStatus.RUNNING.value
            row.worker_id = worker_id
            row.container_id = container_id
            row.started_at = now
            row.updated_at = now
            return _task(row)

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

        def accept(current: dict[str, tuple[str, str | None]]) -> list[Finish]:
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
            return accepted

        def rows(accepted: list[Finish]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            return (
                [
                    {
                        "tid": f.task_id,
                        "st": f.status,
                        "err": f.error,
                        "now": now,
                        "cid": f.container_id,
                        "wid": worker_id,
                    }
                    for f in accepted
                ],
                [{"tid": f.task_id, "res": f.result, "et": f.error_type, "tb": f.traceback} for f in accepted],
            )

        def work(connection: Connection) -> list[Finish]:
            accepted = accept({row[0]: (row[1], row[2]) for row in connection.execute(_locked_states(ids))})
            if accepted:
                task_rows, io_rows = rows(accepted)
                connection.execute(_FINISH, task_rows)
                connection.execute(_FINISH_IO, io_rows)
            return accepted

        def direct_work(connection: sqlite3.Connection) -> list[Finish]:
            accepted = accept(direct.status_and_worker(connection, ids))
            if accepted:
                direct.finish(connection, *rows(accepted))
            return accepted

        done = await (self._db.run_direct(direct_work) if self._db.direct else self._db.run(work))
        return [f.task_id for f in done]

    async def finish(self, task_id: str, status: str, error: str | None = None) -> TaskRecord:
        """End the task with a terminal ``status``. Finishing again with the same status changes nothing."""
        final = parse_enum(TaskStatus, status, "task status")
        if not final.terminal:
            raise ValueError(
                f"finish takes a terminal status (complete, error, cancelled, timeout), got {status!r}; "
                "use requeue to make a task pending again"
            )
        now = utcnow()
        async with self._db.transaction() as session:
            row = await require(session, Task, task_id, "task", lock=True)
            current = TaskStatus(row.status)
            if current == final:
                return _task(row)
            if current.terminal:
                raise InvalidTransition(f"task {task_id} already finished as {current}; it cannot become {final}")
            row.status = final.value
            row.error = error
            row.finished_at = now
            row.updated_at = now
            return _task(row)

    async def cancel(self, task_id: str) -> bool:
        """Cancel the task; True if this call cancelled it, False if it had already finished.

        Cancelling races with completion by nature, so losing that race is not
        an error: the task keeps the outcome it finished with.
        """
        async with self._db.transaction() as session:
            row = await require(session, Task, task_id, "task", lock=True)
            if TaskStatus(row.status).terminal:
                return False
            now = utcnow()
            row.status = TaskStatus.CANCELLED.value
            row.finished_at = now
            row.updated_at = now
            return True

    async def requeue(self, task_id: str, reason: str) -> TaskRecord:
        """Make a pending or running task pending again, counting one more attempt and recording why.

        Where it ran (worker, container, pool, GPU) is cleared from the task and
        kept in its history, attributed to the attempt that ended.
        """
        now = utcnow()
        async with self._db.transaction() as session:
            row = await require(session, Task, task_id, "task", lock=True)
            if TaskStatus(row.status).terminal:
                raise InvalidTransition(f"task {task_id} already finished as {row.status}; it cannot be requeued")
            session.add(
                TaskPlacement(
                    task_id=task_id,
                    attempt=row.attempts,
                    at=now,
                    outcome=PlacementOutcome.REQUEUED.value,
                    pool=row.pool,
                    gpu=row.gpu,
                    region=None,
                    worker_id=row.worker_id,
                    reason=reason,
                )
            )
            row.status = TaskStatus.PENDING.value
            row.attempts += 1
            row.worker_id = None
            row.container_id = None
            row.pool = None
            row.gpu = None
            row.started_at = None
            row.updated_at = now
            return _task(row)

    async def history(self, task_id: str) -> list[PlacementEvent]:
        """The task's placement history in the order it was recorded."""
        async with self._db.transaction() as session:
            await require(session, Task, task_id, "task")
            rows = await session.scalars(
                select(TaskPlacement).where(TaskPlacement.task_id == task_id).order_by(TaskPlacement.id)
            )
            return [_event(row) for row in rows]


__all__ = ["Finish", "TaskStore"]
