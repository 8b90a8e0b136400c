"""Calls queued on workers, checked against a reference model written from the rules, not from the Lua.

The rules (docs/architecture.md §8, ``state/redis/lua/place.lua`` and ``common.lua``): a call takes room on the
fullest worker that has it, never on one with calls waiting in its own queue; a call that fits no worker's room
waits in the shortest queue with a place left (never past a worker's bound, never behind a long call, only a
call of a function measured as short); room a finished call frees goes to its worker's oldest waiting calls,
stopping at the first that does not fit; a function's mean duration is what its finished calls took. After each
step the engine's rooms, queues (in order) and request states must equal the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from levers9.state.redis.backlog import Backlog, Group, QueuedRequest
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from tests.fixtures.redis import run_on_redis

PREFIX = "q:"
T0 = 1_700_000_000_000
TTL_MS = 3_600_000
SHORT_MS = 1_000
GROUPS = (Group(0, ("cpu",), 0),)
#: functions and the mean duration measured before the run (None: never measured)
FUNCTIONS = {"short": 10.0, "long": 5_000.0, "new": None, "middling": 400.0}


@dataclass(frozen=True)
class Place:
    advance_ms: int
    limit: int


@dataclass(frozen=True)
class Finish:
    pick: int


@dataclass(frozen=True)
class Take:
    pick: int


@dataclass(frozen=True)
class Scenario:
    #: (CPU millicores, queue bound) per worker
    workers: tuple[tuple[int, int], ...]
    #: (CPU millicores, function) per call
    calls: tuple[tuple[int, str], ...]
    steps: tuple[Place | Finish | Take, ...]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    workers = tuple(
        (draw(st.sampled_from((1_000, 2_000, 4_000))), draw(st.integers(0, 6))) for _ in range(draw(st.integers(1, 4)))
    )
    calls = tuple(
        (
            draw(st.sampled_from((500, 1_000, 2_000, 3_000))),
            draw(st.sampled_from(("short", "short", "middling", "long", "new"))),
        )
        for _ in range(draw(st.integers(1, 25)))
    )
    step = st.one_of(
        st.builds(Place, st.integers(0, 3_000), st.sampled_from((1, 3, 256))),
        st.builds(Finish, st.integers(0, 1_000)),
        st.builds(Take, st.integers(0, 10)),
    )
    return Scenario(workers, calls, tuple(draw(st.lists(step, min_size=1, max_size=25))))


@dataclass
class Model:
    scenario: Scenario
    cpu: dict[str, int] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)
    bound: dict[str, int] = field(default_factory=dict)
    long: dict[str, int] = field(default_factory=dict)
    queue: dict[str, list[str]] = field(default_factory=dict)
    #: request -> (worker, long?, start ms) for calls holding room
    held: dict[str, tuple[str, bool, int]] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    due: dict[str, int] = field(default_factory=dict)
    duration: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, (cpu, bound) in enumerate(self.scenario.workers):
            wid = f"w{i}"
            self.cpu[wid], self.free[wid], self.bound[wid], self.long[wid], self.queue[wid] = cpu, cpu, bound, 0, []
        for i in range(len(self.scenario.calls)):
            self.due[f"r{i:02d}"] = T0
        self.duration = {fn: d for fn, d in FUNCTIONS.items() if d is not None}

    def call(self, rid: str) -> tuple[int, str]:
        return self.scenario.calls[int(rid[1:])]

    def short(self, fn: str) -> bool:
        return fn in self.duration and self.duration[fn] <= SHORT_MS

    def running(self, wid: str) -> int:
        return sum(1 for w, _, _ in self.held.values() if w == wid)

    def place(self, now: int, limit: int) -> None:
        ready = sorted((t, rid) for rid, t in self.due.items() if t <= now)[:limit]
        #: within one pass, a (size, function) that found no queue is not queued later in that pass
        unqueueable: set[tuple[int, str]] = set()
        for _, rid in ready:
            cpu, fn = self.call(rid)
            roomy = [w for w in self.cpu if not self.queue[w] and self.free[w] >= cpu]
            if roomy:
                best = min(roomy, key=lambda w: (self.free[w], w))
                self.free[best] -= cpu
                long = not self.short(fn)
                self.long[best] += long
                self.held[rid] = (best, long, now)
                del self.due[rid]
                continue
            queues = [
                w
                for w in self.cpu
                if (cpu, fn) not in unqueueable
                and self.short(fn)
                and len(self.queue[w]) < self.bound[w]
                and not self.long[w]
                and self.cpu[w] >= cpu
                # expected to start within the bound: the calls ahead and it, over the calls running there
                and (len(self.queue[w]) + 1) * self.duration[fn] <= max(self.running(w), 1) * SHORT_MS
            ]
            if not queues and self.short(fn):
                unqueueable.add((cpu, fn))
            if queues:
                best = min(queues, key=lambda w: (len(self.queue[w]), w))
                self.queue[best].append(rid)
                self.waiting[rid] = best
                del self.due[rid]
            else:
                self.due[rid] = now + 1_000  # rechecked a second later

    def finish(self, rid: str, now: int) -> None:
        if rid in self.waiting:
            self.queue[self.waiting.pop(rid)].remove(rid)
        elif rid in self.held:
            wid, long, start = self.held.pop(rid)
            cpu, fn = self.call(rid)
            self.free[wid] += cpu
            self.long[wid] -= long
            took = max(now - start, 0)
            self.duration[fn] = self.duration[fn] * 0.8 + took * 0.2 if fn in self.duration else float(took)
            while self.queue[wid] and self.call(self.queue[wid][0])[0] <= self.free[wid]:
                head = self.queue[wid].pop(0)
                del self.waiting[head]
                self.free[wid] -= self.call(head)[0]
                self.held[head] = (wid, False, now)
        self.due.pop(rid, None)
        self.taken.discard(rid)

    def state(self, rid: str) -> str | None:
        if rid in self.held:
            return "running" if rid in self.taken else "placed"
        if rid in self.waiting:
            return "waiting"
        return "queued" if rid in self.due else None


async def run_scenario(redis: Redis, scenario: Scenario) -> None:
    backlog, registry = Backlog(redis, PREFIX), WorkerRegistry(redis, PREFIX)
    model = Model(scenario)
    for wid, cpu in model.cpu.items():
        await registry.register(WorkerInfo(wid, "cpu", cpu, 65_536, queue=model.bound[wid]), now_ms=T0, ttl_ms=TTL_MS)
    for fn, d in FUNCTIONS.items():
        if d is not None:
            await redis.hset(f"{PREFIX}dur", fn, d)
    everyone = sorted(model.due)
    await backlog.enqueue(
        [
            QueuedRequest(rid, model.call(rid)[0], 512, 0, GROUPS, T0, "ws", function=model.call(rid)[1])
            for rid in everyone
        ]
    )
    now = T0
    for step in scenario.steps:
        if isinstance(step, Place):
            now += step.advance_ms
            await backlog.place(now, limit=step.limit, recheck_ms=1_000, short_ms=SHORT_MS)
            model.place(now, step.limit)
        elif isinstance(step, Finish):
            rid = everyone[step.pick % len(everyone)]
            await backlog.finish_many([rid], now)
            model.finish(rid, now)
        else:
            wid = sorted(model.cpu)[step.pick % len(model.cpu)]
            for rid, _ in await backlog.take(wid, 100):
                model.taken.add(rid)
        await check(redis, backlog, registry, model, everyone)


async def check(redis: Redis, backlog: Backlog, registry: WorkerRegistry, model: Model, everyone: list[str]) -> None:
    for wid, state in zip(model.cpu, await registry.get_many(list(model.cpu)), strict=True):
        assert state is not None
        assert state.cpu_free == model.free[wid], f"{wid}: room {state.cpu_free}, the model says {model.free[wid]}"
        assert state.cpu_free >= 0, f"{wid} overcommitted"
        queue = [r.decode() if isinstance(r, bytes) else r for r in await redis.lrange(f"{PREFIX}wqq:{wid}", 0, -1)]
        assert queue == model.queue[wid], f"{wid}: queue {queue}, the model says {model.queue[wid]}"
        assert len(queue) <= model.bound[wid]
    for rid, request in zip(everyone, await backlog.get_many(everyone), strict=True):
        expected = model.state(rid)
        got = None if request is None else request.state
        assert got == expected, f"{rid} is {got}, the model says {expected}"
        if expected in ("placed", "running", "waiting") and request is not None:
            assert request.worker == (model.held[rid][0] if rid in model.held else model.waiting[rid])
    for fn in FUNCTIONS:
        assert await backlog.mean_duration_ms(fn) == model.duration.get(fn), fn


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_queued_calls_follow_the_reference_model_embedded(scenario: Scenario) -> None:
    run_on_redis(None, lambda redis: run_scenario(redis, scenario))


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_queued_calls_follow_the_reference_model_on_redis_server(redis_server: str, scenario: Scenario) -> None:
    run_on_redis(redis_server, lambda redis: run_scenario(redis, scenario))
