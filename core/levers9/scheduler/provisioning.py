"""Starting and stopping machines through provider plugins, and what a provider's "no" means.

A start is recorded in SQL before the provider is called, with a token scoped
to that one machine, so a machine that comes up after a crash or a deadline is
still recognised (or terminated) by the reconciler. The record keeps the offer
the machine was started from (instance type, zone, price) and, once the
provider answers, where it put the machine and its ``provider_data``; every
terminate hands that stored machine back to the provider, so it can find a
machine in a zone or region other than the pool's first.

The provider gets a :class:`~levers9.hooks.types.WorkerBootstrap`: where to
dial, the CA to trust, the machine's single-use token, this controlplane's
levers9 version and ``scheduler.worker_image``, levers9's own wheel as the
controlplane serves it (URL and sha256, for a machine with neither levers9
nor Docker: never levers9 by name from a package index), the worker's size
as its ``LEVERS9_*`` variables, the pool's labels and its runtime.

Provider answers map onto the scheduler's choices:

- no capacity: that offer of the pool (or the whole pool, when it has no
  offers) is skipped for ``unavailable_ttl_s`` and the planner is woken at
  once to try the pool's next offer, then the next pool;
- no quota: what the quota holds for is skipped alike, at once: every offer
  of the pool in the offer's region (``scope="region"``), or the whole pool
  (``scope="account"``, or a pool without offers); trying the region's other
  zones would only meet the same limit;
- a refused payment (:class:`~levers9.hooks.errors.BillingRefused`: no
  balance, a declined card, an account suspended for billing): the whole
  pool is skipped alike, at once, with a reason that asks the operator to
  top up the account; nothing the scheduler tries escapes it until someone
  pays, and the pool is asked again when the mark lapses;
- throttled (or another error the provider calls retryable): the pool waits,
  doubling, and is asked again; the request does not fail over, because the
  provider has not said no;
- anything else (bad credentials, a denied permission, bad settings, a plugin
  bug or deadline): the whole pool is skipped like no capacity, with the error
  as the reason, since its other offers would fail alike, and one broken pool
  never holds up work another pool could take.

Starts and terminates are the planner lease's holder's acts, and are fenced
(:mod:`levers9.scheduler.lease`): with :attr:`Provisioner.fence` set (the
scheduler's loops run), each asks right before it acts whether this replica's
lease token is still current, and raises :class:`LeaseLost` instead of acting
when it is not (a replica that resumed from a freeze after another took the
lease); the pass it was part of ends there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from levers9.__about__ import __version__
from levers9.hooks.errors import (
    BillingRefused,
    InsufficientCapacity,
    Levers9Error,
    PluginError,
    PluginTimeout,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import GpuOffer, Machine, MachineState, ProvisionRequest, WorkerBootstrap
from levers9.scheduler import events
from levers9.scheduler.context import Context
from levers9.scheduler.lease import LeaseLost
from levers9.scheduler.pools import PoolSpec
from levers9.state.sql.records import MachineRecord

__all__ = ["Provisioner", "Throttle", "stored_machine", "worker_environment"]

log = logging.getLogger(__name__)


@dataclass
class Throttle:
    until_ms: int
    strikes: int
    reason: str


#: how long :meth:`Provisioner.close` waits for provider calls in flight before abandoning them
CLOSE_GRACE_S = 15.0


class Provisioner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: asked before each start and terminate: whether this replica still holds the lease under its token
        #: (None: no fence, as for a scheduler driven by hand whose loops do not run)
        self.fence: Callable[[], Awaitable[bool]] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.throttled: dict[str, Throttle] = {}
        #: when this provisioner was made (epoch seconds): a launch recorded before then was asked by another
        #: process (this one before a restart, or another replica), whose call this one cannot be waiting on
        self.started_at = ctx.clock()

    @property
    def in_flight(self) -> set[str]:
        """Machine ids whose provider call has not returned yet."""
        return set(self._tasks)

    def abandoned(self, record: MachineRecord) -> bool:
        """Whether nobody can still be waiting on the launch of ``record`` (in ``requested``): it is not one of
        this process's calls in flight, and it was asked before this process started, or longer ago than any
        provider call may take (``provision_timeout_s``, and the grace a replica that lost the lease gives its
        calls: :data:`CLOSE_GRACE_S`)."""
        if record.id in self._tasks:
            return False
        asked = record.created_at.timestamp()
        longest = self.ctx.settings.provision_timeout_s + CLOSE_GRACE_S
        return asked < self.started_at or self.ctx.clock() - asked > longest

    def throttled_until(self, pool: str) -> Throttle | None:
        t = self.throttled.get(pool)
        return t if t is not None and t.until_ms > self.ctx.now_ms() else None

    async def check_fence(self, act: str) -> None:
        """Raise :class:`LeaseLost` when this replica's lease token is no longer current (see the module doc)."""
        if self.fence is not None and not await self.fence():
            log.warning("not %s: this replica no longer holds the planner lease", act)
            raise LeaseLost(f"not {act}: this replica no longer holds the planner lease")

    async def start(self, pool: PoolSpec, why: str, offer: GpuOffer | None = None) -> str:
        """Record a machine for ``pool`` (of ``offer``, when the pool has offers) and ask its provider for it in
        the background; returns its id."""
        await self.check_fence(f"starting a machine in pool {pool.name}")
        ctx = self.ctx
        register_by = ctx.clock() + ctx.settings.register_timeout_s
        region = (offer.region if offer is not None else None) or pool.pool.region
        machine = await ctx.machines.create(
            pool.name,
            pool.pool.provider,
            gpu=pool.gpu,
            gpu_count=pool.gpu_count,
            region=region,
            register_by=_utc(register_by),
            zone=offer.zone if offer is not None else None,
            instance_type=offer.instance_type if offer is not None else None,
            offer_key=offer.key if offer is not None else None,
            price_per_hour=offer.price_per_hour if offer is not None else None,
        )
        # the join token: spent by the worker's first registration, and worthless after the registration deadline
        token_record, token = await ctx.tokens.issue(
            "machine", subject=machine.id, ttl_s=ctx.settings.register_timeout_s
        )
        await ctx.machines.set_token(machine.id, token_record.id)
        what = f"offer {offer.key}" if offer is not None else "the pool's own shape"
        log.info("starting a machine %s in pool %s, %s (%s)", machine.id, pool.name, what, why)
        bootstrap = WorkerBootstrap(
            controlplane_url=ctx.controlplane_url,
            controlplane_ca=ctx.controlplane_ca,
            token=token,
            machine_id=machine.id,
            pool=pool.name,
            levers9_version=__version__,
            worker_image=ctx.settings.worker_image,
            environment=worker_environment(pool),
            labels=dict(pool.pool.labels),
            runtime=pool.pool.runtime,
        )
        request = ProvisionRequest(
            pool=pool.pool,
            resources=pool.resources,
            machine_id=machine.id,
            bootstrap=bootstrap,
            region=region,
            offer=offer,
        )
        task = asyncio.create_task(self._provision(pool, machine.id, request), name=f"provision {machine.id}")
        self._tasks[machine.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(machine.id, None))
        return machine.id

    async def _provision(self, pool: PoolSpec, machine_id: str, request: ProvisionRequest) -> None:
        ctx = self.ctx
        offer = request.offer
        try:
            request = await self._with_wheel(request)
            machine = await self._call_provider(pool, request)
        except asyncio.CancelledError:
            await self._failed(machine_id, "the controlplane stopped while the machine was being started")
            raise
        except QuotaExceeded as exc:
            await self._over_quota(pool, exc, offer)
            await self._failed(machine_id, str(exc))
        except BillingRefused as exc:
            await self._unavailable(pool, _billing_reason(pool, exc, self.ctx.settings.unavailable_ttl_s), None)
            await self._failed(machine_id, str(exc))
        except InsufficientCapacity as exc:
            await self._unavailable(pool, f"{exc.kind}: {exc}", offer)
            await self._failed(machine_id, str(exc))
        except Throttled as exc:
            self._throttle(pool, exc.retry_after, f"throttled: {exc}")
            await self._failed(machine_id, str(exc))
        except ProviderError as exc:
            if exc.retryable:
                self._throttle(pool, None, f"{exc.kind}: {exc}")
            else:
                # rejected credentials, a denied permission, an impossible request: no other offer escapes it
                await self._unavailable(pool, f"{exc.kind}: {exc}", None)
            await self._failed(machine_id, str(exc))
        except (PluginError, Levers9Error) as exc:
            await self._unavailable(pool, str(exc), None)
            await self._failed(machine_id, str(exc))
        except Exception as exc:
            # A plugin bug must not stop the scheduler; it is reported like any other failure.
            log.exception("provider %s failed to provision %s", pool.pool.provider, machine_id)
            await self._unavailable(pool, f"plugin {pool.pool.provider} raised {type(exc).__name__}: {exc}", None)
            await self._failed(machine_id, f"{type(exc).__name__}: {exc}")
        else:
            self.throttled.pop(pool.name, None)
            await ctx.machines.set_placement(
                machine_id,
                provider_id=machine.provider_id,
                region=machine.region,
                zone=machine.zone,
                instance_type=machine.instance_type,
                provider_data=machine.provider_data or None,
            )
            await ctx.machines.set_state(machine_id, "starting")
            log.info("machine %s is starting as %s in pool %s", machine_id, machine.provider_id, pool.name)

    async def _with_wheel(self, request: ProvisionRequest) -> ProvisionRequest:
        """``request`` with levers9's own wheel (URL on the controlplane, sha256) in its bootstrap, for a machine
        that has neither levers9 nor Docker; unchanged when the controlplane has none to give. Built on first
        use, here in the background rather than in the planner's pass."""
        if self.ctx.wheel is None:
            return request
        found = await self.ctx.wheel()
        if found is None:
            return request
        url, sha256 = found
        bootstrap = request.bootstrap.model_copy(update={"wheel_url": url, "wheel_sha256": sha256})
        return request.model_copy(update={"bootstrap": bootstrap})

    async def _call_provider(self, pool: PoolSpec, request: ProvisionRequest) -> Machine:
        """The provider's provision hook, timed for :attr:`Context.on_provisioned`; its errors pass through."""
        ctx = self.ctx
        started = time.monotonic()
        outcome = "error"
        try:
            machine = await ctx.hooks.provision(request, timeout=ctx.settings.provision_timeout_s)
            outcome = "ok"
            ctx.emit(events.ProviderCalled(pool.pool.provider, "provision"))
            return machine
        except BaseException as exc:
            outcome = _outcome(exc)
            if isinstance(exc, Exception):
                ctx.emit(events.ProviderCalled(pool.pool.provider, "provision", type(exc).__name__))
            raise
        finally:
            if ctx.on_provisioned is not None:
                try:
                    ctx.on_provisioned(pool.pool.provider, time.monotonic() - started, outcome)
                except Exception:
                    # An observer (metrics) must never turn a started machine into a failed one.
                    log.exception("the provisioning observer failed")

    async def _unavailable(self, pool: PoolSpec, reason: str, offer: GpuOffer | None) -> None:
        """Skip ``offer`` of ``pool`` for ``unavailable_ttl_s``, or the whole pool when ``offer`` is None."""
        ctx = self.ctx
        ttl = ctx.settings.unavailable_ttl_s
        ctx.failover_wanted.set()
        if offer is not None:
            log.warning("pool %s offer %s: %s", pool.name, offer.key, reason)
            await ctx.unavailable.mark_offer(pool.name, offer.key, reason, ttl)
            return
        log.warning("pool %s (%s, %s): %s", pool.name, pool.gpu or "CPU", pool.pool.region or "-", reason)
        await ctx.unavailable.mark(pool.name, pool.gpu, pool.pool.region, reason, ttl)

    async def _over_quota(self, pool: PoolSpec, exc: QuotaExceeded, offer: GpuOffer | None) -> None:
        """Skip what the quota holds for: every offer of the pool in the offer's region, or the whole pool."""
        reason = f"{exc.kind}: {exc}"
        if offer is None or exc.scope == "account":
            await self._unavailable(pool, reason, None)
            return
        ctx = self.ctx
        ctx.failover_wanted.set()
        log.warning("pool %s region %s: %s", pool.name, offer.region or "-", reason)
        await ctx.unavailable.mark_region(pool.name, offer.region, reason, ctx.settings.unavailable_ttl_s)

    def _throttle(self, pool: PoolSpec, retry_after: float | None, reason: str) -> None:
        previous = self.throttled.get(pool.name)
        strikes = previous.strikes + 1 if previous else 1
        wait = retry_after if retry_after is not None else self.ctx.backoff_s(strikes - 1)
        wait = min(max(wait, 0.0), self.ctx.settings.retry_max_s)
        self.throttled[pool.name] = Throttle(self.ctx.now_ms() + round(wait * 1000), strikes, reason)
        log.info("pool %s: %s; asking again in %.1f s", pool.name, reason, wait)

    async def _failed(self, machine_id: str, error: str) -> None:
        ctx = self.ctx
        try:
            await ctx.machines.set_state(machine_id, "failed", error=error)
            await ctx.tokens.revoke_subject(machine_id)
        finally:
            ctx.planner_wanted.set()

    async def terminate(
        self,
        pool: PoolSpec,
        target: MachineRecord | Machine,
        why: str,
        *,
        kind: str = events.TERMINATED_OTHER,
    ) -> bool:
        """Stop a machine (idempotent); True when the provider confirmed or there was nothing to stop.

        ``target`` is levers9's record of the machine (its state follows the stop, and the provider gets
        the machine as stored: :func:`stored_machine`), or a machine from the provider's own listing that
        levers9 has no live record of (an orphan), handed back as listed. ``kind`` (a ``TERMINATED_*``
        value of :mod:`levers9.scheduler.events`) is what the stop is counted as.
        """
        ctx = self.ctx
        machine_id: str | None = None
        machine: Machine | None = None
        if isinstance(target, Machine):
            machine = target
        else:
            machine_id = target.id
            machine = stored_machine(target) if target.provider_id is not None else None
        provider_id = machine.provider_id if machine is not None else None
        await self.check_fence(f"terminating machine {machine_id or provider_id} in pool {pool.name}")
        log.info("terminating machine %s (%s) in pool %s: %s", machine_id or "-", provider_id or "-", pool.name, why)
        if machine_id is not None:
            await ctx.machines.set_state(machine_id, "terminating")
        if machine is not None:
            try:
                await ctx.hooks.terminate(pool.pool, machine)
            except Exception as exc:
                ctx.emit(events.ProviderCalled(pool.pool.provider, "terminate", type(exc).__name__))
                log.warning("pool %s: terminating %s failed, will retry: %s", pool.name, provider_id, exc)
                if machine_id is not None:
                    await ctx.machines.set_state(machine_id, "terminating", error=f"terminate failed: {exc}")
                return False
            ctx.emit(events.ProviderCalled(pool.pool.provider, "terminate"))
        if machine_id is not None:
            await ctx.machines.set_state(machine_id, "terminated")
            await ctx.tokens.revoke_subject(machine_id)
        ctx.emit(events.MachineTerminated(pool.name, kind))
        return True

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop waiting for provider calls, after giving those in flight ``grace_s`` to return.

        A provider call runs on the plugin's own thread, which cancelling the awaiting task does not
        stop: a machine it starts after the cancel would be recorded as failed with no provider id, and
        only the reconciler's next listing would find it. So calls that return within the grace are
        recorded as usual (and ``levers9 up`` can stop their machines); the rest are recorded as failed
        and left to the reconciler.
        """
        tasks = list(self._tasks.values())
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _billing_reason(pool: PoolSpec, exc: BillingRefused, ttl_s: float) -> str:
    """What a pool whose provider refused payment shows as its reason: the error, and what the operator must do."""
    return (
        f"{exc.kind}: {exc}; top up the balance (or fix the payment method) of the account provider "
        f"{pool.pool.provider!r} uses: the pool starts nothing until then (asked again every {ttl_s:g} s)"
    )


def _outcome(exc: BaseException) -> str:
    """A short label for a failed provider call, matching how :meth:`Provisioner._provision` reacts to it."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, InsufficientCapacity):
        return "capacity"
    if isinstance(exc, QuotaExceeded):
        return "quota"
    if isinstance(exc, BillingRefused):
        return "billing"
    if isinstance(exc, Throttled) or (isinstance(exc, ProviderError) and exc.retryable):
        return "throttled"
    if isinstance(exc, PluginTimeout):
        return "timeout"
    return "error"


