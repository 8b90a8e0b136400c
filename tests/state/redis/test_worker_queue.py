"""Calls queued on a worker beyond its room (place.lua, common.lua ``promote``), on the embedded Redis and a real one.

A CPU-only call of a function known to be short waits in a worker's own queue when no worker of its groups has
room; it holds no room there until room frees, then takes it before anything else; a worker leaving puts its
queue back on the backlog. The invariants the placement property tests hold for room hold here too.
"""

from __future__ import annotations

from levers9.state.redis.backlog import Backlog, Group, QueuedRequest, Taken
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from tests.fixtures.redis import RedisFactory

NOW = 1_700_000_000_000
TTL = 3_600_000
SHORT_MS = 1000
CPU = (Group(0, ("cpu",), 0),)


def call(
    rid: str, *, fn: str = "f", cpu: int = 1000, mem: int = 1024, groups: tuple[Group, ...] = CPU
) -> QueuedRequest:
    return QueuedRequest(rid, cpu, mem, max(g.gpu_count for g in groups), groups, NOW, "ws", function=fn)


async def setup(factory: RedisFactory, *workers: tuple[str, int, int]) -> tuple[Backlog, WorkerRegistry]:
    """Workers (id, CPU millicores, queue bound) in pool ``cpu``; function ``f`` measured at 10 ms a call."""
    client = factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    for wid, cpu, queue in workers:
        await reg.register(WorkerInfo(wid, "cpu", cpu, 16384, queue=queue), now_ms=NOW, ttl_ms=TTL)
    await client.hset("t:dur", "f", 10)
    return backlog, reg


async def place(backlog: Backlog, at: int = NOW) -> list[tuple[str, str, bool]]:
    result = await backlog.place(at, short_ms=SHORT_MS)
    return [(p.request, p.worker, p.queued) for p in result.placed]


async def test_a_call_is_queued_only_when_no_worker_has_room_and_takes_the_first_room_that_frees(
    redis_factory: RedisFactory,
) -> None:
    backlog, reg = await setup(redis_factory, ("w1", 2000, 2), ("w2", 1000, 2))
    await backlog.enqueue([call(f"r{i}") for i in range(6)])
    placed = await place(backlog)
    # room first, on every worker; then the shortest queues; beyond every bound, the backlog
    assert placed[:3] == [("r0", "w2", False), ("r1", "w1", False), ("r2", "w1", False)]
    assert sorted(placed[3:]) == [("r3", "w1", True), ("r4", "w2", True), ("r5", "w1", True)] or sorted(placed[3:]) == [
        ("r3", "w2", True),
        ("r4", "w1", True),
        ("r5", "w2", True),
    ]
    queued_on = {rid: wid for rid, wid, queued in placed if queued}
    w1 = await reg.get("w1")
    assert w1 is not None
    assert (w1.cpu_free, w1.running) == (0, 2)
    state = await backlog.get("r3")
    assert state is not None
    assert state.state == "waiting"
    assert state.request.function == "f"
    await backlog.enqueue([call("r6"), call("r7")])
    assert len(await place(backlog)) == 1  # one more queue place (2 + 2 in all); the other waits in the backlog
    assert len((await backlog.place(NOW, short_ms=SHORT_MS)).placed) == 0

    # the worker takes its list: what holds room runs, what waits is marked as held by the worker
    w1_queued = sorted(r for r, w in queued_on.items() if w == "w1")
    took = await backlog.take("w1", 10)
    assert [t for t in took if not t.queued] == [Taken("r1"), Taken("r2")]
    assert sorted(t.request for t in took if t.queued)[: len(w1_queued)] == w1_queued

    # r1 ends: its room goes to w1's oldest waiting call in the same step, before anything new could take it
    first_waiting = next(t.request for t in took if t.queued)
    [done] = await backlog.finish_many(["r1"], NOW + 5)
    assert done is not None
    assert done.state == "running"
    promoted = await backlog.get(first_waiting)
    assert promoted is not None
    assert (promoted.state, promoted.worker) == ("running", "w1")
    w1 = await reg.get("w1")
    assert w1 is not None
    assert (w1.cpu_free, w1.running) == (0, 2)


async def test_the_oldest_waiting_call_that_does_not_fit_holds_the_ones_behind_it(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory, ("w", 2000, 4))
    await backlog.enqueue([call("a", cpu=1000), call("b", cpu=1000)])
    await place(backlog)
    await backlog.enqueue([call("big", cpu=2000), call("small", cpu=500)])
    assert [q for _, _, q in await place(backlog)] == [True, True]
    await backlog.finish_many(["a"], NOW + 5)  # 1000 free: "big" does not fit, and "small" does not overtake it
    big, small = await backlog.get_many(["big", "small"])
    assert big is not None
    assert small is not None
    assert (big.state, small.state) == ("waiting", "waiting")
    await backlog.finish_many(["b"], NOW + 6)
    big, small = await backlog.get_many(["big", "small"])
    assert big is not None
    assert small is not None
    assert (big.state, small.state) == ("placed", "waiting")
    w = await reg.get("w")
    assert w is not None
    assert (w.cpu_free, w.running) == (0, 1)


