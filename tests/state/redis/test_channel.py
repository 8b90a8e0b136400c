"""Listening to a pub/sub channel: messages reach the handler, and a cancelled listener ends, whatever its client does."""

from __future__ import annotations

import asyncio

import redis.exceptions

from levers9.state.redis.channel import listen
from levers9.state.redis.connect import connect


async def test_a_cancellation_turned_into_a_connection_error_still_ends_the_listener(redis_url: str) -> None:
    """redis-py can catch the CancelledError of a read and raise a connection error in its place; the
    listener must end all the same, or whoever cancelled it (a hub's close) waits for ever."""
    client = connect(redis_url)
    got: list[str] = []
    inside = asyncio.Event()

    async def handle(data: str) -> None:
        got.append(data)
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None

    subscribed = asyncio.Event()
    listener = asyncio.create_task(listen(client, "test:channel", handle, what="test channel", subscribed=subscribed))
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        await client.publish("test:channel", "hello")
        await asyncio.wait_for(inside.wait(), 10)
        assert got == ["hello"]
        listener.cancel()
        done, _ = await asyncio.wait({listener}, timeout=10)  # a deadline for a hang, not a timing assertion
        assert done, "the listener went on after its cancellation came back as a connection error"
        assert listener.cancelled()
    finally:
        listener.cancel()
        await client.aclose()
