"""Each pool's offers, asked of its provider ahead of need and kept for ``scheduler.offers_ttl_s``.

An offer (:class:`levers9.hooks.types.GpuOffer`) is one kind of machine a
provider can start for a pool: an instance type in a region and zone, spot or
not, with a price when the provider publishes one. The planner walks a pool's
offers in order and starts the first one not marked unavailable (see
:mod:`levers9.scheduler.availability`); this module only knows what the
providers offer.

Invariants:

- the planner never waits on a provider's offers longer than
  :data:`FIRST_ASK_TIMEOUT_S`, and only for a pool never asked before; the
  ask itself goes on in the background under the hook's own deadline (a slow
  listing, 7.5 s of EC2 instance types, is not cut short) and its answer wakes
  the planner. After that the lease holder refreshes answers older than the
  TTL in the background (:meth:`OfferCache.refresh_in_background`), every pool
  at once, so a slow provider delays only its own pools' refresh;
- a GPU pool whose provider has ``levers9_gpu_offers`` is never started
  without an offer while its provider has not answered yet (the first ask is
  still running, or failed): it waits, and its pick says why ("its offers are
  still being listed"; "listing its offers failed: ..."), which the planner
  puts in the placement history. Starting "the pool's own shape" there would
  let the provider guess the machine (a cloud refuses without an instance
  type; a cluster puts an L4 pool's worker on any node). A pool that never
  answered is asked again every :data:`UNANSWERED_RETRY_S`, not once per TTL;
- a refresh that fails (an error, a deadline) keeps the last good answer and
  records the provider's error with it (:attr:`PoolOffers.error`), logged
  once per failure;
- a CPU pool, a pool whose provider has no ``levers9_gpu_offers`` and a pool
  whose provider answered that it offers nothing have no offers: the planner's
  single candidate for them is the pool's own shape (``offer=None``), and the
  provider's provision decides (and names why it cannot);
- only offers that match the pool are kept: its GPU type and count, and one of
  its regions when it names any. Others are dropped and counted
  (:attr:`PoolOffers.dropped`), since a machine of another shape would break
  the scheduler's accounting of what the pool's workers hold;
- the order to try is the provider's (``strategy: preference``) or the lowest
  price first, offers without a price last and in the provider's order
  (``strategy: cheapest``); offers the provider itself reports ``unavailable``
  are never tried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from levers9.hooks.types import Availability, GpuOffer
from levers9.scheduler.context import Context
from levers9.scheduler.pools import PoolSpec

__all__ = ["FIRST_ASK_TIMEOUT_S", "UNANSWERED_RETRY_S", "OfferCache", "Pick", "PoolOffers", "matching", "ordered"]

log = logging.getLogger(__name__)

#: the most the planner waits for a pool's first answer; later answers come from the background refresh
FIRST_ASK_TIMEOUT_S = 5.0
#: how often a pool whose provider never answered (a failure, a deadline) is asked again
UNANSWERED_RETRY_S = 10.0


@dataclass(frozen=True)
class PoolOffers:
    """What is known of one pool's offers."""

    #: the last good answer, as it matched the pool (empty: the pool has no offers)
    offers: tuple[GpuOffer, ...] = ()
    #: when the provider gave that answer (epoch seconds); None when it never answered
    answered_at: float | None = None
    #: when the provider was last asked, answered or not (epoch seconds)
    asked_at: float = 0.0
    #: why the last ask failed, in the provider's words; None when it answered
    error: str | None = None
    #: offers of the last answer dropped as not matching the pool (another GPU type, count or region)
    dropped: int = 0


@dataclass(frozen=True)
class Pick:
    """What to start for a pool now (see :meth:`OfferCache.pick`)."""

    #: the offer to start; None with ``free``: the pool's own shape (it has no offers)
    offer: GpuOffer | None
    #: False when the pool has offers and none may be tried now (``why`` says so)
    free: bool = True
    #: offers passed over, with the reason each is marked unavailable
    skipped: tuple[tuple[GpuOffer, str], ...] = ()
    why: str | None = None


