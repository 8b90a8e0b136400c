"""A scheduler wired to real SQL, a Redis, and a provider plugin installed through the plugin manager."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from levers9.config.model import SchedulerConfig
from levers9.gpu.preference import parse_gpu
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import load_plugins
from levers9.hooks.types import Pool
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.request import PlacementRequest
from levers9.scheduler.service import Scheduler
from levers9.state.redis.connect import connect
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.tasks import Finish
from levers9.state.sql.workspaces import WorkspaceStore
from tests.scheduler.flaky_provider import SOURCE

if TYPE_CHECKING:
    from tests.conftest import Installed

_ids = itertools.count()


@dataclass
class Harness:
    cloud: Path
    hooks: Hooks
    db: Database
    redis: Redis
    workspace: str
    pools: dict[str, PoolSpec]
    settings: SchedulerConfig
    schedulers: list[Scheduler] = field(default_factory=list)

    def scheduler(self, redis: Redis | None = None, db: Database | None = None) -> Scheduler:
        s = Scheduler(
            db=db or self.db, redis=redis or self.redis, hooks=self.hooks, pools=self.pools, settings=self.settings
        )
        self.schedulers.append(s)
        return s

    def behave(self, **actions: str) -> None:
        """What the provider does on its next provision of each GPU type (``cpu`` for CPU machines)."""
        (self.cloud / "behaviour.json").write_text(json.dumps(actions))

    def offer(self, **by_pool: list[dict[str, Any]]) -> None:
        """What ``levers9_gpu_offers`` answers for each pool (``GpuOffer`` fields); other pools have none."""
        (self.cloud / "offers.json").write_text(json.dumps(by_pool))

    def slow_offers(self, **by_pool: dict[str, Any]) -> None:
        """How each pool's offer listing misbehaves: ``delay_s`` before it answers, ``error`` it raises then."""
        (self.cloud / "offers_slow.json").write_text(json.dumps(by_pool))

    def call_log(self) -> list[dict[str, Any]]:
        """Every provision call, in order: pool, action, offer key, region, time, bootstrap (without its token)."""
        path = self.cloud / "calls.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    def calls(self) -> list[tuple[str, str]]:
        return [(c["pool"], c["action"]) for c in self.call_log()]

    def terminates(self) -> list[dict[str, Any]]:
        """The machine each terminate call was given, in order."""
        path = self.cloud / "terminates.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def machines(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted((self.cloud / "machines").glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except FileNotFoundError:  # terminated while listed
                continue
        return found

    def request(self, gpu: object = None, **kw: Any) -> PlacementRequest:
        gpu_kw = {k: kw.pop(k) for k in ("gpu_count", "fallback", "fallback_after") if k in kw}
        return PlacementRequest(
            id=kw.pop("id", f"task_{next(_ids)}"),
            workspace=kw.pop("workspace", self.workspace),
            gpu=parse_gpu(gpu, **gpu_kw),  # type: ignore[arg-type]
            submitted_ms=kw.pop("submitted_ms", int(time.time() * 1000)),
            **kw,
        )

    async def settle(self, scheduler: Scheduler) -> None:
        """Wait for the provider calls in flight (they run in the background)."""
        tasks = list(scheduler.provisioner._tasks.values())
        await asyncio.gather(*tasks, return_exceptions=True)

    async def register_started(self, scheduler: Scheduler, *, at_least: int = 0) -> list[str]:
        """Play the workers of every machine the provider started: each dials in and registers.

        ``at_least``: first wait until the provider lists that many machines. A test driving the
        scheduler's own loops needs it: a provision call is in the call log before its machine is
        written down, so reading the machines straight after the log can find none yet.
        """

        async def listed() -> bool:
            return len(self.machines()) >= at_least

        await eventually(listed, f"the provider to list {at_least} machines")
        registered = await scheduler.workers.ids()
        out = []
        for m in self.machines():
            wid = f"worker-{m['id']}"
            if wid in registered or not m.get("machine_id"):
                continue

            # A real worker can only dial in once its machine exists: the provider's answer reaches the
            # scheduler (the record becomes "starting") a moment after the provider wrote the machine down.
            async def starting(machine_id: str = m["machine_id"]) -> bool:
                record = await scheduler.ctx.machines.get(machine_id)
                return record is not None and record.state != "requested"

            await eventually(starting, f"the scheduler to record machine {m['machine_id']} as started")
            pool = self.pools[m["pool"]]
            info = WorkerInfo(
                id=wid,
                pool=pool.name,
                cpu_millicores=pool.cpu_millicores,
                memory_mib=pool.memory_mib,
                gpu=pool.gpu,
                gpu_count=pool.gpu_count,
                runtime=pool.pool.runtime,
                machine_id=m["machine_id"],
            )
            await scheduler.register_worker(info)
            out.append(wid)
        return out


