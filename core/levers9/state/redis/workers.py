"""The worker registry: what each worker has, what is free on it, and whether it is alive.

A worker's keepalive is a separate key with a TTL, not a TTL on its record: when a
worker goes quiet its record must survive long enough for the reaper to put the
work it held back on the backlog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from levers9.state.redis.scripts import Scripts

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["WorkerInfo", "WorkerRegistry", "WorkerState"]


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
    "pool", "gpu", "gpu_total", "gpu_free", "cpu_total", "cpu_free", "mem_total", "mem_free",
    "runtime", "machine", "address", "ws", "registered", "idle_since", "running", "status", "tunnel",
)  # fmt: skip


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
            )
        )

    async def heartbeat(self, worker: str, *, now_ms: int, ttl_ms: int) -> bool:
        """Extend the keepalive; False means the worker was reaped and must register again."""
        return bool(await self.scripts("heartbeat", worker, now_ms, ttl_ms))

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

    async def ids(self, pool: str | None = None) -> set[str]:
        key = f"{self.prefix}pool:{pool}" if pool else f"{self.prefix}workers"
        return {str(w) for w in await self.redis.smembers(key)}

    async def silent(self) -> list[str]:
        """Workers whose keepalive has lapsed: the reaper's list."""
        ids = sorted(await self.ids())
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in ids:
                pipe.exists(f"{self.prefix}alive:{wid}")
            alive = await pipe.execute()
        return [wid for wid, up in zip(ids, alive, strict=True) if not up]

    async def get(self, worker: str) -> WorkerState | None:
        return (await self.get_many([worker]))[0]

    async def get_many(self, workers: Sequence[str]) -> list[WorkerState | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in workers:
                pipe.hmget(f"{self.prefix}w:{wid}", _FIELDS)
            rows = await pipe.execute()
        return [_state(wid, row) for wid, row in zip(workers, rows, strict=True)]

    async def in_pool(self, pool: str) -> list[WorkerState]:
        states = await self.get_many(sorted(await self.ids(pool)))
        return [s for s in states if s is not None]


def _state(wid: str, row: list[str | None]) -> WorkerState | None:
    (pool, gpu, gpu_total, gpu_free, cpu_total, cpu_free, mem_total, mem_free,
     runtime, machine, address, ws, registered, idle_since, running, status, tunnel) = row  # fmt: skip
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
