"""Durability and concurrency: a restart mid-backlog loses nothing; two schedulers never place twice.

Run against real PostgreSQL and SQLite, and against a real redis-server and the
embedded Redis (whose contents die with the process, the harshest restart).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import fakeredis
import pytest

from levers9.state.redis.backlog import Taken
from levers9.state.redis.connect import EmbeddedRedis, connect
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.database import open_database
from levers9.state.sql.tasks import TaskStore
from tests.fixtures.redis import RedisFactory
from tests.scheduler.conftest import MakeHarness, eventually, worker_finished


@pytest.fixture
def backend(tmp_path: Path) -> tuple[str, str | None]:
    """These tests choose their database and Redis themselves, over every combination."""
    return f"sqlite:///{tmp_path / 'levers9.db'}", None


WORKERS = [WorkerInfo(f"w{i}", "cpu", 4000, 8192) for i in range(10)]


async def placed_counts(tasks: TaskStore, ids: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for tid in ids:
        counts[tid] = sum(1 for e in await tasks.history(tid) if e.outcome == "placed")
    return counts


async def test_a_restart_in_the_middle_of_a_backlog_loses_nothing(
    make_harness: MakeHarness, database_url: str, redis_factory: RedisFactory
) -> None:
    client = redis_factory()
    embedded = isinstance(client, fakeredis.FakeAsyncRedis)
    h = await make_harness([("cpu",)], database_url=database_url, redis=client, batch_size=50)
    first = h.scheduler()
    for w in WORKERS:
        await first.register_worker(w)
    requests = [h.request(None) for _ in range(300)]
    ids = [r.id for r in requests]
    await first.submit_many(requests)
    placed = (await first.place_once()).placed
    assert len(placed) == 40  # 10 workers x 4 CPUs, one CPU each
    tasks = TaskStore(h.db)
    for p in placed[:25]:
        [(rid, _)] = await first.take(p.worker)
        await tasks.set_running(rid, p.worker, f"c-{rid}")
    await first.stop()  # the controlplane goes away; the test plays what comes back
    await h.db.close()

    # A new controlplane process: new connections; with an embedded Redis, nothing survived.
    db = await open_database(database_url)
    try:
        redis = connect(None, embedded=EmbeddedRedis()) if embedded else redis_factory()
        second = h.scheduler(redis=redis, db=db)
        report = await second.rebuild()
        running = {p.request: p.worker for p in placed[:25]}
        if embedded:
            # the 25 running calls are kept for their workers, which Redis forgot, not queued again
            assert (report.requeued_pending, report.requeued_running, report.kept_for_workers) == (275, 0, 25)
        else:
            assert (report.requeued_pending, report.requeued_running, report.kept_for_workers) == (0, 0, 0)
        for w in WORKERS:
            await second.register_worker(w)
            # it registers again saying what it holds: its calls are its own again
            held = [rid for rid, worker in running.items() if worker == w.id]
            assert sorted(await second.reclaim_worker(w.id, held)) == sorted(held)
        tasks = TaskStore(db)
        done: set[str] = set()
        for _ in range(200):
            for p in (await second.place_once()).placed:
                await worker_finished(second, p.request, p.worker)
                done.add(p.request)
            # on a surviving Redis the first run's placements are still there: finish those too
            for tid in ids:
                state = await second.backlog.get(tid)
                if state is not None and state.state in ("placed", "running") and tid not in done:
                    assert state.worker is not None
                    await worker_finished(second, tid, state.worker)
                    done.add(tid)
            if len(done) == len(ids):
                break
        assert done == set(ids), f"{len(set(ids) - done)} tasks were lost"
        statuses = Counter([(await tasks.get(tid)).status for tid in ids])  # type: ignore[union-attr]
        assert statuses == Counter({"complete": 300})
        counts = await placed_counts(tasks, ids)
        if not embedded:
            assert set(counts.values()) == {1}, "with Redis intact nothing is placed twice"
        assert {counts[rid] for rid in running} == {1}, "a call whose worker came back is not placed again"
        assert await second.backlog.size() == 0
        if embedded:
            await redis.aclose()
    finally:
        await db.close()


async def test_two_schedulers_sharing_one_redis_place_every_request_exactly_once(
    make_harness: MakeHarness, database_url: str, redis_server: str
) -> None:
    a_redis, b_redis = connect(redis_server), connect(redis_server)
    await a_redis.flushall()
    h = await make_harness(
        [("cpu", None, 1, {"cpu_millicores": 64000})], database_url=database_url, redis=a_redis, batch_size=17
    )
    db_b = await open_database(database_url)
    try:
        a, b = h.scheduler(), h.scheduler(redis=b_redis, db=db_b)
        for i in range(8):
            await a.register_worker(WorkerInfo(f"w{i}", "cpu", 64000, 10**6))
        requests = [h.request(None, cpu_millicores=100) for _ in range(600)]
        await a.submit_many(requests)

        async def drain(s: object) -> list[str]:
            got: list[str] = []
            while await a.backlog.size():
                got += [p.request for p in (await s.place_once()).placed]  # type: ignore[attr-defined]
                await asyncio.sleep(0)
            return got

        one, two = await asyncio.gather(drain(a), drain(b))
        assert one, "both schedulers took part"
        assert two, "both schedulers took part"
        assert sorted(one + two) == sorted(r.id for r in requests)
        counts = await placed_counts(TaskStore(h.db), [r.id for r in requests])
        assert set(counts.values()) == {1}
        states = await a.workers.get_many([f"w{i}" for i in range(8)])
        assert sum(64000 - s.cpu_free for s in states if s) == 600 * 100
    finally:
        await db_b.close()
        await b_redis.aclose()
        await a_redis.aclose()


async def test_the_running_scheduler_starts_a_machine_and_places_on_it(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("a100", "A100-80")])
    h.behave(H100="capacity")
    s = h.scheduler()
    await s.start()
    req = h.request(["H100", "A100-80"])
    await s.submit(req)

    async def machine_started() -> bool:
        return any(m["pool"] == "a100" for m in h.machines())

    await eventually(machine_started, "the planner to fail over to a100 and start a machine")
    await h.register_started(s)

    async def placed() -> bool:
        state = await s.backlog.get(req.id)
        return state is not None and state.state == "placed" and state.pool == "a100"

    await eventually(placed, "the placement loop to place the request on the new worker")
    await s.stop()
    assert s._runner is None


async def test_a_replica_starting_beside_a_live_one_requeues_no_task_whose_worker_is_alive(
    make_harness: MakeHarness, redis_server: str, tmp_path: Path
) -> None:
    """A rolling restart: replica B starts while A's worker runs calls. A call that just finished in Redis
    (its SQL row still says running, for a moment) is not run again; one whose worker is gone is."""
    redis = connect(redis_server)
    await redis.flushall()
    h = await make_harness([("cpu",)], database_url=f"sqlite:///{tmp_path / 'levers9.db'}", redis=redis)
    a = h.scheduler()
    live, gone = WorkerInfo("w-live", "cpu", 1000, 1024), WorkerInfo("w-gone", "cpu", 1000, 1024)
    for w in (live, gone):
        await a.register_worker(w)
    requests = [h.request(None, cpu_millicores=1000) for _ in range(2)]
    await a.submit_many(requests)
    placed = {p.worker: p.request for p in (await a.place_once()).placed}
    assert set(placed) == {"w-live", "w-gone"}
    tasks = TaskStore(h.db)
    for worker, rid in placed.items():
        assert await a.take(worker) == [Taken(rid)]
        await tasks.set_running(rid, worker, f"c-{rid}")
    now_ms = a.ctx.now_ms()
    await a.backlog.finish(placed["w-live"], now_ms)  # done in Redis; SQL hears a moment later
    await a.backlog.finish(placed["w-gone"], now_ms)  # and this one's worker stops reporting
    await redis.delete(f"{a.ctx.workers.prefix}alive:w-gone")
    b = h.scheduler()
    try:
        report = await b.rebuild()
        assert report.requeued_running == 1
        live_task, gone_task = await tasks.get(placed["w-live"]), await tasks.get(placed["w-gone"])
        assert live_task is not None
        assert gone_task is not None
        assert (live_task.status, gone_task.status) == ("running", "pending")
    finally:
        await b.stop()
        await a.stop()
        await redis.aclose()


async def test_a_call_kept_for_a_worker_that_does_not_come_back_is_queued_again_when_its_time_is_up(
    make_harness: MakeHarness, tmp_path: Path
) -> None:
    """Redis lost its data (an embedded Redis died with its controlplane): the running call waits for its worker,
    holding no room and placed nowhere, for the grace; then it is queued again with its attempt counted."""
    h = await make_harness(
        [("cpu",)],
        database_url=f"sqlite:///{tmp_path / 'levers9.db'}",
        redis=connect(None, embedded=EmbeddedRedis()),
        worker_keepalive_s=3,
    )
    first = h.scheduler()
    await first.register_worker(WorkerInfo("w-old", "cpu", 1000, 1024))
    request = h.request(None, cpu_millicores=1000)
    await first.submit(request)
    [placed] = (await first.place_once()).placed
    assert await first.take(placed.worker) == [Taken(request.id)]
    tasks = TaskStore(h.db)
    await tasks.set_running(request.id, "w-old", "c-1")
    await first.stop()

    now = [1_000_000.0]
    second = h.scheduler(redis=connect(None, embedded=EmbeddedRedis()))  # nothing survived
    second.ctx.clock = lambda: now[0]
    assert second.return_grace_s == 20.0  # the keepalive is shorter than a worker's pause between reconnects
    report = await second.rebuild()
    assert (report.requeued_running, report.kept_for_workers) == (0, 1)
    assert await second.workers.returning(), "no machine is judged gone meanwhile"
    state = await second.backlog.get(request.id)
    assert state is not None
    assert (state.state, state.worker) == ("orphan", "w-old")
    # another worker registers: the kept call is not placed on it
    await second.register_worker(WorkerInfo("w-new", "cpu", 1000, 1024))
    assert (await second.place_once()).placed == []
    assert await second.reap_once() == []  # not yet
    now[0] += 19.0
    assert await second.reap_once() == []
    now[0] += 2.0
    assert await second.reap_once() == [request.id]
    task = await tasks.get(request.id)
    assert task is not None
    assert (task.status, task.attempts) == ("pending", 1)
    assert [(p.request, p.worker) for p in (await second.place_once()).placed] == [(request.id, "w-new")]
    # and the old worker, back too late, has nothing of it: its report would be refused (placed elsewhere)
    await second.register_worker(WorkerInfo("w-old", "cpu", 1000, 1024))
    assert await second.reclaim_worker("w-old", [request.id]) == []


async def test_workers_a_kept_redis_still_holds_are_not_reaped_for_the_downtime(
    make_harness: MakeHarness, redis_server: str, tmp_path: Path
) -> None:
    """A controlplane restarted over a Redis that kept its data (a server, not the embedded one): every
    keepalive lapsed while it was down. Its running call is neither requeued nor its worker removed while the
    workers get the grace to reconnect; one that never comes back is reaped after it."""
    redis = connect(redis_server)
    await redis.flushall()
    h = await make_harness(
        [("cpu",)], database_url=f"sqlite:///{tmp_path / 'levers9.db'}", redis=redis, worker_keepalive_s=0.5
    )
    first = h.scheduler()
    back, gone = WorkerInfo("w-back", "cpu", 1000, 1024), WorkerInfo("w-gone", "cpu", 1000, 1024)
    for w in (back, gone):
        await first.register_worker(w)
    request = h.request(None, cpu_millicores=1000)
    await first.submit(request)
    [placed] = (await first.place_once()).placed
    assert await first.take(placed.worker) == [Taken(request.id)]
    await TaskStore(h.db).set_running(request.id, placed.worker, "c-1")
    await first.stop()

    second = h.scheduler()
    try:

        async def both_silent() -> bool:
            return sorted(await second.ctx.workers.silent()) == ["w-back", "w-gone"]

        await eventually(both_silent, "the keepalives to lapse while no controlplane listens")
        await second.rebuild()
        assert await second.reap_once() == [], "reaped for the controlplane's own downtime"
        assert await second.workers.ids() == {"w-back", "w-gone"}
        state = await second.backlog.get(request.id)
        assert state is not None
        assert (state.state, state.worker) == ("running", placed.worker)
        await second.register_worker(back if placed.worker == "w-back" else gone)  # the call's worker returns
        await redis.delete(f"{second.ctx.workers.prefix}returning")  # the grace is over
        other = "w-gone" if placed.worker == "w-back" else "w-back"
        assert await second.reap_once() == []  # nothing of the absent one's to requeue
        assert await second.workers.ids() == {placed.worker}, f"{other} never came back: reaped"
        task = await TaskStore(h.db).get(request.id)
        assert task is not None
        assert (task.status, task.attempts) == ("running", 0)
    finally:
        await second.stop()
        await redis.aclose()
