"""Listening to one Redis pub/sub channel for as long as a replica runs.

Replicas tell each other things over pub/sub (wake-ups, agent orders and
acknowledgements). A subscription that breaks (Redis restarted, a network
blip) is opened again after a second, for ever, until the listening task is
cancelled; what was published while it was down is lost, so every use of a
channel must tolerate a lost message (pollers catch up, orders are sent again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from levers9.cancelling import raise_if_cancelling

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["listen"]

log = logging.getLogger(__name__)


async def listen(
    redis: Redis,
    channel: str,
    handle: Callable[[str], Awaitable[None] | None],
    *,
    what: str,
    subscribed: asyncio.Event | None = None,
) -> None:
    """Call ``handle`` with each message's data, for ever; ``subscribed`` is set once the first subscription holds."""
    while True:
        try:
            pubsub = redis.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(channel)
            if subscribed is not None:
                subscribed.set()
            try:
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        outcome = handle(str(message.get("data", "")))
                        if outcome is not None:
                            await outcome
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_if_cancelling(exc)  # redis-py can turn the listener's cancellation into a connection error
            log.warning("%s subscription failed, retrying: %s", what, exc)
            await asyncio.sleep(1.0)
