"""The planner lease and its fencing token, on a real redis-server.

Two :class:`Lease` objects on one key play two replicas. A replica that was frozen past the TTL resumes
believing it holds the lease: its token is no longer current, so its acts are refused, and the lease is
shown held by exactly one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from levers9.scheduler.lease import Lease, LeaseLost
from levers9.state.redis.connect import connect
from tests.scheduler.conftest import MakeHarness

KEY = "l9:lease:planner"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_each_acquisition_takes_a_new_token_and_a_renewal_keeps_it(redis: Redis) -> None:
    a = Lease(redis, KEY, "a", ttl_s=10)
    b = Lease(redis, KEY, "b", ttl_s=10)
    assert a.token == 0
    assert not await a.current()
    assert await a.acquire()
    first = a.token
    assert first >= 1
    assert await a.current()
    assert await a.acquire()  # a renewal
    assert a.token == first
    assert not await b.acquire()
    assert b.token == 0
    assert not await b.current()
    await a.release()
    assert not await a.current()
    assert await b.acquire()
    assert b.token == first + 1
    assert await b.current()
    await b.release()
    assert await a.acquire()
    assert a.token == first + 2, "the counter only grows: a release deletes the holder, not the counter"


async def test_a_holder_that_resumes_after_losing_the_lease_is_fenced(redis: Redis) -> None:
    a = Lease(redis, KEY, "a", ttl_s=0.2)
    b = Lease(redis, KEY, "b", ttl_s=10)
    assert await a.acquire()
    stale = a.token
    await asyncio.sleep(0.4)  # a is frozen past its TTL; b takes over
    assert await b.acquire()
    assert b.token == stale + 1
    # a resumes: it still has its token in memory, but no act of its passes the fence
    assert a.token == stale
    assert not await a.current()
    assert [await a.held(), await b.held()] == [False, True]
    assert not await a.acquire(), "a cannot take back a lease b holds"
    assert a.token == 0


async def test_a_holder_that_lost_the_lease_and_took_it_again_acts_only_with_the_new_token(redis: Redis) -> None:
    a = Lease(redis, KEY, "a", ttl_s=0.2)
    assert await a.acquire()
    old = a.token
    await asyncio.sleep(0.4)  # expired with nobody else there
    other = Lease(redis, KEY, "a", ttl_s=10)  # the same replica's name, acquiring afresh (after a restart)
    assert await other.acquire()
    assert other.token == old + 1
    assert not await a.current(), "an act begun under the old acquisition is fenced"
    assert await a.acquire()
    assert a.token == old + 1
    assert await a.current()


async def test_a_replica_that_lost_the_lease_starts_and_terminates_no_machine(make_harness: MakeHarness) -> None:
    """The acts themselves are fenced: a frozen holder resumes in the middle of its pool upkeep."""
    h = await make_harness([("cpu", None, 1, {"min_workers": 1, "max_workers": 2})])
    frozen, other = h.scheduler(), h.scheduler()
    assert await frozen.lease.acquire()
    frozen.provisioner.fence = frozen.lease.current  # as the leader loop sets it
    report = await frozen.upkeep_once()
    await h.settle(frozen)
    assert len(report.started) == 1
    assert len(h.machines()) == 1
    await h.register_started(frozen)

    await h.redis.delete(frozen.lease.key)  # frozen past the TTL
    assert await other.lease.acquire()
    with pytest.raises(LeaseLost):  # below the minimum again: still not its to start one
        await frozen.provisioner.start(h.pools["cpu"], "min_workers is 1")
    [record] = await frozen.ctx.machines.list()
    with pytest.raises(LeaseLost):  # what it read before the freeze says the machine's worker is gone
        await frozen.provisioner.terminate(h.pools["cpu"], record, "its worker stopped reporting")
    with pytest.raises(LeaseLost):  # a provider listing that came back after the freeze is not acted on
        await frozen.reconcile_once()
    assert h.terminates() == []
    assert len(h.machines()) == 1
    assert len(h.call_log()) == 1, "no second machine asked for"
