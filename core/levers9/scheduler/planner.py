"""The capacity planner: getting a worker for work that fits on none, in preference order.

It runs on the replica holding the lease. Each pass reads the unmet requests
oldest first and walks each one's candidate pools in preference order:

Within a group (pools of one GPU rank and priority) the pools are walked by
the price of the offers known at this pass with ``scheduler.pool_order:
price`` (see :mod:`levers9.scheduler.candidates`), so a call queued before
any offer was listed still starts the cheaper pool.

1. a pool marked unavailable as a whole (a provider refused it within the TTL:
   no capacity for a pool without offers, rejected credentials, a denied
   permission, a plugin error) is skipped, with the provider's reason noted;
2. room on a machine of that pool that is already starting is reserved (in this
   pass's accounting), so one machine serves several requests;
3. else, if the pool is under ``max_workers``, its offers are walked in order
   (see :mod:`levers9.scheduler.offers`): an offer marked unavailable (a
   capacity or quota miss on it, or a preemption there, within the TTL) is
   skipped with its reason noted, and a machine is started from the first
   free one; a pool without offers starts a machine of its own shape;
4. else the pool is full (or every offer is out), noted, and the next
   candidate is tried.

A provider's "no" comes back in the background (see
:mod:`levers9.scheduler.provisioning`): it marks that offer and wakes the
planner at once, so the next pass tries the same pool's next offer, then the
next pool, without waiting for a tick.

The notes (``tried``) are kept per request in Redis, one per pool and one per
offer (``h100 offer p5.48xlarge/us-east-1/us-east-1a``), and each new one is
recorded in the task's placement history. A request that found nothing waits
with exponential backoff (capped), and after its deadline fails with every
pool and offer tried and why each failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from levers9.hooks.types import GpuOffer
from levers9.scheduler.candidates import pool_price
from levers9.scheduler.context import Context
from levers9.scheduler.history import HistoryWriter
from levers9.scheduler.offers import OfferCache
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.provisioning import Provisioner
from levers9.state.redis.backlog import RequestState
from levers9.state.sql.records import PlacementEvent

__all__ = ["PassReport", "Planner"]

log = logging.getLogger(__name__)

#: machine states that count against a pool's max_workers
ACTIVE = ("requested", "starting", "running", "draining", "terminating")
STARTING = ("requested", "starting")


@dataclass
class _Slot:
    cpu: int
    mem: int
    gpus: int

    def take(self, cpu: int, mem: int, gpus: int) -> bool:
        if self.cpu >= cpu and self.mem >= mem and self.gpus >= gpus:
            self.cpu, self.mem, self.gpus = self.cpu - cpu, self.mem - mem, self.gpus - gpus
            return True
        return False


@dataclass
class PassReport:
    considered: int = 0
    reserved: int = 0
    started: int = 0
    waiting: int = 0
    gave_up: int = 0


#: a line of placement history the planner writes: request, outcome, pool, reason, region
_Event = tuple[str, str, PoolSpec | None, str, str | None]


@dataclass
class _Pass:
    """What one planning pass knows and gathers as it walks the requests (see :meth:`Planner.plan_once`)."""

    now: int
    report: PassReport
    #: machines per pool in an active state, those this pass started included
    count: dict[str, int] = field(default_factory=dict)
    #: the room left on each pool's starting machines, in this pass's accounting
    slots: dict[str, list[_Slot]] = field(default_factory=dict)
    #: each (pool, GPU, region)'s unavailability mark, read from Redis once per pass
    marks: dict[tuple[str, str | None, str | None], str | None] = field(default_factory=dict)
    #: each pool's offer marks, read once per pass
    offer_marks: dict[str, dict[str, str]] = field(default_factory=dict)
    #: each pool's price from the offers known, worked out once per pass (see Planner._walk_order)
    prices: dict[str, float | None] = field(default_factory=dict)
    #: the region each offer note is about, for its placement event
    regions: dict[str, str | None] = field(default_factory=dict)
    #: history lines to store at the end of the pass
    events: list[_Event] = field(default_factory=list)
    #: (request, next plan, reasons) to note in Redis at the end of the pass
    notes: list[tuple[str, int, list[str]]] = field(default_factory=list)


#: what :meth:`Planner._choose` returns when a pool has offers and none is free
_NONE_FREE = "none free"


def offer_subject(pool: str, offer: GpuOffer) -> str:
    """The name a note about one offer goes under in a request's ``tried``: ``h100 offer p5.48xlarge/us-east-1/a``."""
    return f"{pool} offer {offer.key}"


