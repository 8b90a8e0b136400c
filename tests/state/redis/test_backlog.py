"""The backlog and worker registry on the embedded Redis and on a real redis-server."""

from __future__ import annotations

import asyncio

from levers9.state.redis.backlog import Backlog, Group, QueuedRequest, Taken
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from tests.fixtures.redis import RedisFactory

NOW = 1_700_000_000_000
TTL = 3_600_000


def q(rid: str, *groups: Group, cpu: int = 1000, mem: int = 1024, enq: int = NOW) -> QueuedRequest:
    return QueuedRequest(rid, cpu, mem, max(g.gpu_count for g in groups), groups, enq, "ws")


async def setup(factory: RedisFactory) -> tuple[Backlog, WorkerRegistry]:
    client = factory()
    return Backlog(client, "t:"), WorkerRegistry(client, "t:")


async def add(reg: WorkerRegistry, wid: str, pool: str, cpu: int = 8000, mem: int = 16384, gpus: int = 0) -> None:
    info = WorkerInfo(wid, pool, cpu, mem, "H100" if gpus else None, gpus)
    await reg.register(info, now_ms=NOW, ttl_ms=TTL)


async def test_best_fit_is_the_fullest_worker_that_still_fits(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "roomy", "cpu", cpu=8000)
    await add(reg, "snug", "cpu", cpu=2000)
    await backlog.enqueue([q("a", Group(0, ("cpu",), 0), cpu=1500), q("b", Group(0, ("cpu",), 0), cpu=1500)])
    result = await backlog.place(NOW)
    assert [(p.request, p.worker) for p in result.placed] == [("a", "snug"), ("b", "roomy")]
    snug, roomy = await reg.get_many(["snug", "roomy"])
    assert snug is not None
    assert snug.cpu_free == 500
    assert snug.running == 1
    assert roomy is not None
    assert roomy.cpu_free == 6500


async def test_later_preference_only_when_earlier_is_full(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "h1", "h100", gpus=1)
    await add(reg, "a1", "a100", gpus=1)
    prefs = (Group(0, ("h100",), 1), Group(0, ("a100",), 1))
    await backlog.enqueue([q("r1", *prefs), q("r2", *prefs), q("r3", *prefs)])
    result = await backlog.place(NOW)
    assert [(p.request, p.pool) for p in result.placed] == [("r1", "h100"), ("r2", "a100")]
    assert result.unplaced == ["r3"]
    assert await backlog.unmet() == ["r3"]


async def test_cpu_fallback_waits_for_its_group_to_open(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "c1", "cpu")
    await backlog.enqueue([q("r", Group(0, ("h100",), 1), Group(NOW + 60_000, ("cpu",), 0))])
    first = await backlog.place(NOW)
    assert first.unplaced == ["r"]
    assert await backlog.next_due_ms() == NOW + 1000  # rechecked before the fallback opens
    later = await backlog.place(NOW + 60_000)
    assert [(p.request, p.worker) for p in later.placed] == [("r", "c1")]
    c1 = await reg.get("c1")
    assert c1 is not None
    assert c1.gpu_free == 0
    assert c1.cpu_free == 7000


async def test_enqueue_is_idempotent_and_finish_gives_resources_back(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "g", "h100", gpus=2)
    r = q("r", Group(0, ("h100",), 2))
    assert await backlog.enqueue([r]) == 1
    assert await backlog.enqueue([r]) == 0
    await backlog.place(NOW)
    assert await backlog.enqueue([r]) == 0  # a placed request is not queued again
    assert await backlog.take("g", 5) == [Taken("r")]
    state = await backlog.get("r")
    assert state is not None
    assert state.state == "running"
    assert state.worker == "g"
    finished = await backlog.finish("r", NOW + 5)
    assert finished is not None
    assert finished.state == "running"
    assert finished.pool == "h100"
    g = await reg.get("g")
    assert g is not None
    assert (g.gpu_free, g.cpu_free, g.running, g.idle_since_ms) == (2, 8000, 0, NOW + 5)
    assert await backlog.get("r") is None
    assert await backlog.finish("r", NOW) is None


