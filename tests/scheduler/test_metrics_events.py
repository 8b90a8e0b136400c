"""The scheduler's events reach the metrics: requeues, lost workers, terminated machines, provider calls."""

from __future__ import annotations

import json

import pytest

from levers9.services.metrics import Metrics
from levers9.state.redis.backlog import Taken
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import MakeHarness, eventually


async def test_a_silent_worker_and_a_vanished_machine_are_counted(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)], worker_keepalive_s=0.1)
    s = h.scheduler()
    metrics = Metrics(replica="r1")
    s.ctx.on_event = metrics.scheduler_event
    sample = metrics.registry.get_sample_value

    # a worker that stops reporting: the reaper removes it and requeues its task
    req = h.request(None)
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.worker for p in (await s.place_once()).placed] == [wid]
    assert await s.take(wid) == [Taken(req.id)]
    await TaskStore(h.db).set_running(req.id, wid, "c1")

    async def reaped() -> bool:
        return await s.reap_once() == [req.id]

    await eventually(reaped, "the worker's keepalive to lapse and the reaper to requeue its task")
    assert sample("levers9_requeues_total", {"replica": "r1", "reason": "worker_lost"}) == 1
    assert sample("levers9_workers_lost_total", {"replica": "r1", "pool": "cpu", "reason": "keepalive_lapsed"}) == 1
    assert sample("levers9_provider_calls_total", {"replica": "r1", "provider": "flaky", "hook": "provision"}) == 1
    upkeep = await s.upkeep_once()
    assert len(upkeep.released) == 1
    assert sample("levers9_machines_terminated_total", {"replica": "r1", "pool": "cpu", "reason": "worker_gone"}) == 1
    assert sample("levers9_provider_calls_total", {"replica": "r1", "provider": "flaky", "hook": "terminate"}) == 1

    # the requeued task gets a new machine, which then vanishes from the provider (a spot reclaim)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid2] = await h.register_started(s)
    assert [p.worker for p in (await s.place_once()).placed] == [wid2]
    [machine] = h.machines()
    stray = {"id": "fk-stray", "machine_id": None, "pool": "cpu", "gpu": None, "gpu_count": 0}
    (h.cloud / "machines" / "fk-stray.json").write_text(json.dumps(stray))
    (h.cloud / "machines" / f"{machine['id']}.json").unlink()
    report = await s.reconcile_once()
    assert report.vanished == [machine["machine_id"]]
    assert report.orphans == ["fk-stray"]
    assert sample("levers9_machines_terminated_total", {"replica": "r1", "pool": "cpu", "reason": "vanished"}) == 1
    assert sample("levers9_machines_terminated_total", {"replica": "r1", "pool": "cpu", "reason": "orphan"}) == 1
    assert sample("levers9_requeues_total", {"replica": "r1", "reason": "machine_vanished"}) == 1
    assert sample("levers9_workers_lost_total", {"replica": "r1", "pool": "cpu", "reason": "machine_vanished"}) == 1
    assert sample("levers9_provider_calls_total", {"replica": "r1", "provider": "flaky", "hook": "list_machines"}) == 1
    assert (
        sample(
            "levers9_provider_errors_total",
            {"replica": "r1", "provider": "flaky", "hook": "provision", "error": "AuthenticationFailed"},
        )
        is None
    )


async def test_provider_errors_are_counted_by_hook_and_error_class(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    metrics = Metrics(replica="r1")
    s.ctx.on_event = metrics.scheduler_event
    h.behave(cpu="auth")
    await s.submit(h.request(None))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    labels = {"replica": "r1", "provider": "flaky", "hook": "provision"}
    assert metrics.registry.get_sample_value("levers9_provider_calls_total", labels) == 1
    assert (
        metrics.registry.get_sample_value("levers9_provider_errors_total", labels | {"error": "AuthenticationFailed"})
        == 1
    )


async def test_a_failing_event_observer_changes_nothing(
    make_harness: MakeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make_harness([("cpu",)], worker_keepalive_s=0.1)
    s = h.scheduler()

    def broken(event: object) -> None:
        raise RuntimeError("metrics are down")

    s.ctx.on_event = broken
    req = h.request(None)
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.worker for p in (await s.place_once()).placed] == [wid]

    async def reaped() -> bool:
        return await s.reap_once() == [req.id]

    await eventually(reaped, "the reaper to requeue the task despite the broken observer")
    assert "the scheduler's event observer failed" in caplog.text  # told, failed, and logged
