"""A configured Redis that may have lost writes is noticed, and the state rebuilt once per change.

A real ``redis-server`` on a TCP port: left alone, nothing is rebuilt; emptied (FLUSHALL), rebuilt once;
SIGKILLed and started again on the same port (a new ``run_id``, as a promoted replica has), rebuilt once,
after the server answers again; a rebuild that fails is tried again until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from levers9.state.redis.connect import connect
from levers9.state.redis.watch import watch
from tests.fixtures.ports import free_port
from tests.fixtures.redis import redis_server_process

pytestmark = pytest.mark.timeout(60)

LOOK_S = 0.05


async def _until(what: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not what():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_flush_or_a_new_server_process_has_the_state_rebuilt_once(tmp_path: Path) -> None:
    port = free_port()
    config = f"port {port}\n"
    calls: list[str] = []
    fail_next = [False]

    async def rebuild() -> None:
        calls.append("try")
        if fail_next[0]:
            fail_next[0] = False
            raise ConnectionError("SQL is away")
        calls.append("done")

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    redis = connect(f"redis://127.0.0.1:{port}/0")
    task: asyncio.Task[None] | None = None
    try:
        with redis_server_process(tmp_path / "first", config, {"port": port}):
            task = asyncio.create_task(watch(redis, "t:", rebuild, interval_s=LOOK_S))
            deadline = time.monotonic() + 10
            while not await redis.keys("t:watch:*"):  # the first look recorded the server
                assert time.monotonic() < deadline, "the watch never looked"
                await asyncio.sleep(0.02)
            await asyncio.sleep(LOOK_S * 6)
            assert calls == []  # nothing changed
            await redis.flushall()
            await _until(lambda: calls == ["try", "done"])
            fail_next[0] = True
            await redis.flushall()
            await _until(lambda: calls == ["try", "done", "try", "try", "done"])  # failed, then tried again
            await asyncio.sleep(LOOK_S * 6)
            assert calls.count("done") == 2  # once per change
        calls.clear()
        # the server is gone (SIGTERM, so no snapshot either: "save" is off): no rebuild while nothing answers
        await asyncio.sleep(LOOK_S * 6)
        assert calls == []
        with redis_server_process(tmp_path / "second", config, {"port": port}):
            await _until(lambda: calls == ["try", "done"])
            await asyncio.sleep(LOOK_S * 6)
            assert calls == ["try", "done"]
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await redis.aclose()


async def test_a_user_that_may_not_ask_is_told_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    config = f"port {port}\nuser default off\nuser bob on >pw ~* &* +@all -info\n"
    calls: list[str] = []

    async def rebuild() -> None:
        calls.append("done")

    with redis_server_process(tmp_path, config, {"port": port, "username": "bob", "password": "pw"}):
        redis = connect(f"redis://bob:pw@127.0.0.1:{port}/0")
        task = asyncio.create_task(watch(redis, "t:", rebuild, interval_s=LOOK_S))
        try:
            await _until(lambda: "Redis refuses what the watch for lost state asks" in caplog.text)
            await asyncio.sleep(LOOK_S * 6)
            assert caplog.text.count("Redis refuses what the watch") == 1
            assert "no permissions to run the 'info' command" in caplog.text
            assert calls == []
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await redis.aclose()
