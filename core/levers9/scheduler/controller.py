"""Pool upkeep: the warm minimum, releasing idle workers, and never leaking a machine.

Runs on the replica holding the lease. Each pool is handled on its own, so a
provider that errors or hangs delays only its own pools.

Reconciliation compares levers9's machine records with the provider's own
listing: a machine the provider runs that levers9 has no live record of is
terminated (a start that timed out, a record lost, a machine from a crashed
run); a record whose machine the provider no longer has is closed and its
worker's work requeued. A machine that never registered within
``register_timeout_s`` is terminated and its record removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from levers9.hooks.types import MachineState
from levers9.scheduler import events
from levers9.scheduler.context import Context
from levers9.scheduler.planner import ACTIVE, STARTING
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.provisioning import Provisioner

__all__ = ["PoolController", "UpkeepReport"]

log = logging.getLogger(__name__)


@dataclass
class UpkeepReport:
    started: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class PoolController:
    def __init__(self, ctx: Context, provisioner: Provisioner) -> None:
        self.ctx = ctx
        self.provisioner = provisioner

    async def tick(self, report: UpkeepReport | None = None) -> UpkeepReport:
        """Warm minimum, idle release and registration deadlines, for every pool."""
        report = report or UpkeepReport()
        for pool in list(self.ctx.pools.values()):
            try:
                await self._tick_pool(pool, report)
            except Exception as exc:
                log.exception("upkeep of pool %s failed", pool.name)
                report.errors.append(f"{pool.name}: {type(exc).__name__}: {exc}")
        return report

    async def reconcile(self, report: UpkeepReport | None = None) -> UpkeepReport:
        """Compare each pool with its provider's listing and clean up both sides."""
        report = report or UpkeepReport()
        for pool in list(self.ctx.pools.values()):
            try:
                await self._reconcile_pool(pool, report)
            except Exception as exc:
                log.warning("reconciling pool %s failed: %s", pool.name, exc)
                report.errors.append(f"{pool.name}: {type(exc).__name__}: {exc}")
        return report

    # ------------------------------------------------------------------ upkeep

    async def _tick_pool(self, pool: PoolSpec, report: UpkeepReport) -> None:
        ctx = self.ctx
        now_s = ctx.clock()
        machines = await ctx.machines.list(pool=pool.name, states=list(ACTIVE))

        # Registration deadline: a machine that never dialled in is stopped and forgotten.
        in_flight = self.provisioner.in_flight
        for m in machines:
            overdue = m.register_by is not None and m.register_by.timestamp() <= now_s
            if m.state in STARTING and m.id not in in_flight and overdue:
                if await self.provisioner.terminate(
                    pool, m.id, m.provider_id, "its worker never registered", kind=events.TERMINATED_NEVER_REGISTERED
                ):
                    await ctx.machines.delete(m.id)
                report.timed_out.append(m.id)

        # A running machine whose worker is gone (crashed, reaped) is no use to anyone.
        registered = await ctx.workers.ids(pool.name)
        for m in machines:
            gone = m.state == "running" and m.worker_id and m.worker_id not in registered
            if gone and await self.provisioner.terminate(
                pool, m.id, m.provider_id, "its worker stopped reporting", kind=events.TERMINATED_WORKER_GONE
            ):
                report.released.append(m.id)

        machines = await ctx.machines.list(pool=pool.name, states=list(ACTIVE))
        live = [m for m in machines if m.state not in ("terminating",)]

        # The warm minimum.
        for _ in range(pool.min_workers - len(live)):
            report.started.append(await self.provisioner.start(pool, f"min_workers is {pool.min_workers}"))

        # Idle release above the minimum, longest idle first.
        spare = len(live) - pool.min_workers
        if spare <= 0:
            return
        by_worker = {m.worker_id: m for m in live if m.worker_id and m.state == "running"}
        workers = [w for w in await ctx.workers.in_pool(pool.name) if w.info.id in by_worker]
        idle_ms = round(pool.idle_timeout_s * 1000)
        now_ms = ctx.now_ms()
        for w in sorted(workers, key=lambda w: w.idle_since_ms):
            if spare <= 0:
                break
            if w.status != "running" or w.running or not w.idle_since_ms:
                continue
            if not await ctx.workers.drain_if_idle(w.info.id, now_ms=now_ms, idle_ms=idle_ms):
                continue
            m = by_worker[w.info.id]
            if await self.provisioner.terminate(
                pool, m.id, m.provider_id, f"idle for {pool.idle_timeout_s:g} s", kind=events.TERMINATED_IDLE
            ):
                await ctx.workers.remove(w.info.id, now_ms=now_ms, force=True)
                report.released.append(m.id)
                spare -= 1

    # ------------------------------------------------------------------ reconciliation

    async def _reconcile_pool(self, pool: PoolSpec, report: UpkeepReport) -> None:
        ctx = self.ctx
        try:
            listed = await ctx.hooks.list_machines(pool.pool)
        except Exception as exc:
            ctx.emit(events.ProviderCalled(pool.pool.provider, "list_machines", type(exc).__name__))
            raise
        ctx.emit(events.ProviderCalled(pool.pool.provider, "list_machines"))
        records = {m.id: m for m in await ctx.machines.list(pool=pool.name)}
        active = {mid for mid, m in records.items() if m.state in ACTIVE}
        in_flight = self.provisioner.in_flight
        seen: set[str] = set()
        for machine in listed:
            if machine.state is MachineState.TERMINATED:
                continue
            if machine.machine_id is not None:
                seen.add(machine.machine_id)
            if machine.machine_id in active or machine.machine_id in in_flight:
                record = records.get(machine.machine_id or "")
                if record is not None and record.provider_id is None and machine.machine_id not in in_flight:
                    await ctx.machines.set_provider_id(record.id, machine.provider_id)
                continue
            why = "levers9 has no record of it" if machine.machine_id not in records else "its record is closed"
            log.warning("pool %s: machine %s (%s) is running but %s; terminating it",
                        pool.name, machine.provider_id, machine.machine_id or "untagged", why)  # fmt: skip
            if await self.provisioner.terminate(pool, None, machine.provider_id, why, kind=events.TERMINATED_ORPHAN):
                report.orphans.append(machine.provider_id)
        for mid in active - seen - in_flight:
            m = records[mid]
            if m.provider_id is None or m.state not in ("running", "starting", "draining", "terminating"):
                continue
            log.warning("pool %s: machine %s (%s) is gone from the provider", pool.name, mid, m.provider_id)
            await ctx.machines.set_state(mid, "terminated", error="the provider no longer lists it")
            await ctx.tokens.revoke_subject(mid)
            ctx.emit(events.MachineTerminated(pool.name, events.TERMINATED_VANISHED))
            if m.worker_id:
                requeued = await ctx.workers.remove(m.worker_id, now_ms=ctx.now_ms(), force=True)
                if requeued is not None:
                    ctx.emit(events.WorkerLost(pool.name, events.LOST_MACHINE_VANISHED))
                for rid in requeued or []:
                    await ctx.tasks.requeue(rid, f"machine {mid} disappeared from the provider")
                if requeued:
                    ctx.emit(events.Requeued(events.REQUEUE_MACHINE_VANISHED, len(requeued)))
            report.vanished.append(mid)
