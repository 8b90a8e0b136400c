"""Where each running container is and how to reach it, for the gateway and `levers9 ps`.

Short-lived and rewritten by workers as containers change, so it lives in Redis;
the task row in SQL keeps the lasting facts (which container, the outcome).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["ContainerRecord", "Containers"]


@dataclass(frozen=True)
class ContainerRecord:
    id: str
    worker: str
    status: str
    request: str | None = None
    #: host:port where its first port answers
    address: str | None = None
    updated_ms: int = 0


class Containers:
    def __init__(self, redis: Redis, prefix: str = "l9:") -> None:
        self.redis = redis
        self.prefix = prefix

    async def put(self, record: ContainerRecord) -> None:
        key = f"{self.prefix}c:{record.id}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "worker": record.worker,
                    "status": record.status,
                    "request": record.request or "",
                    "address": record.address or "",
                    "updated": record.updated_ms,
                },
            )
            pipe.sadd(f"{self.prefix}wc:{record.worker}", record.id)
            await pipe.execute()

    async def get(self, container: str) -> ContainerRecord | None:
        row = await self.redis.hmget(
            f"{self.prefix}c:{container}", ["worker", "status", "request", "address", "updated"]
        )
        worker, status, request, address, updated = (None if v is None else str(v) for v in row)
        if worker is None or status is None:
            return None
        return ContainerRecord(container, worker, status, request or None, address or None, int(updated or 0))

    async def on_worker(self, worker: str) -> set[str]:
        return {str(c) for c in await self.redis.smembers(f"{self.prefix}wc:{worker}")}

    async def delete(self, container: str) -> None:
        record = await self.get(container)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(f"{self.prefix}c:{container}")
            if record is not None:
                pipe.srem(f"{self.prefix}wc:{record.worker}", container)
            await pipe.execute()