class Planner:
    def __init__(
        self,
        ctx: Context,
        provisioner: Provisioner,
        offers: OfferCache | None = None,
        *,
        window: int = 2000,
        history: HistoryWriter | None = None,
    ) -> None:
        self.ctx = ctx
        #: where its history lines go (the scheduler's writer, in order with the placements'); None: straight to SQL
        self.history = history
        self.provisioner = provisioner
        self.offers = offers if offers is not None else OfferCache(ctx)
        self.window = window
        #: rounds in a row that found nothing, per request, for the backoff
        self._rounds: dict[str, int] = {}
        #: when each request may next ask for a machine; kept here, not written to Redis each pass,
        #: since only the lease holder plans (a new holder starts without backoff, which is harmless)
        self._next_plan: dict[str, int] = {}

    async def plan_once(self) -> PassReport:
        """One pass over the unmet requests, oldest first: reserve room, start machines, note why not, give up.

        The steps, each a method named for what it decides: :meth:`_unmet` (which requests are planned),
        :meth:`_capacity` (what the pools hold and are starting now), :meth:`_plan_request` per request
        (give up at the deadline, else :meth:`_find_capacity` over its pools, each :meth:`_try_pool`), then
        :meth:`_pace` (its backoff) and :meth:`_note_changes` (its new reasons), stored at the end in one
        write each (:meth:`_store_notes`).
        """
        now = self.ctx.now_ms()  # the pass's time, read before the backlog as deadlines and backoffs are judged by it
        report = PassReport()
        states = await self._unmet()
        report.considered = len(states)
        if not states:
            self._rounds.clear()
            self._next_plan.clear()
            return report
        if len(self._next_plan) > 4 * self.window:
            live = {st.request.id for st in states}
            self._next_plan = {k: v for k, v in self._next_plan.items() if k in live}
        state = await self._capacity(now, report)
        for st in states:
            await self._plan_request(state, st)
        await self._store_notes(state)
        return report

    async def _unmet(self) -> list[RequestState]:
        """The requests no worker had room for, oldest first (up to :attr:`window`), still queued."""
        ctx = self.ctx
        ids = await ctx.backlog.unmet(self.window)
        return [s for s in await ctx.backlog.get_many(ids) if s is not None and s.state == "queued"]

    async def _capacity(self, now: int, report: PassReport) -> _Pass:
        """What the pools hold now: machines counted against ``max_workers``, and the room of those starting."""
        ctx = self.ctx
        state = _Pass(now=now, report=report)
        for m in await ctx.machines.list(states=list(ACTIVE)):
            state.count[m.pool] = state.count.get(m.pool, 0) + 1
            pool = ctx.pools.get(m.pool)
            if m.state in STARTING and pool is not None:
                state.slots.setdefault(m.pool, []).append(_Slot(pool.cpu_millicores, pool.memory_mib, pool.gpu_count))
        return state

    async def _plan_request(self, state: _Pass, st: RequestState) -> None:
        """Plan one request: give it up past its deadline, else find it capacity and note what was tried."""
        req, report = st.request, state.report
        if req.deadline_ms and state.now >= req.deadline_ms:
            await self._give_up(st, state.now)
            report.gave_up += 1
            return
        tried = dict(_parse_tried(st.tried))
        before = dict(tried)
        outcome = await self._find_capacity(state, st, tried)
        if outcome == "reserved":
            report.reserved += 1
        elif outcome == "started":
            report.started += 1
            self._rounds.pop(req.id, None)
            self._next_plan.pop(req.id, None)
        else:
            report.waiting += 1
        next_plan = self._pace(state.now, st, outcome)
        if tried != before:
            self._note_changes(state, req.id, next_plan, tried, before)

    async def _find_capacity(self, state: _Pass, st: RequestState, tried: dict[str, str]) -> str:
        """Walk the request's open groups and their pools in order until one decides; the outcome.

        ``reserved`` (room on a starting machine), ``started`` (a machine asked for), ``waiting`` (a pool
        that would take it is throttled, or the request's backoff has not passed), or ``none`` (every
        pool noted in ``tried`` why not).
        """
        for group in st.request.groups:
            if group.not_before_ms > state.now:
                continue
            for name in self._walk_order(group.pools, state.prices):
                outcome = await self._try_pool(state, st, group.gpu_count, name, tried)
                if outcome is not None:
                    return outcome
        return "none"

    async def _try_pool(
        self, state: _Pass, st: RequestState, gpu_count: int, name: str, tried: dict[str, str]
    ) -> str | None:
        """Whether pool ``name`` decides the request (the outcome), or None with the reason in ``tried``."""
        ctx, req, now = self.ctx, st.request, state.now
        pool = ctx.pools.get(name)
        if pool is None:
            tried[name] = "the pool is no longer configured"
            return None
        key = (name, pool.gpu, pool.pool.region)
        if key not in state.marks:
            state.marks[key] = await ctx.unavailable.reason(*key)
        if state.marks[key] is not None:
            tried[name] = f"unavailable: {state.marks[key]}"
            return None
        if any(s.take(req.cpu_millicores, req.memory_mib, gpu_count) for s in state.slots.get(name, [])):
            return "reserved"
        throttle = self.provisioner.throttled_until(name)
        if throttle is not None:
            tried[name] = f"{throttle.reason}; asking again in {(throttle.until_ms - now) / 1000:.0f} s"
            return "waiting"
        if state.count.get(name, 0) >= pool.max_workers:
            tried[name] = f"at max_workers ({pool.max_workers}) with no room free"
            return None
        if now < max(st.next_plan_ms, self._next_plan.get(req.id, 0)):
            return "waiting"
        offer = await self._choose(pool, tried, state.offer_marks, state.regions)
        if isinstance(offer, str):  # _NONE_FREE: every offer is out, noted; the next pool
            return None
        await self.provisioner.start(pool, f"request {req.id} fits on no worker", offer)
        state.count[name] = state.count.get(name, 0) + 1
        slot = _Slot(pool.cpu_millicores, pool.memory_mib, pool.gpu_count)
        slot.take(req.cpu_millicores, req.memory_mib, gpu_count)
        state.slots.setdefault(name, []).append(slot)
        tried.pop(name, None)
        if offer is not None:
            tried.pop(offer_subject(name, offer), None)
        return "started"

    def _pace(self, now: int, st: RequestState, outcome: str) -> int:
        """When the request may next ask for a machine: backed off (exponentially) after a pass that found none."""
        req = st.request
        next_plan = max(st.next_plan_ms, self._next_plan.get(req.id, 0))
        if outcome == "none" and now >= next_plan:
            rounds = self._rounds.get(req.id, 0)
            self._rounds[req.id] = rounds + 1
            next_plan = now + round(self.ctx.backoff_s(rounds) * 1000)
            self._next_plan[req.id] = next_plan
        return next_plan

    def _note_changes(
        self, state: _Pass, request_id: str, next_plan: int, tried: dict[str, str], before: dict[str, str]
    ) -> None:
        """Queue the request's reasons for Redis and a history line for each reason that is new this pass."""
        pools = self.ctx.pools
        # Redis gets the reasons (the give-up message and `levers9 tasks` show them); the
        # backoff alone changes every pass and stays here
        state.notes.append((request_id, next_plan, _format_tried(tried)))
        for subject, reason in tried.items():
            name, _, offer_key = subject.partition(" offer ")
            if before.get(subject) == reason or name not in pools:
                continue
            pool = pools[name]
            if offer_key:
                state.events.append(
                    (request_id, "unavailable", pool, f"offer {offer_key}: {reason}", state.regions.get(subject))
                )
            else:
                state.events.append((request_id, "unavailable", pool, reason, pool.pool.region))

    async def _store_notes(self, state: _Pass) -> None:
        """The pass's reasons to Redis and its history lines to SQL, one write each."""
        if state.notes:
            await self.ctx.backlog.note_plans(state.notes)
        if state.events:
            await self._record(state.events)

    def _walk_order(self, pools: tuple[str, ...], prices: dict[str, float | None]) -> list[str]:
        """A group's pools in the order to start a machine: with ``pool_order: price``, by the price of the
        offers known now (the order stored with the request used the prices its replica knew when it was
        queued, none at all before the first listing); ties and unpriced pools keep the stored order.
        ``prices`` is this pass's memo of each pool's price."""
        if self.ctx.settings.pool_order != "price" or len(pools) < 2:
            return list(pools)
        for name in pools:
            if name not in prices:
                spec, known = self.ctx.pools.get(name), self.offers.get(name)
                prices[name] = pool_price(spec, known.offers) if spec is not None and known is not None else None
        return sorted(pools, key=lambda name: (prices[name] is None, prices[name] or 0.0))

    async def _choose(
        self,
        pool: PoolSpec,
        tried: dict[str, str],
        offer_marks: dict[str, dict[str, str]],
        regions: dict[str, str | None],
    ) -> GpuOffer | str | None:
        """The offer of ``pool`` to start (None: the pool's own shape), or :data:`_NONE_FREE`; notes why in ``tried``.

        ``offer_marks`` and ``regions`` are this pass's: the marks read from Redis once per pool, and the
        region of each offer noted.
        """
        pick = await self.offers.pick(pool, offer_marks)
        for offer, reason in pick.skipped:
            subject = offer_subject(pool.name, offer)
            tried[subject] = reason
            regions[subject] = offer.region
        if not pick.free:
            tried[pool.name] = pick.why or "no offer may be tried"
            return _NONE_FREE
        return pick.offer

    async def _give_up(self, st: RequestState, now: int) -> None:
        ctx = self.ctx
        req = st.request
        finished = await ctx.backlog.finish(req.id, now)
        self._rounds.pop(req.id, None)
        if finished is None or finished.state != "queued":
            return  # placed in the meantime
        waited = (now - req.enqueued_ms) / 1000
        tried = dict(_parse_tried(st.tried))
        await self._latest_refusals(st, tried, now)
        lines = []
        for group in req.groups:
            for name in group.pools:
                pool = ctx.pools.get(name)
                what = pool.describe() if pool else name
                if group.not_before_ms > now:
                    lines.append(f"  - {what}: not tried: its fallback had not opened")
                    continue
                offers = [(s.partition(" offer ")[2], r) for s, r in tried.items() if s.startswith(f"{name} offer ")]
                lines += [f"  - {what} offer {key}: {reason}" for key, reason in offers]
                if name in tried or not offers:
                    reason = tried.get(name) or "no worker had room and no machine could be added"
                    lines.append(f"  - {what}: {reason}")
        message = f"no worker for this request after {waited:.0f} s; tried:\n" + "\n".join(lines)
        log.warning("request %s gave up: %s", req.id, message)
        await ctx.tasks.finish(req.id, "error", error=message)
        await self._record([(req.id, "gave_up", None, message, None)])

    async def _latest_refusals(self, st: RequestState, tried: dict[str, str], now: int) -> None:
        """Add to ``tried`` the refusals that came back after the request's last pass (its last attempt's)."""
        ctx = self.ctx
        for group in st.request.groups:
            if group.not_before_ms > now:
                continue
            for name in group.pools:
                pool = ctx.pools.get(name)
                if pool is None:
                    continue
                mark = await ctx.unavailable.reason(name, pool.gpu, pool.pool.region)
                if mark is not None:
                    tried.setdefault(name, f"unavailable: {mark}")
                known = self.offers.get(name)
                if known is None or not known.offers:
                    continue
                marks = await ctx.unavailable.offer_marks(name, known.offers)
                for offer in known.offers:
                    if offer.key in marks:
                        tried.setdefault(offer_subject(name, offer), marks[offer.key])

    async def _record(self, events: list[_Event]) -> None:
        """Store the lines; returns once they are stored (through the history writer, after every line before)."""
        lines = [
            PlacementEvent(
                task_id=rid,
                outcome=outcome,
                pool=pool.name if pool else None,
                gpu=pool.gpu if pool else None,
                region=region,
                reason=reason,
            )
            for rid, outcome, pool, reason, region in events
        ]
        if self.history is None:
            await self.ctx.tasks.record(lines)
        else:
            await self.history.written(self.history.add(lines))


def _parse_tried(lines: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        pool, _, reason = line.partition("\t")
        out.append((pool, reason))
    return out


def _format_tried(tried: dict[str, str]) -> list[str]:
    return [f"{pool}\t{reason.replace(chr(10), ' ')}" for pool, reason in tried.items()]
