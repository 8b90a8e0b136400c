"""One provider hanging past its deadline does not delay placement on another provider's pool.

Two provider plugins are installed as real distributions: the scheduler
tests' ``flaky`` (pool ``good``) and ``hanging`` below (pool ``hang``), whose
``levers9_provision`` notes that it entered, then blocks until the test
writes a release file. Requests that may go to either pool list ``hang``
first; others may only go to ``good``. What the test asserts is order: the
``good`` machines start and their requests are placed while every ``hang``
call is still blocked inside the plugin (entered, not left). The only time
bounds are the provider deadline under test (1 s) and the 20 s a hang may
take before the test gives up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from levers9.hooks.types import Pool
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.service import Scheduler
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.records import MachineRecord
from tests.conftest import Installed
from tests.scheduler.conftest import Harness, MakeHarness, eventually

HANGING = """
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl
from levers9.hooks.errors import InsufficientCapacity
from levers9.hooks.types import Machine, Pool, ProvisionRequest

_lock = threading.Lock()


class HangingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state_dir: str


def _note(root: Path, event: str, machine_id: str) -> None:
    with _lock, open(root / "hang.jsonl", "a") as log:
        log.write(json.dumps({"event": event, "machine_id": machine_id, "t": time.time()}) + "\\n")


@hookimpl
def levers9_provider_settings():
    return HangingSettings


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    root = Path(request.pool.settings.state_dir)
    _note(root, "enter", request.machine_id)
    give_up = time.monotonic() + 60
    while not (root / "release").exists() and time.monotonic() < give_up:
        time.sleep(0.02)
    _note(root, "leave", request.machine_id)
    raise InsufficientCapacity("released by the test")


@hookimpl
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    return None


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return []
"""


@pytest.fixture
def make_isolated(installed: Installed, backend: Any, request: pytest.FixtureRequest) -> MakeHarness:
    """The scheduler harness, with the hanging provider installed before its plugins are loaded."""
    installed.add("levers9-hanging", {"hanging": "l9_hanging"}, {"l9_hanging": HANGING})
    make: MakeHarness = request.getfixturevalue("make_harness")
    return make


def hang_log(root: Path) -> list[dict[str, Any]]:
    path = root / "hang.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def still_hanging(root: Path, entered: int) -> None:
    events = [e["event"] for e in hang_log(root)]
    assert events.count("enter") == entered, events
    assert "leave" not in events, "the hanging provider was released before the assertion: it proves nothing"


async def register_started(h: Harness, s: Scheduler) -> None:
    """Play the worker of every machine whose provision has returned (the scheduler marked it starting)."""
    for m in await s.ctx.machines.list(states=["starting"]):
        pool = h.pools[m.pool]
        info = WorkerInfo(
            id=f"worker-{m.id}",
            pool=pool.name,
            cpu_millicores=pool.cpu_millicores,
            memory_mib=pool.memory_mib,
            gpu=pool.gpu,
            gpu_count=pool.gpu_count,
            runtime=pool.pool.runtime,
            machine_id=m.id,
        )
        await s.register_worker(info)


async def place(h: Harness, s: Scheduler, wanted: set[str], placements: dict[str, str]) -> None:
    """Plan, let started workers register, and place until every request in ``wanted`` is in ``placements``."""

    async def done() -> bool:
        await s.plan_once()
        await register_started(h, s)
        for p in (await s.place_once()).placed:
            placements[p.request] = p.pool
        return wanted <= set(placements)

    await eventually(done, f"requests {sorted(wanted - set(placements))} to be placed")


async def test_a_hanging_provider_does_not_delay_placement_on_another_providers_pool(
    make_isolated: MakeHarness, tmp_path: Path
) -> None:
    h = await make_isolated([("good",)], provision_timeout_s=1.0)
    hang_dir = tmp_path / "hanging"
    hang_dir.mkdir()
    settings = h.hooks.provider_settings_model("hanging")(state_dir=str(hang_dir))
    h.pools["hang"] = PoolSpec(
        pool=Pool(name="hang", provider="hanging", runtime="runc", settings=settings),
        cpu_millicores=4000,
        memory_mib=8192,
        priority=1,  # ranked before `good` for requests that may use both
    )
    s = h.scheduler()
    try:
        # One machine per request (each takes a whole worker), so `hang` gets 5 provision calls: its 4
        # threads all block and the fifth waits for one; `good` gets its own calls at once. The good-only
        # requests are the oldest, so the first `good` workers are theirs (placement is oldest first).
        good_only = [h.request(cpu_millicores=4000, pools=("good",)) for _ in range(3)]
        either = [h.request(cpu_millicores=4000, pools=("hang", "good")) for _ in range(5)]
        for req in good_only + either:
            await s.submit(req)
        assert (await s.place_once()).placed == []

        report = await s.plan_once()
        assert report.started == 8
        await eventually(lambda: _async(len(hang_log(hang_dir)) == 4), "the hanging provider to fill its 4 threads")

        # The good-only requests are placed on `good` while every `hang` call is still blocked.
        placements: dict[str, str] = {}
        await place(h, s, {r.id for r in good_only}, placements)
        still_hanging(hang_dir, entered=4)
        assert {placements[r.id] for r in good_only} == {"good"}

        # The requests that listed `hang` first wait for its machines until a call passes its deadline
        # (1 s); the pool is then marked unavailable and they fail over to `good`, all while the plugin's
        # threads are stuck.
        await place(h, s, {r.id for r in either}, placements)
        still_hanging(hang_dir, entered=4)
        assert {placements[r.id] for r in either} == {"good"}

        async def hang_calls_failed() -> bool:
            return len(await s.ctx.machines.list(pool="hang", states=["failed"])) == 5

        await eventually(hang_calls_failed, "every call to the hanging provider to pass its deadline")
        still_hanging(hang_dir, entered=4)
        failed: list[MachineRecord] = await s.ctx.machines.list(pool="hang", states=["failed"])
        errors = sorted(m.last_error or "" for m in failed)
        assert sum("did not answer within 1 s" in e for e in errors) == 4, errors
        assert sum("never started: all 4 of the plugin's threads stayed busy" in e for e in errors) == 1, errors

        # Five timeouts in a row (the fifth call never started): the provider is unhealthy, the other healthy.
        health = h.hooks.health()
        assert health["flaky"].healthy
        assert not health["hanging"].healthy
        assert health["hanging"].reason == "levers9_provision did not answer within 1 s, 5 times in a row"
    finally:
        (hang_dir / "release").touch()
        await eventually(lambda: _async(_left_all(hang_dir)), "the hanging calls to return")


def _left_all(root: Path) -> bool:
    events = [e["event"] for e in hang_log(root)]
    return events.count("leave") == events.count("enter")


async def _async(value: bool) -> bool:
    return value
