"""The worker registry's steps over many workers, on the embedded Redis and on a real redis-server."""

from __future__ import annotations

from levers9.state.redis.backlog import Backlog, Group, QueuedRequest, Taken
from levers9.state.redis.workers import CHUNK, WorkerInfo, WorkerRegistry
from tests.fixtures.redis import RedisFactory

NOW = 1_700_000_000_000
TTL = 3_600_000


def _info(wid: str, *, runtime: str = "", address: str | None = None) -> WorkerInfo:
    return WorkerInfo(wid, "cpu", 8000, 16384, runtime=runtime, address=address)


async def test_get_many_reads_every_field_in_order_across_chunks(redis_factory: RedisFactory) -> None:
    reg = WorkerRegistry(redis_factory(), "t:")
    ids = [f"w{i:04d}" for i in range(CHUNK + 3)]
    for wid in ids:
        await reg.register(_info(wid, runtime="runc", address=f"{wid}.local:7000"), now_ms=NOW, ttl_ms=TTL)
    special = WorkerInfo(
        "w-gpu",
        "h100",
        4000,
        8192,
        gpu="H100",
        gpu_count=2,
        runtime="runc",
        machine_id="m-1",
        address='a "quoted"\\ name/é',
        workspace="ws_1",
        tunnel=True,
    )
    await reg.register(special, now_ms=NOW + 5, ttl_ms=TTL)
    asked = ["nobody", *reversed(ids), "w-gpu"]
    states = await reg.get_many(asked)
    assert len(states) == len(asked)
    assert states[0] is None
    assert [s.info.id if s else None for s in states[1:-1]] == list(reversed(ids))
    first = states[-2]
    assert first is not None
    assert first.info == _info("w0000", runtime="runc", address="w0000.local:7000")
    assert (first.cpu_free, first.memory_free, first.gpu_free, first.status, first.running) == (
        8000,
        16384,
        0,
        "running",
        0,
    )
    gpu = states[-1]
    assert gpu is not None
    assert gpu.info == special
    assert (gpu.gpu_free, gpu.registered_ms, gpu.idle_since_ms) == (2, NOW + 5, NOW + 5)
    assert await reg.get("w-gpu") == gpu
    assert await reg.get_many([]) == []


async def test_silent_lists_only_lapsed_workers_sorted(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    reg = WorkerRegistry(client, "t:")
    assert await reg.silent() == []
    for wid in ("c", "a", "b"):
        await reg.register(_info(wid), now_ms=NOW, ttl_ms=TTL)
    await client.delete("t:alive:c", "t:alive:a")
    assert await reg.silent() == ["a", "c"]


async def test_heartbeat_many_refreshes_the_living_and_names_the_reaped(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    for wid in ("a", "b"):
        await reg.register(_info(wid), now_ms=NOW, ttl_ms=TTL)
    await client.delete("t:alive:a")  # lapsed, not reaped yet
    assert await reg.remove("b", now_ms=NOW, force=True) == []  # reaped
    assert await reg.heartbeat_many(["a", "b"], now_ms=NOW + 1, ttl_ms=TTL) == {"b"}
    assert await client.get("t:alive:a") == str(NOW + 1)
    assert 0 < await client.pttl("t:alive:a") <= TTL
    assert await reg.silent() == []
    # the lapsed worker is back in its pool's index: placement finds it again
    await backlog.enqueue([QueuedRequest("r", 1000, 1024, 0, (Group(0, ("cpu",), 0),), NOW, "ws")])
    assert [(p.request, p.worker) for p in (await backlog.place(NOW)).placed] == [("r", "a")]
    assert await reg.heartbeat_many([], now_ms=NOW, ttl_ms=TTL) == set()


async def test_with_work_names_workers_with_placements_they_have_not_taken(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    assert await reg.with_work() == set()
    for wid in ("busy", "idle"):
        await reg.register(WorkerInfo(wid, "cpu", 1000, 1024), now_ms=NOW, ttl_ms=TTL)
    await backlog.enqueue([QueuedRequest("r", 1000, 1024, 0, (Group(0, ("cpu",), 0),), NOW, "ws")])
    [placed] = (await backlog.place(NOW)).placed
    assert await reg.with_work() == {placed.worker}
    assert await backlog.take(placed.worker, 10) == [Taken("r")]
    assert await reg.with_work() == set()


async def test_census_counts_workers_by_pool_gpu_and_status(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    reg = WorkerRegistry(client, "t:")
    assert await reg.census() == {}
    for wid in ("c1", "c2", "c3"):
        await reg.register(_info(wid), now_ms=NOW, ttl_ms=TTL)
    for wid in ("g1", "g2"):
        await reg.register(WorkerInfo(wid, "h100", 8000, 16384, "H100", 8), now_ms=NOW, ttl_ms=TTL)
    await client.delete("t:alive:c3")  # lapsed: counted as silent until the reaper takes it out
    assert await reg.cordon("g2")
    assert await reg.census() == {
        ("cpu", "", "running"): 2,
        ("cpu", "", "silent"): 1,
        ("h100", "H100", "running"): 1,
        ("h100", "H100", "draining"): 1,
    }
