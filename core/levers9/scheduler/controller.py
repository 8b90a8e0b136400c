"""Pool upkeep: the warm minimum, releasing idle workers, and never leaking a machine.

Runs on the replica holding the lease. Each pool is handled on its own, so a
provider that errors or hangs delays only its own pools. A tick reads every
pool's active machines in one query; a pool reads its own again only after its
upkeep changed them, or when earlier pools took more than a second. A pool's
registered workers are read only when it has a running machine whose worker
could be gone: at rest a fleet of workers started by hand costs no read per
worker (the fleet benchmark's 1,000 workers were read every 5 s). The warm minimum is
started from the pool's first free offer, like the planner's machines; when
every offer is marked unavailable it waits for the next tick.

Reconciliation compares levers9's machine records with the provider's own
listing:

- a machine the provider runs that levers9 has no live record of is
  terminated, handed back as listed (a start that timed out, a record lost, a
  machine from a crashed run);
- a machine the provider reports ``preempted`` or ``failed`` whose record is
  live is ended in the same pass: its record closed with the provider's
  reason, its token revoked, its worker removed and the worker's calls
  requeued at once (not after the keepalive timeout), and it is terminated so
  nothing is left billed; a preemption also marks the machine's offer
  unavailable, since the spot capacity there is gone, and so does a failure
  of a machine that never ran a worker (an image that cannot be pulled, a pod
  Pod Security refuses): the next machine of that offer would fail alike;
- a record whose machine the provider no longer lists (or lists as
  terminated) is closed and its worker's work requeued;
- a spot machine lost without levers9 stopping it (gone, listed terminated,
  or its worker silent) is taken as interrupted, whatever the provider calls
  it: its offer is marked like a preemption, so its calls are not relaunched
  into the same spot zone;
- a record still missing the provider's id or ``provider_data`` gets them from
  the listing: a launch whose answer never came (the controlplane was killed
  during the provider's call) is adopted when the provider lists a machine
  of its id (by tag, name or idempotency token);
- a record still ``requested`` that nobody can be waiting on (not a call in
  flight here, and asked before this process started or longer ago than a
  provider call may take: :meth:`Provisioner.abandoned`) and that the
  provider does not list is released (failed, token revoked, planner woken)
  once the return grace after a start is over, not at its registration
  deadline ten minutes later;
- during the return grace after a start
  (:meth:`~levers9.state.redis.workers.WorkerRegistry.returning`), a machine
  the provider does not list is not judged gone: a provider that lists from
  its agents' reports (joined machines, attached clusters) has not heard from
  them yet. One it lists as terminated is closed all the same.

Every terminate hands the provider the machine as levers9 stored it (see
:func:`levers9.scheduler.provisioning.stored_machine`). A record that another
replica closed in the meantime (``InvalidTransition``) is left as it is. A
machine that never registered within ``register_timeout_s`` is terminated and
its record removed; when the provider's listing said why it was still waiting
(kept as the record's last error: a pod the scheduler could not place, with
the scheduler's message), that is a capacity miss of the machine's offer for
``unavailable_ttl_s``, so the calls waiting for it move to the next candidate
and their history says why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from levers9.hooks.types import Machine, MachineState
from levers9.scheduler import events
from levers9.scheduler.context import Context
from levers9.scheduler.lease import LeaseLost
from levers9.scheduler.offers import OfferCache
from levers9.scheduler.planner import ACTIVE, STARTING
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.provisioning import Provisioner, stored_machine
from levers9.state.errors import InvalidTransition
from levers9.state.sql.records import MachineRecord

__all__ = ["PoolController", "UpkeepReport"]

#: how old the tick's read of the machines may be when a pool's upkeep begins; older, the pool reads its own
_FRESH_S = 1.0

log = logging.getLogger(__name__)


@dataclass
class UpkeepReport:
    started: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    #: levers9 ids of machines the provider reported preempted or failed, ended in this pass
    ended: list[str] = field(default_factory=list)
    #: levers9 ids of machines whose launch was never answered and that the provider does not list, released
    abandoned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class PoolController:
    def __init__(self, ctx: Context, provisioner: Provisioner, offers: OfferCache | None = None) -> None:
        self.ctx = ctx
        self.provisioner = provisioner
        self.offers = offers if offers is not None else OfferCache(ctx)

    async def tick(self, report: UpkeepReport | None = None) -> UpkeepReport:
        """Warm minimum, idle release and registration deadlines, for every pool."""
        report = report or UpkeepReport()
        # one read of every pool's active machines per tick; a pool re-reads its own only after changing them
        by_pool: dict[str, list[MachineRecord]] = {}
        read_at = time.monotonic()
        for m in await self.ctx.machines.list(states=list(ACTIVE)):
            by_pool.setdefault(m.pool, []).append(m)
        for pool in list(self.ctx.pools.values()):
            try:
                machines = by_pool.get(pool.name, [])
                if time.monotonic() - read_at > _FRESH_S:  # earlier pools' provider calls took a while
                    machines = await self.ctx.machines.list(pool=pool.name, states=list(ACTIVE))
                await self._tick_pool(pool, report, machines)
            except LeaseLost:
                raise  # no pool's upkeep is this replica's any more
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
            except LeaseLost:
                raise
            except Exception as exc:
                log.warning("reconciling pool %s failed: %s", pool.name, exc)
                report.errors.append(f"{pool.name}: {type(exc).__name__}: {exc}")
        return report

    # ------------------------------------------------------------------ upkeep

    async def _tick_pool(self, pool: PoolSpec, report: UpkeepReport, machines: list[MachineRecord]) -> None:
        """One pool's upkeep, from its ``machines`` in an active state as the tick read them.

        In order: machines past their registration deadline go, machines whose worker is gone go, then the
        warm minimum is started and idle workers above it are released.
        """
        changed = await self._stop_unregistered(pool, report, machines)
        changed = await self._stop_workerless(pool, report, machines) or changed
        if changed:
            machines = await self.ctx.machines.list(pool=pool.name, states=list(ACTIVE))
        live = [m for m in machines if m.state not in ("terminating",)]
        await self._keep_warm_minimum(pool, report, live)
        await self._release_idle(pool, report, live)

    async def _stop_unregistered(self, pool: PoolSpec, report: UpkeepReport, machines: list[MachineRecord]) -> bool:
        """Registration deadline: a machine that never dialled in is stopped and forgotten. Whether any was."""
        ctx = self.ctx
        now_s = ctx.clock()
        changed = False
        in_flight = self.provisioner.in_flight
        for m in machines:
            overdue = m.register_by is not None and m.register_by.timestamp() <= now_s
            if m.state not in STARTING or m.id in in_flight or not overdue:
                continue
            changed = True
            if await self.provisioner.terminate(
                pool, m, "its worker never registered", kind=events.TERMINATED_NEVER_REGISTERED
            ):
                await ctx.machines.delete(m.id)
                if m.last_error:
                    await self._missed(pool, m)
                ctx.planner_wanted.set()  # calls that waited for it are planned again now, not at a tick
            report.timed_out.append(m.id)
        return changed

    async def _stop_workerless(self, pool: PoolSpec, report: UpkeepReport, machines: list[MachineRecord]) -> bool:
        """A running machine whose worker is gone (crashed, reaped) is no use to anyone: stopped. Whether any was.

        The pool's worker list is read only when it has such machines: a pool of workers started by hand has
        none. After a restart that lost Redis's data, workers it forgot are given time to register again first.
        """
        ctx = self.ctx
        running = [m for m in machines if m.state == "running" and m.worker_id]
        if not running or await ctx.workers.returning():
            return False
        registered = await ctx.workers.ids(pool.name)
        changed = False
        for m in running:
            if m.worker_id in registered:
                continue
            # read again right before acting: a worker reaped while its replica was frozen may have just
            # registered with another replica; its machine is healthy and is not stopped
            if m.worker_id and await ctx.workers.get(m.worker_id) is not None:
                continue
            changed = True
            await self._spot_lost(pool, m, "its worker stopped reporting")
            if await self.provisioner.terminate(
                pool, m, "its worker stopped reporting", kind=events.TERMINATED_WORKER_GONE
            ):
                report.released.append(m.id)
        return changed

    async def _keep_warm_minimum(self, pool: PoolSpec, report: UpkeepReport, live: list[MachineRecord]) -> None:
        """The warm minimum, from the pool's first free offer (the next tick tries again after a miss)."""
        marks: dict[str, dict[str, str]] = {}
        for _ in range(pool.min_workers - len(live)):
            pick = await self.offers.pick(pool, marks)
            if not pick.free:
                log.info("pool %s is below min_workers (%d) but %s", pool.name, pool.min_workers, pick.why)
                break
            why = f"min_workers is {pool.min_workers}"
            report.started.append(await self.provisioner.start(pool, why, pick.offer))

    async def _release_idle(self, pool: PoolSpec, report: UpkeepReport, live: list[MachineRecord]) -> None:
        """Idle release above the minimum, longest idle first."""
        ctx = self.ctx
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
                pool, m, f"idle for {pool.idle_timeout_s:g} s", kind=events.TERMINATED_IDLE
            ):
                await ctx.workers.remove(w.info.id, now_ms=now_ms, force=True)
                report.released.append(m.id)
                spare -= 1

    # ------------------------------------------------------------------ reconciliation

    async def _reconcile_pool(self, pool: PoolSpec, report: UpkeepReport) -> None:
        """One pool against its provider's listing: the machines listed, then the records the listing lacks."""
        listed = await self._listing(pool)
        records = {m.id: m for m in await self.ctx.machines.list(pool=pool.name)}
        active = {mid for mid, m in records.items() if m.state in ACTIVE}
        seen: set[str] = set()
        #: machines the provider lists as terminated: a live record of one is closed as gone
        ended_there: set[str] = set()
        for machine in listed:
            if machine.state is MachineState.TERMINATED:
                if machine.machine_id is not None:
                    ended_there.add(machine.machine_id)
                continue
            if machine.machine_id is not None:
                seen.add(machine.machine_id)
            await self._judge_listed(pool, machine, records, active, report)
        await self._judge_unlisted(pool, records, active - seen, ended_there, report)

    async def _listing(self, pool: PoolSpec) -> list[Machine]:
        """The provider's listing of ``pool``, once this replica is known to still hold the lease."""
        ctx = self.ctx
        try:
            listed = await ctx.hooks.list_machines(pool.pool)
        except Exception as exc:
            ctx.emit(events.ProviderCalled(pool.pool.provider, "list_machines", type(exc).__name__))
            raise
        ctx.emit(events.ProviderCalled(pool.pool.provider, "list_machines"))
        # a listing may take long, and this replica may have been frozen meanwhile: act on it only if still the holder
        await self.provisioner.check_fence(f"reconciling pool {pool.name}")
        return list(listed)

    async def _judge_listed(
        self,
        pool: PoolSpec,
        machine: Machine,
        records: dict[str, MachineRecord],
        active: set[str],
        report: UpkeepReport,
    ) -> None:
        """A machine the provider lists (not terminated): end it, fill in its record, keep it, or stop it."""
        in_flight = self.provisioner.in_flight
        mid = machine.machine_id
        ended = machine.state in (MachineState.PREEMPTED, MachineState.FAILED)
        if ended and mid in active and mid not in in_flight:
            await self._end(pool, records[mid or ""], machine, report)
            return
        if mid in active or mid in in_flight:
            record = records.get(mid or "")
            if record is not None and mid not in in_flight:
                await self._fill_in(record, machine)
            return
        if mid is not None and mid not in records:
            other = await self.ctx.machines.get(mid)
            if other is not None and other.pool != pool.name:
                return  # listed here too (a provider that cannot tell pools apart): its own pool's to judge
        why = "levers9 has no record of it" if mid not in records else "its record is closed"
        log.warning(
            "pool %s: machine %s (%s) is %s but %s; terminating it",
            pool.name,
            machine.provider_id,
            mid or "untagged",
            machine.state,
            why,
        )
        if await self.provisioner.terminate(pool, machine, why, kind=events.TERMINATED_ORPHAN):
            report.orphans.append(machine.provider_id)

    async def _judge_unlisted(
        self,
        pool: PoolSpec,
        records: dict[str, MachineRecord],
        unlisted: set[str],
        ended_there: set[str],
        report: UpkeepReport,
    ) -> None:
        """Live records the listing lacks (or lists terminated): an abandoned launch is released, a machine gone
        is closed and its calls requeued.

        After a start, a provider that lists machines from its agents' reports (agent_machine, attached_cluster)
        has not heard from them yet: a machine it does not list is not judged gone (nor a launch abandoned)
        until the workers' return grace is over; one it lists as terminated is gone all the same.
        """
        ctx = self.ctx
        returning = await ctx.workers.returning()
        for mid in unlisted - self.provisioner.in_flight:
            m = records[mid]
            if returning and mid not in ended_there:
                continue
            if m.state == "requested" and m.provider_id is None and self.provisioner.abandoned(m):
                await self._abandoned(pool, m, report)
                continue
            if m.provider_id is None or m.state not in ("running", "starting", "draining", "terminating"):
                continue
            how = "the provider reports it terminated" if mid in ended_there else "the provider no longer lists it"
            log.warning("pool %s: machine %s (%s) is gone: %s", pool.name, mid, m.provider_id, how)
            if not await self._close(m, how):
                continue
            ctx.emit(events.MachineTerminated(pool.name, events.TERMINATED_VANISHED))
            await self._spot_lost(pool, m, how)
            await self._requeue(
                pool,
                m,
                f"machine {mid} disappeared from the provider",
                events.LOST_MACHINE_VANISHED,
                events.REQUEUE_MACHINE_VANISHED,
            )
            if mid not in ended_there:
                await self._stop_unlisted(pool, m)
            report.vanished.append(mid)

    async def _stop_unlisted(self, pool: PoolSpec, record: MachineRecord) -> None:
        """Ask the provider once to stop a machine its listing lacks: it may run where the listing does not look
        (a region dropped from the pool's ``regions``, a tag removed by hand), billed and unseen. Terminating
        is idempotent and an unknown id succeeds, so this costs one call; a failure is logged, and the record
        stays closed (its calls are already requeued)."""
        await self.provisioner.check_fence(f"stopping unlisted machine {record.id}")
        try:
            await self.ctx.hooks.terminate(pool.pool, stored_machine(record))
        except Exception as exc:
            log.warning(
                "pool %s: machine %s (%s) is not listed; stopping it anyway failed (stop it by hand if it runs): %s",
                pool.name,
                record.id,
                record.provider_id,
                exc,
            )

    async def _spot_lost(self, pool: PoolSpec, machine: MachineRecord, how: str) -> None:
        """A spot machine lost without levers9 stopping it (gone from the listing, listed terminated, its worker
        silent) was most likely interrupted, whatever the provider calls it: its offer is marked like a
        preemption, so its calls are not relaunched into the same spot zone within ``unavailable_ttl_s``."""
        if not (machine.offer_key or "").endswith("/spot"):
            return
        reason = f"spot machine {machine.id} was lost, taken as an interruption: {how}"
        log.warning("pool %s offer %s: %s", pool.name, machine.offer_key, reason)
        self.ctx.failover_wanted.set()
        await self.ctx.unavailable.mark_offer(
            pool.name, machine.offer_key or "", reason, self.ctx.settings.unavailable_ttl_s
        )

    async def _abandoned(self, pool: PoolSpec, machine: MachineRecord, report: UpkeepReport) -> None:
        """A launch whose answer never came (the controlplane that asked stopped during it), and of which the
        provider lists nothing by the machine's id: nothing was started, so the record is released now rather
        than at its registration deadline, and the calls that waited for it are planned again at once. Had the
        launch created a machine after all, a later listing finds it with a closed record and stops it."""
        ctx = self.ctx
        why = (
            "its launch was never answered (the controlplane that asked stopped during it) and "
            f"{pool.pool.provider} lists no machine {machine.id}"
        )
        try:
            await ctx.machines.set_state(machine.id, "failed", error=why)
        except InvalidTransition:
            return  # it registered, or was closed, since it was read
        await ctx.tokens.revoke_subject(machine.id)
        log.warning("pool %s: machine %s: %s; released", pool.name, machine.id, why)
        report.abandoned.append(machine.id)
        ctx.planner_wanted.set()

    async def _missed(self, pool: PoolSpec, machine: MachineRecord, reason: str | None = None) -> None:
        """A machine that never started, and whose provider said why (a pod the scheduler could not place, an
        image that cannot be pulled): its offer (or the pool, without one) is a capacity miss for
        ``unavailable_ttl_s``, with the provider's words, so the planner moves the waiting calls to the next
        candidate and their history says why."""
        ctx = self.ctx
        reason = reason or f"never started within its registration deadline: {machine.last_error}"
        log.warning("pool %s: machine %s %s", pool.name, machine.id, reason)
        ttl = ctx.settings.unavailable_ttl_s
        ctx.failover_wanted.set()
        if machine.offer_key:
            await ctx.unavailable.mark_offer(pool.name, machine.offer_key, reason, ttl)
        else:
            await ctx.unavailable.mark(pool.name, pool.gpu, pool.pool.region, reason, ttl)

    async def _fill_in(self, record: MachineRecord, machine: Machine) -> None:
        """Take the provider's id, zone, instance type and data from its listing where the record lacks them,
        and, for a machine still starting, the provider's word on why it waits (kept as its last error)."""
        waiting = record.state in STARTING and machine.state is MachineState.PENDING and machine.reason
        if waiting and machine.reason != record.last_error:
            try:
                await self.ctx.machines.set_state(record.id, record.state, error=machine.reason)
            except InvalidTransition:
                return  # it registered (or was closed) since it was read: the reason is stale
        missing_id = record.provider_id is None
        missing_data = not record.provider_data and bool(machine.provider_data)
        if not (missing_id or missing_data):
            return
        await self.ctx.machines.set_placement(
            record.id,
            provider_id=machine.provider_id if missing_id else None,
            zone=machine.zone if record.zone is None else None,
            instance_type=machine.instance_type if record.instance_type is None else None,
            provider_data=machine.provider_data if missing_data else None,
        )

    async def _end(self, pool: PoolSpec, record: MachineRecord, machine: Machine, report: UpkeepReport) -> None:
        """The provider took ``machine`` back (preempted) or says it will never run (failed): end it now."""
        await self.provisioner.check_fence(f"ending machine {record.id}")  # its record is closed, its calls requeued
        ctx = self.ctx
        preempted = machine.state is MachineState.PREEMPTED
        said = machine.reason or "no reason given"
        error = f"preempted by the provider: {said}" if preempted else f"failed: {said}"
        log.warning("pool %s: machine %s (%s) %s", pool.name, record.id, machine.provider_id, error)
        if not await self._close(record, error):
            return
        ctx.emit(
            events.MachineTerminated(pool.name, events.TERMINATED_PREEMPTED if preempted else events.TERMINATED_FAILED)
        )
        if preempted and record.offer_key:
            await ctx.unavailable.mark_offer(pool.name, record.offer_key, error, ctx.settings.unavailable_ttl_s)
        elif not preempted and record.worker_id is None:
            # it never ran a worker (an image that cannot be pulled, a pod Pod Security refuses): the next machine
            # of that offer would fail alike, so it is a miss, and the waiting calls' history says why
            await self._missed(pool, record, f"its machine never started: {said}")
        await self._requeue(
            pool,
            record,
            f"machine {record.id} was {error}" if preempted else f"machine {record.id} {error}",
            events.LOST_PREEMPTED if preempted else events.LOST_MACHINE_FAILED,
            events.REQUEUE_PREEMPTED if preempted else events.REQUEUE_MACHINE_FAILED,
        )
        report.ended.append(record.id)
        # Terminate what is left of it so nothing stays billed; the provider gets the stored machine, with
        # whatever the listing adds. A failure is retried when the next pass finds it listed with a closed record.
        target = stored_machine(record) if record.provider_id is not None else machine
        target = target.model_copy(
            update={
                "provider_id": machine.provider_id,
                "zone": target.zone or machine.zone,
                "instance_type": target.instance_type or machine.instance_type,
                "provider_data": target.provider_data or machine.provider_data,
                "state": machine.state,
            }
        )
        try:
            await ctx.hooks.terminate(pool.pool, target)
        except Exception as exc:
            ctx.emit(events.ProviderCalled(pool.pool.provider, "terminate", type(exc).__name__))
            log.warning(
                "pool %s: terminating %s machine %s failed, will retry: %s",
                pool.name,
                machine.state,
                machine.provider_id,
                exc,
            )
            return
        ctx.emit(events.ProviderCalled(pool.pool.provider, "terminate"))

    async def _close(self, record: MachineRecord, error: str) -> bool:
        """Close ``record`` as terminated with ``error`` and revoke its token; False when it was closed already."""
        ctx = self.ctx
        try:
            await ctx.machines.set_state(record.id, "terminated", error=error)
        except InvalidTransition:
            return False  # another replica, or the upkeep, closed it meanwhile
        await ctx.tokens.revoke_subject(record.id)
        return True

    async def _requeue(self, pool: PoolSpec, record: MachineRecord, why: str, lost: str, requeue: str) -> None:
        """Remove the machine's worker (alive or not) and requeue its calls in Redis and SQL, now."""
        ctx = self.ctx
        if not record.worker_id:
            return
        ids = await ctx.workers.remove(record.worker_id, now_ms=ctx.now_ms(), force=True)
        if ids is None:
            return
        ctx.emit(events.WorkerLost(pool.name, lost))
        requeued = await ctx.requeue_in_sql(ids, why)
        if requeued:
            ctx.emit(events.Requeued(requeue, len(requeued)))
            ctx.placer_wanted.set()
        ctx.planner_wanted.set()
