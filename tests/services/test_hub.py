"""The wake-up hub on a real Redis: a replica alone publishes no wake-ups, and learns of a replica that joins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from levers9.services import hub as hub_module
from levers9.services.hub import Hub
from levers9.state.redis.connect import connect


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = connect(redis_url)
    try:
        yield redis
    finally:
        await redis.aclose()


async def _publishes(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def _started(hub: Hub) -> Hub:
    await hub.start()
    await asyncio.wait_for(hub._subscribed.wait(), 10)
    return hub


async def test_a_replica_alone_stops_publishing_wake_ups_and_still_publishes_cancellations(
    client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "ALONE_RECHECK_S", 3600.0)  # it does not look again within this test
    alone = await _started(Hub(client, name="a"))
    try:
        before = await _publishes(client)
        await alone.finished(["task_1"])  # heard by its own listener only
        await alone.finished(["task_2"])
        await alone.placed(["worker-elsewhere"])
        assert await _publishes(client) == before + 1, "after one publish no one else heard, wake-ups stay here"
        await alone.cancel("worker-elsewhere", "task_3")
        assert await _publishes(client) == before + 2, "a cancellation is not a wake-up: it is always published"
    finally:
        await alone.close()


async def test_a_replica_that_joins_is_woken_once_the_first_looks_again(
    client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "ALONE_RECHECK_S", 3600.0)
    first = await _started(Hub(client, name="a"))
    joined = None
    try:
        await first.finished(["task_1"])  # alone: wake-ups stop
        joined = await _started(Hub(client, name="b"))
        watch = joined.watch(["task_2"])
        before = await _publishes(client)
        await first.finished(["task_2"])
        assert await _publishes(client) == before, "within the recheck interval the first has not looked again"
        first._alone_until = 0.0  # the interval has passed
        await first.finished(["task_2"])
        assert await asyncio.wait_for(watch.ready.get(), 10) == [("task_2", None)]
        before = await _publishes(client)
        await first.finished(["task_3"])
        assert await _publishes(client) == before + 1, "with another replica listening, every wake-up is published"
    finally:
        await first.close()
        if joined is not None:
            await joined.close()
