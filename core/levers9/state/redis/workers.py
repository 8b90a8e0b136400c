"""The worker registry: what each worker has, what is free on it, and whether it is alive.

A worker's keepalive is a separate key with a TTL, not a TTL on its record: when a
worker goes quiet its record must survive long enough for the reaper to put the
work it held back on the backlog.

Whatever touches many workers is one Lua step (per :data:`CHUNK` of the ids it
names), not one command per worker: reading states (``rows.lua``, one JSON
reply), the reaper's list of silent workers (``silent.lua``), the counts the
metrics export (``census.lua``), a replica's batch of keepalives
(``heartbeat_many.lua``, the same change as ``heartbeat.lua`` for each) and its
look for work that workers have not taken (``with_work.lua``). A controlplane
with a thousand idle workers spends its CPU on the workers' keepalives, not on
sending and parsing a thousand commands.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from levers9.state.redis.scripts import Scripts

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["CHUNK", "WorkerInfo", "WorkerRegistry", "WorkerState"]

#: the most workers one step of :meth:`WorkerRegistry.get_many` or :meth:`WorkerRegistry.heartbeat_many`
#: names, so that no single script holds Redis for long (a few ms at most)
CHUNK = 500


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker declares when it registers."""

    id: str
    pool: str
    cpu_millicores: int
    memory_mib: int
    gpu: str | None = None
    gpu_count: int = 0
    runtime: str = ""
    machine_id: str | None = None
    address: str | None = None
    #: set for workers of a workspace's own attached cluster
    workspace: str | None = None
    #: the controlplane cannot connect to it: its serving containers are reached through the tunnel it opens
    tunnel: bool = False
    #: how many calls it may hold waiting in its own queue beyond what it runs at once (0: none)
    queue: int = 0


@dataclass(frozen=True)
class WorkerState:
    info: WorkerInfo
    cpu_free: int
    memory_free: int
    gpu_free: int
    #: running (takes work) or draining (being released)
    status: str
    #: requests placed on it or running there
    running: int
    #: epoch ms since which it has had no work (0 while busy)
    idle_since_ms: int
    registered_ms: int


_FIELDS = (
    "pool",
    "gpu",
    "gpu_total",
    "gpu_free",
    "cpu_total",
    "cpu_free",
    "mem_total",
    "mem_free",
    "runtime",
    "machine",
    "address",
    "ws",
    "registered",
    "idle_since",
    "running",
    "status",
    "tunnel",
)


