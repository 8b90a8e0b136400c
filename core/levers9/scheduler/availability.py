"""Marks for (pool, GPU type, region) that a provider just said it cannot supply.

Clouds run out of a GPU type for minutes to hours. Once a provider answers
"no capacity" or "no quota", asking again on every request only adds latency, so
the answer is remembered for a TTL (``scheduler.unavailable_ttl_s``) in Redis,
where every controlplane replica sees it, and the next candidate is tried at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Unavailable"]


class Unavailable:
    def __init__(self, redis: Redis, prefix: str = "l9:") -> None:
        self.redis = redis
        self.prefix = prefix

    def _key(self, pool: str, gpu: str | None, region: str | None) -> str:
        return f"{self.prefix}unavail:{pool}:{gpu or 'cpu'}:{region or '-'}"

    async def mark(self, pool: str, gpu: str | None, region: str | None, reason: str, ttl_s: float) -> None:
        await self.redis.set(self._key(pool, gpu, region), reason, px=max(1, round(ttl_s * 1000)))

    async def reason(self, pool: str, gpu: str | None, region: str | None) -> str | None:
        """Why the combination is marked unavailable, or None when it may be tried."""
        value = await self.redis.get(self._key(pool, gpu, region))
        return None if value is None else str(value)
