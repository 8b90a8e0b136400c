"""Marks for what a provider just said it cannot supply: one offer of a pool, or the whole pool.

Clouds run out of a machine type in one zone for minutes to hours while the
next zone, or the next type, still has some. Once a provider answers "no
capacity" or "no quota" for an offer, asking again on every request only adds
latency, so the answer is remembered for a TTL (``scheduler.unavailable_ttl_s``)
in Redis, where every controlplane replica sees it, and the pool's next offer,
then the next pool, is tried at once.

Two kinds of mark, both holding the provider's reason as text:

- an offer mark, keyed by pool and :attr:`levers9.hooks.types.GpuOffer.key`
  (instance type, region, zone, spot): a capacity or quota miss on that offer,
  or a spot preemption there; the pool's other offers stay usable;
- a region mark, kept beside the offer marks of the pool under
  :func:`region_key`: a quota the provider says holds for a whole region
  (``QuotaExceeded`` with ``scope="region"``: EC2's ``VcpuLimitExceeded``,
  OCI's ``LimitExceeded``); every offer of the pool in that region is skipped
  with it, where trying zone after zone would only meet the same limit;
- a pool mark, keyed by (pool, GPU type, region): a capacity miss of a pool
  that has no offers (a CPU pool, a provider without ``levers9_gpu_offers``),
  a quota of the whole account, and any refusal that no other offer of the
  pool would escape (rejected credentials, a denied permission, a plugin bug
  or deadline).

A mark that lapses is simply gone: the next planner pass tries the offer again.
A Redis error propagates to the caller (the planner logs it and retries on its
next pass); it never counts as "available".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from levers9.hooks.types import GpuOffer

__all__ = ["Unavailable", "region_key"]


def region_key(region: str | None) -> str:
    """The name a region mark goes under among a pool's offer marks (no offer key starts with ``@``)."""
    return f"@region/{region or '-'}"


class Unavailable:
    def __init__(self, redis: Redis, prefix: str = "l9:") -> None:
        self.redis = redis
        self.prefix = prefix

    def _key(self, pool: str, gpu: str | None, region: str | None) -> str:
        return f"{self.prefix}unavail:{pool}:{gpu or 'cpu'}:{region or '-'}"

    def _offer_key(self, pool: str, offer: str) -> str:
        return f"{self.prefix}unavail-offer:{pool}:{offer}"

    async def mark(self, pool: str, gpu: str | None, region: str | None, reason: str, ttl_s: float) -> None:
        """Skip the whole pool (of this GPU type, in this region) for ``ttl_s`` seconds."""
        await self.redis.set(self._key(pool, gpu, region), reason, px=_px(ttl_s))

    async def reason(self, pool: str, gpu: str | None, region: str | None) -> str | None:
        """Why the combination is marked unavailable, or None when it may be tried."""
        value = await self.redis.get(self._key(pool, gpu, region))
        return None if value is None else str(value)

    async def mark_offer(self, pool: str, offer: str, reason: str, ttl_s: float) -> None:
        """Skip offer ``offer`` (a ``GpuOffer.key``) of ``pool`` for ``ttl_s`` seconds; its other offers stay."""
        await self.redis.set(self._offer_key(pool, offer), reason, px=_px(ttl_s))

    async def mark_region(self, pool: str, region: str | None, reason: str, ttl_s: float) -> None:
        """Skip every offer of ``pool`` in ``region`` for ``ttl_s`` seconds (a quota of that region)."""
        await self.mark_offer(pool, region_key(region), reason, ttl_s)

    async def offer_marks(self, pool: str, offers: Sequence[GpuOffer]) -> dict[str, str]:
        """The offers of ``pool`` among ``offers`` that may not be tried, by offer key, with why: each one's own
        mark, else its region's; one round trip."""
        keys = list(dict.fromkeys([o.key for o in offers] + [region_key(o.region) for o in offers]))
        found = await self.offer_reasons(pool, keys)
        out = {}
        for offer in offers:
            reason = found.get(offer.key) or found.get(region_key(offer.region))
            if reason is not None:
                out[offer.key] = reason
        return out

    async def offer_reasons(self, pool: str, offers: Sequence[str]) -> dict[str, str]:
        """The offers of ``pool`` among ``offers`` that are marked, with why; one round trip."""
        if not offers:
            return {}
        values = await self.redis.mget([self._offer_key(pool, key) for key in offers])
        return {key: str(value) for key, value in zip(offers, values, strict=True) if value is not None}


def _px(ttl_s: float) -> int:
    return max(1, round(ttl_s * 1000))
