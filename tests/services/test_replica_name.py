"""A replica's stable name, claimed in a real redis-server: one live replica per name (issue 36 item 3)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from levers9.services.replica_name import (
    ReplicaNameClaim,
    ReplicaNameError,
    ReplicaNameTaken,
    process_identity,
    replica_name,
)
from levers9.state.redis.connect import connect


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def test_the_name_is_the_flag_else_the_config_else_the_host_name() -> None:
    assert replica_name("cp-a", "cp-b") == "cp-a"
    assert replica_name(None, "cp-b") == "cp-b"
    assert replica_name(None, None) == socket.gethostname()
    with pytest.raises(ReplicaNameError, match=r"^--replica-name: 'a b' is not a replica name; use letters"):
        replica_name("a b", None)
    # the process's own identity starts with the name and differs at every start
    assert process_identity("cp-a").startswith("cp-a-")
    assert process_identity("cp-a") != process_identity("cp-a")


async def test_a_name_held_by_a_live_replica_is_refused_and_free_again_once_released(redis: Redis) -> None:
    first = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=1)
    await asyncio.wait_for(first.claim(), 5)
    try:
        await asyncio.sleep(1.5)  # past one TTL: the first renews its hold
        second = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=1)
        with pytest.raises(ReplicaNameTaken) as info:
            await asyncio.wait_for(second.claim(), 10)  # refused once it sees the hold renewed
        message = str(info.value)
        assert f"'cp-a' is in use by another live replica (process {first.identity})" in message
        assert "listen.replica_name or levers9 server --replica-name" in message
        # another name is free meanwhile
        other = ReplicaNameClaim(redis, "cp-b", process_identity("cp-b"), ttl_s=1)
        await asyncio.wait_for(other.claim(), 5)
        await other.release()
    finally:
        await first.release()
    assert await redis.get(first.key) is None
    again = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=30)
    await asyncio.wait_for(again.claim(), 2)  # released: no TTL to wait out
    await again.release()


async def test_a_killed_holder_on_this_host_is_taken_over_at_once(redis: Redis, redis_url: str) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import asyncio, sys
            from levers9.services.replica_name import ReplicaNameClaim, process_identity
            from levers9.state.redis.connect import connect

            async def main():
                claim = ReplicaNameClaim(connect({redis_url!r}), "cp-a", process_identity("cp-a"), ttl_s=60)
                await claim.claim()
                print("claimed", flush=True)
                await asyncio.sleep(600)

            asyncio.run(main())
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "claimed"
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert await redis.pttl("l9:replica-name:cp-a") > 50_000  # its key would outlive it by a minute
        claim = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=60)
        await asyncio.wait_for(claim.claim(), 5)  # not a minute: its holder is known dead
        await claim.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


async def test_a_name_that_lapsed_while_its_replica_was_frozen_is_taken_again(redis: Redis) -> None:
    claim = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=0.6)
    await asyncio.wait_for(claim.claim(), 5)
    try:
        await redis.delete(claim.key)  # as if the TTL ran out while the process did not run
        for _ in range(50):
            if await redis.get(claim.key) is not None:
                break
            await asyncio.sleep(0.1)
        held = await redis.get(claim.key)
        assert held is not None
        assert str(held).startswith(claim.identity + "|")
    finally:
        await claim.release()


async def test_a_holder_elsewhere_that_renews_nothing_is_waited_out(redis: Redis) -> None:
    # a replica on another host, killed: its key names a process this one cannot look up
    await redis.set("l9:replica-name:cp-a", "cp-a-7-abcdef|7|elsewhere|pid:[1]", px=1500)
    claim = ReplicaNameClaim(redis, "cp-a", process_identity("cp-a"), ttl_s=1)
    await asyncio.wait_for(claim.claim(), 5)
    try:
        assert str(await redis.get(claim.key)).startswith(claim.identity + "|")
    finally:
        await claim.release()