def pool(hooks: Hooks, cloud: Path, name: str, gpu: str | None = None, count: int = 1, **kw: Any) -> PoolSpec:
    settings = hooks.provider_settings_model("flaky")(state_dir=str(cloud))
    regions = list(kw.pop("regions", []))
    shape = {"regions": regions, "region": regions[0] if regions else None}
    shape.update({k: kw.pop(k) for k in ("strategy", "labels") if k in kw})
    p = Pool(
        name=name, provider="flaky", runtime="runc", gpu=gpu, gpu_count=count if gpu else 0, settings=settings, **shape
    )
    sizes: dict[str, Any] = {"cpu_millicores": 4000, "memory_mib": 8192}
    sizes.update({k: kw.pop(k) for k in ("cpu_millicores", "memory_mib") if k in kw})
    return PoolSpec(pool=p, **sizes, **kw)


MakeHarness = Callable[..., Awaitable[Harness]]


@pytest.fixture(params=["sqlite+embedded", "postgresql+redis-server"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(database URL, Redis URL) for a harness that is not given its own: the one-machine defaults,
    and the real servers several replicas would share."""
    if request.param == "sqlite+embedded":
        return f"sqlite:///{tmp_path / 'levers9.db'}", None
    redis_url: str = request.getfixturevalue("redis_url")
    postgres_url: str = request.getfixturevalue("postgres_url")
    return postgres_url, redis_url


@pytest.fixture
async def make_harness(
    installed: Installed, tmp_path: Path, backend: tuple[str, str | None]
) -> AsyncIterator[MakeHarness]:
    installed.add("levers9-flaky", {"flaky": "l9_flaky"}, {"l9_flaky": SOURCE})
    hooks = Hooks(load_plugins())
    cloud = tmp_path / "cloud"
    (cloud / "machines").mkdir(parents=True)
    made: list[Harness] = []
    opened: list[Database] = []
    clients: list[Redis] = []

    async def make(
        pools: list[tuple[Any, ...] | dict[str, Any]],
        *,
        database_url: str | None = None,
        redis: Redis | None = None,
        **settings: Any,
    ) -> Harness:
        db = await open_database(database_url or backend[0])
        opened.append(db)
        if redis is None:
            redis = connect(backend[1])
            clients.append(redis)
        specs = {}
        for item in pools:
            if isinstance(item, dict):
                args, kwargs = (), dict(item)
            elif item and isinstance(item[-1], dict):
                args, kwargs = item[:-1], dict(item[-1])
            else:
                args, kwargs = item, {}
            spec = pool(hooks, cloud, *args, **kwargs)
            specs[spec.name] = spec
        ws = await WorkspaceStore(db).get_or_create("ws1")
        base = {"retry_initial_s": 0.01, "retry_max_s": 0.05}
        h = Harness(cloud, hooks, db, redis, ws.id, specs, SchedulerConfig(**(base | settings)))
        made.append(h)
        return h

    yield make
    for h in made:
        for s in h.schedulers:
            await s.stop()
    for db in opened:
        await db.close()
    for client in clients:
        await client.aclose()
    hooks.close()


async def worker_finished(scheduler: Scheduler, request_id: str, worker: str, status: str = "complete") -> None:
    """Play a worker's report of an outcome the way the data plane handles it: Redis frees the request from that
    very worker (refusing it otherwise), then the outcome is stored in SQL for that worker."""
    assert await scheduler.release_reported(worker, [request_id]) == [], f"{request_id} is not placed on {worker}"
    assert await scheduler.ctx.tasks.finish_many([Finish(request_id, status)], worker_id=worker) == [request_id]


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Poll until ``check`` holds; fails naming ``what`` (a deadline for a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for: {what}")
        await asyncio.sleep(0.02)
