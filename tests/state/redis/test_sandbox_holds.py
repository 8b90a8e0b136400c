"""A sandbox's hold on its worker's room (sandbox_hold.lua, sandbox_release.lua), on the embedded Redis and a real one.

A sandbox takes room as a placed call does: calls are not placed into it, the worker is not idle while it
runs, releasing gives the room back (and to the calls waiting in the worker's queue), and a worker that leaves
takes its holds with it.
"""

from __future__ import annotations

from levers9.state.redis.backlog import Backlog, Group, QueuedRequest
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from tests.fixtures.redis import RedisFactory

NOW = 1_700_000_000_000
TTL = 3_600_000
CPU = (Group(0, ("cpu",), 0),)


async def _registry(factory: RedisFactory) -> tuple[Backlog, WorkerRegistry]:
    client = factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    await reg.register(WorkerInfo("w1", "cpu", 2000, 4096), now_ms=NOW, ttl_ms=TTL)
    return backlog, reg


async def test_a_hold_takes_room_calls_cannot_have_and_releasing_gives_it_back(redis_factory: RedisFactory) -> None:
    backlog, reg = await _registry(redis_factory)
    assert await reg.hold_sandbox("sb-1", "w1", cpu=1500, mem=1024, gpus=0, now_ms=NOW) is True
    assert await reg.hold_sandbox("sb-1", "w1", cpu=1500, mem=1024, gpus=0, now_ms=NOW) is True  # idempotent
    worker = await reg.get("w1")
    assert worker is not None
    assert (worker.cpu_free, worker.memory_free, worker.running, worker.idle_since_ms) == (500, 3072, 1, 0)
    # no room for a second sandbox of that size, nor for a call of 1000 millicores
    assert await reg.hold_sandbox("sb-2", "w1", cpu=1500, mem=1024, gpus=0, now_ms=NOW) is False
    await backlog.enqueue([QueuedRequest("r1", 1000, 512, 0, CPU, NOW, "ws")])
    assert (await backlog.place(NOW)).placed == []
    assert await reg.release_sandbox("sb-1", now_ms=NOW + 10) is True
    assert await reg.release_sandbox("sb-1", now_ms=NOW + 10) is False  # once
    worker = await reg.get("w1")
    assert worker is not None
    assert (worker.cpu_free, worker.memory_free, worker.running, worker.idle_since_ms) == (2000, 4096, 0, NOW + 10)
    # (an unplaced call is looked at again a recheck later, 1 s by default)
    assert [p.request for p in (await backlog.place(NOW + 2000)).placed] == ["r1"]


async def test_no_hold_on_a_worker_that_is_gone_or_draining_and_a_removed_worker_drops_its_holds(
    redis_factory: RedisFactory,
) -> None:
    _, reg = await _registry(redis_factory)
    assert await reg.hold_sandbox("sb-1", "nobody", cpu=100, mem=64, gpus=0, now_ms=NOW) is False
    assert await reg.hold_sandbox("sb-1", "w1", cpu=100, mem=64, gpus=0, now_ms=NOW) is True
    assert await reg.remove("w1", now_ms=NOW, force=True) == []  # a sandbox is no call: nothing is requeued
    assert await reg.release_sandbox("sb-1", now_ms=NOW) is False
    await reg.register(WorkerInfo("w2", "cpu", 2000, 4096), now_ms=NOW, ttl_ms=TTL)
    assert await reg.cordon("w2") is True
    assert await reg.hold_sandbox("sb-2", "w2", cpu=100, mem=64, gpus=0, now_ms=NOW) is False


async def test_a_gpu_sandbox_holds_its_gpus_from_calls_until_released(redis_factory: RedisFactory) -> None:
    client = redis_factory()
    backlog, reg = Backlog(client, "t:"), WorkerRegistry(client, "t:")
    await reg.register(WorkerInfo("g1", "gpu", 8000, 16384, gpu="H100", gpu_count=2), now_ms=NOW, ttl_ms=TTL)
    assert await reg.hold_sandbox("sb-1", "g1", cpu=100, mem=64, gpus=3, now_ms=NOW) is False  # more than it has
    assert await reg.hold_sandbox("sb-1", "g1", cpu=100, mem=64, gpus=2, now_ms=NOW) is True
    worker = await reg.get("g1")
    assert worker is not None
    assert worker.gpu_free == 0
    assert await reg.hold_sandbox("sb-2", "g1", cpu=100, mem=64, gpus=1, now_ms=NOW) is False
    # a call of one GPU has the CPU and memory it needs there, but no GPU: it is not placed
    await backlog.enqueue([QueuedRequest("r1", 1000, 512, 1, (Group(0, ("gpu",), 1),), NOW, "ws")])
    assert (await backlog.place(NOW)).placed == []
    assert await reg.release_sandbox("sb-1", now_ms=NOW + 10) is True
    worker = await reg.get("g1")
    assert worker is not None
    assert worker.gpu_free == 2
    assert [p.request for p in (await backlog.place(NOW + 2000)).placed] == ["r1"]
