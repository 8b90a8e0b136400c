"""What the reconciler does with a machine the provider reports preempted or failed, and with provider data."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from levers9.hooks.types import GpuOffer
from levers9.scheduler import events
from levers9.scheduler.events import SchedulerEvent
from levers9.state.redis.backlog import Taken
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import Harness, MakeHarness

SPOT = {
    "gpu": "H100",
    "gpu_count": 1,
    "gpu_memory_mib": 81559,
    "instance_type": "p5.48xlarge",
    "region": "us-east-1",
    "zone": "us-east-1a",
    "spot": True,
}


def _report(h: Harness, machine: dict[str, Any], **changes: Any) -> None:
    """Make the provider list ``machine`` with ``changes`` (its state, a reason, provider data)."""
    (h.cloud / "machines" / f"{machine['id']}.json").write_text(json.dumps(machine | changes))


async def test_a_preempted_machine_is_ended_and_its_calls_requeued_in_the_same_pass(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})], worker_keepalive_s=300.0)
    h.offer(h100=[SPOT])
    s = h.scheduler()
    seen: list[SchedulerEvent] = []
    s.ctx.on_event = seen.append
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.worker for p in (await s.place_once()).placed] == [wid]
    assert await s.take(wid) == [Taken(req.id)]
    await TaskStore(h.db).set_running(req.id, wid, "c1")
    [machine] = h.machines()

    _report(h, machine, state="preempted", reason="spot instance interrupted")
    assert await s.workers.ids() == {wid}, "the worker is still alive as far as its keepalive goes"
    report = await s.reconcile_once()

    assert report.ended == [machine["machine_id"]]
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.state, record.last_error) == ("terminated", "preempted by the provider: spot instance interrupted")
    assert await s.workers.ids() == set()
    task = await TaskStore(h.db).get(req.id)
    assert task is not None
    assert (task.status, task.attempts, task.worker_id) == ("pending", 1, None)
    state = await s.backlog.get(req.id)
    assert state is not None
    assert state.state == "queued"
    assert s.ctx.placer_wanted.is_set(), "the requeued call is placed at once"
    # terminated so nothing stays billed, with the machine as stored
    [terminated] = h.terminates()
    assert (terminated["provider_id"], terminated["zone"], terminated["provider_data"]) == (
        machine["id"],
        "us-east-1a",
        {"zone": "us-east-1a"},
    )
    assert h.machines() == []
    # the spot capacity there is gone: its offer is skipped for the TTL
    key = GpuOffer(**SPOT).key
    marks = await s.ctx.unavailable.offer_reasons("h100", [key])
    assert marks == {key: "preempted by the provider: spot instance interrupted"}
    assert events.MachineTerminated("h100", events.TERMINATED_PREEMPTED) in seen
    assert events.WorkerLost("h100", events.LOST_PREEMPTED) in seen
    assert events.Requeued(events.REQUEUE_PREEMPTED, 1) in seen

    again = await s.reconcile_once()
    assert (again.ended, again.vanished, again.orphans) == ([], [], []), "an ended machine is ended once"


async def test_a_failed_machine_that_never_registered_is_closed_and_terminated(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    s = h.scheduler()
    await s.upkeep_once()
    await h.settle(s)
    [machine] = h.machines()
    _report(h, machine, state="failed", reason="the host failed its health check")

    report = await s.reconcile_once()

    assert report.ended == [machine["machine_id"]]
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.state, record.last_error) == ("terminated", "failed: the host failed its health check")
    assert [t["provider_id"] for t in h.terminates()] == [machine["id"]]
    # it never ran a worker: the next machine would most likely fail alike (an image that cannot be pulled, a pod
    # Pod Security refuses), so the pool (it has no offers) is a miss with the provider's words
    assert await s.ctx.unavailable.reason("cpu", None, None) == (
        "its machine never started: the host failed its health check"
    )
    assert s.ctx.failover_wanted.is_set()


async def test_a_failed_machine_that_never_registered_marks_its_offer_and_the_calls_history_says_why(
    make_harness: MakeHarness,
) -> None:
    # issue 35 item 11: a Job whose image cannot be pulled was retried machine after machine, the calls' history
    # silent about why
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})])
    demand = SPOT | {"spot": False}
    other = demand | {"zone": "us-east-1b"}
    h.offer(h100=[demand, other])
    s = h.scheduler()
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [machine] = h.machines()
    said = "the worker's pod cannot start: ErrImagePull: pull access denied for levers9/worker"
    _report(h, machine, state="failed", reason=said)
    await s.reconcile_once()
    key = GpuOffer(**demand).key
    assert await s.ctx.unavailable.offer_reasons("h100", [key]) == {key: f"its machine never started: {said}"}
    await s.plan_once()
    await h.settle(s)
    assert [c["offer"] for c in h.call_log()] == [key, GpuOffer(**other).key]
    history = [e.reason or "" for e in await TaskStore(h.db).history(req.id) if e.outcome == "unavailable"]
    assert f"offer {key}: its machine never started: {said}" in history


async def test_reconcile_fills_in_provider_data_a_record_lacks(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    s = h.scheduler()
    await s.upkeep_once()
    await h.settle(s)
    [machine] = h.machines()
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert record.provider_data is None, "the provision answer had no provider data"

    _report(h, machine, provider_data={"host": "rack-7"}, zone="z1")
    await s.reconcile_once()
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.provider_data, record.zone) == ({"host": "rack-7"}, "z1")

    _report(h, machine, provider_data={"host": "elsewhere"})
    await s.reconcile_once()
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert record.provider_data == {"host": "rack-7"}, "what the record has is kept"


async def test_a_provision_in_flight_when_the_scheduler_stops_is_recorded_not_abandoned(
    make_harness: MakeHarness,
) -> None:
    # The provider call runs on the plugin's thread, which a cancel does not stop: a machine it starts
    # after the scheduler gave up would have no provider id on record and could not be stopped.
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    h.behave(cpu="hang:1.0")
    s = h.scheduler()
    await s.upkeep_once()
    assert s.provisioner.in_flight, "the provision call is under way"

    await s.stop()

    [machine] = h.machines()
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.state, record.provider_id) == ("starting", machine["id"])


async def test_a_provision_past_the_close_grace_is_recorded_failed(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    h.behave(cpu="hang:1.0")
    s = h.scheduler()
    await s.upkeep_once()
    [machine_id] = s.provisioner.in_flight

    await s.provisioner.close(grace_s=0.05)

    record = await MachineStore(h.db).get(machine_id)
    assert record is not None
    assert record.state == "failed"
    assert record.provider_id is None
    assert "stopped while the machine was being started" in (record.last_error or "")


async def test_a_machine_still_pending_with_a_reason_at_its_deadline_is_its_offers_miss(
    make_harness: MakeHarness,
) -> None:
    """A Kubernetes pod the scheduler cannot place: the listing says why it waits, the deadline makes it a miss."""
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})], register_timeout_s=0.3)
    on_demand = {**SPOT, "spot": False, "zone": "us-east-1b"}
    h.offer(h100=[on_demand])
    s = h.scheduler()
    await s.submit(h.request("H100"))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [machine] = h.machines()
    why = "FailedScheduling: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu."
    _report(h, machine, state="pending", reason=why)

    await s.reconcile_once()
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.state, record.last_error) == ("starting", why), "kept while it waits, not an end"
    key = GpuOffer(**on_demand).key
    assert await s.ctx.unavailable.offer_reasons("h100", [key]) == {}, "not a miss before the deadline"

    await asyncio.sleep(0.35)  # past the registration deadline under test
    s.ctx.planner_wanted.clear()
    report = await s.upkeep_once()
    assert report.timed_out == [machine["machine_id"]]
    marks = await s.ctx.unavailable.offer_reasons("h100", [key])
    assert marks == {key: f"never started within its registration deadline: {why}"}
    assert s.ctx.planner_wanted.is_set(), "the call that waited for it is planned again at once"
    assert [t["provider_id"] for t in h.terminates()] == [machine["id"]]


async def test_a_launch_never_answered_before_a_restart_is_released_at_once_when_not_listed(
    make_harness: MakeHarness,
) -> None:
    # The trial: kill -9 during a RunInstances that created nothing left the record `requested` and the call
    # pending for 607 s (the registration deadline): the planner counted the dead launch as room coming.
    h = await make_harness([("cpu", None, 1, {"max_workers": 2})])
    machines = MachineStore(h.db)
    lost = await machines.create("cpu", "flaky", register_by=datetime.now(UTC) + timedelta(seconds=600))
    await asyncio.sleep(0.05)

    s = h.scheduler()  # the restarted controlplane
    req = h.request()
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    assert h.call_log() == [], "the call waits for room on the launch on record"

    report = await s.reconcile_once()
    assert report.abandoned == [lost.id]
    record = await machines.get(lost.id)
    assert record is not None
    assert record.state == "failed"
    assert "its launch was never answered" in (record.last_error or "")
    assert "flaky lists no machine" in (record.last_error or "")
    assert s.ctx.planner_wanted.is_set()
    await s.plan_once()
    await h.settle(s)
    assert [c["pool"] for c in h.call_log()] == ["cpu"], "the call gets a machine of its own at once"


async def test_a_launch_never_answered_before_a_restart_is_adopted_when_listed(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"max_workers": 2})])
    machines = MachineStore(h.db)
    made = await machines.create("cpu", "flaky", register_by=datetime.now(UTC) + timedelta(seconds=600))
    _report(h, {"id": "fk-made", "machine_id": made.id, "pool": "cpu", "state": "pending"})
    await asyncio.sleep(0.05)
    s = h.scheduler()
    report = await s.reconcile_once()
    assert (report.abandoned, report.orphans) == ([], [])
    adopted = await machines.get(made.id)
    assert adopted is not None
    assert (adopted.state, adopted.provider_id) == ("requested", "fk-made")


async def test_a_launch_in_flight_in_this_process_is_not_released(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    h.behave(cpu="hang:1.0")
    s = h.scheduler()
    await s.upkeep_once()
    [machine_id] = s.provisioner.in_flight
    report = await s.reconcile_once()
    assert report.abandoned == []
    record = await MachineStore(h.db).get(machine_id)
    assert record is not None
    assert record.state == "requested"
    await h.settle(s)


async def test_a_spot_machine_first_seen_terminated_marks_its_offer_like_a_preemption(
    make_harness: MakeHarness,
) -> None:
    # The trial: an interruption EC2 reported only as the instance `terminated` relaunched the call into the
    # same spot zone, to be interrupted again.
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})], worker_keepalive_s=300.0)
    other = SPOT | {"zone": "us-east-1b"}
    h.offer(h100=[SPOT, other])
    s = h.scheduler()
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.worker for p in (await s.place_once()).placed] == [wid]
    assert await s.take(wid) == [Taken(req.id)]
    await TaskStore(h.db).set_running(req.id, wid, "c1")
    [machine] = h.machines()

    _report(h, machine, state="terminated")
    report = await s.reconcile_once()
    assert report.vanished == [machine["machine_id"]]
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.state, record.last_error) == ("terminated", "the provider reports it terminated")
    key = GpuOffer(**SPOT).key
    marks = await s.ctx.unavailable.offer_reasons("h100", [key])
    assert marks == {
        key: f"spot machine {machine['machine_id']} was lost, taken as an interruption: the provider reports it "
        "terminated"
    }
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    assert [c["offer"] for c in h.call_log()] == [key, GpuOffer(**other).key], "relaunched in the other zone"


async def test_an_on_demand_machine_gone_marks_nothing(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})], worker_keepalive_s=300.0)
    demand = SPOT | {"spot": False}
    h.offer(h100=[demand])
    s = h.scheduler()
    await s.submit(h.request("H100"))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    await h.register_started(s)
    [machine] = h.machines()
    (h.cloud / "machines" / f"{machine['id']}.json").unlink()
    report = await s.reconcile_once()
    assert report.vanished == [machine["machine_id"]]
    assert await s.ctx.unavailable.offer_reasons("h100", [GpuOffer(**demand).key]) == {}


async def test_a_spot_machine_whose_worker_dropped_marks_its_offer(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]})], worker_keepalive_s=300.0)
    h.offer(h100=[SPOT])
    s = h.scheduler()
    await s.submit(h.request("H100"))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    [machine] = h.machines()
    await s.workers.remove(wid, now_ms=s.ctx.now_ms(), force=True)  # what the reaper does to a silent worker
    report = await s.upkeep_once()
    assert report.released == [machine["machine_id"]]
    key = GpuOffer(**SPOT).key
    assert (await s.ctx.unavailable.offer_reasons("h100", [key])) == {
        key: f"spot machine {machine['machine_id']} was lost, taken as an interruption: its worker stopped reporting"
    }
