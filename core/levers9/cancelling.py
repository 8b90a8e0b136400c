"""Telling a cancellation that a client library turned into an error from a real error.

A background loop that logs an error and goes on must not go on when the error is
its own cancellation in disguise: some clients (redis-py among them) catch the
``CancelledError`` raised inside a read and raise a connection error instead. The
loop's task still has the cancellation pending (``Task.cancelling()`` counts it
until something calls ``uncancel``), so a loop that checks it ends as it was
asked to; one that does not runs on, and whoever awaits its end after cancelling
it (a hub's close, a server's stop) waits for ever.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelling"]


def raise_if_cancelling(exc: BaseException) -> None:
    """Raise ``CancelledError`` (from ``exc``) when the current task has a cancellation pending; else nothing."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