class WorkerRegistry:
    def __init__(self, redis: Redis, prefix: str = "l9:", scripts: Scripts | None = None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.scripts = scripts or Scripts(redis, prefix)

    async def register(self, info: WorkerInfo, *, now_ms: int, ttl_ms: int) -> str:
        """Add the worker (or refresh it after a reconnect); returns its status."""
        return str(
            await self.scripts(
                "register",
                info.id,
                info.pool,
                info.gpu or "",
                info.gpu_count,
                info.cpu_millicores,
                info.memory_mib,
                info.runtime,
                info.machine_id or "",
                info.address or "",
                info.workspace or "",
                now_ms,
                ttl_ms,
                "1" if info.tunnel else "",
                max(0, info.queue),
            )
        )

    async def heartbeat(self, worker: str, *, now_ms: int, ttl_ms: int) -> bool:
        """Extend the keepalive; False means the worker was reaped and must register again."""
        return bool(await self.scripts("heartbeat", worker, now_ms, ttl_ms))

    async def heartbeat_many(self, workers: Sequence[str], *, now_ms: int, ttl_ms: int) -> set[str]:
        """:meth:`heartbeat` for many workers, one step per :data:`CHUNK`; the ids that were reaped and must
        register again."""
        lost: set[str] = set()
        for start in range(0, len(workers), CHUNK):
            chunk = workers[start : start + CHUNK]
            lost.update(str(w) for w in await self.scripts("heartbeat_many", now_ms, ttl_ms, *chunk))
        return lost

    async def with_work(self) -> set[str]:
        """The workers whose queue holds requests placed on them and not taken yet (one step for all)."""
        return {str(w) for w in await self.scripts("with_work")}

    async def census(self) -> dict[tuple[str, str, str], int]:
        """How many workers there are by (pool, GPU model or "", status), a silent one counted as "silent"."""
        return {(str(p), str(g), str(s)): int(n) for p, g, s, n in await self.scripts("census")}

    async def remove(self, worker: str, *, now_ms: int, force: bool = False) -> list[str] | None:
        """Drop the worker, requeueing its work; None when it is still alive and ``force`` is off."""
        out = await self.scripts("remove", worker, now_ms, "1" if force else "0")
        return None if out is None else list(out)

    async def reclaim(self, worker: str, held: Sequence[str], *, now_ms: int) -> tuple[list[str], list[str]]:
        """Requeue what ``worker`` had taken but does not hold (see reclaim.lua).

        Returns the requeued ids, and the ids of ``held`` that are still placed on or running on the worker.
        """
        requeued, kept = await self.scripts("reclaim", worker, now_ms, *held)
        return [str(r) for r in requeued], [str(r) for r in kept]

    async def drain_if_idle(self, worker: str, *, now_ms: int, idle_ms: int) -> bool:
        """Stop placing on the worker if it has been idle for ``idle_ms``; True when it now drains."""
        return bool(await self.scripts("drain", worker, now_ms, idle_ms))

    async def cordon(self, worker: str) -> bool:
        """Stop placing on the worker even while it is busy (it is shutting down); False when unknown."""
        return bool(await self.scripts("cordon", worker))

    async def expect_returning(self, for_ms: int) -> None:
        """Redis lost its workers: for ``for_ms`` no worker is judged gone for being unknown (see :meth:`returning`)."""
        await self.redis.set(f"{self.prefix}returning", "1", px=max(1, for_ms))

    async def returning(self) -> bool:
        """Whether workers Redis forgot may still be on their way back (after a restart that lost its data)."""
        return bool(await self.redis.exists(f"{self.prefix}returning"))

    async def requests_of(self, worker: str) -> list[str]:
        """The requests placed on ``worker`` now (holding room there, running, or waiting in its queue)."""
        return sorted(str(r) for r in await self.redis.smembers(f"{self.prefix}wr:{worker}"))

    async def hold_sandbox(
        self, sandbox_id: str, worker: str, *, cpu: int, mem: int, gpus: int, now_ms: int, workspace: str = ""
    ) -> bool:
        """A sandbox of ``workspace`` takes ``cpu``/``mem``/``gpus`` of ``worker``'s room; False when the worker
        has not that much free (or is not running). Idempotent for one sandbox id."""
        held = await self.scripts("sandbox_hold", sandbox_id, worker, cpu, mem, gpus, now_ms, workspace)
        return bool(int(held))

    async def sandbox_workspaces(self, worker: str) -> set[str]:
        """The workspaces (lower-cased, as image refs name them) whose sandboxes hold room on ``worker`` now."""
        held = [_text(s) for s in await self.redis.smembers(f"{self.prefix}wsb:{worker}")]
        found: set[str] = set()
        for sandbox in held:
            workspace = await self.redis.hget(f"{self.prefix}sbh:{sandbox}", "ws")
            if workspace:
                found.add(_text(workspace).lower())
        return found

    async def release_sandbox(self, sandbox_id: str, *, now_ms: int) -> bool:
        """The sandbox's room goes back to its worker; False when it held none (released already)."""
        return bool(int(await self.scripts("sandbox_release", sandbox_id, now_ms)))

    async def ids(self, pool: str | None = None) -> set[str]:
        key = f"{self.prefix}pool:{pool}" if pool else f"{self.prefix}workers"
        return {str(w) for w in await self.redis.smembers(key)}

    async def silent(self) -> list[str]:
        """Workers whose keepalive has lapsed: the reaper's list (one step, however many workers)."""
        return sorted(str(w) for w in await self.scripts("silent"))

    async def get(self, worker: str) -> WorkerState | None:
        return (await self.get_many([worker]))[0]

    async def get_many(self, workers: Sequence[str]) -> list[WorkerState | None]:
        """The workers' states, in order (None for one unknown), one step per :data:`CHUNK` of them."""
        out: list[WorkerState | None] = []
        for start in range(0, len(workers), CHUNK):
            chunk = workers[start : start + CHUNK]
            rows = json.loads(await self.scripts("rows", len(_FIELDS), *_FIELDS, *chunk))
            if not isinstance(rows, list):  # an empty table is encoded as an object: no row
                rows = []
            out += [
                _state(wid, [v if isinstance(v, str) else None for v in row])
                for wid, row in zip(chunk, rows, strict=True)
            ]
        return out

    async def in_pool(self, pool: str) -> list[WorkerState]:
        states = await self.get_many(sorted(await self.ids(pool)))
        return [s for s in states if s is not None]


def _state(wid: str, row: list[str | None]) -> WorkerState | None:
    (
        pool,
        gpu,
        gpu_total,
        gpu_free,
        cpu_total,
        cpu_free,
        mem_total,
        mem_free,
        runtime,
        machine,
        address,
        ws,
        registered,
        idle_since,
        running,
        status,
        tunnel,
    ) = row
    if pool is None or status is None:
        return None
    info = WorkerInfo(
        id=wid,
        pool=pool,
        cpu_millicores=int(cpu_total or 0),
        memory_mib=int(mem_total or 0),
        gpu=gpu or None,
        gpu_count=int(gpu_total or 0),
        runtime=runtime or "",
        machine_id=machine or None,
        address=address or None,
        workspace=ws or None,
        tunnel=tunnel == "1",
    )
    return WorkerState(
        info=info,
        cpu_free=int(cpu_free or 0),
        memory_free=int(mem_free or 0),
        gpu_free=int(gpu_free or 0),
        status=status,
        running=int(running or 0),
        idle_since_ms=int(idle_since or 0),
        registered_ms=int(registered or 0),
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
