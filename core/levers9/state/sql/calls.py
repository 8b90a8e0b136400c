"""The data path of calls: arguments out to workers, results and output back, in batches.

A map of ten thousand calls must not become forty thousand transactions, so
every method here takes many tasks at once; the worker session batches what
its worker reports, and these turn each batch into one transaction.

This store only reads the ``tasks`` table (and ``task_io``'s arguments and
results); it writes calls' output (``task_logs``) and stubs' handlers. The one
writer of ``tasks`` is :class:`~levers9.state.sql.tasks.TaskStore`, which
also stores what workers report (:meth:`~levers9.state.sql.tasks.TaskStore.start_many`,
:meth:`~levers9.state.sql.tasks.TaskStore.finish_many`).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from sqlalchemy import Connection, Table, func, insert, select, update

from levers9.quantities import MIB, format_bytes
from levers9.state.sql.database import Database
from levers9.state.sql.models import Stub, Task, TaskIO, TaskLog, utcnow
from levers9.state.sql.records import CallResult, TaskStatus

__all__ = ["CallResult", "CallStore", "Dispatch"]

#: output kept per task when the operator sets no limits.max_task_log_bytes (the config's default)
DEFAULT_MAX_TASK_LOG_BYTES = 8 * MIB
#: tasks whose stored output size this replica remembers; a forgotten one is read back from SQL once
_LOG_KEPT_TASKS = 100_000
_UNFINISHED = (TaskStatus.PENDING.value, TaskStatus.RUNNING.value)
# Core tables for executemany updates: the ORM's bulk update does not take a WHERE with many parameter sets.
_TASKS = cast(Table, Task.__table__)
_TASK_IO = cast(Table, TaskIO.__table__)
_TASK_LOGS = cast(Table, TaskLog.__table__)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What a worker needs to run one placed task."""

    task_id: str
    workspace_id: str
    stub_id: str | None
    args: bytes
    attempts: int
    status: str
    #: it waits in the worker's own queue, to start when the worker's room frees (the scheduler says)
    queued: bool = False


@dataclass(slots=True)
class _KeptLog:
    """A task's stored output as append_logs sees it: bytes kept, bytes dropped, and the marker row saying so."""

    stored: int = 0
    dropped: int = 0
    #: whether the kept output ends a line (the marker starts a new one when it does not)
    ends_line: bool = True
    marker_id: int | None = None
    #: the count the marker row shows now
    marker_dropped: int = 0


def _marker(state: _KeptLog, cap: int) -> bytes:
    lead = "" if state.ends_line else "\n"
    return (
        f"{lead}[levers9: {state.dropped:,} bytes of output dropped; the limit is {format_bytes(cap)} "
        "(limits.max_task_log_bytes)]\n"
    ).encode()


_MARKER = re.compile(
    rb"\n?\[levers9: ([0-9,]+) bytes of output dropped; the limit is [^\]\n]+ \(limits\.max_task_log_bytes\)\]\n"
)


def _keepable(data: bytes, room: int) -> bytes:
    """The part of ``data`` that fits in ``room`` bytes, not ending inside a UTF-8 character."""
    if len(data) <= room:
        return data
    end = max(room, 0)
    for _ in range(3):  # a UTF-8 character is at most 4 bytes: back off at most 3 continuation bytes
        if 0 < end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1
    return data[:end]


def _stored_logs(connection: Connection, task_ids: set[str]) -> dict[str, _KeptLog]:
    """What is stored of each task's output, read from SQL for tasks this replica has not tracked."""
    sums = connection.execute(
        select(_TASK_LOGS.c.task_id, func.sum(func.length(_TASK_LOGS.c.data)))
        .where(_TASK_LOGS.c.task_id.in_(task_ids))
        .group_by(_TASK_LOGS.c.task_id)
    )
    kept = {t: _KeptLog() for t in task_ids}
    for task_id, total in sums:
        state = kept[task_id]
        state.stored = int(total or 0)
        if state.stored == 0:
            continue
        last = connection.execute(
            select(_TASK_LOGS.c.id, _TASK_LOGS.c.data)
            .where(_TASK_LOGS.c.task_id == task_id)
            .order_by(_TASK_LOGS.c.id.desc())
            .limit(1)
        ).one()
        match = _MARKER.fullmatch(last[1])
        if match is not None:
            state.stored -= len(last[1])
            state.dropped = state.marker_dropped = int(match[1].replace(b",", b""))
            state.marker_id = int(last[0])
            state.ends_line = not last[1].startswith(b"\n")
        # no marker: anything past the cap (stored under a larger one) stays, and what comes now is dropped
    return kept


