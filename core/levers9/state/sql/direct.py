"""The call path's statements on SQLite, run on the sqlite3 driver itself.

Every call costs three transactions: its submit, its placement history and
its outcome. Through SQLAlchemy each of them cost about 1.7 ms of CPU on
SQLite's thread here (building the statement, its cache key, the execution
context, the bind processors, the connection pool and the ``begin`` event),
of which SQLite itself spent about 12%; a lone ``.remote()`` thus spent more
CPU in SQLAlchemy than anywhere else in the controlplane. These functions run
the same statements as plain SQL text on the connection that
:meth:`~levers9.state.sql.database.Database.run_direct` holds, inside its
``BEGIN IMMEDIATE`` transaction.

Invariants:

* Values are stored exactly as SQLAlchemy stores them on SQLite, so either
  path reads what the other wrote: timestamps as naive UTC text with
  microseconds (:func:`stamp`), JSON as ``json.dumps`` text, bytes as BLOBs.
* Only SQLite comes here. PostgreSQL keeps SQLAlchemy: its cost there is the
  network round trips, which these statements would not save.
* Each function is one or two statements of one store method; the decisions
  (which rows to accept, what history to write) stay in the store, shared by
  both paths.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "attempts_and_status",
    "finish",
    "insert_history",
    "insert_tasks",
    "set_placed",
    "stamp",
    "status_and_worker",
    "workspace_exists",
]

#: ids per ``IN (...)`` list: far under SQLite's limit on variables in one statement
_IN_CHUNK = 500

_INSERT_TASK = (
    "INSERT INTO tasks (id, workspace_id, stub_id, status, attempts, request, container_id, worker_id, pool, gpu, "
    "error, created_at, updated_at, started_at, finished_at) VALUES (?, ?, ?, ?, 0, ?, NULL, NULL, NULL, NULL, NULL, "
    "?, ?, NULL, NULL)"
)
_INSERT_ARGS = "INSERT INTO task_io (task_id, args) VALUES (?, ?)"
_INSERT_HISTORY = (
    "INSERT INTO task_placements (task_id, attempt, at, outcome, pool, gpu, region, worker_id, reason) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SET_PLACED = "UPDATE tasks SET worker_id = ?, pool = ?, gpu = ?, updated_at = ? WHERE id = ?"
_FINISH = (
    "UPDATE tasks SET status = ?, error = ?, finished_at = ?, updated_at = ?, started_at = coalesce(started_at, ?), "
    "container_id = coalesce(?, container_id), worker_id = coalesce(worker_id, ?) WHERE id = ?"
)
_FINISH_IO = "UPDATE task_io SET result = ?, error_type = ?, traceback = ? WHERE task_id = ?"


def stamp(value: datetime | None) -> str | None:
    """A timestamp as SQLAlchemy's SQLite ``DATETIME`` stores it: naive UTC text, always with microseconds."""
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"timestamp {value.isoformat()} has no time zone; pass an aware UTC datetime")
    v = value.astimezone(UTC)
    return f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}.{v.microsecond:06d}"


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _IN_CHUNK):
        yield ids[start : start + _IN_CHUNK]


def _rows_of(connection: sqlite3.Connection, columns: str, ids: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    for chunk in _chunks(ids):
        marks = ", ".join("?" * len(chunk))
        yield from connection.execute(f"SELECT id, {columns} FROM tasks WHERE id IN ({marks})", tuple(chunk))


def workspace_exists(connection: sqlite3.Connection, workspace_id: str) -> bool:
    return connection.execute("SELECT 1 FROM workspaces WHERE id = ?", (workspace_id,)).fetchone() is not None


def insert_tasks(
    connection: sqlite3.Connection, rows: Sequence[dict[str, Any]], io_rows: Sequence[dict[str, Any]] | None
) -> None:
    """New pending tasks (the rows :meth:`TaskStore.create_many` builds), and their arguments when given."""
    connection.executemany(
        _INSERT_TASK,
        [
            (
                r["id"],
                r["workspace_id"],
                r["stub_id"],
                r["status"],
                json.dumps(r["request"]),
                stamp(r["created_at"]),
                stamp(r["updated_at"]),
            )
            for r in rows
        ],
    )
    if io_rows is not None:
        connection.executemany(_INSERT_ARGS, [(r["task_id"], r["args"]) for r in io_rows])


def attempts_and_status(connection: sqlite3.Connection, ids: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Each existing task's attempt count and status (SQLite's write lock is already held: no row locks)."""
    return {row[0]: (row[1], row[2]) for row in _rows_of(connection, "attempts, status", ids)}


def status_and_worker(connection: sqlite3.Connection, ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    return {row[0]: (row[1], row[2]) for row in _rows_of(connection, "status, worker_id", ids)}


def insert_history(connection: sqlite3.Connection, history: Sequence[dict[str, Any]]) -> None:
    connection.executemany(
        _INSERT_HISTORY,
        [
            (
                h["task_id"],
                h["attempt"],
                stamp(h["at"]),
                h["outcome"],
                h["pool"],
                h["gpu"],
                h["region"],
                h["worker_id"],
                h["reason"],
            )
            for h in history
        ],
    )


def set_placed(connection: sqlite3.Connection, placed: Sequence[dict[str, Any]], now: datetime) -> None:
    at = stamp(now)
    connection.executemany(_SET_PLACED, [(p["worker_id"], p["pool"], p["gpu"], at, p["id"]) for p in placed])


def finish(connection: sqlite3.Connection, rows: Sequence[dict[str, Any]], io_rows: Sequence[dict[str, Any]]) -> None:
    """Store outcomes: the rows :meth:`TaskStore.finish_many` builds for the calls it accepted."""
    connection.executemany(
        _FINISH,
        [
            (r["st"], r["err"], stamp(r["now"]), stamp(r["now"]), stamp(r["now"]), r["cid"], r["wid"], r["tid"])
            for r in rows
        ],
    )
    connection.executemany(_FINISH_IO, [(r["res"], r["et"], r["tb"], r["tid"]) for r in io_rows])
