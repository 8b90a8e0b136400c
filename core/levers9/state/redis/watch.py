"""Noticing that a configured Redis may have lost state: a failover, a restart, a flush.

The embedded Redis has its supervisor (:mod:`levers9.state.redis.supervisor`); a configured one is run
by the operator, and can change under a live controlplane in three ways that lose writes:

* Sentinel promotes a replica (the primary died): what the old primary had not yet sent the replica
  (replication is asynchronous: the last milliseconds of writes) is gone;
* the server restarts: without persistence it comes back empty, with it as of its last save;
* someone empties it (``FLUSHALL``).

:func:`watch` asks the server every :data:`INTERVAL_S` for its ``run_id`` (new in every server process, so
new on the promoted replica and after a restart) and for a marker key it writes (gone after a flush or a
restart without persistence). When either changed, ``rebuild`` runs: the controlplane's steps that fill
Redis from SQL at start (every one of them leaves alone what Redis still knows), so a call that SQL holds
and Redis lost is queued again instead of waiting for ever. Invariants:

* ``rebuild`` runs once per change seen, and again at the next look if it failed (the change is only
  taken as handled once it succeeded); never while the server does not answer (a failover in progress:
  commands fail, callers retry, and the look after the new primary answers sees the change).
* The first look only records what it sees: a controlplane that starts rebuilds anyway.
* A server that refuses a look (an ACL user without ``INFO``) is reported once as a warning; the
  watch keeps asking, and works once it is allowed.
* A look costs two commands (``INFO server``, ``GET``) and one ``SET``; the marker expires a day after
  the last look, so a controlplane that died leaves nothing behind for long.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from levers9.cancelling import raise_if_cancelling

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["INTERVAL_S", "watch"]

log = logging.getLogger(__name__)

#: how often the server is asked who it is
INTERVAL_S = 1.0


async def watch(
    redis: Redis, prefix: str, rebuild: Callable[[], Awaitable[None]], *, interval_s: float = INTERVAL_S
) -> None:
    """Run ``rebuild`` whenever the server behind ``redis`` may have lost writes (see the module docstring)."""
    marker_key = f"{prefix}watch:{secrets.token_hex(8)}"  # one per controlplane: replicas never share it
    seen: str | None = None  # the run_id of the server the marker was last written to
    refused = False  # whether the server refused a look (said once)
    from redis.exceptions import ResponseError

    while True:
        try:
            run_id = str((await redis.info("server"))["run_id"])
            marker = await redis.get(marker_key)
            if seen is not None and (run_id != seen or marker is None):
                why = "is another server process (a failover or a restart)" if run_id != seen else "lost its data"
                log.warning("Redis %s: rebuilding what it may have lost from SQL", why)
                try:
                    await rebuild()
                except Exception as exc:
                    raise_if_cancelling(exc)
                    log.warning("rebuilding the Redis state failed, trying again: %s", exc)
                    await asyncio.sleep(interval_s)
                    continue
                log.warning("rebuilt the Redis state from SQL after the change")
            # written after a rebuild, so a failed one is tried again at the next look
            await redis.set(marker_key, run_id, ex=86400)
            seen = run_id
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_if_cancelling(exc)
            if isinstance(exc, ResponseError) and not refused:  # answered, but no: an ACL user without INFO, say
                refused = True
                log.warning(
                    "Redis refuses what the watch for lost state asks (INFO server, GET/SET %s): %s; "
                    "a failover or restart that loses writes goes unnoticed until a replica restarts",
                    marker_key,
                    exc,
                )
            else:
                log.debug("looking at the Redis server failed (it is away): %s", exc)
        await asyncio.sleep(interval_s)
