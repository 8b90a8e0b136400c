"""Tasks: their status rules, attempts, placement history, and recovery after a restart."""

from __future__ import annotations

import pytest

from levers9.state.errors import AlreadyExists, InvalidTransition, NotFound
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.records import PlacementEvent, TaskStatus, WorkspaceRecord
from levers9.state.sql.tasks import TaskStore
from levers9.state.sql.workspaces import WorkspaceStore

REQUEST = {"id": "r1", "gpu": ["H100", "A100"], "cpu_millicores": 2000, "labels": {"team": "ml"}}


async def test_a_new_task_is_pending_and_keeps_its_request(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST)
    assert task.id.startswith("task_")
    assert task.status is TaskStatus.PENDING
    assert task.attempts == 0
    assert task.request == REQUEST
    assert task.created_at == task.updated_at
    assert (task.started_at, task.finished_at, task.worker_id) == (None, None, None)
    assert await tasks.get(task.id) == task
    assert await tasks.get("task_missing") is None


async def test_chosen_ids_and_their_errors(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST, task_id="req-42")
    assert task.id == "req-42"
    with pytest.raises(AlreadyExists, match="req-42"):
        await tasks.create(workspace.id, REQUEST, task_id="req-42")
    with pytest.raises(NotFound, match="workspace 'ws_missing'"):
        await tasks.create("ws_missing", REQUEST)


