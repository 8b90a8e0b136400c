"""The scheduler as the controlplane runs it: submit, place, reap, plan, keep pools.

Every replica places and reaps (both are single Lua steps, safe side by side);
only the replica holding the lease plans capacity, refreshes the pools' offers
in the background (:mod:`levers9.scheduler.offers`) and looks after pools. SQL
is written first on submit and the backlog is rebuilt from it at start, so a
restart loses nothing. A provider's refusal wakes the planner and cuts its
pacing gap short, so the next offer or pool is asked at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from levers9.config.model import SchedulerConfig
from levers9.scheduler import events
from levers9.scheduler.availability import Unavailable
from levers9.scheduler.candidates import Candidate, NoPoolOffers, candidates, groups, pool_prices
from levers9.scheduler.context import Context
from levers9.scheduler.controller import PoolController, UpkeepReport
from levers9.scheduler.history import HistoryWriter
from levers9.scheduler.lease import Lease, LeaseLost
from levers9.scheduler.offers import OfferCache
from levers9.scheduler.planner import PassReport, Planner
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.provisioning import Provisioner
from levers9.scheduler.request import PlacementRequest
from levers9.scheduler.restart import RebuildReport, rebuild, requeue_kept, return_grace_s
from levers9.state.errors import InvalidTransition, NotFound
from levers9.state.redis.backlog import Backlog, Group, PlaceResult, QueuedRequest, Released, RequestState, Taken
from levers9.state.redis.outage import Outage
from levers9.state.redis.scripts import Scripts
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.records import PlacementEvent
from levers9.state.sql.tasks import TaskStore
from levers9.state.sql.workspaces import TokenStore

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from levers9.hooks.facade import Hooks
    from levers9.state.sql.database import Database

__all__ = ["RebuildReport", "Scheduler"]

log = logging.getLogger(__name__)

#: how long stop() waits for the placement history still buffered to be stored
_HISTORY_FLUSH_S = 10.0


class Scheduler:
    def __init__(
        self,
        *,
        db: Database,
        redis: Redis,
        hooks: Hooks,
        pools: dict[str, PoolSpec],
        settings: SchedulerConfig | None = None,
        controlplane_url: str = "grpc://127.0.0.1:1993",
        controlplane_ca: str = "",
        prefix: str = "l9:",
        clock: Callable[[], float] = time.time,
        name: str | None = None,
        on_placed: Callable[[PlaceResult], Awaitable[None]] | None = None,
    ) -> None:
        scripts = Scripts(redis, prefix)
        self.redis = redis
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.ctx = Context(
            backlog=Backlog(redis, prefix, scripts),
            workers=WorkerRegistry(redis, prefix, scripts),
            unavailable=Unavailable(redis, prefix),
            hooks=hooks,
            pools=dict(pools),
            settings=settings or SchedulerConfig(),
            tasks=TaskStore(db),
            machines=MachineStore(db),
            tokens=TokenStore(db),
            controlplane_url=controlplane_url,
            controlplane_ca=controlplane_ca,
            clock=clock,
        )
        self.provisioner = Provisioner(self.ctx)
        #: each pool's offers, refreshed in the background while this replica holds the lease
        self.offers = OfferCache(self.ctx)
        #: stores the placement history in the background, in batches, in order (see place_once); the planner's
        #: lines go through it too, so a placement's line is never stored after a later planner line
        self.history = HistoryWriter(self.ctx.tasks)
        self.planner = Planner(self.ctx, self.provisioner, self.offers, history=self.history)
        self.controller = PoolController(self.ctx, self.provisioner, self.offers)
        self.lease = Lease(redis, f"{prefix}lease:planner", self.name, ttl_s=15)
        #: told of every batch of placements (the server wakes worker sessions); its history is stored by self.history
        self.on_placed = on_placed
        self._runner: asyncio.Task[None] | None = None
        self._upkeep_at = 0.0
        self._reconcile_at = 0.0
        #: set by stop(): the loops end at their next turn even if their cancellation was swallowed
        self._stopping = False
        #: a submission's own placement pass is running (see submit_many's place_now)
        self._placing_now = False

    @property
    def backlog(self) -> Backlog:
        return self.ctx.backlog

    @property
    def workers(self) -> WorkerRegistry:
        return self.ctx.workers

    @property
    def settings(self) -> SchedulerConfig:
        return self.ctx.settings

    # ------------------------------------------------------------------ requests

    def _queued(
        self,
        request: PlacementRequest,
        same_as: dict[str, tuple[Group, ...]] | None = None,
        function: str | None = None,
    ) -> QueuedRequest:
        """Raises :class:`NoPoolOffers` when no configured pool could ever take the request.

        ``same_as`` memoizes the candidate groups across one batch: requests that differ
        only by id (a map) share them.
        """
        wait_s = request.max_wait_s or self.settings.max_wait_s
        key = request.model_dump_json(exclude={"id"}) if same_as is not None else ""
        cached = same_as.get(key) if same_as is not None else None
        found = cached if cached is not None else groups(self._candidates(request))
        if same_as is not None:
            same_as[key] = found
        return QueuedRequest(
            id=request.id,
            cpu_millicores=request.cpu_millicores,
            memory_mib=request.memory_mib,
            gpu_count=request.gpu.count,
            groups=found,
            enqueued_ms=request.submitted_ms,
            workspace=request.workspace,
            deadline_ms=request.submitted_ms + round(wait_s * 1000),
            function=function or "",
        )

    def _candidates(self, request: PlacementRequest) -> list[Candidate]:
        """The request's pools in order, priced by the offers this replica knows (``scheduler.pool_order``)."""
        pools = self.ctx.pools
        order = self.settings.pool_order
        prices = None
        if order == "price":
            known = {name: self.offers.get(name) for name in pools}
            prices = pool_prices(pools, {name: k.offers for name, k in known.items() if k is not None})
        return candidates(request, pools, order=order, prices=prices)

    async def submit(self, request: PlacementRequest, *, stub_id: str | None = None, args: bytes | None = None) -> None:
        await self.submit_many([request], stub_id=stub_id, args=None if args is None else [args])

    async def submit_many(
        self,
        requests: Sequence[PlacementRequest],
        *,
        stub_id: str | None = None,
        args: Sequence[bytes] | None = None,
        place_now: bool = False,
        alike: bool = False,
    ) -> None:
        """Store the requests as pending tasks (with each call's ``args``), then queue them.

        Refuses all if any can never be placed. ``place_now``: run a placement pass here, right after
        queueing, rather than waking the placement loop (a lone call is placed without waiting for the
        loop's turn; a failure of that pass is logged and left to the loop, the requests are queued).
        ``alike``: the requests differ only by their ids (copies of one request: a map), so what is
        derived from a request (its candidate pools, its stored form) is worked out once.
        """
        if args is not None and len(args) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(args)} argument payloads")
        if alike and requests:
            first = self._queued(requests[0], None, stub_id)
            queued = [first] + [replace(first, id=r.id) for r in requests[1:]]
            stored = requests[0].to_json()
            as_json = [{**stored, "id": r.id} for r in requests]
        else:
            memo: dict[str, tuple[Group, ...]] = {}
            queued = [self._queued(r, memo, stub_id) for r in requests]
            as_json = [r.to_json() for r in requests]
        by_workspace: dict[str, list[tuple[PlacementRequest, dict[str, Any], bytes | None]]] = {}
        for i, r in enumerate(requests):
            by_workspace.setdefault(r.workspace, []).append((r, as_json[i], None if args is None else args[i]))
        for workspace, batch in by_workspace.items():
            await self.ctx.tasks.create_many(
                workspace,
                [(r.id, body) for r, body, _ in batch],
                stub_id=stub_id,
                args=None if args is None else [a or b"" for _, _, a in batch],
                records=False,
            )
        await self.backlog.enqueue(queued)
        if place_now and not self._placing_now:
            await self._place_now()
        else:
            self.ctx.placer_wanted.set()

    async def _place_now(self) -> None:
        """One placement pass for a submission that just queued its calls (see ``submit_many``)."""
        self._placing_now = True  # one at a time: the others wake the loop, whose pass places theirs too
        try:
            await self.place_once(wait_for_history=False)
        except Exception:
            log.exception("placing at submit failed; the placement loop places the calls")
            self.ctx.placer_wanted.set()
        finally:
            self._placing_now = False

    async def ensure_queued(self, request_ids: Sequence[str]) -> int:
        """Put those of ``request_ids`` that SQL has as pending but Redis does not know back on the backlog.

        For a submission sent again after the replica that stored it went away, perhaps between the SQL
        commit and the backlog write. Returns how many were queued again.
        """
        tasks = [t for t in await self.ctx.tasks.get_many(request_ids) if t.status == "pending"]
        if not tasks:
            return 0
        known = await self.backlog.get_many([t.id for t in tasks])
        lost = [t for t, state in zip(tasks, known, strict=True) if state is None]
        if lost:
            await self.backlog.enqueue(
                [self._queued(PlacementRequest.from_json(t.request), None, t.stub_id) for t in lost]
            )
            log.info("queued again %d tasks of a submission sent twice", len(lost))
            self.ctx.placer_wanted.set()
        return len(lost)

    async def cancel(self, request_id: str) -> bool:
        """Cancel a task that has not finished; False when it already had."""
        finished = await self.backlog.finish(request_id, self.ctx.now_ms())
        if finished is not None and finished.pool:
            await self.backlog.wake(finished.pool, self.ctx.now_ms())
            self.ctx.placer_wanted.set()
        return await self.ctx.tasks.cancel(request_id)

    @property
    def return_grace_s(self) -> float:
        """How long workers Redis forgot are waited for before their calls are queued again and machines stopped."""
        return return_grace_s(self.settings)

    async def rebuild(self) -> RebuildReport:
        """Put SQL's unfinished tasks back into Redis after a restart: see :func:`levers9.scheduler.restart.rebuild`."""
        return await rebuild(self.ctx, self.backlog, self._queued, self.return_grace_s)

    async def place_once(self, *, wait_for_history: bool = True) -> PlaceResult:
        """One batch of placements; their history goes to the history writer (:attr:`history`).

        Redis holds the placement itself; SQL's history is the record of it, stored by one
        writer task in batches of whatever piled up (:mod:`levers9.scheduler.history`). With
        ``wait_for_history`` this returns once the batch's history is stored (tests, tools);
        the placement loop passes False: the workers are told at once and the next batch
        follows, unless the writer is :data:`~levers9.scheduler.history.MAX_BUFFERED` events
        behind, when this waits for it to catch up.
        """
        ctx = self.ctx
        settings = ctx.settings
        result = await self.backlog.place(
            ctx.now_ms(),
            limit=settings.batch_size,
            recheck_ms=round(settings.retry_initial_s * 1000),
            short_ms=round(settings.queue_wait_s * 1000) if settings.worker_queue else 0,
        )
        if result.placed:
            # buffered before anything is awaited, so a placement made in Redis always gets its history
            ticket = self.history.add(self._placement_events(result))
            if not wait_for_history:
                if self.on_placed is not None:
                    await self.on_placed(result)
            elif self.on_placed is None:
                await self.history.written(ticket)
            else:
                # the workers are told while the history is written: a call is not held up by its own record
                await asyncio.gather(self.history.written(ticket), self.on_placed(result))
            await self.history.room()
        if result.unplaced:
            ctx.planner_wanted.set()
        return result

    def _placement_events(self, result: PlaceResult) -> list[PlacementEvent]:
        """The history of a batch, stamped now: the time of placing, not of the writer's transaction."""
        pools, at = self.ctx.pools, datetime.now(UTC)
        return [
            PlacementEvent(
                task_id=p.request,
                outcome="placed",
                pool=p.pool,
                gpu=pools[p.pool].gpu if p.pool in pools else None,
                region=pools[p.pool].pool.region if p.pool in pools else None,
                worker_id=p.worker,
                at=at,
            )
            for p in result.placed
        ]

    # ------------------------------------------------------------------ workers

    async def register_worker(self, info: WorkerInfo) -> None:
        ctx = self.ctx
        if info.machine_id:
            await ctx.machines.mark_registered(info.machine_id, info.id)
        ttl = round(ctx.settings.worker_keepalive_s * 1000)
        # the worker says how many queued calls it can hold (0: a worker that starts every call it is sent)
        info = replace(info, queue=min(info.queue, ctx.settings.worker_queue))
        await ctx.workers.register(info, now_ms=ctx.now_ms(), ttl_ms=ttl)
        await ctx.backlog.wake(info.pool, ctx.now_ms())
        ctx.placer_wanted.set()

    async def heartbeat(self, worker: str) -> bool:
        ttl = round(self.settings.worker_keepalive_s * 1000)
        return await self.workers.heartbeat(worker, now_ms=self.ctx.now_ms(), ttl_ms=ttl)

    async def heartbeat_many(self, workers: Sequence[str]) -> set[str]:
        """:meth:`heartbeat` for many workers in one step; returns those that were presumed dead."""
        ttl = round(self.settings.worker_keepalive_s * 1000)
        return await self.workers.heartbeat_many(workers, now_ms=self.ctx.now_ms(), ttl_ms=ttl)

    async def take(self, worker: str, max_count: int = 1) -> list[Taken]:
        return await self.backlog.take(worker, max_count)

    async def placements(self, request_ids: Sequence[str]) -> list[RequestState | None]:
        """Where Redis has each of ``request_ids`` now, in order (None: it holds no such request, finished or lost).

        The placement itself, every replica's: what a worker may report on is judged by it, not by SQL's record
        of the placement, which the history writer stores behind.
        """
        return await self.backlog.get_many(request_ids) if request_ids else []

    async def held_by(self, worker: str) -> list[RequestState]:
        """The requests Redis has placed on ``worker`` now (placed, running, or waiting in its queue)."""
        held = await self.workers.requests_of(worker)
        return [state for state in await self.placements(held) if state is not None]

    async def release_many(self, request_ids: Sequence[str], *, worker: str | None = None) -> int:
        """Return the resources of finished requests (their SQL rows are written by the caller) and wake pools.

        With ``worker``, only requests placed on that worker are released. Returns how many were.
        """
        if not request_ids:
            return 0
        done = await self._release(request_ids, worker)
        return sum(1 for d in done if d is not None)

    async def release_reported(self, worker: str, request_ids: Sequence[str]) -> list[str]:
        """:meth:`release_many` for what ``worker`` reported finished; the ids it may not report on.

        Those are the requests Redis has placed on another worker, or on none: the worker's outcomes for them
        must not be stored (a late report from a worker presumed dead, or a forged one).
        """
        if not request_ids:
            return []
        return (await self._release(request_ids, worker)).refused

    async def _release(self, request_ids: Sequence[str], worker: str | None) -> Released:
        # about as many waiting requests are woken as places were freed, not the whole queue: each woken
        # request is looked at by the next placement pass, and most could not fit anyway
        done = await self.ctx.backlog.finish_many(request_ids, self.ctx.now_ms(), worker=worker, wake_per_freed=2)
        # Only a request the freed places made due is new to the placement loop: the others are placed,
        # due later (the loop's timer), or were looked at already. A lone call's release wakes nothing,
        # and the loop's pass over an empty backlog (two round trips) is saved.
        if done.woken:
            self.ctx.placer_wanted.set()
        return done

    async def retry(self, request_id: str, reason: str) -> bool:
        """Run a failed attempt again: free its worker, count the attempt in SQL and queue the request anew.

        Returns False when the task can no longer run (it finished meanwhile, or no pool fits it any more).
        """
        ctx = self.ctx
        await self.release_many([request_id])
        try:
            task = await ctx.tasks.requeue(request_id, reason)
        except (InvalidTransition, NotFound):
            return False
        try:
            queued = self._queued(PlacementRequest.from_json(task.request), None, task.stub_id)
        except NoPoolOffers as exc:
            await ctx.tasks.finish(request_id, "error", error=f"{reason}; cannot run it again: {exc}")
            return False
        await ctx.backlog.enqueue([queued])
        ctx.emit(events.Requeued(events.REQUEUE_ATTEMPT_FAILED))
        ctx.placer_wanted.set()
        return True

    async def reap_once(self) -> list[str]:
        """Remove workers whose keepalive lapsed and requeue their work, and the calls kept for workers that did
        not come back after a restart (see :meth:`rebuild`); returns the requeued request ids."""
        requeued: list[str] = []
        # after a start, keepalives that lapsed while no controlplane listened mean nothing (see rebuild)
        silent = [] if await self.ctx.workers.returning() else await self.ctx.workers.silent()
        for worker in silent:
            requeued += await self.remove_worker(worker, "stopped reporting")
        requeued += await requeue_kept(self.ctx, self.backlog, self.return_grace_s)
        return requeued

    async def remove_worker(self, worker: str, why: str, *, force: bool = False) -> list[str]:
        """Take ``worker`` out and requeue its work ("worker W <why>"); returns the requeued request ids.

        Without ``force`` a worker whose keepalive holds stays (the reaper's case); with it, it goes
        anyway (a drained worker that hung up).
        """
        ctx = self.ctx
        state = await ctx.workers.get(worker)
        ids = await ctx.workers.remove(worker, now_ms=ctx.now_ms(), force=force)
        if ids is None:
            return []
        log.warning("worker %s %s; requeued %d requests", worker, why, len(ids))
        if state is not None:
            ctx.emit(events.WorkerLost(state.info.pool, events.LOST_LEFT if force else events.LOST_KEEPALIVE))
        requeued = await self._requeue_in_sql(ids, f"worker {worker} {why}")
        if requeued:
            ctx.emit(events.Requeued(events.REQUEUE_WORKER_LOST, len(requeued)))
        if state is not None and state.info.machine_id:
            ctx.planner_wanted.set()
        if requeued:
            ctx.placer_wanted.set()
        return requeued

    async def reclaim_worker(self, worker: str, held: Sequence[str]) -> list[str]:
        """A worker registered again and said what it ``held``: requeue what it had taken but never got.

        A replica that goes away mid-session may have taken requests off the worker's queue and sent them into
        the breaking stream. The worker never saw them, so it does not list them, and without this they would
        stay running on it forever. Returns the ids of ``held`` that are still the worker's.
        """
        ctx = self.ctx
        ids, kept = await ctx.workers.reclaim(worker, held, now_ms=ctx.now_ms())
        requeued = await self._requeue_in_sql(ids, f"it was sent to worker {worker} by a replica that went away first")
        if requeued:
            log.warning("worker %s came back without %d requests sent to it; requeued them", worker, len(requeued))
            ctx.emit(events.Requeued(events.REQUEUE_NEVER_DELIVERED, len(requeued)))
            ctx.placer_wanted.set()
        return kept

    async def _requeue_in_sql(self, ids: Sequence[str], reason: str) -> list[str]:
        """See :meth:`Context.requeue_in_sql` (the reconciler requeues a preempted machine's calls with it too)."""
        return await self.ctx.requeue_in_sql(ids, reason)

    # ------------------------------------------------------------------ leader work

    async def plan_once(self) -> PassReport:
        return await self.planner.plan_once()

    async def upkeep_once(self) -> UpkeepReport:
        return await self.controller.tick()

    async def reconcile_once(self) -> UpkeepReport:
        return await self.controller.reconcile()

    # ------------------------------------------------------------------ running

    async def start(self) -> None:
        """Rebuild from SQL and start the loops in the background."""
        await self.rebuild()
        self._stopping = False
        self._runner = asyncio.create_task(self.run(), name=f"scheduler {self.name}")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._loop("placement", self._place_step))
            tg.create_task(self._loop("reaper", self._reap_step))
            tg.create_task(self._loop("leader", self._leader_step))

    async def stop(self) -> None:
        self._stopping = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None
        await self.history.close(timeout=_HISTORY_FLUSH_S)
        await self.offers.close()
        await self.provisioner.close()
        with contextlib.suppress(Exception):
            await self.lease.release()

    async def _loop(self, name: str, step: Callable[[], Awaitable[float]]) -> None:
        """Run ``step`` until stopped; it returns how long to sleep. A failing step is logged, never fatal.

        Redis not answering (a restart, a Sentinel failover) is one warning per outage, and one line when
        it answers again (:class:`~levers9.state.redis.outage.Outage`); any other failure is logged with
        its traceback every time. The loop also ends when :meth:`stop` has begun: a cancellation
        swallowed on its way (by a client library, or by ``asyncio.wait_for`` on Python 3.11) must not
        keep ``stop`` waiting.
        """
        outage = Outage(log, f"scheduler {name} loop")
        while not self._stopping:
            try:
                wait = await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not outage.failed(exc):
                    log.exception("scheduler %s loop failed; retrying", name)
                wait = 1.0
            else:
                outage.answered()
            await asyncio.sleep(wait)

    async def _wait(self, event: asyncio.Event, timeout: float) -> None:
        """Until ``event`` is set or ``timeout`` passes.

        Not ``asyncio.wait_for``: on Python 3.11 it can swallow a cancellation that arrives as the
        event is set, and a loop that misses its cancellation never lets ``stop`` finish.
        """
        if not event.is_set():
            waiter = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait({waiter}, timeout=timeout)
            finally:
                waiter.cancel()
        event.clear()

    async def _place_step(self) -> float:
        result = await self.place_once(wait_for_history=False)  # waits there while the history writer is far behind
        if len(result.placed) + len(result.unplaced) >= self.settings.batch_size:
            return 0  # more may be due right now
        due = await self.backlog.next_due_ms()
        now = self.ctx.now_ms()
        timeout = 1.0 if due is None else min(1.0, max(0.0, (due - now) / 1000))
        await self._wait(self.ctx.placer_wanted, timeout)
        return 0

    async def _reap_step(self) -> float:
        await self.reap_once()
        return max(0.5, self.settings.worker_keepalive_s / 3)

    async def _leader_step(self) -> float:
        if not await self.lease.acquire():
            return 5.0
        # from now on every start and terminate checks that this acquisition is still current (fencing)
        self.provisioner.fence = self.lease.current
        try:
            return await self._lead()
        except LeaseLost:
            log.warning("the planner lease was lost during this replica's pass; it stopped there")
            return 1.0

    async def _lead(self) -> float:
        self.offers.refresh_in_background()
        started = time.monotonic()
        self.ctx.failover_wanted.clear()  # a refusal before this pass is seen by it (its mark is in Redis)
        await self.plan_once()
        # A pass over a long backlog is costly, and a busy backlog asks for one after every
        # placement batch; leaving four times the pass's own length between passes keeps
        # planning under a fifth of a core while a short backlog is still planned at once.
        # A provider's refusal cuts the gap short: its request tries the next offer or pool now.
        gap = min(1.0, 4 * (time.monotonic() - started))
        now = self.ctx.clock()
        if now - self._upkeep_at >= 5.0:
            await self.upkeep_once()
            self._upkeep_at = now
        if now - self._reconcile_at >= self.settings.reconcile_interval_s:
            await self.reconcile_once()
            self._reconcile_at = now
        if gap > 0.01:
            await self._wait(self.ctx.failover_wanted, gap)
        await self._wait(self.ctx.planner_wanted, 1.0)
        return 0
