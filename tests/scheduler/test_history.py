"""The placement history writer: every placement's history is stored, in order, in batches, whatever the database does.

Each test runs on SQLite with the embedded Redis and on PostgreSQL with a redis-server
(the ``backend`` fixture of tests/scheduler/conftest.py). A database failure is made for
real: the history table is renamed away under the writer, so its statements fail in the
database, and renamed back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

import pytest
from sqlalchemy import Connection, delete, select

from levers9.scheduler.history import HistoryLost, HistoryWriter
from levers9.scheduler.service import Scheduler
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.database import Database
from levers9.state.sql.models import Task, TaskPlacement
from levers9.state.sql.records import PlacementEvent
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import Harness, MakeHarness, eventually

WORKERS = [WorkerInfo(f"w{i}", "cpu", 4000, 8192) for i in range(8)]


async def placed_history(db: Database) -> list[tuple[str, str | None, datetime]]:
    """Every stored placement history row, in the order it was stored: (task, worker, when)."""
    async with db.transaction() as session:
        rows = await session.execute(
            select(TaskPlacement.task_id, TaskPlacement.worker_id, TaskPlacement.at).order_by(TaskPlacement.id)
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def ready(h: Harness, count: int) -> tuple[Scheduler, list[str]]:
    """A scheduler with 8 workers and ``count`` small requests submitted; returns it and the request ids."""
    s = h.scheduler()
    for w in WORKERS:
        await s.register_worker(w)
    requests = [h.request(None, cpu_millicores=10, memory_mib=16) for _ in range(count)]
    await s.submit_many(requests)
    return s, [r.id for r in requests]


async def rename_history_table(db: Database, away: bool) -> None:
    """Take the history table away (every write to it then fails in the database), or bring it back."""
    old, new = ("task_placements", "task_placements_away") if away else ("task_placements_away", "task_placements")

    def work(connection: Connection) -> None:
        connection.exec_driver_sql(f"ALTER TABLE {old} RENAME TO {new}")

    await db.run(work)


def record_adds(writer: HistoryWriter) -> list[str]:
    """The task ids of the events added to ``writer``, in the order they were added."""
    order: list[str] = []
    add = writer.add

    def recording(events: Sequence[PlacementEvent]) -> int:
        order.extend(e.task_id for e in events)
        return add(events)

    writer.add = recording  # type: ignore[method-assign]
    return order


async def test_concurrent_placements_store_every_event_once_in_the_order_they_were_placed(
    make_harness: MakeHarness,
) -> None:
    h = await make_harness([("cpu",)], batch_size=7)
    s, ids = await ready(h, 600)
    order = record_adds(s.history)

    async def placer() -> int:
        placed = 0
        while await s.backlog.size():
            placed += len((await s.place_once(wait_for_history=False)).placed)
        return placed

    counts = await asyncio.gather(*[placer() for _ in range(8)])
    assert sum(counts) == 600
    assert sum(1 for c in counts if c) > 1, "several placement calls ran side by side"
    await s.history.written(s.history.added)

    stored = await placed_history(h.db)
    assert [task for task, _, _ in stored] == order, "stored in the order placed"
    assert sorted(order) == sorted(ids), "every placement once"
    times = [at for _, _, at in stored]
    assert times == sorted(times), "stamped when placed, so in placing order too"
    tasks = await TaskStore(h.db).get_many(ids)
    assert {t.id: t.worker_id for t in tasks} == {task: worker for task, worker, _ in stored}
    assert s.history.stored == 600
    assert s.history.dropped == s.history.lost == 0


async def test_what_piles_up_while_a_write_runs_goes_into_one_transaction(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)], batch_size=10)
    s, ids = await ready(h, 40)
    results = [await s.backlog.place(s.ctx.now_ms(), limit=10) for _ in range(4)]
    for result in results:  # four placement batches' history, added before the writer first runs
        s.history.add(s._placement_events(result))
    assert s.history.buffered == 40
    await s.history.written(s.history.added)
    assert s.history.transactions == 1
    assert sorted(t for t, _, _ in await placed_history(h.db)) == sorted(ids)


async def test_placement_waits_for_room_when_the_writer_is_behind(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await make_harness([("cpu",)], batch_size=10)
    s, ids = await ready(h, 30)
    s.history = HistoryWriter(s.ctx.tasks, max_buffered=10)
    gate, entered = asyncio.Event(), asyncio.Event()
    record = TaskStore.record

    async def held(self: TaskStore, events: Sequence[PlacementEvent], *, skip_missing: bool = False) -> list[str]:
        entered.set()
        await gate.wait()
        return await record(self, events, skip_missing=skip_missing)

    monkeypatch.setattr(TaskStore, "record", held)
    first = asyncio.create_task(s.place_once(wait_for_history=False))
    await entered.wait()  # the writer holds the first batch and cannot finish it
    for _ in range(20):
        await asyncio.sleep(0)
    assert not first.done(), "the buffer is at its bound: placement waits for the writer"
    assert s.history.buffered == 10
    assert await s.backlog.size() == 20, "and nothing more is placed meanwhile"

    gate.set()
    assert len((await first).placed) == 10
    while await s.backlog.size():
        await s.place_once(wait_for_history=False)
    await s.history.written(s.history.added)
    assert sorted(t for t, _, _ in await placed_history(h.db)) == sorted(ids)


async def test_stop_stores_what_is_buffered(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)], batch_size=25)
    s, ids = await ready(h, 50)
    await s.place_once(wait_for_history=False)
    await s.place_once(wait_for_history=False)
    assert s.history.buffered > 0, "nothing waited on the writer yet"
    await s.stop()
    assert sorted(t for t, _, _ in await placed_history(h.db)) == sorted(ids)
    assert s.history.lost == 0


async def test_a_failing_database_is_retried_and_nothing_is_lost(
    make_harness: MakeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make_harness([("cpu",)], batch_size=10)
    s, ids = await ready(h, 30)
    s.history = HistoryWriter(s.ctx.tasks, retry_initial_s=0.01, retry_max_s=0.05)
    order = record_adds(s.history)
    await rename_history_table(h.db, away=True)
    caplog.set_level(logging.WARNING, logger="levers9.scheduler.history")
    for _ in range(3):
        await s.place_once(wait_for_history=False)

    async def retried() -> bool:
        return s.history.failures >= 3

    await eventually(retried, "the writer to fail and retry")
    assert s.history.buffered == 30
    assert "storing" in caplog.text
    assert "failed" in caplog.text

    await rename_history_table(h.db, away=False)
    await s.history.written(s.history.added)
    assert [t for t, _, _ in await placed_history(h.db)] == order
    assert sorted(order) == sorted(ids)
    assert (s.history.stored, s.history.dropped, s.history.lost) == (30, 0, 0)


async def test_stop_with_the_database_down_gives_up_after_its_timeout_and_says_how_many_were_lost(
    make_harness: MakeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make_harness([("cpu",)], batch_size=10)
    s, ids = await ready(h, 20)
    s.history = HistoryWriter(s.ctx.tasks, retry_initial_s=0.01, retry_max_s=0.05)
    await rename_history_table(h.db, away=True)
    await s.place_once(wait_for_history=False)
    await s.place_once(wait_for_history=False)
    ticket = s.history.added

    caplog.set_level(logging.ERROR, logger="levers9.scheduler.history")
    assert await s.history.close(timeout=0.2) == 20
    assert "the placement history of 20 placements was lost" in caplog.text
    assert (s.history.lost, s.history.buffered) == (20, 0)
    with pytest.raises(HistoryLost):
        await s.history.written(ticket)

    await rename_history_table(h.db, away=False)
    assert await placed_history(h.db) == []
    # after a close, the next events start a new writer
    await s.history.written(s.history.add([PlacementEvent(task_id=ids[0], outcome="placed", worker_id="w0")]))
    assert [(t, w) for t, w, _ in await placed_history(h.db)] == [(ids[0], "w0")]


async def test_wait_for_history_returns_once_the_batch_is_stored(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s, ids = await ready(h, 5)
    result = await s.place_once()
    assert sorted(p.request for p in result.placed) == sorted(ids)
    assert s.history.buffered == 0
    for p in result.placed:
        [event] = await TaskStore(h.db).history(p.request)
        assert (event.outcome, event.worker_id, event.pool) == ("placed", p.worker, "cpu")


async def test_events_of_a_task_gone_from_sql_are_left_out_and_the_rest_stored(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s, ids = await ready(h, 6)
    gone = ids[2]

    def drop(connection: Connection) -> None:
        connection.execute(delete(Task).where(Task.id == gone))

    await h.db.run(drop)
    await s.place_once()
    assert sorted(t for t, _, _ in await placed_history(h.db)) == sorted(set(ids) - {gone})
    assert (s.history.stored, s.history.dropped) == (5, 1)


async def test_an_event_the_database_refuses_is_left_out_alone(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s, ids = await ready(h, 3)
    writer = HistoryWriter(s.ctx.tasks)
    good = [PlacementEvent(task_id=i, outcome="placed", pool="cpu", worker_id="w0") for i in ids]
    refused = PlacementEvent(task_id=ids[0], outcome="x" * 40)  # longer than an outcome may be
    await writer.written(writer.add([good[0], refused, good[1], good[2]]))
    assert [t for t, _, _ in await placed_history(h.db)] == ids
    assert (writer.stored, writer.dropped) == (3, 1)
    await writer.close(timeout=1)


async def test_a_planner_line_is_stored_after_the_placement_lines_added_before_it(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner's lines go through the same writer: a placement's line still buffered is stored first."""
    h = await make_harness([("cpu",)])
    s, [rid] = await ready(h, 1)
    gate, entered = asyncio.Event(), asyncio.Event()
    record = TaskStore.record
    calls = 0

    async def first_held(self: TaskStore, events: Sequence[PlacementEvent], *, skip_missing: bool = False) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the writer's first batch (the placement) waits; any later write goes through
            entered.set()
            await gate.wait()
        return await record(self, events, skip_missing=skip_missing)

    monkeypatch.setattr(TaskStore, "record", first_held)
    await s.place_once(wait_for_history=False)
    await entered.wait()
    later = asyncio.create_task(s.planner._record([(rid, "unavailable", None, "a line written later", None)]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not later.done(), "the planner's line waits behind the placement's"
    gate.set()
    await later
    async with h.db.transaction() as session:
        rows = await session.execute(
            select(TaskPlacement.outcome).where(TaskPlacement.task_id == rid).order_by(TaskPlacement.id)
        )
        assert [r[0] for r in rows] == ["placed", "unavailable"]
