"""The scheduler's own entry points: pools from a config file, cancelling, a worker reporting."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from levers9.config.load import load_config
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.scheduler.pools import pool_specs
from levers9.state.redis.backlog import Taken
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import MakeHarness, worker_finished


def test_pool_specs_from_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            pools:
              h100:
                provider: toycloud
                runtime: process
                gpu: h100-80gb
                gpu_count: 8
                cpu: 96
                memory: 1TiB
                min_workers: 1
                max_workers: 4
                priority: 3
                idle_timeout_s: 60
                labels: {{zone: eu}}
                settings: {{state_dir: {tmp_path}}}
              cpu:
                provider: toycloud
                runtime: process
                settings: {{state_dir: {tmp_path}}}
            """
        )
    )
    loaded = load_config(path, plugins=load_plugins(PluginPolicy()))
    try:
        specs = pool_specs(loaded)
    finally:
        loaded.hooks.close()
    h100 = specs["h100"]
    assert (h100.gpu, h100.gpu_count, h100.cpu_millicores, h100.memory_mib) == ("H100", 8, 96_000, 1_048_576)
    assert (h100.min_workers, h100.max_workers, h100.priority, h100.idle_timeout_s) == (1, 4, 3, 60.0)
    assert h100.pool.labels == {"zone": "eu"}
    assert type(h100.pool.settings).__name__ == "ToyCloudSettings"
    assert h100.workspace is None
    assert specs["cpu"].resources.gpu is None
    assert h100.describe() == "h100 (8x H100, toycloud)"


async def test_cancel_a_queued_and_a_placed_request(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    queued, placed = h.request(None), h.request(None, cpu_millicores=4000)
    await s.submit(placed)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.request for p in (await s.place_once()).placed] == [placed.id]
    await s.submit(queued)
    assert (await s.place_once()).unplaced == [queued.id]  # the only worker is full

    assert await s.cancel(placed.id)
    worker = await s.workers.get(wid)
    assert worker is not None
    assert (worker.cpu_free, worker.running) == (4000, 0), "cancelling gives the worker its resources back"
    assert [p.request for p in (await s.place_once()).placed] == [queued.id], "and the waiting request gets them"

    assert await s.cancel(queued.id)
    assert not await s.cancel(queued.id), "a finished task stays finished"
    tasks = TaskStore(h.db)
    for tid in (placed.id, queued.id):
        task = await tasks.get(tid)
        assert task is not None
        assert task.status == "cancelled"
    assert await s.backlog.get(queued.id) is None


async def test_a_worker_takes_runs_and_finishes_a_request(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    req = h.request(None)
    await s.submit(req)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    await s.place_once()
    assert await s.heartbeat(wid)
    assert await s.take(wid, 10) == [Taken(req.id)]
    assert await s.ctx.tasks.start_many(wid, [(req.id, "ctr-1")]) == [req.id]
    task = await TaskStore(h.db).get(req.id)
    assert task is not None
    assert (task.status, task.worker_id, task.container_id) == ("running", wid, "ctr-1")
    await worker_finished(s, req.id, wid)
    task = await TaskStore(h.db).get(req.id)
    assert task is not None
    assert task.status == "complete"
    worker = await s.workers.get(wid)
    assert worker is not None
    assert (worker.cpu_free, worker.running) == (4000, 0)


async def test_a_release_wakes_the_placement_loop_only_for_a_request_it_let_in(make_harness: MakeHarness) -> None:
    """The loop's pass over a backlog with nothing new is two Redis round trips, once per lone call."""
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    first, second = h.request(None, cpu_millicores=4000), h.request(None, cpu_millicores=4000)
    await s.submit(first)
    await s.place_once()
    await s.plan_once()
    await h.settle(s)
    [wid] = await h.register_started(s)
    assert [p.request for p in (await s.place_once()).placed] == [first.id]

    s.ctx.placer_wanted.clear()
    assert await s.release_many([first.id], worker=wid) == 1
    assert not s.ctx.placer_wanted.is_set(), "nothing waited for the room freed"

    await s.submit(second)
    await s.submit(third := h.request(None, cpu_millicores=4000))
    assert [p.request for p in (await s.place_once()).placed] == [second.id]  # the third waits for room
    s.ctx.placer_wanted.clear()
    assert await s.release_many([second.id], worker=wid) == 1
    assert s.ctx.placer_wanted.is_set(), "the waiting request is placed at once"
    assert [p.request for p in (await s.place_once()).placed] == [third.id]


async def test_alike_requests_are_stored_and_queued_as_each_would_be_alone(make_harness: MakeHarness) -> None:
    """``submit_many(alike=True)`` (a map) works out a request's pools and stored form once: the result is the same."""
    h = await make_harness([("cpu",)])
    s = h.scheduler()
    template = h.request(None, cpu_millicores=250, memory_mib=64)
    copies = [template] + [template.model_copy(update={"id": f"{template.id}_{i}"}) for i in range(3)]
    alone = h.request(None, cpu_millicores=250, memory_mib=64)
    await s.submit_many(copies, alike=True, args=[b"a", b"b", b"c", b"d"])
    await s.submit_many([alone])
    tasks = {t.id: t for t in await TaskStore(h.db).get_many([r.id for r in [*copies, alone]])}
    for r in copies:
        assert tasks[r.id].request == r.to_json(), "each task stores its own request, its own id in it"
    states = await s.backlog.get_many([r.id for r in [*copies, alone]])
    assert all(st is not None for st in states)
    assert [st.request.id for st in states if st is not None] == [r.id for r in [*copies, alone]]
    shapes = {replace(st.request, id="", enqueued_ms=0, deadline_ms=0) for st in states if st is not None}
    assert len(shapes) == 1, "the copies were queued as the same request is alone: same size, pools and function"
