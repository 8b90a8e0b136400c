"""Placement checked against a reference model written from the rules, not from the Lua.

The placement script is the one place where capacity is spent, and it is atomic and
batched, so a mistake there (a worker overcommitted, a request placed twice, a worse
preference taken while a better one had room) would not show up as an error anywhere:
it would show up as a slow or wrong cluster. These tests replay every batch ``place``
returns through a small pure-Python model that keeps its own free capacities and its
own idea of the backlog order, and hold the engine to it step by step.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from levers9.state.redis.backlog import Backlog, Finished, Group, Placement, PlaceResult, QueuedRequest
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from tests.fixtures.redis import RedisFactory, run_on_redis

PREFIX = "l9:"
#: a fixed epoch for the simulated clock; keepalive keys use Redis' own clock, hence the long TTL
T0 = 1_700_000_000_000
TTL_MS = 3_600_000
GPU_UNIT = 2**21

PAST = T0 - 5_000
FAR = T0 + 10**9
#: not-before times that open while a run's clock advances, so groups open mid-run
SOON = (T0 + 1_500, T0 + 4_000)

GPU_TYPES = ("H100", "A100-80", "L40S")
CPU_TOTALS = (2_000, 4_000, 8_000)
MEM_TOTALS = (4_096, 8_192, 16_384)
CPU_ASKS = (500, 1_000, 1_500, 2_000, 3_000)
MEM_ASKS = (512, 1_024, 2_048, 4_096)


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class PoolSpec:
    name: str
    gpu: str | None
    gpus_per_worker: int


@dataclass(frozen=True)
class WorkerSpec:
    id: str
    pool: str
    cpu: int
    mem: int
    gpus: int
    #: up (takes work), draining (asked to stop) or silent (keepalive gone)
    mode: str


@dataclass(frozen=True)
class Place:
    advance_ms: int
    limit: int
    recheck_ms: int


@dataclass(frozen=True)
class Finish:
    pick: int


@dataclass(frozen=True)
class Scenario:
    pools: tuple[PoolSpec, ...]
    workers: tuple[WorkerSpec, ...]
    requests: tuple[QueuedRequest, ...]
    start_ms: int
    steps: tuple[Place | Finish, ...]


@st.composite
def groups_for(draw: st.DrawFn, pools: tuple[PoolSpec, ...], gpus: int) -> tuple[Group, ...]:
    """Preference groups of one kind each (GPU pools hold the request's GPUs, CPU pools none)."""
    # A GPU request may also fall back to CPU pools; a CPU request goes to CPU pools only.
    by_kind = {False: [p.name for p in pools if p.gpu is None]}
    if gpus:
        by_kind[True] = [p.name for p in pools if p.gpu is not None]
    kinds = [kind for kind, names in by_kind.items() if names]
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        names = draw(st.lists(st.sampled_from(by_kind[kind]), min_size=1, max_size=3, unique=True))
        not_before = draw(st.sampled_from((0, 0, 0, PAST, *SOON, FAR)))
        out.append(Group(not_before, tuple(names), gpus if kind else 0))
    return tuple(out)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    pools = []
    for i in range(draw(st.integers(2, 5))):
        gpu = draw(st.sampled_from((None, *GPU_TYPES)))
        pools.append(PoolSpec(f"p{i}", gpu, draw(st.sampled_from((1, 2, 4, 8))) if gpu else 0))
    # Some pool must be able to take a request at all; a CPU pool keeps every request placeable in principle.
    if all(p.gpu for p in pools):
        pools[0] = PoolSpec("p0", None, 0)
    workers = [
        WorkerSpec(
            f"w{pool.name}{j}",
            pool.name,
            draw(st.sampled_from(CPU_TOTALS)),
            draw(st.sampled_from(MEM_TOTALS)),
            pool.gpus_per_worker,
            draw(st.sampled_from(("up", "up", "up", "up", "draining", "silent"))),
        )
        for pool in pools
        for j in range(draw(st.integers(0, 4)))
    ]
    count = draw(st.integers(1, 30))
    # Ids in an order unrelated to creation, so ties in due time are broken by id and not by accident.
    names = draw(st.permutations(range(count)))
    requests = []
    for i in range(count):
        gpus = draw(st.sampled_from((0, 1, 2, 4, 8))) if any(p.gpu for p in pools) else 0
        due = T0 + draw(st.integers(0, 40))
        requests.append(
            QueuedRequest(
                id=f"r{names[i]:02d}",
                cpu_millicores=draw(st.sampled_from(CPU_ASKS)),
                memory_mib=draw(st.sampled_from(MEM_ASKS)),
                gpu_count=gpus,
                groups=draw(groups_for(tuple(pools), gpus)),
                enqueued_ms=due,
            )
        )
    place = st.builds(
        Place,
        advance_ms=st.integers(0, 3_000),
        limit=st.sampled_from((1, 2, 3, 5, 256)),
        recheck_ms=st.sampled_from((0, 500, 2_000)),
    )
    steps = draw(st.lists(st.one_of(place, st.builds(Finish, st.integers(0, 1_000))), min_size=1, max_size=12))
    return Scenario(tuple(pools), tuple(workers), tuple(requests), T0 + draw(st.integers(0, 40)), tuple(steps))


# --------------------------------------------------------------------------- the reference model


@dataclass
class Free:
    cpu: int
    mem: int
    gpus: int


@dataclass
class Model:
    """What the cluster should look like, computed from the placement rules alone."""

    scenario: Scenario
    workers: dict[str, WorkerSpec] = field(default_factory=dict)
    free: dict[str, Free] = field(default_factory=dict)
    #: request id -> (worker, pool, gpus held) for requests placed and not finished
    held: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: request id -> when it is next due, for requests waiting in the backlog
    due: dict[str, int] = field(default_factory=dict)
    requests: dict[str, QueuedRequest] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    placements: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for w in self.scenario.workers:
            self.workers[w.id] = w
            self.free[w.id] = Free(w.cpu, w.mem, w.gpus)
        for r in self.scenario.requests:
            self.requests[r.id] = r
            self.due[r.id] = r.enqueued_ms

    def score(self, wid: str) -> int:
        f = self.free[wid]
        return f.gpus * GPU_UNIT + min(max(f.cpu, 0), GPU_UNIT - 1)

    def fitting(self, req: QueuedRequest, group: Group) -> list[str]:
        f = self.free
        return [
            w.id
            for w in self.workers.values()
            if w.pool in group.pools
            and w.mode == "up"
            and f[w.id].cpu >= req.cpu_millicores
            and f[w.id].mem >= req.memory_mib
            and f[w.id].gpus >= group.gpu_count
        ]

    def due_now(self, now: int, limit: int) -> list[str]:
        """The backlog's order: by due time, then by id (a sorted set's tie order)."""
        ready = sorted((t, rid) for rid, t in self.due.items() if t <= now)
        return [rid for _, rid in ready[:limit]]

    def replay(self, now: int, step: Place, result: PlaceResult) -> None:
        expected = self.due_now(now, step.limit)
        placed = {p.request: p for p in result.placed}
        got = [p.request for p in result.placed] + result.unplaced
        assert sorted(got) == sorted(expected), f"place handled {got}, the backlog had {expected} due"
        assert len(set(got)) == len(got), f"a request came back twice in one batch: {got}"
        order = {rid: i for i, rid in enumerate(expected)}
        for listed in ([p.request for p in result.placed], result.unplaced):
            assert listed == sorted(listed, key=order.__getitem__), f"{listed} is not in backlog order {expected}"
        for rid in expected:
            req = self.requests[rid]
            open_groups = [g for g in req.groups if g.not_before_ms <= now]
            winner = next(((g, fit) for g in open_groups if (fit := self.fitting(req, g))), None)
            if rid not in placed:
                assert winner is None, f"{rid} left unplaced though {winner} could take it"
                gates = [g.not_before_ms for g in req.groups if g.not_before_ms > now]
                self.due[rid] = min([now + step.recheck_ms, *gates])
                continue
            p = placed[rid]
            assert winner is not None, f"{rid} placed on {p.worker} though no open group had room"
            group, fit = winner
            assert p.pool in group.pools, f"{rid} went to pool {p.pool}, but {group} was the first group with room"
            assert p.worker in fit, f"{rid} put on {p.worker}, which is not among the fitting {fit}"
            assert self.workers[p.worker].pool == p.pool
            best = min(self.score(w) for w in fit)
            assert self.score(p.worker) == best, f"{rid} on {p.worker}, not the fullest fit (scores {fit})"
            f = self.free[p.worker]
            f.cpu -= req.cpu_millicores
            f.mem -= req.memory_mib
            f.gpus -= group.gpu_count
            self.held[rid] = (p.worker, p.pool, group.gpu_count)
            self.placements[rid] += 1
            assert self.placements[rid] == 1, f"{rid} placed {self.placements[rid]} times"
            del self.due[rid]

    def finish(self, rid: str) -> Finished | None:
        if rid in self.finished:
            return None
        self.finished.add(rid)
        if rid in self.held:
            wid, pool, gpus = self.held.pop(rid)
            req = self.requests[rid]
            f = self.free[wid]
            f.cpu += req.cpu_millicores
            f.mem += req.memory_mib
            f.gpus += gpus
            return Finished("placed", wid, pool)
        del self.due[rid]
        return Finished("queued", None, None)


async def check_workers(registry: WorkerRegistry, model: Model) -> None:
    ids = sorted(model.workers)
    states = await registry.get_many(ids)
    for wid, state in zip(ids, states, strict=True):
        assert state is not None, f"{wid} vanished"
        spec = model.workers[wid]
        on_it = [(rid, gpus) for rid, (w, _, gpus) in model.held.items() if w == wid]
        used_cpu = sum(model.requests[rid].cpu_millicores for rid, _ in on_it)
        used_mem = sum(model.requests[rid].memory_mib for rid, _ in on_it)
        used_gpus = sum(gpus for _, gpus in on_it)
        assert 0 <= state.cpu_free <= spec.cpu, f"{wid}: cpu_free {state.cpu_free} of {spec.cpu}"
        assert 0 <= state.memory_free <= spec.mem, f"{wid}: memory_free {state.memory_free} of {spec.mem}"
        assert 0 <= state.gpu_free <= spec.gpus, f"{wid}: gpu_free {state.gpu_free} of {spec.gpus}"
        assert (spec.cpu - state.cpu_free, spec.mem - state.memory_free, spec.gpus - state.gpu_free) == (
            used_cpu,
            used_mem,
            used_gpus,
        ), f"{wid} accounts differently from the requests placed on it: {on_it}"
        assert state.running == len(on_it), f"{wid}: running {state.running}, placed {len(on_it)}"


async def run_scenario(redis: Redis, scenario: Scenario) -> None:
    backlog, registry = Backlog(redis, PREFIX), WorkerRegistry(redis, PREFIX)
    for w in scenario.workers:
        pool = next(p for p in scenario.pools if p.name == w.pool)
        info = WorkerInfo(w.id, w.pool, w.cpu, w.mem, pool.gpu, w.gpus)
        await registry.register(info, now_ms=T0, ttl_ms=TTL_MS)
        if w.mode == "draining":
            assert await registry.drain_if_idle(w.id, now_ms=T0, idle_ms=0)
        elif w.mode == "silent":
            # The keepalive's TTL runs on Redis' clock; dropping the key is the deterministic way to go quiet.
            await redis.delete(f"{PREFIX}alive:{w.id}")
    assert await backlog.enqueue(list(scenario.requests)) == len(scenario.requests)
    model = Model(scenario)
    now = scenario.start_ms
    everyone = sorted(model.requests)
    for step in scenario.steps:
        if isinstance(step, Place):
            now += step.advance_ms
            result = await backlog.place(now, limit=step.limit, recheck_ms=step.recheck_ms)
            model.replay(now, step, result)
        else:
            rid = everyone[step.pick % len(everyone)]
            assert await backlog.finish(rid, now) == model.finish(rid)
        await check_workers(registry, model)
    assert max(model.placements.values(), default=0) <= 1


# --------------------------------------------------------------------------- properties


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_placement_follows_the_reference_model_embedded(scenario: Scenario) -> None:
    run_on_redis(None, lambda redis: run_scenario(redis, scenario))


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_placement_follows_the_reference_model_on_redis_server(redis_server: str, scenario: Scenario) -> None:
    run_on_redis(redis_server, lambda redis: run_scenario(redis, scenario))


async def test_two_schedulers_place_each_request_exactly_once(redis_factory: RedisFactory) -> None:
    """Two controllers sharing one Redis must split the backlog, never both take a request."""
    first, second = redis_factory(), redis_factory()
    registry = WorkerRegistry(first, PREFIX)
    pools = ("cpu-a", "cpu-b", "gpu")
    workers: dict[str, WorkerInfo] = {}
    for i in range(50):
        pool = pools[i % 3]
        gpu = pool == "gpu"
        info = WorkerInfo(f"w{i:02d}", pool, 64_000, 262_144, "H100" if gpu else None, 8 if gpu else 0)
        workers[info.id] = info
        await registry.register(info, now_ms=T0, ttl_ms=TTL_MS)
    requests: dict[str, QueuedRequest] = {}
    sizes = itertools.cycle([(100, 128), (250, 256), (500, 128), (250, 512)])
    for i in range(3_000):
        cpu, mem = next(sizes)
        if i % 30 == 0:  # 100 GPU requests; the gpu pool holds 16 x 8 GPUs
            groups: tuple[Group, ...] = (Group(0, ("gpu",), 1),)
        else:
            first_pool = pools[i % 2]
            groups = (Group(0, (first_pool,)), Group(0, ("cpu-a", "cpu-b")), Group(PAST, ("gpu",)))
        req = QueuedRequest(f"r{i:04d}", cpu, mem, groups[0].gpu_count, groups, T0 + i % 7)
        requests[req.id] = req
    assert await Backlog(first, PREFIX).enqueue(list(requests.values())) == 3_000

    async def drain(backlog: Backlog) -> list[Placement]:
        out: list[Placement] = []
        while await backlog.size():
            result = await backlog.place(T0 + 10, limit=17)
            assert result.unplaced == [], "capacity was enough for every request"
            out += result.placed
        return out

    a, b = await asyncio.gather(drain(Backlog(first, PREFIX)), drain(Backlog(second, PREFIX)))
    assert a, "both schedulers should have taken part, or this tested nothing concurrent"
    assert b, "both schedulers should have taken part, or this tested nothing concurrent"
    ids = [p[0] for p in a + b]
    assert len(ids) == len(set(ids)), "a request was placed by both schedulers"
    assert set(ids) == set(requests)

    used: dict[str, list[int]] = {wid: [0, 0, 0, 0] for wid in workers}
    for rid, wid, pool, _ in a + b:
        assert workers[wid].pool == pool
        req = requests[rid]
        gpus = 1 if pool == "gpu" and req.gpu_count else 0
        for k, amount in enumerate((req.cpu_millicores, req.memory_mib, gpus, 1)):
            used[wid][k] += amount
    states = await registry.get_many(sorted(workers))
    for state in states:
        assert state is not None
        info = state.info
        assert [
            info.cpu_millicores - state.cpu_free,
            info.memory_mib - state.memory_free,
            info.gpu_count - state.gpu_free,
            state.running,
        ] == used[info.id]
