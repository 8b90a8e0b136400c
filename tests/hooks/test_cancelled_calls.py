"""A hook's caller that is cancelled is cancelled, even in the instant its hook returns.

Python 3.11's ``asyncio.wait_for`` returns the awaited result, swallowing the cancellation, when the
result and the cancellation reach the loop in the same turn; a caller that meant to stop (a build
being cancelled, a worker shutting down) then went on as if nothing had happened. The lane waits
with ``asyncio.timeout`` instead, which keeps the cancellation.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from levers9.hooks.executors import PluginLane, RanPastDeadline


async def test_a_caller_cancelled_as_its_hook_returns_is_cancelled() -> None:
    lane = PluginLane("plugin", 1)
    loop = asyncio.get_running_loop()
    caller: asyncio.Future[str] | None = None

    def hook() -> str:
        time.sleep(0.3)  # the caller, told the hook started, now waits for its answer
        # The loop is kept busy while the answer and then the cancellation arrive, so it handles both in
        # one turn, the answer first: the order in which wait_for lost the cancellation.
        loop.call_soon_threadsafe(time.sleep, 2.0)
        cancel = caller.cancel if caller is not None else None
        assert cancel is not None
        threading.Timer(0.2, lambda: loop.call_soon_threadsafe(cancel)).start()
        return "answer"

    try:
        caller = asyncio.ensure_future(lane.run(hook, 30))
        with pytest.raises(asyncio.CancelledError):
            await caller
    finally:
        lane.close()


async def test_a_hook_raising_timeout_error_is_not_a_deadline_passed() -> None:
    lane = PluginLane("plugin", 1)

    def hook() -> None:
        time.sleep(0.05)  # still running when the caller starts waiting for the answer
        raise TimeoutError("the hook's own")

    try:
        with pytest.raises(TimeoutError, match="the hook's own"):
            await lane.run(hook, 30)
        with pytest.raises(RanPastDeadline):
            await lane.run(lambda: time.sleep(1), 0.1)
    finally:
        lane.close()