class CallStore:
    def __init__(self, db: Database, *, max_task_log_bytes: int = DEFAULT_MAX_TASK_LOG_BYTES) -> None:
        self._db = db
        #: output kept per task (limits.max_task_log_bytes); see :meth:`append_logs`
        self.max_task_log_bytes = max_task_log_bytes
        #: what this replica knows of the output stored per task, most recently used last
        self._log_kept: OrderedDict[str, _KeptLog] = OrderedDict()

    async def dispatch(self, task_ids: Sequence[str]) -> list[Dispatch]:
        """The tasks with their arguments, in the order asked; unknown ids are left out."""
        if not task_ids:
            return []
        query = (
            select(
                _TASKS.c.id,
                _TASKS.c.workspace_id,
                _TASKS.c.stub_id,
                _TASK_IO.c.args,
                _TASKS.c.attempts,
                _TASKS.c.status,
            )
            .join(_TASK_IO, _TASK_IO.c.task_id == _TASKS.c.id, isouter=True)
            .where(_TASKS.c.id.in_(task_ids))
        )

        def work(connection: Connection) -> dict[str, Dispatch]:
            rows = connection.execute(query)
            return {row[0]: Dispatch(row[0], row[1], row[2], row[3] or b"", row[4], row[5]) for row in rows}

        found = await self._db.run(work)
        return [found[t] for t in task_ids if t in found]

    async def owners(self, task_ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
        """Status and worker of each known task of ``task_ids`` (unknown ids are left out); nothing is locked."""
        if not task_ids:
            return {}
        query = select(_TASKS.c.id, _TASKS.c.status, _TASKS.c.worker_id).where(_TASKS.c.id.in_(list(task_ids)))
        return await self._db.run(lambda connection: {row[0]: (row[1], row[2]) for row in connection.execute(query)})

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
        """Append output chunks, keeping at most ``max_task_log_bytes`` of each task's output.

        Chunks of tasks that no longer exist are dropped. A task's output is kept
        from its beginning up to the cap (cut back to a whole UTF-8 character);
        everything after is dropped, and one marker row after the kept part says
        how many bytes were, updated in place as more are. The end of the output
        is not kept: rows are only ever appended before the marker, so a reader
        following the logs by chunk id never misses one, and a failed call's
        traceback is stored with its result anyway.

        What is stored per task is tracked here, in memory (a bounded LRU), so a
        batch of tasks under the cap costs no extra statement; a task this replica
        has not seen (after a restart, on another replica, or evicted) costs one
        grouped sum of its stored rows and, when it has some, a read of its last
        row, which is its marker when output was dropped. Two replicas appending for one task at once could each
        keep up to the cap; a task's worker reports to one replica at a time.
        """
        chunks = [(t, d) for t, d in chunks if d]
        if not chunks:
            return
        now = utcnow()
        cap = self.max_task_log_bytes
        cached = {t: replace(self._log_kept[t]) for t in {t for t, _ in chunks} if t in self._log_kept}

        def work(connection: Connection) -> dict[str, _KeptLog]:
            ids = {t for t, _ in chunks}
            known = set(connection.scalars(select(_TASKS.c.id).where(_TASKS.c.id.in_(ids))))
            kept = {t: k for t, k in cached.items() if t in known}
            unseen = known - kept.keys()
            if unseen:
                kept.update(_stored_logs(connection, unseen))
            rows: list[dict[str, Any]] = []
            for task_id, data in chunks:
                state = kept.get(task_id)
                if state is None:
                    continue
                keep = _keepable(data, cap - state.stored) if state.dropped == 0 else b""
                if keep:
                    rows.append({"task_id": task_id, "at": now, "data": keep})
                    state.stored += len(keep)
                    state.ends_line = keep.endswith(b"\n")
                state.dropped += len(data) - len(keep)
            if rows:
                connection.execute(insert(_TASK_LOGS), rows)
            for task_id, state in kept.items():
                if state.dropped and state.marker_id is None:
                    marker = _marker(state, cap)
                    insert_marker = insert(_TASK_LOGS).values(task_id=task_id, at=now, data=marker)
                    state.marker_id = int(connection.execute(insert_marker.returning(_TASK_LOGS.c.id)).scalar_one())
                    state.marker_dropped = state.dropped
                elif state.marker_id is not None and state.marker_dropped != state.dropped:
                    connection.execute(
                        update(_TASK_LOGS).where(_TASK_LOGS.c.id == state.marker_id).values(data=_marker(state, cap))
                    )
                    state.marker_dropped = state.dropped
            return kept

        kept = await self._db.run(work)
        for task_id, state in kept.items():  # only once stored: a batch that failed is retried from the old counts
            self._log_kept[task_id] = state
            self._log_kept.move_to_end(task_id)
        while len(self._log_kept) > _LOG_KEPT_TASKS:
            self._log_kept.popitem(last=False)

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
