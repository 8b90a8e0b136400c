"""Whether this replica can work: the database and Redis answer, each within a deadline, and the disk has room.

A probe that waits longer than :data:`HEALTH_TIMEOUT_S` reports the dependency
as not answering, so a hung database makes a load balancer's check fail
instead of hang. The data directory counts as full below
:data:`~levers9.state.disk.MIN_FREE_BYTES` free, the same test that refuses new
work (:func:`~levers9.state.disk.require_room`), so health fails exactly while
work is refused, and is ok again as soon as space returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

from sqlalchemy import text

from levers9.services.core import Services
from levers9.state.disk import room

__all__ = ["HEALTH_TIMEOUT_S", "HealthReport", "health"]

HEALTH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class HealthReport:
    #: "ok", or why the database did not answer
    database: str
    #: "ok", or why Redis did not answer
    redis: str
    #: "ok", or why the data directory takes no new work ("data directory full: ...")
    disk: str = "ok"

    @property
    def degraded(self) -> bool:
        return self.database != "ok" or self.redis != "ok" or self.disk != "ok"


async def _probe(check: Awaitable[object]) -> str:
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):
            await check
    except TimeoutError:
        return f"no answer within {HEALTH_TIMEOUT_S:g} s"
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"[:300]
    return "ok"


async def _ping_database(services: Services) -> None:
    async with services.db.engine.connect() as connection:
        await connection.execute(text("SELECT 1"))


async def _ping_redis(services: Services) -> None:
    await services.redis.ping()


async def health(services: Services) -> HealthReport:
    database, redis = await asyncio.gather(_probe(_ping_database(services)), _probe(_ping_redis(services)))
    return HealthReport(database, redis, room(services.config.data_dir))