async def test_calls_of_a_function_not_measured_or_long_or_needing_gpus_are_never_queued(
    redis_factory: RedisFactory,
) -> None:
    backlog, _reg = await setup(redis_factory, ("w", 1000, 8))
    await backlog.redis.hset("t:dur", "slow", 5000)
    await backlog.enqueue([call("busy")])
    await place(backlog)
    await backlog.enqueue([call("new", fn="unmeasured"), call("slow", fn="slow"), call("none", fn="")])
    result = await backlog.place(NOW, short_ms=SHORT_MS)
    assert result.placed == []
    assert sorted(result.unplaced) == ["new", "none", "slow"]
    # queueing off (short_ms 0): not even a short one
    await backlog.enqueue([call("short")])
    assert (await backlog.place(NOW, short_ms=0)).placed == []
    assert [q for _, _, q in await place(backlog, NOW + 10_000)] == [True]


async def test_no_queue_forms_behind_a_long_call(redis_factory: RedisFactory) -> None:
    backlog, _ = await setup(redis_factory, ("w", 1000, 8))
    await backlog.redis.hset("t:dur", "slow", 5000)
    await backlog.enqueue([call("long", fn="slow")])
    assert await place(backlog) == [("long", "w", False)]
    await backlog.enqueue([call("short")])
    assert await place(backlog) == []  # w runs a long call: the short one waits in the backlog for another worker
    await backlog.finish_many(["long"], NOW + 5)
    assert await place(backlog, NOW + 10_000) == [("short", "w", False)]


async def test_a_worker_leaving_puts_its_queue_back_without_spending_an_attempt(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory, ("w", 1000, 4), ("v", 1000, 0))
    await backlog.enqueue([call("run"), call("other"), call("wait1"), call("wait2")])
    assert [(r, q) for r, _, q in await place(backlog)][2:] == [("wait1", True), ("wait2", True)]
    assert await backlog.take("w", 1) == [Taken("run")]  # wait1 and wait2 not taken yet
    requeued = await reg.remove("w", now_ms=NOW + 1, force=True)
    assert sorted(requeued or []) == ["run", "wait1", "wait2"]
    states = {s.request.id: s for s in await backlog.get_many(["run", "wait1", "wait2"]) if s is not None}
    assert {r: (s.state, s.attempts) for r, s in states.items()} == {
        "run": ("queued", 1),
        "wait1": ("queued", 0),
        "wait2": ("queued", 0),
    }


async def test_a_worker_back_after_a_lost_session_keeps_the_waiting_calls_it_holds(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory, ("w", 1000, 4))
    await backlog.enqueue([call("a_run"), call("b_held"), call("c_lost"), call("d_later")])
    await place(backlog)
    assert await backlog.take("w", 3) == [Taken("a_run"), Taken("b_held", True), Taken("c_lost", True)]
    requeued, kept = await reg.reclaim("w", ["a_run", "b_held"], now_ms=NOW + 1)
    assert (sorted(requeued), sorted(kept)) == (["c_lost"], ["a_run", "b_held"])
    later = await backlog.get("d_later")
    assert later is not None
    assert later.state == "waiting"
    assert await backlog.take("w", 5) == [Taken("d_later", True)]


async def test_finishing_a_waiting_call_frees_its_queue_place_and_no_room(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory, ("w", 1000, 1))
    await backlog.enqueue([call("run"), call("wait")])
    await place(backlog)
    [done] = await backlog.finish_many(["wait"], NOW + 1)  # cancelled while it waited
    assert done is not None
    assert done.state == "waiting"
    w = await reg.get("w")
    assert w is not None
    assert (w.cpu_free, w.running) == (0, 1)
    await backlog.enqueue([call("next")])
    assert await place(backlog) == [("next", "w", True)]  # the queue place is free again


async def test_a_finished_call_teaches_its_functions_mean_duration(redis_factory: RedisFactory) -> None:
    backlog, _ = await setup(redis_factory, ("w", 4000, 0))
    await backlog.enqueue([call("a", fn="g"), call("b", fn="g")])
    await place(backlog)
    assert await backlog.mean_duration_ms("g") is None
    await backlog.finish_many(["a"], NOW + 100)
    assert await backlog.mean_duration_ms("g") == 100
    await backlog.finish_many(["b"], NOW + 600)
    assert await backlog.mean_duration_ms("g") == 100 * 0.8 + 600 * 0.2


async def test_a_worker_cordoned_puts_its_queue_back_on_the_backlog_at_once(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory, ("w", 1000, 4))
    await backlog.enqueue([call("a_run"), call("b_taken"), call("c_untaken")])
    await place(backlog)
    assert await backlog.take("w", 2) == [Taken("a_run"), Taken("b_taken", True)]
    assert await reg.cordon("w")
    states = {s.request.id: s for s in await backlog.get_many(["a_run", "b_taken", "c_untaken"]) if s is not None}
    assert {r: (s.state, s.worker, s.attempts) for r, s in states.items()} == {
        "a_run": ("running", "w", 0),  # what runs there finishes there
        "b_taken": ("queued", None, 1),  # the worker may have started it before it dropped its queue
        "c_untaken": ("queued", None, 0),
    }
    assert await backlog.next_due_ms() == 0  # due at once, for another worker
    await backlog.finish_many(["a_run"], NOW + 1)
    assert (await backlog.get_many(["b_taken"]))[0].state == "queued"  # type: ignore[union-attr]
