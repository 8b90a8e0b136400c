"""The worker's one account of its GPUs (levers9.worker.gpu_ledger), alone: no container, no runtime."""

from __future__ import annotations

import asyncio

import pytest

from levers9.hooks.types import GpuDevice
from levers9.worker.gpu_ledger import GpuLedger


def devices(n: int) -> list[GpuDevice]:
    return [GpuDevice(index=i, uuid=f"GPU-ledger-{i}", model="test", memory_mib=1024) for i in range(n)]


def test_take_gives_the_lowest_free_and_never_more_than_are_free() -> None:
    ledger = GpuLedger(reversed(devices(4)))
    first = ledger.take(2)
    assert first is not None
    assert [g.index for g in first] == [0, 1]
    assert ledger.take(3) is None
    assert ledger.free == 2  # a refused take holds nothing
    assert ledger.take(0) == []
    ledger.give(first[1:])
    taken = ledger.take(1)
    assert taken is not None
    assert [g.index for g in taken] == [1]


def test_a_device_given_back_twice_or_never_held_is_a_bug_named() -> None:
    ledger = GpuLedger(devices(2))
    taken = ledger.take(1)
    assert taken is not None
    ledger.give(taken)
    with pytest.raises(ValueError, match="GPU 0 is not held"):
        ledger.give(taken)
    stranger = GpuDevice(index=7, uuid="GPU-other", model="test", memory_mib=1)
    with pytest.raises(ValueError, match="GPU 7 is not held"):
        ledger.give([stranger])
    with pytest.raises(ValueError, match="repeat"):
        GpuLedger([*devices(1), *devices(1)])
    assert ledger.free == 2


def test_listeners_hear_of_devices_back_and_a_broken_one_does_not_stop_the_rest() -> None:
    ledger = GpuLedger(devices(1))
    heard: list[int] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    ledger.on_freed(broken)
    ledger.on_freed(lambda: heard.append(ledger.free))
    taken = ledger.take(1)
    assert taken is not None
    ledger.give(taken)
    assert heard == [1]


async def test_a_claim_is_served_first_as_devices_come_back_and_blocks_other_takers_meanwhile() -> None:
    ledger = GpuLedger(devices(2))
    held = ledger.take(2)
    assert held is not None
    asked: list[int] = []

    def reclaim(needed: int) -> int:  # the warm pool: it stops idle containers holding both
        asked.append(needed)
        return 2

    ledger.reclaim_with(reclaim)
    claim = asyncio.ensure_future(ledger.claim(2, timeout_s=10))
    await asyncio.sleep(0)  # the claim is waiting
    assert asked == [2]
    assert not ledger.can_take(1)
    ledger.give(held[:1])
    assert ledger.take(1) is None  # the claim waits for two: the one back is kept for it
    assert not claim.done()
    ledger.give(held[1:])
    got = await claim
    assert [g.index for g in got or []] == [0, 1]
    assert (ledger.free, ledger.can_take(0)) == (0, True)


async def test_a_claim_that_cannot_be_met_stops_nothing_and_one_not_met_in_time_holds_nothing() -> None:
    ledger = GpuLedger(devices(2))
    busy = ledger.take(1)
    assert busy is not None
    assert await ledger.claim(3, timeout_s=1) is None  # more than the machine has: not even asked
    assert await ledger.claim(2, timeout_s=1) is None  # no reclaimer: nothing can be freed
    ledger.reclaim_with(lambda needed: 0)  # busy containers hold the rest
    assert await ledger.claim(2, timeout_s=1) is None
    ledger.reclaim_with(lambda needed: 1)  # a container is stopping, but it is slow
    assert await ledger.claim(2, timeout_s=0.05) is None
    assert ledger.can_take(1)  # the lapsed claim no longer blocks anyone
    ledger.give(busy)
    assert ledger.free == 2
    got = await ledger.claim(2, timeout_s=1)
    assert [g.index for g in got or []] == [0, 1]


async def test_a_claim_whose_caller_went_away_holds_nothing() -> None:
    ledger = GpuLedger(devices(1))
    busy = ledger.take(1)
    assert busy is not None
    ledger.reclaim_with(lambda needed: 1)
    claim = asyncio.ensure_future(ledger.claim(1, timeout_s=10))
    await asyncio.sleep(0)
    claim.cancel()  # the create was abandoned while the device was on its way back
    with pytest.raises(asyncio.CancelledError):
        await claim
    ledger.give(busy)
    assert ledger.free == 1

    # served and cancelled in the same turn of the loop: the device is the caller's, or free; never lost
    busy = ledger.take(1)
    assert busy is not None
    claim = asyncio.ensure_future(ledger.claim(1, timeout_s=10))
    await asyncio.sleep(0)
    ledger.give(busy)
    claim.cancel()
    try:
        got = await claim
    except asyncio.CancelledError:
        got = None
    assert ledger.free + len(got or []) == 1
