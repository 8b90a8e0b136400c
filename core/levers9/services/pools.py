"""Pools and their workers as a caller may see them: one visibility rule and one set of fields for every transport.

Who sees what (see :mod:`levers9.services.access`): shared pools and their
workers are everyone's, an attached cluster's are its workspace's and the
operators'. A worker counts while its keepalive holds: a silent one is about
to be reaped and takes no work. Which machine a worker runs on and where it
listens are the operators' to see; a workspace user gets None for both.

A pool is ``unavailable`` (with the reason) while the scheduler would start
nothing of it: the whole pool is marked (see
:mod:`levers9.scheduler.availability`), or it has offers and every one is
either reported unavailable by its provider or marked after a miss (a
capacity or quota answer, a preemption); the reason is then the first mark's.
The offers are those this replica's scheduler knows: a replica that has not
asked a pool's provider (it does not hold the planner's lease) judges the
pool by its pool mark alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from levers9.hooks.types import Availability
from levers9.scheduler.pools import PoolSpec
from levers9.services.access import is_operator, visible, worker_visible
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.isolation import pool_isolation
from levers9.state.errors import NotFound
from levers9.state.redis.workers import WorkerState

__all__ = ["PoolView", "WorkerView", "list_pools", "list_workers", "live_workers"]

#: machine states that count as "starting" in a pool's listing
_STARTING = ("requested", "starting")


@dataclass(frozen=True)
class PoolView:
    name: str
    provider: str
    runtime: str
    gpu: str | None
    gpu_count: int
    region: str | None
    #: what one worker of the pool has
    cpu_millicores: int
    memory_mib: int
    min_workers: int
    max_workers: int
    priority: int
    #: set for a workspace's own attached cluster
    workspace_id: str | None
    #: workers registered whose keepalive holds
    workers: int
    #: machines asked of the provider that have not registered yet
    starting: int
    #: why the provider is not being asked for machines right now (no capacity, no quota...), if it is not
    unavailable: str | None
    #: how the runtime keeps calls apart: "none" (process), "namespaces", "sandbox", "vm", or "unknown"
    isolation: str


@dataclass(frozen=True)
class WorkerView:
    id: str
    pool: str
    status: str
    runtime: str
    gpu: str | None
    gpu_count: int
    gpu_free: int
    cpu_millicores: int
    cpu_free: int
    memory_mib: int
    memory_free: int
    #: requests placed on it or running there
    running: int
    registered_at: datetime
    #: since when it has had no work; None while busy
    idle_since: datetime | None
    workspace_id: str | None
    #: operators only (None for workspace users): which machine it runs on and where it listens
    machine_id: str | None
    address: str | None


async def live_workers(services: Services) -> list[WorkerState]:
    """Registered workers whose keepalive holds: a silent one is about to be reaped and takes no work."""
    registry = services.scheduler.workers
    silent = set(await registry.silent())
    ids = sorted(await registry.ids() - silent)
    return [state for state in await registry.get_many(ids) if state is not None]


async def list_pools(services: Services, principal: Principal) -> list[PoolView]:
    """The configured pools the caller may see, in configuration order."""
    specs = [s for s in services.pools.values() if visible(principal, s.workspace)]
    live = Counter(state.info.pool for state in await live_workers(services))
    starting = Counter(m.pool for m in await services.machines.list(None, list(_STARTING)))
    out = []
    for spec in specs:
        pool = spec.pool
        out.append(
            PoolView(
                name=spec.name,
                provider=pool.provider,
                runtime=pool.runtime,
                gpu=spec.gpu,
                gpu_count=spec.gpu_count,
                region=pool.region,
                cpu_millicores=spec.cpu_millicores,
                memory_mib=spec.memory_mib,
                min_workers=spec.min_workers,
                max_workers=spec.max_workers,
                priority=spec.priority,
                workspace_id=spec.workspace,
                workers=live[spec.name],
                starting=starting[spec.name],
                unavailable=await _why_unavailable(services, spec),
                isolation=await pool_isolation(services, spec.name, pool.runtime),
            )
        )
    return out


async def _why_unavailable(services: Services, spec: PoolSpec) -> str | None:
    """Why the scheduler starts nothing of ``spec`` now (see the module docstring), or None when it would."""
    marks = services.scheduler.ctx.unavailable
    whole = await marks.reason(spec.name, spec.gpu, spec.pool.region)
    if whole is not None:
        return whole
    known = services.scheduler.offers.get(spec.name)
    if known is None or not known.offers:
        return None
    usable = [o for o in known.offers if o.availability is not Availability.UNAVAILABLE]
    if not usable:
        return f"the provider reports every offer unavailable ({len(known.offers)})"
    marked = await marks.offer_marks(spec.name, usable)  # each offer's own mark, or its region's (a quota)
    if len(marked) < len(usable):
        return None
    first = usable[0]
    return f"every offer is unavailable ({len(usable)}); {first.key}: {marked[first.key]}"


async def list_workers(services: Services, principal: Principal, pool: str | None = None) -> list[WorkerView]:
    """The live workers the caller may see, of ``pool`` when named (NotFound for a pool it may not see)."""
    states = [s for s in await live_workers(services) if worker_visible(services, principal, s)]
    if pool:
        spec = services.pools.get(pool)
        if spec is not None and not visible(principal, spec.workspace):
            raise NotFound("pool", pool)
        states = [s for s in states if s.info.pool == pool]
        if spec is None and not states:
            raise NotFound("pool", pool)
    operator = is_operator(principal)
    return [_worker_view(s, operator=operator) for s in states]


def _epoch_ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, UTC)


def _worker_view(state: WorkerState, *, operator: bool) -> WorkerView:
    info = state.info
    return WorkerView(
        id=info.id,
        pool=info.pool,
        status=state.status,
        runtime=info.runtime,
        gpu=info.gpu,
        gpu_count=info.gpu_count,
        gpu_free=state.gpu_free,
        cpu_millicores=info.cpu_millicores,
        cpu_free=state.cpu_free,
        memory_mib=info.memory_mib,
        memory_free=state.memory_free,
        running=state.running,
        registered_at=_epoch_ms(state.registered_ms),
        idle_since=_epoch_ms(state.idle_since_ms) if state.idle_since_ms else None,
        workspace_id=info.workspace,
        machine_id=info.machine_id if operator else None,
        address=info.address if operator else None,
    )