#: how a record's state reads to a provider
_AS_PROVIDER_STATE = {
    "requested": MachineState.PENDING,
    "starting": MachineState.PENDING,
    "running": MachineState.RUNNING,
    "draining": MachineState.RUNNING,
    "terminating": MachineState.STOPPING,
    "terminated": MachineState.TERMINATED,
    "failed": MachineState.FAILED,
}


def stored_machine(record: MachineRecord) -> Machine:
    """The machine as levers9 stored it, for the provider's terminate: its ids, where it is, its provider data."""
    if record.provider_id is None:
        raise ValueError(f"machine {record.id} has no provider id yet; there is nothing to hand to the provider")
    return Machine(
        provider_id=record.provider_id,
        machine_id=record.id,
        pool=record.pool,
        state=_AS_PROVIDER_STATE.get(str(record.state), MachineState.UNKNOWN),
        gpu=record.gpu,
        gpu_count=record.gpu_count,
        region=record.region,
        zone=record.zone,
        instance_type=record.instance_type,
        provider_data=dict(record.provider_data or {}),
    )


def worker_environment(pool: PoolSpec) -> dict[str, str]:
    """The worker's size as the ``LEVERS9_*`` variables its bootstrap carries (see :mod:`levers9.bootstrap`)."""
    return {
        "LEVERS9_CPU_MILLICORES": str(pool.cpu_millicores),
        "LEVERS9_MEMORY_MIB": str(pool.memory_mib),
        "LEVERS9_GPU_COUNT": str(pool.gpu_count),
    }


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)
