"""Pool upkeep: warm minimum, max_workers, idle release, registration deadlines, reconciliation, the reaper."""

from __future__ import annotations

import asyncio
import json

from levers9.state.redis.backlog import Taken
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import MakeHarness, eventually, worker_finished


async def test_min_workers_are_kept_warm(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 2, "max_workers": 3})])
    s = h.scheduler()
    report = await s.upkeep_once()
    await h.settle(s)
    assert len(report.started) == 2
    assert len(h.machines()) == 2
    await s.upkeep_once()
    await h.settle(s)
    assert len(h.machines()) == 2, "starting machines count towards the minimum"


async def test_never_more_than_max_workers(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"max_workers": 2})])
    s = h.scheduler()
    for _ in range(5):
        await s.submit(h.request("H100"))
    await s.place_once()
    for _ in range(3):
        await s.plan_once()
        await h.settle(s)
    assert len(h.machines()) == 2
    await h.register_started(s)
    assert len((await s.place_once()).placed) == 2
    await s.plan_once()
    waiting = await s.backlog.get_many(await s.backlog.unmet())
    assert len(waiting) == 3
    assert all(w is not None and "at max_workers (2)" in w.tried[0] for w in waiting)


async def test_one_starting_machine_serves_several_requests(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"cpu_millicores": 4000})])
    s = h.scheduler()
    for _ in range(4):
        await s.submit(h.request(None, cpu_millicores=1000))
    await s.place_once()
    await s.plan_once()
    await s.plan_once()
    await h.settle(s)
    assert len(h.machines()) == 1, "room on a starting machine is reserved instead of starting another"
    await h.register_started(s)
    assert len((await s.place_once()).placed) == 4


async def test_idle_workers_above_the_minimum_are_released(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1, "idle_timeout_s": 0.0})])
    s = h.scheduler()
    for _ in range(2):
        await s.submit(h.request(None, cpu_millicores=4000))
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    await h.register_started(s)
    placed = (await s.place_once()).placed
    assert len(placed) == 2
    assert len(h.machines()) == 2
    report = await s.upkeep_once()
    assert report.released == [], "busy workers are never released"
    for p in placed:
        await worker_finished(s, p.request, p.worker)
    report = await s.upkeep_once()
    assert len(report.released) == 1
    assert len(h.machines()) == 1
    assert len(await s.workers.ids("cpu")) == 1
    assert len(await MachineStore(h.db).list(pool="cpu", states=["running"])) == 1


async def test_a_machine_that_never_registers_is_terminated_and_forgotten(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})], register_timeout_s=0.1)
    s = h.scheduler()
    await s.upkeep_once()
    await h.settle(s)
    assert len(h.machines()) == 1
    await asyncio.sleep(0.15)  # past the registration deadline under test
    report = await s.upkeep_once()
    assert len(report.timed_out) == 1
    await h.settle(s)
    records = await MachineStore(h.db).list(pool="cpu")
    assert report.timed_out[0] not in {r.id for r in records}
    # min_workers starts a replacement; the timed-out machine itself is gone from the provider
    assert all(m["machine_id"] != report.timed_out[0] for m in h.machines())


async def test_reconcile_terminates_unknown_machines_and_closes_vanished_ones(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    req = h.request(None)
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    await h.register_started(s)
    assert len((await s.place_once()).placed) == 1
    await TaskStore(h.db).set_running(req.id, "w", "c1")
    [ours] = h.machines()
    stray = {"id": "fk-stray", "machine_id": None, "pool": "cpu", "gpu": None, "gpu_count": 0}
    ghost = {"id": "fk-ghost", "machine_id": "machine_unknown", "pool": "cpu", "gpu": None, "gpu_count": 0}
    for m in (stray, ghost):
        (h.cloud / "machines" / f"{m['id']}.json").write_text(json.dumps(m))

    report = await s.reconcile_once()
    assert sorted(report.orphans) == ["fk-ghost", "fk-stray"]
    assert [m["id"] for m in h.machines()] == [ours["id"]]

    # the provider's listing no longer shows it (listed under another pool: where the listing does not look)
    path = h.cloud / "machines" / f"{ours['id']}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pool": "elsewhere"}))
    report = await s.reconcile_once()
    assert report.vanished == [ours["machine_id"]]
    assert not path.exists(), "a machine the listing lacks is asked to stop all the same (it may run, billed)"
    stopped = [json.loads(line) for line in (h.cloud / "terminates.jsonl").read_text().splitlines()]
    assert [t["provider_id"] for t in stopped if t["provider_id"] == ours["id"]] == [ours["id"]]
    record = await MachineStore(h.db).get(ours["machine_id"])
    assert record is not None
    assert record.state == "terminated"
    assert await s.workers.ids() == set()
    task = await TaskStore(h.db).get(req.id)
    assert task is not None
    assert task.status == "pending"
    assert task.attempts == 1
    state = await s.backlog.get(req.id)
    assert state is not None
    assert state.state == "queued"


async def test_a_machine_listed_in_another_pool_too_is_left_to_its_own(make_harness: MakeHarness) -> None:
    """A provider that cannot tell its pools apart (Lambda answers without tags) lists a machine in every pool:
    a pool that holds no record of it leaves a machine recorded in another pool alone, never terminating it."""
    h = await make_harness([("cpu",), ("spare",)])
    s = h.scheduler()
    req = h.request(None)
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    await h.register_started(s)
    [ours] = h.machines()
    record = await MachineStore(h.db).get(ours["machine_id"])
    assert record is not None
    assert record.pool != "spare"
    seen_there = {
        "id": "fk-same-seen-there",
        "machine_id": ours["machine_id"],
        "pool": "spare",
        "gpu": None,
        "gpu_count": 0,
    }
    (h.cloud / "machines" / f"{seen_there['id']}.json").write_text(json.dumps(seen_there))
    report = await s.reconcile_once()
    assert report.orphans == []
    assert sorted(m["id"] for m in h.machines()) == sorted([ours["id"], seen_there["id"]])
    # a machine nobody has a record of is still an orphan there
    ghost = {"id": "fk-ghost", "machine_id": "machine_unknown", "pool": "spare", "gpu": None, "gpu_count": 0}
    (h.cloud / "machines" / f"{ghost['id']}.json").write_text(json.dumps(ghost))
    assert (await s.reconcile_once()).orphans == ["fk-ghost"]


async def test_the_reaper_requeues_the_work_of_a_silent_worker(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)], worker_keepalive_s=0.1)
    s = h.scheduler()
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
    task = await TaskStore(h.db).get(req.id)
    assert task is not None
    assert (task.status, task.attempts, task.worker_id) == ("pending", 1, None)
    upkeep = await s.upkeep_once()
    assert len(upkeep.released) == 1, "the machine of a dead worker is terminated"
    assert h.machines() == []
