"""The backlog: requests waiting for a worker, scored by when they are next due.

A request carries its candidate pools in preference groups (see
:mod:`levers9.scheduler.candidates`); placing it is one Lua step that finds the
fullest fitting worker in the first group that has one, reserves its resources
and hands the request to that worker's queue. Requests that fit nowhere are
rechecked later and listed as *unmet*, which is what the capacity planner reads
to decide which machines to start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from levers9.state.redis.scripts import Scripts

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "Backlog",
    "Finished",
    "Group",
    "PlaceResult",
    "Placement",
    "QueuedRequest",
    "Released",
    "RequestState",
    "Taken",
]


class Group(NamedTuple):
    """Pools of equal preference; tried only from ``not_before_ms`` (epoch ms; 0 means at once)."""

    not_before_ms: int
    pools: tuple[str, ...]
    #: GPUs the request holds on these pools' workers (0 when it falls back to CPU)
    gpu_count: int = 0


def encode_groups(groups: Iterable[Group]) -> str:
    text = "|".join(f"{int(g.not_before_ms)};{int(g.gpu_count)};{','.join(g.pools)}" for g in groups if g.pools)
    if not text:
        raise ValueError("a request needs at least one candidate pool")
    return text


def decode_groups(text: str) -> tuple[Group, ...]:
    out = []
    for part in filter(None, text.split("|")):
        not_before, gpus, pools = part.split(";", 2)
        out.append(Group(int(not_before), tuple(filter(None, pools.split(","))), int(gpus)))
    return tuple(out)


@dataclass(frozen=True)
class QueuedRequest:
    """What the placement script needs to know about a request, and nothing else."""

    id: str
    cpu_millicores: int
    memory_mib: int
    gpu_count: int
    groups: tuple[Group, ...]
    enqueued_ms: int
    workspace: str = ""
    #: epoch ms after which the planner stops trying and the request fails (0: never)
    deadline_ms: int = 0
    #: the function (stub) whose call it is: calls of a function known to be short may wait in a worker's own
    #: queue ("" for none: never queued)
    function: str = ""


@dataclass(frozen=True)
class RequestState:
    request: QueuedRequest
    #: queued (in the backlog), placed (holding room on a worker, not taken yet), running (taken by the
    #: worker), waiting (in a worker's own queue, holding no room until room there frees) or orphan (kept for
    #: a worker Redis forgot, after Redis lost its data, until it registers again or its time is up)
    state: str
    worker: str | None
    pool: str | None
    attempts: int
    #: the capacity planner's bookkeeping: when it may next ask providers, and what it tried
    next_plan_ms: int
    tried: tuple[str, ...]


class Placement(NamedTuple):
    request: str
    worker: str
    pool: str
    #: it waits in the worker's own queue (runs there next) rather than holding room there now
    queued: bool = False


class Taken(NamedTuple):
    """A request a worker took: one that holds room runs at once; a ``queued`` one when the worker's room frees."""

    request: str
    queued: bool = False


@dataclass(frozen=True)
class PlaceResult:
    placed: list[Placement]
    unplaced: list[str]


class Finished(NamedTuple):
    #: the state the request was in: queued, placed, running or waiting
    state: str
    worker: str | None
    pool: str | None


class Released(list[Finished | None]):
    """What :meth:`Backlog.finish_many` returns: per request, what it finished (None: unknown or left alone), in order."""

    def __init__(self) -> None:
        super().__init__()
        #: how many waiting requests the freed places made due (see ``wake_per_freed``)
        self.woken = 0
        #: requests left alone because they are placed on another worker than the one named, or on none
        self.refused: list[str] = []


_FIELDS = (
    "cpu",
    "mem",
    "gpus",
    "groups",
    "enq",
    "ws",
    "deadline",
    "state",
    "worker",
    "pool",
    "attempts",
    "next_plan",
    "tried",
    "fn",
)


