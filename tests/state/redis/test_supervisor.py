"""The embedded redis-server's supervisor, on a real redis-server child: death noticed, child reaped, restarted.

Each test starts its own :class:`ManagedRedis` in a temporary data directory and
stops it at the end (the supervisor first), so no redis-server outlives it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from levers9.state.errors import StateError
from levers9.state.redis.connect import ManagedRedis, connect
from levers9.state.redis.supervisor import RedisSupervisor

pytestmark = pytest.mark.timeout(120)

_DEADLINE_S = 30.0


@pytest.fixture
async def managed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ManagedRedis]:
    monkeypatch.delenv("LEVERS9_EMBEDDED_REDIS", raising=False)
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; run scripts/setup (apt-get install redis-server)")
    started = ManagedRedis.start(tmp_path / "redis")
    assert started is not None
    try:
        yield started
    finally:
        started.stop()


async def _until(what: str, check: object) -> None:
    assert callable(check)
    async with asyncio.timeout(_DEADLINE_S):
        while not check():
            await asyncio.sleep(0.02)
    assert check(), what


def _zombie_or_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def test_a_killed_server_is_reaped_started_again_on_its_socket_and_recovered(managed: ManagedRedis) -> None:
    recovered: list[int] = []
    restarted: list[int] = []

    async def recover() -> None:
        recovered.append(managed.process.pid)

    client = connect(managed.url)
    supervisor = RedisSupervisor(managed, recover, on_restart=lambda: restarted.append(1))
    supervisor.start()
    try:
        await client.set("before", "1")
        script = client.register_script("return redis.call('GET', KEYS[1]) or 'none'")
        assert await script(keys=["before"]) == "1"
        old = managed.process.pid
        os.kill(old, signal.SIGKILL)
        await _until("recovered", lambda: recovered)
        assert managed.process.pid != old
        assert recovered == [managed.process.pid]
        assert (supervisor.restarts, restarted) == (1, [1])
        assert not _zombie_or_alive(old)  # reaped: no zombie
        # the same client reconnects to the same socket; the new server is empty, and EVALSHA of a script it
        # never saw falls back to loading it
        assert await client.ping()
        assert await client.get("before") is None
        assert await script(keys=["before"]) == "none"
        assert not supervisor.failed.is_set()
    finally:
        await supervisor.close()
        await client.aclose()


async def test_a_recovery_that_fails_is_tried_again_until_it_succeeds(managed: ManagedRedis) -> None:
    tries: list[str] = []

    async def recover() -> None:
        tries.append("try")
        if len(tries) < 3:
            raise ConnectionError("not yet")

    supervisor = RedisSupervisor(managed, recover)
    supervisor.start()
    try:
        os.kill(managed.process.pid, signal.SIGKILL)
        await _until("recovered on the third try", lambda: len(tries) == 3)
        await asyncio.sleep(0.3)
        assert len(tries) == 3  # and not again once it succeeded
        assert supervisor.restarts == 1
    finally:
        await supervisor.close()


async def test_a_server_that_cannot_start_again_makes_the_supervisor_give_up_saying_why(
    managed: ManagedRedis, tmp_path: Path
) -> None:
    async def recover() -> None:
        raise AssertionError("nothing to recover: no server started")

    broken = tmp_path / "redis-server"
    broken.write_text("#!/bin/sh\necho 'cannot start: the test broke it' >&2\nexit 3\n")
    broken.chmod(0o755)
    supervisor = RedisSupervisor(managed, recover, tries=2)
    supervisor.start()
    try:
        managed.binary = str(broken)
        os.kill(managed.process.pid, signal.SIGKILL)
        async with asyncio.timeout(_DEADLINE_S):
            await supervisor.failed.wait()
        assert isinstance(supervisor.failure, StateError)
        message = str(supervisor.failure)
        assert message.startswith("the embedded redis-server died and could not be started again (2 tries): ")
        assert "exit status 3" in message
        assert message.endswith("cannot start: the test broke it"), message  # only what the last start wrote
        assert supervisor.restarts == 0
        assert managed.process.poll() == 3  # reaped as well
    finally:
        await supervisor.close()


async def test_a_server_stopped_after_its_supervisor_closed_is_not_started_again(managed: ManagedRedis) -> None:
    recovered: list[int] = []

    async def recover() -> None:
        recovered.append(1)

    supervisor = RedisSupervisor(managed, recover)
    supervisor.start()
    await asyncio.sleep(0.05)
    await supervisor.close()
    pid = managed.process.pid
    os.kill(pid, signal.SIGTERM)
    managed.process.wait(10)
    await asyncio.sleep(0.3)
    assert (managed.process.pid, supervisor.restarts, recovered) == (pid, 0, [])


async def test_a_data_directory_too_deep_for_a_socket_gets_one_in_a_short_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unix socket's path is at most 107 bytes: an embedded Redis under a deep data directory (a test's tmp path
    past pytest-999, a home with a long name) failed to start. Its socket now lives in a short directory of its own,
    removed when it stops; restarts use the same socket."""
    monkeypatch.delenv("LEVERS9_EMBEDDED_REDIS", raising=False)
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "redis"
    started = ManagedRedis.start(deep)
    assert started is not None
    short = started.socket.parent
    try:
        assert len(os.fsencode(started.socket)) <= 107
        assert short != deep
        assert (short.stat().st_mode & 0o777) == 0o700
        client = connect(started.url)
        try:
            assert await client.ping()
        finally:
            await client.aclose()
    finally:
        started.stop()
    assert not short.exists()
