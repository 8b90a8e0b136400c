"""Clients of a Redis server: a burst of commands past the connection cap waits for a connection, never fails."""

from __future__ import annotations

import asyncio

from levers9.state.redis.connect import connect


async def test_a_burst_past_the_connection_cap_waits_for_connections_and_every_command_succeeds(
    redis_server: str,
) -> None:
    redis = connect(redis_server, max_connections=10)
    try:
        # each BLPOP holds its connection for its whole wait: 40 at once take turns on the 10 connections
        results = await asyncio.gather(*(redis.blpop([f"burst:{i}"], timeout=0.2) for i in range(40)))
        assert results == [None] * 40  # every one ran to its timeout; none was refused a connection
        pool = redis.connection_pool
        opened = len(pool._available_connections) + len(pool._in_use_connections)
        assert opened == 10, f"{opened} connections opened for a cap of 10"
    finally:
        await redis.aclose()