def matching(pool: PoolSpec, offers: Sequence[GpuOffer]) -> tuple[list[GpuOffer], int]:
    """The offers that start a machine of ``pool``'s shape in one of its regions, and how many others there were."""
    regions = set(pool.pool.regions)
    kept = [
        o
        for o in offers
        if o.gpu == pool.gpu
        and o.gpu_count == pool.gpu_count
        and (not regions or o.region is None or o.region in regions)
    ]
    return kept, len(offers) - len(kept)


def ordered(pool: PoolSpec, offers: Sequence[GpuOffer]) -> list[GpuOffer]:
    """The offers to try, in the order to try them (see the module docstring)."""
    usable = [o for o in offers if o.availability is not Availability.UNAVAILABLE]
    if pool.pool.strategy == "cheapest":
        # sorted() is stable: equal prices, and every unpriced offer, keep the provider's order
        usable.sort(key=lambda o: (o.price_per_hour is None, o.price_per_hour or 0.0))
    return usable


class OfferCache:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._known: dict[str, PoolOffers] = {}
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._refresh: asyncio.Task[None] | None = None

    def offers_hook(self, pool: PoolSpec) -> bool:
        """Whether ``pool`` can have offers at all: a GPU pool whose provider implements ``levers9_gpu_offers``."""
        return pool.gpu is not None and self.ctx.hooks.makes_offers(pool.pool.provider)

    def get(self, name: str) -> PoolOffers | None:
        """What is known of pool ``name``'s offers; None when it was never asked."""
        return self._known.get(name)

    async def candidates(self, pool: PoolSpec) -> list[GpuOffer | None] | str:
        """What the planner may start for ``pool``, in order: ``[None]`` (its own shape) when it has no offers.

        An empty list means the pool has offers but the provider reports every one ``unavailable``; a
        string, that the provider has not answered yet, and why (the pool waits for its offers).
        """
        if not self.offers_hook(pool):
            return [None]
        known = self._known.get(pool.name)
        if known is None:
            await self._first_ask(pool)
            known = self._known.get(pool.name)
        if known is None or known.answered_at is None:
            return _unanswered(pool, known)
        if not known.offers:
            return [None]
        return list(ordered(pool, known.offers))

    async def pick(self, pool: PoolSpec, marks: dict[str, dict[str, str]] | None = None) -> Pick:
        """The first of ``pool``'s offers not marked unavailable (see :mod:`levers9.scheduler.availability`).

        ``marks`` caches the marks read from Redis per pool, for callers that pick many times in one pass.
        """
        offers = await self.candidates(pool)
        if isinstance(offers, str):
            return Pick(None, free=False, why=offers)
        if offers == [None]:
            return Pick(None)
        if not offers:
            return Pick(None, free=False, why=await self._all_unavailable(pool))
        known = marks if marks is not None else {}
        if pool.name not in known:
            known[pool.name] = await self.ctx.unavailable.offer_marks(pool.name, [o for o in offers if o is not None])
        marked = known[pool.name]
        skipped: list[tuple[GpuOffer, str]] = []
        for offer in offers:
            assert offer is not None
            reason = marked.get(offer.key)
            if reason is None:
                return Pick(offer, skipped=tuple(skipped))
            skipped.append((offer, reason))
        return Pick(None, free=False, skipped=tuple(skipped), why=f"every offer is unavailable ({len(offers)} tried)")

    async def _all_unavailable(self, pool: PoolSpec) -> str:
        """Why nothing of ``pool`` can start: the provider says so, with the last miss levers9 saw, if one is
        remembered (a machine that never started, and why), so the call's history keeps the provider's words."""
        why = "the provider reports every offer of the pool unavailable"
        known = self._known.get(pool.name)
        marked = await self.ctx.unavailable.offer_marks(pool.name, known.offers) if known is not None else {}
        return f"{why} (last miss: {next(iter(marked.values()))})" if marked else why

    def stale(self) -> list[PoolSpec]:
        """The pools whose offers are due to be asked again (older than the TTL, or never asked)."""
        now = self.ctx.clock()
        ttl = self.ctx.settings.offers_ttl_s
        out = []
        for pool in self.ctx.pools.values():
            if not self.offers_hook(pool) or pool.name in self._asking:
                continue
            known = self._known.get(pool.name)
            if known is None or now - known.asked_at >= (ttl if known.answered_at is not None else UNANSWERED_RETRY_S):
                out.append(pool)
        return out

    async def refresh(self, pools: Sequence[PoolSpec] | None = None, *, timeout: float | None = None) -> None:
        """Ask ``pools`` (default: every stale pool) for their offers at once; failures are kept per pool."""
        for name in [n for n in self._known if n not in self.ctx.pools]:
            del self._known[name]  # the pool was removed (a detached cluster)
        todo = self.stale() if pools is None else list(pools)
        tasks = [self._ask(pool, timeout) for pool in todo]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def refresh_in_background(self) -> None:
        """Start a refresh of the stale pools unless one is running; for the lease holder's loop."""
        if self._refresh is not None and not self._refresh.done():
            return
        if not self.stale():
            return
        self._refresh = asyncio.create_task(self.refresh(), name="offers refresh")
        self._refresh.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Stop every refresh in flight (the replica is stopping, or lost the lease)."""
        tasks = [*self._asking.values(), *([self._refresh] if self._refresh is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._refresh = None

    # ------------------------------------------------------------------ asking

    async def _first_ask(self, pool: PoolSpec) -> None:
        # the ask runs under the hook's own deadline; the planner waits for it only this long, and the
        # answer, when it comes, wakes the planner (see _answer)
        task = self._ask(pool, None)
        await asyncio.wait({task}, timeout=FIRST_ASK_TIMEOUT_S)

    def _ask(self, pool: PoolSpec, timeout: float | None) -> asyncio.Task[None]:
        """One ask of ``pool``'s provider, shared by whoever needs it while it runs."""
        running = self._asking.get(pool.name)
        if running is not None:
            return running
        task = asyncio.create_task(self._answer(pool, timeout), name=f"offers of {pool.name}")
        self._asking[pool.name] = task
        task.add_done_callback(lambda _: self._asking.pop(pool.name, None))
        return task

    async def _answer(self, pool: PoolSpec, timeout: float | None) -> None:
        ctx = self.ctx
        asked_at = ctx.clock()
        previous = self._known.get(pool.name, PoolOffers())
        try:
            offers = await ctx.hooks.gpu_offers(pool.pool, timeout=timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            if error != previous.error:
                kept = "keeping its last answer" if previous.answered_at is not None else "it waits for them"
                log.warning("pool %s: asking %s for offers failed, %s: %s", pool.name, pool.pool.provider, kept, error)
            self._known[pool.name] = PoolOffers(
                offers=previous.offers,
                answered_at=previous.answered_at,
                asked_at=asked_at,
                error=error,
                dropped=previous.dropped,
            )
            return
        kept_offers, dropped = matching(pool, offers)
        if dropped and dropped != previous.dropped:
            log.warning(
                "pool %s: %s offered %d machines not of the pool's shape (%s x%d%s); they are ignored",
                pool.name,
                pool.pool.provider,
                dropped,
                pool.gpu,
                pool.gpu_count,
                f" in {', '.join(pool.pool.regions)}" if pool.pool.regions else "",
            )
        self._known[pool.name] = PoolOffers(
            offers=tuple(kept_offers), answered_at=asked_at, asked_at=asked_at, error=None, dropped=dropped
        )
        if previous.answered_at is None:
            ctx.planner_wanted.set()  # requests waiting for this pool's first answer may go on now


def _unanswered(pool: PoolSpec, known: PoolOffers | None) -> str:
    """Why ``pool`` waits: its provider has not answered for its offers yet (see the module docstring)."""
    if known is None or known.error is None:
        return f"its offers are still being listed by {pool.pool.provider}; it waits for them"
    return f"listing its offers failed ({known.error}); it waits for them and asks again"


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("refreshing offers failed: %s", task.exception())
