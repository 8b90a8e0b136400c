"""A lease in Redis, so only one controlplane replica starts and stops machines at a time.

Placement is safe on every replica at once (it is one Lua step), but deciding
to start a machine is not: two replicas seeing the same unmet request would
start two. The holder renews well within the TTL; a replica that dies loses the
lease after the TTL and another takes over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Lease"]

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    def __init__(self, redis: Redis, key: str, holder: str, ttl_s: float) -> None:
        self.redis = redis
        self.key = key
        self.holder = holder
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def acquire(self) -> bool:
        """Take the lease, or keep it if held; False when another replica holds it."""
        if await self._renew(keys=[self.key], args=[self.holder, self.ttl_ms]):
            return True
        return bool(await self.redis.set(self.key, self.holder, nx=True, px=self.ttl_ms))

    async def release(self) -> None:
        await self._release(keys=[self.key], args=[self.holder])

    async def held(self) -> bool:
        """Whether this replica holds the lease right now, read without taking or renewing it."""
        holder = await self.redis.get(self.key)
        if isinstance(holder, bytes):
            holder = holder.decode()
        return holder == self.holder
