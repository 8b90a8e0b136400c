"""Starting and stopping machines through provider plugins, and what a provider's "no" means.

A start is recorded in SQL before the provider is called, with a token scoped
to that one machine, so a machine that comes up after a crash or a deadline is
still recognised (or terminated) by the reconciler. Provider answers map onto
the scheduler's choices:

- no capacity or no quota: that (pool, GPU type, region) is skipped for
  ``unavailable_ttl_s`` and the planner tries the next candidate at once;
- throttled (or another error the provider calls retryable): the pool waits,
  doubling, and is asked again; the request does not fail over, because the
  provider has not said no;
- anything else (bad credentials, bad settings, a plugin bug or deadline): the
  combination is skipped like no capacity, with the error as the reason, so one
  broken pool never holds up work another pool could take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from levers9.hooks.errors import (
    InsufficientCapacity,
    Levers9Error,
    PluginError,
    PluginTimeout,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import Machine, ProvisionRequest
from levers9.scheduler import events
from levers9.scheduler.context import Context
from levers9.scheduler.pools import PoolSpec

__all__ = ["Provisioner", "Throttle"]

log = logging.getLogger(__name__)


@dataclass
class Throttle:
    until_ms: int
    strikes: int
    reason: str


class Provisioner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.throttled: dict[str, Throttle] = {}

    @property
    def in_flight(self) -> set[str]:
        """Machine ids whose provider call has not returned yet."""
        return set(self._tasks)

    def throttled_until(self, pool: str) -> Throttle | None:
        t = self.throttled.get(pool)
        return t if t is not None and t.until_ms > self.ctx.now_ms() else None

    async def start(self, pool: PoolSpec, why: str) -> str:
        """Record a machine for ``pool`` and ask its provider for it in the background; returns its id."""
        ctx = self.ctx
        register_by = ctx.clock() + ctx.settings.register_timeout_s
        machine = await ctx.machines.create(
            pool.name,
            pool.pool.provider,
            gpu=pool.gpu,
            gpu_count=pool.gpu_count,
            region=pool.pool.region,
            register_by=_utc(register_by),
        )
        token_record, token = await ctx.tokens.issue("machine", subject=machine.id)
        await ctx.machines.set_token(machine.id, token_record.id)
        log.info("starting a machine %s in pool %s (%s)", machine.id, pool.name, why)
        request = ProvisionRequest(
            pool=pool.pool,
            resources=pool.resources,
            machine_id=machine.id,
            token=token,
            controlplane_url=ctx.controlplane_url,
            controlplane_ca=ctx.controlplane_ca,
            region=pool.pool.region,
        )
        task = asyncio.create_task(self._provision(pool, machine.id, request), name=f"provision {machine.id}")
        self._tasks[machine.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(machine.id, None))
        return machine.id

    async def _provision(self, pool: PoolSpec, machine_id: str, request: ProvisionRequest) -> None:
        ctx = self.ctx
        try:
            machine = await self._call_provider(pool, request)
        except asyncio.CancelledError:
            await self._failed(machine_id, "the controlplane stopped while the machine was being started")
            raise
        except (InsufficientCapacity, QuotaExceeded) as exc:
            await self._unavailable(pool, f"{exc.kind}: {exc}")
            await self._failed(machine_id, str(exc))
        except Throttled as exc:
            self._throttle(pool, exc.retry_after, f"throttled: {exc}")
            await self._failed(machine_id, str(exc))
        except ProviderError as exc:
            if exc.retryable:
                self._throttle(pool, None, f"{exc.kind}: {exc}")
            else:
                await self._unavailable(pool, f"{exc.kind}: {exc}")
            await self._failed(machine_id, str(exc))
        except (PluginError, Levers9Error) as exc:
            await self._unavailable(pool, str(exc))
            await self._failed(machine_id, str(exc))
        except Exception as exc:
            # A plugin bug must not stop the scheduler; it is reported like any other failure.
            log.exception("provider %s failed to provision %s", pool.pool.provider, machine_id)
            await self._unavailable(pool, f"plugin {pool.pool.provider} raised {type(exc).__name__}: {exc}")
            await self._failed(machine_id, f"{type(exc).__name__}: {exc}")
        else:
            self.throttled.pop(pool.name, None)
            await ctx.machines.set_provider_id(machine_id, machine.provider_id)
            await ctx.machines.set_state(machine_id, "starting")
            log.info("machine %s is starting as %s in pool %s", machine_id, machine.provider_id, pool.name)

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

    async def _unavailable(self, pool: PoolSpec, reason: str) -> None:
        ctx = self.ctx
        log.warning("pool %s (%s, %s): %s", pool.name, pool.gpu or "CPU", pool.pool.region or "-", reason)
        await ctx.unavailable.mark(pool.name, pool.gpu, pool.pool.region, reason, ctx.settings.unavailable_ttl_s)

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
        machine_id: str | None,
        provider_id: str | None,
        why: str,
        *,
        kind: str = events.TERMINATED_OTHER,
    ) -> bool:
        """Stop a machine (idempotent); True when the provider confirmed or there was nothing to stop.

        ``kind`` (a ``TERMINATED_*`` value of :mod:`levers9.scheduler.events`) is what the stop is counted as.
        """
        ctx = self.ctx
        log.info("terminating machine %s (%s) in pool %s: %s", machine_id or "-", provider_id or "-", pool.name, why)
        if machine_id is not None:
            await ctx.machines.set_state(machine_id, "terminating")
        if provider_id is not None:
            try:
                await ctx.hooks.terminate(pool.pool, provider_id)
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

    async def close(self) -> None:
        """Stop waiting for provider calls; their machines are recorded as failed and the reconciler cleans up."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _outcome(exc: BaseException) -> str:
    """A short label for a failed provider call, matching how :meth:`Provisioner._provision` reacts to it."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, InsufficientCapacity):
        return "capacity"
    if isinstance(exc, QuotaExceeded):
        return "quota"
    if isinstance(exc, Throttled) or (isinstance(exc, ProviderError) and exc.retryable):
        return "throttled"
    if isinstance(exc, PluginTimeout):
        return "timeout"
    return "error"


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)
