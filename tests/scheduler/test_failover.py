"""Failover between GPU types and pools when providers say no, and the answer when nothing can be had."""

from __future__ import annotations

import asyncio

import pytest

from levers9.scheduler.candidates import NoPoolOffers
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import MakeHarness, eventually, worker_finished


async def test_no_capacity_fails_over_to_the_next_gpu_type_at_once(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("a100", "A100-80")])
    s = h.scheduler()
    h.behave(H100="capacity")
    req = h.request(["H100", "A100-80"])
    await s.submit(req)
    assert (await s.place_once()).unplaced == [req.id]

    await s.plan_once()
    await h.settle(s)
    assert h.calls() == [("h100", "capacity")]
    assert s.ctx.planner_wanted.is_set(), "a provider's no must wake the planner to try the next candidate"
    assert "OutOfCapacity" in (await s.ctx.unavailable.reason("h100", "H100", None) or "")

    await s.plan_once()
    await h.settle(s)
    assert h.calls() == [("h100", "capacity"), ("a100", "ok")]
    await h.register_started(s)
    placed = (await s.place_once()).placed
    assert [(p.request, p.pool) for p in placed] == [(req.id, "a100")]

    history = await TaskStore(h.db).history(req.id)
    assert [(e.outcome, e.pool) for e in history] == [("unavailable", "h100"), ("placed", "a100")]
    assert "no H100 capacity in the test region" in (history[0].reason or "")


async def test_quota_is_treated_like_no_capacity_and_the_mark_expires(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("a100", "A100-80")], unavailable_ttl_s=2.0)
    s = h.scheduler()
    h.behave(H100="quota", **{"A100-80": "capacity"})
    await s.submit(h.request(["H100", "A100-80"]))
    await s.place_once()
    for _ in range(3):
        await s.plan_once()
        await h.settle(s)
    assert h.calls() == [("h100", "quota"), ("a100", "capacity")]
    await asyncio.sleep(2.1)  # both marks lapse (the TTL under test; long enough that a loaded machine
    # cannot see it lapse during the three rounds above, which are what it must cover)
    h.behave()
    for _ in range(5):
        await s.plan_once()
        await h.settle(s)
        if len(h.calls()) > 2:
            break
        await asyncio.sleep(0.05)  # the request's own retry backoff
    assert h.calls()[2] == ("h100", "ok"), "after the TTL the first choice is asked again"


async def test_throttling_retries_the_same_pool_without_failing_over(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("a100", "A100-80")])
    s = h.scheduler()
    h.behave(H100="throttle:2")
    await s.submit(h.request(["H100", "A100-80"]))
    await s.place_once()
    for _ in range(200):
        await s.plan_once()
        await h.settle(s)
        if h.machines():
            break
        await asyncio.sleep(0.01)
    assert h.calls() == [("h100", "throttle"), ("h100", "throttle"), ("h100", "ok")]
    assert [m["pool"] for m in h.machines()] == ["h100"]


async def test_a_crashing_or_hanging_plugin_fails_over_and_leaks_no_machine(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("l40s", "L40S"), ("a100", "A100-80")], provision_timeout_s=0.2)
    s = h.scheduler()
    h.behave(H100="crash", L40S="hang:0.6")
    req = h.request(["H100", "L40S", "A100-80"])
    await s.submit(req)
    await s.place_once()
    for _ in range(3):
        await s.plan_once()
        await h.settle(s)
    assert h.calls() == [("h100", "crash"), ("l40s", "hang:0.6"), ("a100", "ok")]
    assert "RuntimeError: plugin bug" in (await s.ctx.unavailable.reason("h100", "H100", None) or "")
    assert "did not answer within 0.2 s" in (await s.ctx.unavailable.reason("l40s", "L40S", None) or "")

    # The hung call finishes late and its machine appears; the reconciler terminates it.
    async def late_machine() -> bool:
        return any(m["pool"] == "l40s" for m in h.machines())

    await eventually(late_machine, "the hung provider call to finish")
    report = await s.reconcile_once()
    assert len(report.orphans) == 1
    assert [m["pool"] for m in h.machines()] == ["a100"]


async def test_giving_up_lists_every_pool_and_gpu_tried_and_why(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("a100", "A100-80", 1, {"max_workers": 0})])
    s = h.scheduler()
    h.behave(H100="capacity")
    req = h.request(["H100", "A100-80"], max_wait_s=1.0)  # room for both pools to be walked on a loaded machine
    await s.submit(req)
    await s.place_once()
    tasks = TaskStore(h.db)
    for _ in range(500):
        await s.plan_once()
        await h.settle(s)
        task = await tasks.get(req.id)
        assert task is not None
        if task.status != "pending":
            break
        await asyncio.sleep(0.02)
    assert task.status == "error"
    message = task.error or ""
    assert "no worker for this request after" in message
    assert "h100 (1x H100, flaky): unavailable: insufficient_capacity: [flaky] no H100 capacity" in message
    assert "a100 (1x A100-80, flaky): at max_workers (0)" in message
    assert await s.backlog.get(req.id) is None


async def test_a_gpu_no_pool_offers_fails_at_once_naming_the_pools(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 8), ("cpu",)])
    s = h.scheduler()
    req = h.request("B200")
    with pytest.raises(NoPoolOffers) as info:
        await s.submit(req)
    assert "h100 (8x H100, flaky)" in str(info.value)
    assert "cpu (CPU, flaky)" in str(info.value)
    assert await TaskStore(h.db).get(req.id) is None
    assert await s.backlog.size() == 0


async def test_cpu_fallback_is_taken_only_after_fallback_after(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100"), ("cpu",)])
    s = h.scheduler()
    h.behave(H100="capacity", cpu="capacity")
    await s.submit(h.request(None, id="warm"))  # gives the CPU pool a worker below
    h.behave(H100="capacity")
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    await h.register_started(s)
    [warm] = (await s.place_once()).placed
    await worker_finished(s, "warm", warm.worker)

    req = h.request(["H100", "cpu"], fallback_after=0.3)
    await s.submit(req)
    assert (await s.place_once()).unplaced == [req.id]
    placed = []
    for _ in range(200):
        placed = (await s.place_once()).placed
        if placed:
            break
        await asyncio.sleep(0.01)
    assert [(p.request, p.pool) for p in placed] == [(req.id, "cpu")]
    cpu_worker = await s.workers.get(placed[0].worker)
    assert cpu_worker is not None
    assert cpu_worker.gpu_free == 0
    assert cpu_worker.info.gpu is None
