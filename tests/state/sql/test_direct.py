"""The call path's statements on SQLite's driver (state/sql/direct.py): what they store is what SQLAlchemy stores.

The store tests run each store method on both databases; these check what only
the direct path can get wrong: the text a timestamp is stored as, transactions
committed or rolled back whole, and batches larger than one ``IN`` list.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Connection, Table

from levers9.state.sql import direct
from levers9.state.sql.calls import CallStore
from levers9.state.sql.database import Database
from levers9.state.sql.models import Task, new_id
from levers9.state.sql.records import PlacementEvent, WorkspaceRecord
from levers9.state.sql.tasks import Finish, TaskStore

_TASKS: Table = Task.__table__  # type: ignore[assignment]

REQUEST = {"cpu_millicores": 125, "memory_mib": 128, "gpu": None}


#: the package's ``db`` and ``workspace`` fixtures, on SQLite only: the direct path is SQLite's
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 12, 3, 16, 53, 20, 634025, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # no microseconds: still written with six digits
        datetime(2026, 6, 30, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-7))),  # another zone: to UTC
    ],
)
@sqlite_only
async def test_a_timestamp_is_stored_as_the_text_sqlalchemy_stores(
    db: Database, workspace: WorkspaceRecord, when: datetime
) -> None:
    [task] = await TaskStore(db).create_many(workspace.id, [REQUEST])

    def stored_by_sqlalchemy(connection: Connection) -> str:
        connection.execute(_TASKS.update().where(_TASKS.c.id == task.id).values(updated_at=when))
        return str(connection.exec_driver_sql("SELECT updated_at FROM tasks WHERE id = ?", (task.id,)).scalar())

    assert direct.stamp(when) == await db.run(stored_by_sqlalchemy)


def test_a_naive_timestamp_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        direct.stamp(datetime(2026, 12, 3, 12, 0))


@sqlite_only
async def test_what_the_direct_path_writes_reads_back_through_sqlalchemy(
    db: Database, workspace: WorkspaceRecord
) -> None:
    tasks, calls = TaskStore(db), CallStore(db)
    before = datetime.now(UTC)
    [created] = await tasks.create_many(workspace.id, [("task_direct1", REQUEST)], args=[b"arguments"])
    await tasks.record([PlacementEvent("task_direct1", "placed", pool="cpu", worker_id="w1", gpu="L4")])
    assert await tasks.finish_many([Finish("task_direct1", "complete", b"value")], worker_id="w1") == ["task_direct1"]

    task = await tasks.get("task_direct1")
    assert task is not None
    assert (task.status, task.worker_id, task.pool, task.gpu, task.request) == ("complete", "w1", "cpu", "L4", REQUEST)
    assert task.created_at == created.created_at
    assert task.created_at.tzinfo is not None
    assert task.finished_at is not None
    assert before <= task.created_at <= task.finished_at
    [history] = await tasks.history("task_direct1")
    assert (history.outcome, history.worker_id, history.attempt) == ("placed", "w1", 0)
    [dispatch] = await calls.dispatch(["task_direct1"])
    assert dispatch.args == b"arguments"
    [result] = await calls.results(["task_direct1"])
    assert (result.status, result.result) == ("complete", b"value")


@sqlite_only
async def test_a_failing_batch_stores_nothing_and_the_next_one_is_stored(
    db: Database, workspace: WorkspaceRecord
) -> None:
    tasks = TaskStore(db)
    await tasks.create_many(workspace.id, [("task_taken", REQUEST)])
    with pytest.raises(Exception, match="already exists"):  # the second id is taken: the first is not kept either
        await tasks.create_many(workspace.id, [("task_fresh", REQUEST), ("task_taken", REQUEST)])
    assert await tasks.get("task_fresh") is None
    await tasks.create_many(workspace.id, [("task_fresh", REQUEST)])  # the connection is usable again
    assert await tasks.get("task_fresh") is not None


@sqlite_only
async def test_run_direct_rolls_back_what_its_work_wrote_before_raising(
    db: Database, workspace: WorkspaceRecord
) -> None:
    [task] = await TaskStore(db).create_many(workspace.id, [REQUEST])

    def write_then_fail(connection: sqlite3.Connection) -> None:
        connection.execute("UPDATE tasks SET status = 'running' WHERE id = ?", (task.id,))
        raise RuntimeError("after the write")

    with pytest.raises(RuntimeError, match="after the write"):
        await db.run_direct(write_then_fail)
    stored = await TaskStore(db).get(task.id)
    assert stored is not None
    assert stored.status == "pending"


@sqlite_only
async def test_batches_larger_than_one_in_list_are_read_whole(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    ids = [new_id("task") for _ in range(1_234)]  # more than two of direct's IN lists
    await tasks.create_many(workspace.id, [(t, REQUEST) for t in ids], args=[b"a"] * len(ids))
    await tasks.record([PlacementEvent(t, "placed", pool="cpu", worker_id="w1") for t in ids])
    stored = await tasks.finish_many([Finish(t, "complete", b"r") for t in ids], worker_id="w1")
    assert sorted(stored) == sorted(ids)
    assert {t.worker_id for t in await tasks.get_many(ids)} == {"w1"}


def test_the_direct_statements_read_the_columns_the_models_declare() -> None:
    columns = {c.name for c in _TASKS.columns}
    assert columns == {
        "id",
        "workspace_id",
        "stub_id",
        "status",
        "attempts",
        "request",
        "container_id",
        "worker_id",
        "pool",
        "gpu",
        "error",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
    }, "tasks changed: state/sql/direct.py's INSERT names every column; add the new one there"
