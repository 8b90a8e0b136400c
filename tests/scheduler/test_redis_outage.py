"""A Redis outage is one warning per scheduler loop, not a traceback a second, and a line when Redis is back.

A real ``redis-server`` on a TCP port is stopped under a running scheduler and started again on the same
port (as a restart or a Sentinel failover looks to a client: commands fail for a while).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from levers9.state.redis.connect import connect
from levers9.state.redis.outage import Outage, unreachable
from tests.fixtures.ports import free_port
from tests.fixtures.redis import redis_server_process
from tests.scheduler.conftest import MakeHarness, eventually

LOOPS = ("placement", "reaper", "leader")


@pytest.fixture
def backend(tmp_path: Path) -> tuple[str, str | None]:
    """This test brings its own Redis; SQLite is enough for the rest."""
    return f"sqlite:///{tmp_path / 'levers9.db'}", None


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> dict[str, int]:
    counts = dict.fromkeys(LOOPS, 0)
    for record in caplog.records:
        if record.levelno < logging.WARNING:
            continue
        for name in LOOPS:
            if record.getMessage().startswith(f"scheduler {name} loop: {text}"):
                counts[name] += 1
    return counts


async def test_a_redis_outage_is_one_warning_per_loop_and_a_line_when_it_answers_again(
    make_harness: MakeHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="levers9")
    port = free_port()
    config = f"port {port}\n"
    redis = connect(f"redis://127.0.0.1:{port}/0")
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    try:
        with redis_server_process(tmp_path / "first", config, {"port": port}):
            # the reaper runs every keepalive/3 s: a short keepalive has it meet the outage soon
            h = await make_harness([("cpu",)], redis=redis, worker_keepalive_s=1.5)
            scheduler = h.scheduler()
            await scheduler.start()

            async def leading() -> bool:
                return await scheduler.lease.held()

            await eventually(leading, "the leader loop to take the lease")
        # the server is stopped: every loop fails now, again and again

        async def every_loop_warned() -> bool:
            return all(_lines(caplog, "Redis does not answer").values())

        await eventually(every_loop_warned, "a 'Redis does not answer' warning from each loop")
        with redis_server_process(tmp_path / "second", config, {"port": port}):

            async def every_loop_back() -> bool:
                return all(_lines(caplog, "Redis answers again").values())

            await eventually(every_loop_back, "an 'answers again' line from each loop")
            await scheduler.stop()
    finally:
        await redis.aclose()
    assert _lines(caplog, "Redis does not answer") == dict.fromkeys(LOOPS, 1), "one warning per loop per outage"
    assert _lines(caplog, "Redis answers again") == dict.fromkeys(LOOPS, 1)
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info and r.name.startswith("levers9.scheduler")]
    assert tracebacks == [], "a Redis outage logged with tracebacks"
    warned = [r for r in caplog.records if "Redis does not answer" in r.getMessage()]
    assert {r.levelno for r in warned} == {logging.WARNING}
    assert all("Error" in r.getMessage() for r in warned), "the warning names the error"


def test_only_redis_not_answering_is_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A bug in a loop keeps its traceback: only connection errors, timeouts and no primary are outages."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ResponseError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.sentinel import MasterNotFoundError

    assert unreachable(RedisConnectionError("Connection refused"))
    assert unreachable(RedisTimeoutError("Timeout reading from socket"))
    assert unreachable(MasterNotFoundError("No master found for 'levers9'"))
    assert unreachable(ExceptionGroup("tasks", [RedisConnectionError("x"), RedisTimeoutError("y")]))
    assert not unreachable(ExceptionGroup("tasks", [RedisConnectionError("x"), KeyError("y")]))
    assert not unreachable(ResponseError("NOSCRIPT No matching script"))
    assert not unreachable(KeyError("task_1"))
    caplog.set_level(logging.DEBUG, logger="levers9.test")
    outage = Outage(logging.getLogger("levers9.test"), "test loop")
    assert not outage.failed(ValueError("a bug"))
    assert not outage.down
    # a second outage right after the first (a restarting server flaps) is the same incident: debug lines only
    for _ in range(2):
        assert outage.failed(RedisConnectionError("Connection closed by server"))
        assert outage.failed(RedisConnectionError("Connection refused"))
        assert outage.down
        outage.answered()
        assert not outage.down
    assert [(r.levelname, r.getMessage().split(": ")[1].split(" after")[0]) for r in caplog.records] == [
        ("WARNING", "Redis does not answer"),
        ("WARNING", "Redis answers again"),
        ("DEBUG", "Redis does not answer"),
        ("DEBUG", "Redis answers again"),
    ]
