"""Which controlplane replica owns which serving container, so one left behind by a gone replica is stopped.

Endpoints and boxes run as serving tasks that the replica which started them
also stops; a replica that restarts or crashes forgets them. Each replica
records the containers it starts (:meth:`ServingOwners.own`) and says it is
alive every few seconds (:meth:`ServingOwners.alive`); a serving task that is
older than a grace period and whose owner is no longer alive is an orphan
(:meth:`ServingOwners.orphans`), which any replica may stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from levers9.services.dataplane import DataPlane

__all__ = ["Orphan", "ServingOwners"]

#: the kinds of stub whose containers serve (the gateway starts and stops them)
SERVED_KINDS = ("endpoint", "box")


@dataclass(frozen=True)
class Orphan:
    task_id: str
    worker_id: str | None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ServingOwners:
    """The owners of serving containers, in Redis, as one replica (``name``) sees and records them."""

    def __init__(self, dp: DataPlane, *, prefix: str = "l9:", name: str | None = None) -> None:
        self._dp = dp
        self._redis = dp.services.redis
        #: this replica's name, as the owner of the containers it starts
        self.name = name or dp.services.scheduler.name
        self._owners_key = f"{prefix}serving:owner"
        self._alive_prefix = f"{prefix}serving:alive:"

    async def alive(self, ttl_s: float) -> None:
        """This replica is alive for the next ``ttl_s`` seconds."""
        await self._redis.set(self._alive_prefix + self.name, "1", px=int(ttl_s * 1000))

    async def own(self, task_id: str) -> None:
        await self._redis.hset(self._owners_key, task_id, self.name)

    async def disown(self, task_id: str) -> None:
        await self._redis.hdel(self._owners_key, task_id)

    async def orphans(self, *, older_than_s: float, skip: set[str] | frozenset[str] = frozenset()) -> list[Orphan]:
        """Unfinished serving tasks older than ``older_than_s`` whose owner is not alive (``skip``: known ones)."""
        before = datetime.now(UTC) - timedelta(seconds=older_than_s)
        tasks = await self._dp.services.tasks.unfinished_of_kinds(SERVED_KINDS, created_before=before)
        out = []
        for task in tasks:
            if task.id in skip:
                continue
            owner = await self._redis.hget(self._owners_key, task.id)
            if owner is not None and await self._redis.exists(self._alive_prefix + _text(owner)):
                continue
            out.append(Orphan(task.id, task.worker_id))
        return out
