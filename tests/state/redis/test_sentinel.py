"""A client of ``redis+sentinel://`` follows a failover: commands, Lua scripts and subscriptions carry on.

A real primary, replica and three Sentinels (tests/fixtures/redis_sentinel.py); the primary is SIGKILLed.
The same over TLS with an ACL user (``rediss+sentinel://USER:PASSWORD@...?ca_file=...&sentinel_auth=yes``).
What was replicated before (``WAIT``) is on the new primary; a script registered before the failover runs
there (redis-py loads it again on ``NOSCRIPT``); a subscription of :func:`levers9.state.redis.channel.listen`
hears what is published on the new primary; :func:`levers9.state.redis.watch.watch` sees the new server
(its marker was replicated: the new ``run_id`` tells) and has the state rebuilt once. Commands sent while no primary is elected fail with a
``ConnectionError`` (callers retry), and none of them needs a new client.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import RedisError

from levers9.state.errors import StateError
from levers9.state.redis.channel import listen
from levers9.state.redis.connect import connect, verify
from levers9.state.redis.scripts import Scripts
from levers9.state.redis.watch import watch
from tests.fixtures.redis_sentinel import PASSWORD, SentinelRedis, redis_sentinel, redis_sentinel_secure  # noqa: F401

pytestmark = pytest.mark.timeout(120)


async def _until_it_works(what: object, deadline_s: float = 30) -> object:
    """Run the coroutine function ``what`` until it does not raise a Redis error (a primary is elected)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await what()  # type: ignore[operator]
        except (RedisError, OSError):
            assert time.monotonic() < deadline, "no primary answered after the failover"
            await asyncio.sleep(0.1)


async def test_a_sentinel_client_follows_a_failover(redis_sentinel: SentinelRedis) -> None:  # noqa: F811
    # a service the Sentinels do not monitor, and a Sentinel that is not there: one short reason each
    wrong = redis_sentinel.url.replace("/l9", "/nope").replace("redis+sentinel://", "redis+sentinel://:pw@127.0.0.1:1,")
    with pytest.raises(StateError) as refused:
        await verify(connect(wrong), wrong)
    said = str(refused.value)
    assert said.startswith(f"Redis at {wrong.replace(':pw@', ':***@')} (state.redis_url) does not answer: "), said
    assert "no Sentinel named a primary for 'nope' (127.0.0.1:1: Error 111 connecting" in said, said
    assert f"127.0.0.1:{redis_sentinel.sentinel_ports[0]}: monitors no 'nope'" in said, said
    assert len(said) < 1000, said

    redis = connect(redis_sentinel.url)
    await verify(redis, redis_sentinel.url)
    heard: list[str] = []
    subscribed = asyncio.Event()
    listener = asyncio.create_task(listen(redis, "l9:test", heard.append, what="test", subscribed=subscribed))
    rebuilt: list[int] = []

    async def rebuild() -> None:
        rebuilt.append(1)

    watching = asyncio.create_task(watch(redis, "t:", rebuild, interval_s=0.1))
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        scripts = Scripts(redis, "t:")
        assert await scripts("census") == []  # loaded on the first primary
        sha = scripts._scripts["census"].sha
        await redis.set("kept", "yes")
        while not await redis.keys("t:watch:*"):  # the watch's first look
            await asyncio.sleep(0.05)
        assert await redis.wait(1, 5000) == 1  # on the replica too
        assert redis_sentinel.primary_address()[1] == redis_sentinel.primary_port

        redis_sentinel.kill_primary()
        redis_sentinel.wait_failover()

        assert await _until_it_works(lambda: redis.get("kept")) == "yes"
        assert await redis.script_exists(sha) == [False]  # a replica's script cache starts empty
        assert await scripts("census") == []  # NOSCRIPT: redis-py loaded it again
        info = await redis.info("server")
        assert int(info["tcp_port"]) == redis_sentinel.replica_port  # the client is on the new primary
        deadline = time.monotonic() + 15  # the subscription opens again within about a second
        while not heard:
            await redis.publish("l9:test", "after")
            assert time.monotonic() < deadline, "the subscription did not come back on the new primary"
            await asyncio.sleep(0.2)
        assert heard[-1] == "after"
        deadline = time.monotonic() + 10
        while not rebuilt:
            assert time.monotonic() < deadline, "the watch did not notice the new primary"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert rebuilt == [1]  # once
    finally:
        listener.cancel()
        watching.cancel()
        await asyncio.gather(listener, watching, return_exceptions=True)
        await redis.aclose()


async def test_over_tls_with_an_acl_user_too(redis_sentinel_secure: SentinelRedis) -> None:  # noqa: F811
    group = redis_sentinel_secure
    wrong = group.url.replace(f":{PASSWORD}@", ":wrong-pw@")
    with pytest.raises(StateError) as info:
        await verify(connect(wrong), wrong)
    assert "wrong-pw" not in str(info.value)
    assert "invalid username-password pair" in str(info.value)
    redis = connect(group.url)
    try:
        await verify(redis, group.url)
        await redis.set("kept", "yes")
        assert await redis.wait(1, 5000) == 1
        group.kill_primary()
        group.wait_failover()
        assert await _until_it_works(lambda: redis.get("kept")) == "yes"
        assert (await redis.info("replication"))["role"] == "master"
        assert (await redis.config_get("tls-port"))["tls-port"] == str(group.replica_port)
    finally:
        await redis.aclose()
