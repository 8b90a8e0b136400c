"""Which replica holds each worker's tunnel, where each replica is reached by the others, and their credential.

A worker behind NAT holds its tunnel to one replica; a gateway request for
its containers may arrive at any. The replica that gets it relays it to the
holder (:class:`levers9.services.tunnels.TunnelRegistry` decides, the
``Replica.Relay`` gRPC call carries the bytes). This module is what the
replicas share for that, in Redis:

* ``<prefix>tunnel:<worker_id>`` -> the name of the replica holding the
  worker's tunnel, set when the tunnel opens, renewed every ``ttl_s / 3``
  while it lasts, deleted when it ends (only by its holder: a newer tunnel on
  another replica is not undone by the older one ending);
* ``<prefix>replica:<name>:relay`` -> ``host:port``, the gRPC address other
  replicas reach this one at (``listen.replica_address``), renewed the same way.

Both expire after ``ttl_s`` without renewal, so a replica that died (SIGKILL,
a lost host) stops being named within that time; until then a relay to it
fails and the caller waits for the worker to open its tunnel again somewhere
(:class:`RelayFailed` is what such a failure raises).

The credential (:func:`replica_credentials`) is an HMAC-SHA256 of a fixed
purpose label under each secret key of ``state.secret_key_file``, which every
replica shares: a replica sends the one of its first (current) key and
accepts any of its keys' (so a key rotation does not split the replicas),
compared in constant time (:func:`credential_accepted`). Nothing else opens a
relay: a user's or worker's token is never accepted there.

A Redis failure while recording is logged and retried at the next renewal; it
never ends a tunnel. A Redis failure while looking a holder up is the caller's
(the gateway answers 502 as for any worker it cannot reach).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from levers9.cancelling import raise_if_cancelling
from levers9.state.crypto import load_keys

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "CREDENTIAL_METADATA",
    "RelayFailed",
    "TunnelHolders",
    "configured_credentials",
    "credential_accepted",
    "replica_credentials",
]

log = logging.getLogger(__name__)

#: the gRPC metadata a replica's relay call carries its credential in
CREDENTIAL_METADATA = "x-levers9-replica"
_PURPOSE = b"levers9 replica-to-replica relay, v1"
#: how long a holder or an address stays named without renewal
TTL_S = 30.0

# delete the key only if it still names this replica
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RelayFailed(ConnectionError):
    """A relay to the replica named as holder did not open: it is gone, holds no tunnel of the worker now,
    or refused this replica's credential. The caller waits for the worker's tunnel and looks again."""


def replica_credentials(keys: Sequence[bytes]) -> list[str]:
    """The credential of each secret key, the first key's first (the one a replica sends)."""
    return [hmac.new(key, _PURPOSE, hashlib.sha256).hexdigest() for key in keys]


def configured_credentials(secret_key_file: str | None, data_dir: str) -> list[str]:
    """:func:`replica_credentials` of the keys ``state.secret_key_file`` holds (the shared secret key)."""
    return replica_credentials(load_keys(secret_key_file, data_dir))


def credential_accepted(given: str, accepted: Sequence[str]) -> bool:
    """Whether ``given`` is one of ``accepted``, each compared in constant time."""
    found = False
    for credential in accepted:
        found |= hmac.compare_digest(given.encode(), credential.encode())
    return found and bool(given)


class TunnelHolders:
    """This replica's entries in the shared directory of tunnel holders and replica addresses."""

    def __init__(self, redis: Redis, *, replica: str, address: str, prefix: str = "l9:", ttl_s: float = TTL_S):
        self.redis = redis
        self.replica = replica
        self.address = address
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._task: asyncio.Task[None] | None = None

    def _holder_key(self, worker_id: str) -> str:
        return f"{self.prefix}tunnel:{worker_id}"

    def _address_key(self, replica: str) -> str:
        return f"{self.prefix}replica:{replica}:relay"

    async def held(self, worker_id: str) -> None:
        """Record that this replica holds ``worker_id``'s tunnel (a Redis failure is logged: renewal retries)."""
        try:
            await self.redis.set(self._holder_key(worker_id), self.replica, px=int(self.ttl_s * 1000))
        except Exception as exc:
            raise_if_cancelling(exc)
            log.warning("cannot record worker %s's tunnel as held here: %s", worker_id, exc)

    async def released(self, worker_id: str) -> None:
        """The tunnel ended: forget it, unless another replica holds the worker's newer one."""
        try:
            await self.redis.eval(_RELEASE, 1, self._holder_key(worker_id), self.replica)
        except Exception as exc:
            raise_if_cancelling(exc)
            log.warning("cannot forget worker %s's tunnel (it expires in %g s): %s", worker_id, self.ttl_s, exc)

    async def holder(self, worker_id: str) -> tuple[str, str] | None:
        """``(replica, address)`` of the replica holding ``worker_id``'s tunnel; None when none is named."""
        raw = await self.redis.get(self._holder_key(worker_id))
        if raw is None:
            return None
        replica = raw.decode() if isinstance(raw, bytes) else str(raw)
        if replica == self.replica:
            return replica, self.address
        address = await self.redis.get(self._address_key(replica))
        if address is None:
            return None
        return replica, address.decode() if isinstance(address, bytes) else str(address)

    async def renew(self, held: Iterable[str]) -> None:
        """Renew this replica's address and every tunnel it holds (one round trip)."""
        ttl_ms = int(self.ttl_s * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._address_key(self.replica), self.address, px=ttl_ms)
            for worker_id in held:
                pipe.set(self._holder_key(worker_id), self.replica, px=ttl_ms)
            await pipe.execute()

    def start(self, held: Callable[[], Iterable[str]]) -> None:
        """Renew every ``ttl_s / 3`` in the background until :meth:`close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._renewing(held), name="tunnel-holders")

    async def _renewing(self, held: Callable[[], Iterable[str]]) -> None:
        while True:
            try:
                await self.renew(list(held()))
            except Exception as exc:
                raise_if_cancelling(exc)
                log.warning("cannot renew this replica's tunnels and relay address in Redis: %s", exc)
            await asyncio.sleep(self.ttl_s / 3)

    async def close(self, held: Iterable[str] = ()) -> None:
        """Stop renewing, and take this replica's address and tunnels out of the directory."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.redis.delete(self._address_key(self.replica))
        for worker_id in held:
            await self.released(worker_id)
