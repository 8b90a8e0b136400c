"""A replica that was stopped (SIGSTOP) does not trust the worker sessions it held.

The sessions' shared timer notices that its sleep overran by more than ``STALE_S`` (the monotonic clock runs
on while a process is stopped) and ends every session it holds; a session also checks before each take. The
stop is played by moving the module's monotonic clock forward while the timer sleeps.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from levers9.controlplane import grpc_worker


class _Session:
    worker_id = "wkr_1"

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def outdated(self) -> None:
        self.ended.set()


def _sessions(monkeypatch: pytest.MonkeyPatch, skipped: list[float]) -> Any:
    monkeypatch.setattr(grpc_worker, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + sum(skipped)))
    scheduler = SimpleNamespace(worker_keepalive_s=30.0)
    dataplane: Any = SimpleNamespace(services=SimpleNamespace(config=SimpleNamespace(scheduler=scheduler)))
    sessions = grpc_worker._Sessions(dataplane)

    async def tick() -> None:  # no Redis here: only the timer's own bookkeeping is tested
        return None

    monkeypatch.setattr(sessions, "_tick", tick)
    return sessions


async def test_a_replica_stopped_for_longer_than_stale_s_ends_the_sessions_it_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    skipped: list[float] = []
    sessions = _sessions(monkeypatch, skipped)
    session = _Session()
    sessions.attach(session)
    try:
        await asyncio.sleep(1.5)  # a tick or so: nothing stale in a timer that keeps time
        assert not sessions.stale()
        assert not session.ended.is_set()
        skipped.append(40.0)  # stopped for 40 s while the timer slept
        assert sessions.stale(), "a session about to take work sees it at once"
        await asyncio.wait_for(session.ended.wait(), 5)
    finally:
        sessions.detach(session)
    assert not sessions.stale(), "no timer, no verdict"
