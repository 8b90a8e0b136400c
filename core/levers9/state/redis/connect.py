"""Connecting to Redis, or to an embedded one when no URL is configured.

One machine should not need a Redis server to try levers9, so an empty
``state.redis_url`` gives an in-process Redis (fakeredis with real Lua), which the
same scheduler code runs against. It lives and dies with the process: SQL is the
source of truth and the backlog is rebuilt from it at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["EmbeddedRedis", "connect"]


class EmbeddedRedis:
    """An in-process Redis server; every client from :meth:`client` sees the same data."""

    def __init__(self) -> None:
        import fakeredis

        self._server: Any = fakeredis.FakeServer()

    def client(self) -> Redis:
        import fakeredis

        client: Redis = fakeredis.FakeAsyncRedis(server=self._server, decode_responses=True)
        return client


def connect(url: str | None, *, embedded: EmbeddedRedis | None = None) -> Redis:
    """A client for ``url``, or for ``embedded`` (a fresh one when not given) when ``url`` is empty."""
    if not url:
        return (embedded or EmbeddedRedis()).client()
    from redis.asyncio import Redis

    return Redis.from_url(url, decode_responses=True, health_check_interval=30)