async def test_create_many_stores_all_or_nothing(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    made = await tasks.create_many(workspace.id, [{"n": 1}, ("mine", {"n": 2}), {"n": 3}])
    assert [t.request["n"] for t in made] == [1, 2, 3]
    assert made[1].id == "mine"
    assert await tasks.create_many(workspace.id, []) == []
    with pytest.raises(AlreadyExists):
        await tasks.create_many(workspace.id, [("fresh-1", {"n": 4}), ("mine", {"n": 5})])
    assert await tasks.get("fresh-1") is None


async def test_lifecycle_and_refused_transitions(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST)
    running = await tasks.set_running(task.id, "wrk_1", "ctr_1")
    assert running.status is TaskStatus.RUNNING
    assert (running.worker_id, running.container_id) == ("wrk_1", "ctr_1")
    assert running.started_at is not None
    assert await tasks.set_running(task.id, "wrk_1", "ctr_1") == running  # a retried report
    with pytest.raises(InvalidTransition, match="is running in container ctr_1 on wrk_1; only a pending task"):
        await tasks.set_running(task.id, "wrk_2", "ctr_2")
    done = await tasks.finish(task.id, "complete")
    assert done.status is TaskStatus.COMPLETE
    assert done.finished_at is not None
    assert await tasks.finish(task.id, "complete") == done  # idempotent
    with pytest.raises(InvalidTransition, match="already finished as complete; it cannot become error"):
        await tasks.finish(task.id, "error", error="late")
    with pytest.raises(InvalidTransition, match="is complete; only a pending task can start"):
        await tasks.set_running(task.id, "wrk_1", "ctr_9")
    with pytest.raises(InvalidTransition, match="cannot be requeued"):
        await tasks.requeue(task.id, "too late")
    assert (await tasks.get(task.id)) == done


async def test_finish_takes_only_terminal_statuses(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST)
    with pytest.raises(ValueError, match="finish takes a terminal status"):
        await tasks.finish(task.id, "running")
    with pytest.raises(ValueError, match="task status 'done' is not one of: pending, running, complete"):
        await tasks.finish(task.id, "done")
    with pytest.raises(NotFound, match="task 'task_missing'"):
        await tasks.finish("task_missing", "complete")
    failed = await tasks.finish(task.id, "timeout", error="ran past 600 s")
    assert (failed.status, failed.error) == (TaskStatus.TIMEOUT, "ran past 600 s")


async def test_cancel_only_cancels_unfinished_tasks(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    pending = await tasks.create(workspace.id, REQUEST)
    assert await tasks.cancel(pending.id) is True
    cancelled = await tasks.get(pending.id)
    assert cancelled is not None
    assert cancelled.status is TaskStatus.CANCELLED
    assert cancelled.finished_at is not None
    assert await tasks.cancel(pending.id) is False
    completed = await tasks.create(workspace.id, REQUEST)
    await tasks.finish(completed.id, "complete")
    assert await tasks.cancel(completed.id) is False
    still = await tasks.get(completed.id)
    assert still is not None
    assert still.status is TaskStatus.COMPLETE


async def test_requeue_counts_an_attempt_and_keeps_where_it_ran(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST)
    await tasks.record(
        [PlacementEvent(task.id, "placed", pool="h100s", gpu="H100", region="us-east-1", worker_id="w1")]
    )
    await tasks.set_running(task.id, "w1", "c1")
    requeued = await tasks.requeue(task.id, "worker w1 stopped reporting")
    assert requeued.status is TaskStatus.PENDING
    assert requeued.attempts == 1
    assert (requeued.worker_id, requeued.container_id, requeued.pool, requeued.started_at) == (None, None, None, None)
    again = await tasks.requeue(task.id, "still nowhere to run")  # a pending task can be requeued too
    assert again.attempts == 2
    history = await tasks.history(task.id)
    assert [(e.outcome, e.attempt, e.worker_id, e.pool, e.reason) for e in history] == [
        ("placed", 0, "w1", "h100s", None),
        ("requeued", 0, "w1", "h100s", "worker w1 stopped reporting"),
        ("requeued", 1, None, None, "still nowhere to run"),
    ]
    assert all(e.at is not None and e.at.tzinfo is not None for e in history)
    running_again = await tasks.set_running(task.id, "w2", "c2")
    assert running_again.attempts == 2


async def test_one_batch_records_history_for_many_tasks(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    a, b, c = await tasks.create_many(workspace.id, [{"n": 1}, {"n": 2}, {"n": 3}])
    await tasks.cancel(c.id)
    await tasks.record(
        [
            PlacementEvent(a.id, "unavailable", pool="h100s", gpu="H100", reason="InsufficientInstanceCapacity"),
            PlacementEvent(a.id, "placed", pool="a100s", gpu="A100", region="eu", worker_id="w-a"),
            PlacementEvent(b.id, "placed", pool="cpu", worker_id="w-b", attempt=7),
            PlacementEvent(c.id, "placed", pool="cpu", worker_id="w-c"),
        ]
    )
    placed_a = await tasks.get(a.id)
    assert placed_a is not None
    assert (placed_a.status, placed_a.worker_id, placed_a.pool, placed_a.gpu) == (
        TaskStatus.PENDING,
        "w-a",
        "a100s",
        "A100",
    )
    history_a = await tasks.history(a.id)
    assert [(e.outcome, e.pool, e.reason, e.attempt) for e in history_a] == [
        ("unavailable", "h100s", "InsufficientInstanceCapacity", 0),
        ("placed", "a100s", None, 0),
    ]
    assert history_a[1].region == "eu"
    assert [(e.outcome, e.attempt) for e in await tasks.history(b.id)] == [("placed", 7)]
    cancelled = await tasks.get(c.id)
    assert cancelled is not None
    assert cancelled.worker_id is None  # finished meanwhile: history only
    assert [e.worker_id for e in await tasks.history(c.id)] == ["w-c"]


async def test_a_batch_with_an_unknown_task_records_nothing(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    task = await tasks.create(workspace.id, REQUEST)
    with pytest.raises(NotFound, match="task 'task_ghost'"):
        await tasks.record([PlacementEvent(task.id, "placed", worker_id="w1"), PlacementEvent("task_ghost", "placed")])
    assert await tasks.history(task.id) == []
    unchanged = await tasks.get(task.id)
    assert unchanged is not None
    assert unchanged.worker_id is None
    with pytest.raises(ValueError, match="placement outcome"):
        await tasks.record([PlacementEvent(task.id, "")])
    with pytest.raises(NotFound):
        await tasks.history("task_ghost")


async def test_unfinished_tasks_are_read_back_after_a_restart(database_url: str) -> None:
    db = await open_database(database_url)
    try:
        workspace = await WorkspaceStore(db).create("team")
        tasks = TaskStore(db)
        pending = await tasks.create(workspace.id, {"n": 1})
        running = await tasks.create(workspace.id, {"n": 2})
        await tasks.set_running(running.id, "w1", "c1")
        complete = await tasks.create(workspace.id, {"n": 3})
        await tasks.finish(complete.id, "complete")
        requeued = await tasks.create(workspace.id, {"n": 4})
        await tasks.set_running(requeued.id, "w2", "c2")
        await tasks.requeue(requeued.id, "worker lost")
        errored = await tasks.create(workspace.id, {"n": 5})
        await tasks.finish(errored.id, "error", error="boom")
    finally:
        await db.close()
    restarted = await open_database(database_url)
    try:
        back = await TaskStore(restarted).unfinished()
        assert [(t.id, t.status, t.attempts, t.request) for t in back] == [
            (pending.id, TaskStatus.PENDING, 0, {"n": 1}),
            (running.id, TaskStatus.RUNNING, 0, {"n": 2}),
            (requeued.id, TaskStatus.PENDING, 1, {"n": 4}),
        ]
        assert back[1].worker_id == "w1"
        assert [t.id for t in await TaskStore(restarted).for_workspace(workspace.id, statuses=["error"])] == [
            errored.id
        ]
        assert len(await TaskStore(restarted).for_workspace(workspace.id)) == 5
    finally:
        await restarted.close()
