"""A lease in Redis, so only one controlplane replica starts and stops machines at a time; fenced.

Placement is safe on every replica at once (it is one Lua step), but deciding
to start a machine is not: two replicas seeing the same unmet request would
start two. The holder renews well within the TTL; a replica that dies loses the
lease after the TTL and another takes over.

**Fencing.** A replica that is frozen (SIGSTOP, a host that stops answering)
and then resumes still believes it holds the lease: its loops carry on from
where they stopped, with what they had read before. So every acquisition
takes a **fencing token**, a counter in Redis (``<key>:token``) incremented in
the same Lua step that sets the holder, and the holder's acts are checked
against it:

- :meth:`Lease.current` says whether this replica's token is still the one in
  Redis *and* the lease is still its own (one round trip); the holder asks it
  right before each provider call (starting or terminating a machine), so a
  replica that resumes after losing the lease does not act. A check right
  before a provider call leaves the call's own length unfenced (a provider
  cannot compare tokens); the window is that call, not the freeze.
- :meth:`Lease.held` is what the metrics port shows at each scrape: read from
  Redis then, never remembered, so exactly one replica reads 1 whatever the
  others believed before a freeze.

Invariants: the token only grows (the counter key has no TTL, and a release
deletes the holder only); renewing never changes it; a renewal that finds the
lease held under another token (this replica lost it and took it again) takes
that token, since it was this replica's own acquisition. Errors (Redis
unreachable) propagate: an act whose fence cannot be checked is not done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Lease", "LeaseLost"]

# KEYS: holder key, token key. ARGV: holder, ttl ms. Returns the token held, or 0 when another replica holds it.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"""
# KEYS: holder key, token key. ARGV: holder, token. 1 when the lease is this holder's under this token.
_CURRENT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaseLost(Exception):
    """An act of the lease's holder was refused: this replica's fencing token is no longer current."""


class Lease:
    def __init__(self, redis: Redis, key: str, holder: str, ttl_s: float) -> None:
        self.redis = redis
        self.key = key
        #: the fencing counter: incremented at each acquisition, never expires
        self.token_key = f"{key}:token"
        self.holder = holder
        self.ttl_ms = max(1, round(ttl_s * 1000))
        #: the fencing token of this replica's last acquisition or renewal (0: it has not held the lease)
        self.token = 0
        self._acquire = redis.register_script(_ACQUIRE)
        self._current = redis.register_script(_CURRENT)
        self._release = redis.register_script(_RELEASE)

    async def acquire(self) -> bool:
        """Take the lease, or renew it if held; False when another replica holds it.

        A new acquisition takes the next fencing token; a renewal keeps the one in Redis.
        """
        token = int(await self._acquire(keys=[self.key, self.token_key], args=[self.holder, self.ttl_ms]))
        if token:
            self.token = token
            return True
        self.token = 0
        return False

    async def current(self) -> bool:
        """Whether this replica holds the lease now under the token it took: the check before each act."""
        if not self.token:
            return False
        return bool(await self._current(keys=[self.key, self.token_key], args=[self.holder, self.token]))

    async def release(self) -> None:
        self.token = 0
        await self._release(keys=[self.key], args=[self.holder])

    async def held(self) -> bool:
        """Whether this replica holds the lease right now, read without taking or renewing it."""
        holder = await self.redis.get(self.key)
        if isinstance(holder, bytes):
            holder = holder.decode()
        return holder == self.holder