class Backlog:
    def __init__(self, redis: Redis, prefix: str = "l9:", scripts: Scripts | None = None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.scripts = scripts or Scripts(redis, prefix)

    # ------------------------------------------------------------------ writing

    async def enqueue(self, requests: Sequence[QueuedRequest], *, ready_ms: int | None = None) -> int:
        """Queue requests not already known; returns how many were new. Due at ``ready_ms`` (default: enqueued)."""
        added = 0
        for start in range(0, len(requests), 500):
            args: list[str | int] = []
            for r in requests[start : start + 500]:
                args += [
                    r.id,
                    r.enqueued_ms if ready_ms is None else ready_ms,
                    r.cpu_millicores,
                    r.memory_mib,
                    r.gpu_count,
                    encode_groups(r.groups),
                    r.enqueued_ms,
                    r.workspace,
                    r.deadline_ms,
                    r.function,
                ]
            added += int(await self.scripts("enqueue", *args))
        return added

    async def place(self, now_ms: int, *, limit: int = 256, recheck_ms: int = 1000, short_ms: int = 0) -> PlaceResult:
        """One placement pass (place.lua). ``short_ms``: a CPU-only call of a function whose calls took at most
        this long on average may wait in a worker's own queue when no worker has room (0: never)."""
        placed_flat, unplaced = await self.scripts("place", now_ms, limit, recheck_ms, short_ms)
        placed = [
            Placement(placed_flat[i], placed_flat[i + 1], placed_flat[i + 2], placed_flat[i + 3] == "1")
            for i in range(0, len(placed_flat), 4)
        ]
        return PlaceResult(placed, list(unplaced))

    async def take(self, worker: str, max_count: int = 1) -> list[Taken]:
        """The requests a worker takes off its list: those holding room now running, queued ones still waiting."""
        flat = await self.scripts("take", worker, max_count)
        return [Taken(flat[i], flat[i + 1] == "1") for i in range(0, len(flat), 2)]

    async def mean_duration_ms(self, function: str) -> float | None:
        """What a call of ``function`` took on average lately (finish to placement), None before the first."""
        value = await self.redis.hget(f"{self.prefix}dur", function)
        return None if value is None else float(value)

    async def finish(self, request: str, now_ms: int) -> Finished | None:
        """Forget a request (done, cancelled or given up), giving its worker the resources back."""
        out = await self.scripts("finish", request, now_ms)
        if not out:
            return None
        state, worker, pool = out
        return Finished(state, worker or None, pool or None)

    async def finish_many(
        self, requests: Sequence[str], now_ms: int, *, worker: str | None = None, wake_per_freed: int = 0
    ) -> Released:
        """:meth:`finish` for many requests in one atomic step, in order.

        With ``worker``, requests placed on another worker, or on none (queued, or queued again), are
        left alone: they come back as None and are listed in ``refused`` (a late report of a worker
        presumed dead, or a report on what was never placed on it). ``wake_per_freed`` makes that many waiting requests
        of a pool due for each place freed in it, as :meth:`wake` does, in the same step; the result's
        ``woken`` counts them.
        """
        out = Released()
        for start in range(0, len(requests), 1000):
            chunk = requests[start : start + 1000]
            flat = list(await self.scripts("finish_many", now_ms, worker or "", wake_per_freed, *chunk))
            out.woken += int(flat.pop())
            for i in range(0, len(flat), 3):
                state, worker_id, pool = flat[i : i + 3]
                if state == "!":
                    out.refused.append(chunk[i // 3])
                    out.append(None)
                else:
                    out.append(Finished(state, worker_id or None, pool or None) if state else None)
        return out

    async def keep_for_workers(self, kept: Sequence[tuple[QueuedRequest, str, str, int]], *, until_ms: int) -> int:
        """Keep requests for the workers SQL says run them, until ``until_ms`` (see ``orphan.lua``).

        ``kept``: (request, worker, pool, GPUs it takes there). For after Redis lost its data: a worker that
        registers again holding one gets it back (:meth:`WorkerRegistry.reclaim`); :meth:`orphans_due` queues
        the others again. A request Redis knows is left alone. Returns how many were kept.
        """
        count = 0
        for start in range(0, len(kept), 200):
            flat: list[str | int] = []
            for r, worker, pool, held in kept[start : start + 200]:
                flat += [
                    r.id,
                    r.cpu_millicores,
                    r.memory_mib,
                    r.gpu_count,
                    encode_groups(r.groups),
                    r.enqueued_ms,
                    r.workspace,
                    r.deadline_ms,
                    r.function,
                    worker,
                    pool,
                    held,
                ]
            count += int(await self.scripts("orphan", until_ms, *flat))
        return count

    async def orphans_due(self, now_ms: int, limit: int = 500) -> list[str]:
        """Requests kept for a worker that did not come back by now, queued again (their attempt counted)."""
        return [str(r) for r in await self.scripts("orphans_due", now_ms, limit)]

    async def wake(self, pool: str, now_ms: int, count: int = 256) -> int:
        """Make the oldest requests waiting on ``pool`` due now (it just gained capacity)."""
        return int(await self.scripts("wake", pool, now_ms, count))

    async def note_plan(self, request: str, *, next_plan_ms: int, tried: Sequence[str]) -> None:
        """Record the planner's progress on a request (only while it is still known)."""
        await self.note_plans([(request, next_plan_ms, tried)])

    async def note_plans(self, notes: Sequence[tuple[str, int, Sequence[str]]]) -> None:
        """:meth:`note_plan` for many requests, a few hundred per round trip."""
        for start in range(0, len(notes), 300):
            flat: list[str | int] = []
            for request, next_plan_ms, tried in notes[start : start + 300]:
                flat += [request, next_plan_ms, "\n".join(tried)]
            await self.scripts("note", *flat)

    # ------------------------------------------------------------------ reading

    async def next_due_ms(self) -> int | None:
        """When the earliest request in the backlog is due, or None when it is empty."""
        first = await self.redis.zrange(f"{self.prefix}backlog", 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    async def size(self) -> int:
        return int(await self.redis.zcard(f"{self.prefix}backlog"))

    async def unmet(self, limit: int = 1000) -> list[str]:
        """Requests that last found no worker, oldest first."""
        return [str(r) for r in await self.redis.zrange(f"{self.prefix}unmet", 0, limit - 1)]

    async def get(self, request: str) -> RequestState | None:
        return (await self.get_many([request]))[0]

    async def get_many(self, requests: Sequence[str]) -> list[RequestState | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for rid in requests:
                pipe.hmget(f"{self.prefix}r:{rid}", _FIELDS)
            rows = await pipe.execute()
        return [_state(rid, row) for rid, row in zip(requests, rows, strict=True)]


def _state(rid: str, row: list[str | None]) -> RequestState | None:
    cpu, mem, gpus, groups, enq, ws, deadline, state, worker, pool, attempts, next_plan, tried, fn = row
    if cpu is None or state is None:
        return None
    request = QueuedRequest(
        id=rid,
        cpu_millicores=int(cpu),
        memory_mib=int(mem or 0),
        gpu_count=int(gpus or 0),
        groups=decode_groups(groups or ""),
        enqueued_ms=int(enq or 0),
        workspace=ws or "",
        deadline_ms=int(deadline or 0),
        function=fn or "",
    )
    return RequestState(
        request=request,
        state=state,
        worker=worker or None,
        pool=pool or None,
        attempts=int(attempts or 0),
        next_plan_ms=int(next_plan or 0),
        tried=tuple(filter(None, (tried or "").split("\n"))),
    )
