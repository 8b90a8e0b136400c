"""Which of several pools with the same GPU gets the machine: the cheaper one, unless the operator ranked them.

``scheduler.pool_order: price`` (the default) starts the pool whose cheapest offer costs least per GPU-hour,
``config`` the pool listed first; ``priority`` ranks pools above price either way.
"""

from __future__ import annotations

from typing import Any

import pytest

from levers9.hooks.types import GpuOffer
from tests.scheduler.conftest import Harness, MakeHarness


def _offer(zone: str, price: float | None, count: int = 1) -> dict[str, Any]:
    return {
        "gpu": "H100",
        "gpu_count": count,
        "gpu_memory_mib": 81559,
        "instance_type": f"h100x{count}",
        "region": "r1",
        "zone": zone,
        "price_per_hour": price,
    }


async def _first_start(h: Harness) -> str:
    """Ask every pool for its offers, queue one H100 call, run one planner pass: the pool the provider was asked."""
    s = h.scheduler()
    await s.offers.refresh()
    await s.submit(h.request("H100"))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    calls = h.calls()
    assert len(calls) == 1, calls
    return calls[0][0]


@pytest.mark.parametrize(("order", "started"), [("price", "b-cheap"), ("config", "a-dear")])
async def test_the_cheaper_pool_is_started_unless_the_order_is_the_configs(
    make_harness: MakeHarness, order: str, started: str
) -> None:
    # "a-dear" is listed first and its name sorts first too: only the price can put "b-cheap" ahead
    h = await make_harness([("a-dear", "H100"), ("b-cheap", "H100")], pool_order=order)
    h.offer(**{"a-dear": [_offer("a", 4.0)], "b-cheap": [_offer("b", 2.5), _offer("c", None)]})
    assert await _first_start(h) == started


async def test_the_price_compared_is_per_gpu_hour(make_harness: MakeHarness) -> None:
    # one GPU for 3.0 against eight for 16.0 (2.0 a GPU): the eight-GPU pool is the cheaper per GPU
    h = await make_harness([("a-one", "H100", 1), ("b-eight", "H100", 8)])
    h.offer(**{"a-one": [_offer("a", 3.0)], "b-eight": [_offer("b", 16.0, 8)]})
    assert await _first_start(h) == "b-eight"


async def test_priority_ranks_above_price_and_unpriced_pools_come_last(make_harness: MakeHarness) -> None:
    h = await make_harness(
        [("unpriced", "H100"), ("cheap", "H100"), ("ranked", "H100", 1, {"priority": 5})], pool_order="price"
    )
    h.offer(unpriced=[_offer("a", None)], cheap=[_offer("b", 1.0)], ranked=[_offer("c", 9.0)])
    assert await _first_start(h) == "ranked"
    s = h.schedulers[-1]
    queued = s._queued(h.request("H100"))
    assert [g.pools for g in queued.groups] == [("ranked",), ("cheap", "unpriced")]


async def test_an_offer_the_provider_reports_unavailable_does_not_price_its_pool(make_harness: MakeHarness) -> None:
    h = await make_harness([("a-gone", "H100"), ("b-dear", "H100"), ("c-cheap", "H100")])
    gone = {**_offer("a", 0.5), "availability": "unavailable"}
    h.offer(**{"a-gone": [gone], "b-dear": [_offer("b", 4.0)], "c-cheap": [_offer("c", 1.0)]})
    assert GpuOffer(**gone).price_per_hour == 0.5
    s = h.scheduler()
    await s.offers.refresh()
    queued = s._queued(h.request("H100"))
    assert [g.pools for g in queued.groups] == [("c-cheap", "b-dear", "a-gone")]


async def test_a_call_queued_before_any_offer_was_listed_still_starts_the_cheaper_pool(
    make_harness: MakeHarness,
) -> None:
    # the order stored with the call had no prices (nothing listed yet: a replica without the lease, or the
    # first call after a start); the planner orders the group by the prices it knows when it starts a machine
    h = await make_harness([("a-dear", "H100"), ("b-cheap", "H100")])
    h.offer(**{"a-dear": [_offer("a", 4.0)], "b-cheap": [_offer("b", 2.5)]})
    s = h.scheduler()
    await s.submit(h.request("H100"))
    await s.offers.refresh()
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    assert [pool for pool, _ in h.calls()] == ["b-cheap"]