async def test_a_silent_worker_gets_nothing_and_removing_it_requeues_its_work(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    await add(reg, "w", "cpu")
    await backlog.enqueue([q("r1", Group(0, ("cpu",), 0))])
    assert len((await backlog.place(NOW)).placed) == 1
    assert await reg.remove("w", now_ms=NOW) is None  # alive: the reaper must not touch it
    await client.delete("t:alive:w")  # its keepalive lapses
    await backlog.enqueue([q("r2", Group(0, ("cpu",), 0))])
    assert (await backlog.place(NOW)).unplaced == ["r2"]
    assert await reg.silent() == ["w"]
    assert await reg.remove("w", now_ms=NOW) == ["r1"]
    r1 = await backlog.get("r1")
    assert r1 is not None
    assert (r1.state, r1.worker, r1.attempts) == ("queued", None, 1)
    assert await reg.ids() == set()
    assert not await reg.heartbeat("w", now_ms=NOW, ttl_ms=TTL)  # it must register again


async def test_drain_only_an_idle_worker(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "w", "cpu")
    await backlog.enqueue([q("r", Group(0, ("cpu",), 0))])
    await backlog.place(NOW)
    assert not await reg.drain_if_idle("w", now_ms=NOW + 10**9, idle_ms=1)  # busy
    await backlog.finish("r", NOW + 100)
    assert not await reg.drain_if_idle("w", now_ms=NOW + 150, idle_ms=100)  # not idle long enough
    assert await reg.drain_if_idle("w", now_ms=NOW + 200, idle_ms=100)
    await backlog.enqueue([q("r2", Group(0, ("cpu",), 0))])
    assert (await backlog.place(NOW + 300)).unplaced == ["r2"]  # a draining worker takes nothing


async def test_wake_makes_waiting_requests_due_now(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await backlog.enqueue([q("r", Group(0, ("cpu",), 0))])
    await backlog.place(NOW, recheck_ms=60_000)
    assert await backlog.next_due_ms() == NOW + 60_000
    await add(reg, "w", "cpu")
    assert await backlog.wake("cpu", NOW + 1) == 1
    assert [p.request for p in (await backlog.place(NOW + 1)).placed] == ["r"]
    assert await backlog.unmet() == []


async def test_two_schedulers_place_every_request_exactly_once(redis_factory: RedisFactory) -> None:
    one, two = Backlog(redis_factory(), "t:"), Backlog(redis_factory(), "t:")
    reg = WorkerRegistry(redis_factory(), "t:")
    for i in range(20):
        await add(reg, f"w{i}", "cpu", cpu=50_000, mem=10**6)
    ids = [f"r{i}" for i in range(1000)]
    await one.enqueue([q(rid, Group(0, ("cpu",), 0), enq=NOW + i) for i, rid in enumerate(ids)])

    async def drain(backlog: Backlog) -> list[str]:
        got: list[str] = []
        while await backlog.size():
            got += [p.request for p in (await backlog.place(NOW + 10_000, limit=13)).placed]
            await asyncio.sleep(0)
        return got

    a, b = await asyncio.gather(drain(one), drain(two))
    assert sorted(a + b) == sorted(ids)
    assert a
    assert b
    states = await reg.get_many([f"w{i}" for i in range(20)])
    assert sum(50_000 - s.cpu_free for s in states if s) == 1000 * 1000


async def test_a_late_heartbeat_puts_the_worker_back_in_placement(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    await add(reg, "w", "cpu")
    await client.delete("t:alive:w")  # silent for a moment
    await backlog.enqueue([q("r", Group(0, ("cpu",), 0))])
    assert (await backlog.place(NOW)).unplaced == ["r"]  # and placement dropped it from the index
    assert await reg.heartbeat("w", now_ms=NOW, ttl_ms=TTL)  # back before the reaper came
    assert await reg.remove("w", now_ms=NOW) is None
    assert [p.worker for p in (await backlog.place(NOW + 5_000)).placed] == ["w"]


async def test_finish_many_gives_back_resources_like_finish_in_one_step(redis_factory: RedisFactory) -> None:
    backlog, reg = await setup(redis_factory)
    await add(reg, "w1", "p", cpu=1000, mem=1024)
    await backlog.enqueue([q(f"r{i}", Group(0, ("p",), 0), cpu=400, mem=100, enq=NOW + i) for i in range(3)])
    placed = await backlog.place(NOW + 10)
    assert sorted(p.request for p in placed.placed) == ["r0", "r1"]  # the third does not fit yet
    done = await backlog.finish_many(["r0", "nope", "r1"], NOW + 20)
    assert [d.state if d else None for d in done] == ["placed", None, "placed"]
    state = await reg.get("w1")
    assert state is not None
    assert (state.cpu_free, state.memory_free, state.running) == (1000, 1024, 0)
    assert await backlog.get("r0") is None
    assert await backlog.get("r2") is not None  # untouched: still waiting


async def test_finish_many_for_one_worker_leaves_requests_on_other_workers_alone(redis_factory: RedisFactory) -> None:
    """A late report from a worker presumed dead must not free the worker that now runs the request."""
    backlog, reg = await setup(redis_factory)
    await add(reg, "w1", "p", cpu=400, mem=100)
    await add(reg, "w2", "p", cpu=400, mem=100)
    await backlog.enqueue([q(f"r{i}", Group(0, ("p",), 0), cpu=400, mem=100, enq=NOW + i) for i in range(3)])
    placed = {p.request: p.worker for p in (await backlog.place(NOW + 10)).placed}
    assert sorted(placed) == ["r0", "r1"]
    other = {"w1": "w2", "w2": "w1"}[placed["r0"]]
    done = await backlog.finish_many(["r0", "r1"], NOW + 20, worker=other, wake_per_freed=2)
    assert [d is not None for d in done] == [False, True]
    assert done.woken == 1  # r2, waiting on the pool: the placement loop is woken for it
    assert await backlog.get("r0") is not None  # still placed where it runs
    state = await reg.get(placed["r0"])
    assert state is not None
    assert state.running == 1
    # the place freed on the other worker made the waiting request due at once, in the same step
    assert [(p.request, p.worker) for p in (await backlog.place(NOW + 21)).placed] == [("r2", other)]
    assert await backlog.finish_many(["r1"], NOW + 30, worker=other) == [None]  # nothing twice


async def test_a_release_with_nothing_waiting_wakes_no_one(redis_factory: RedisFactory) -> None:
    """A lone call's release: the placement loop need not look at an empty backlog."""
    backlog, reg = await setup(redis_factory)
    await add(reg, "w1", "p", cpu=1000, mem=1024)
    await backlog.enqueue([q("r0", Group(0, ("p",), 0), cpu=400, mem=100, enq=NOW)])
    assert [p.request for p in (await backlog.place(NOW + 1)).placed] == ["r0"]
    done = await backlog.finish_many(["r0"], NOW + 2, worker="w1", wake_per_freed=2)
    assert ([d.state if d else None for d in done], done.woken) == (["placed"], 0)
