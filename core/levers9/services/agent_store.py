"""What every replica knows about the agents: their registration, last inventory, last heartbeat, and where each is connected.

Kept in Redis, so an agent connected to one replica is listed (and sent
orders) from every other. Keys, under the controlplane's prefix:

* ``agent:<id>`` (hash): ``provider``, ``workspace`` (empty: an operator's
  agent), ``labels`` (the issuer's, JSON), ``agent_labels`` (the agent's own,
  JSON), ``state`` (``pending`` until it joins, then ``joined``; ``removed``
  after ``levers9 machine remove``, for good: Hello never turns it back), ``capacity``
  and ``machines`` (its last inventory, JSON), ``last_seen`` (epoch seconds),
  ``version`` and ``hostname``. A pending registration expires with its join
  token; a joined one stays;
* ``agents`` (set): every agent id with a registration;
* ``agent:<id>:conn`` (string): the name of the replica holding the agent's
  stream, expiring three heartbeats after the last one. Absent: the agent is
  connected nowhere.

Invariants: who an agent is and which workspace it belongs to come from its
credential in SQL (:mod:`levers9.state.sql.workspaces`), never from here, so
workspace isolation does not depend on Redis. If Redis loses its contents, an
agent's registration is written again from its next Hello (its provider and
labels as it states them) and its inventory from its next report; the issuer's
labels are then lost until the agent joins again (they exist only here).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["AgentRecord", "AgentStore"]

#: compare-and-delete: a replica ends only its own claim on an agent's stream, never a newer one's
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class AgentRecord:
    id: str
    provider: str
    #: None: an operator's agent (shared pools)
    workspace: str | None
    #: the issuer's labels, then the agent's own under them (an issuer's label wins)
    labels: dict[str, str] = field(default_factory=dict)
    joined: bool = False
    #: ``levers9 machine remove`` removed it: it is refused at Join and Connect, and no pool sees it
    removed: bool = False
    capacity: dict[str, Any] = field(default_factory=dict)
    machines: list[str] = field(default_factory=list)
    #: epoch seconds of the last message on its stream; 0: never connected
    last_seen: float = 0.0
    version: str = ""
    hostname: str = ""


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _record(agent_id: str, fields: dict[str, str]) -> AgentRecord:
    issuer: dict[str, str] = _json(fields.get("labels"), {})
    own: dict[str, str] = _json(fields.get("agent_labels"), {})
    try:
        last_seen = float(fields.get("last_seen") or 0.0)
    except ValueError:
        last_seen = 0.0
    return AgentRecord(
        id=agent_id,
        provider=fields.get("provider", ""),
        workspace=fields.get("workspace") or None,
        labels={**own, **issuer},
        joined=fields.get("state") == "joined",
        removed=fields.get("state") == "removed",
        capacity=_json(fields.get("capacity"), {}),
        machines=_json(fields.get("machines"), []),
        last_seen=last_seen if math.isfinite(last_seen) else 0.0,
        version=fields.get("version", ""),
        hostname=fields.get("hostname", ""),
    )


class AgentStore:
    def __init__(self, redis: Redis, *, prefix: str = "l9:") -> None:
        self._redis = redis
        self._prefix = prefix
        self._index = f"{prefix}agents"

    @property
    def prefix(self) -> str:
        """The controlplane's Redis key prefix (the agent channel is ``<prefix>agents``)."""
        return self._prefix

    def _key(self, agent_id: str) -> str:
        return f"{self._prefix}agent:{agent_id}"

    def _conn(self, agent_id: str) -> str:
        return f"{self._prefix}agent:{agent_id}:conn"

    async def register(
        self, agent_id: str, *, provider: str, workspace: str | None, labels: dict[str, str], ttl_s: float
    ) -> None:
        """A pending agent, issued a join token valid for ``ttl_s``: forgotten with the token unless it joins."""
        key = self._key(agent_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"provider": provider, "workspace": workspace or "", "labels": json.dumps(labels),
                                    "state": "pending"})  # fmt: skip
            pipe.expire(key, max(1, math.ceil(ttl_s)) + 60)
            pipe.sadd(self._index, agent_id)
            await pipe.execute()

    async def joined(self, agent_id: str, *, workspace: str | None, version: str, hostname: str) -> AgentRecord:
        """The agent spent its join token: its registration stays for good. Returns it as it now is."""
        key = self._key(agent_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"state": "joined", "workspace": workspace or "", "version": version,
                                    "hostname": hostname})  # fmt: skip
            pipe.persist(key)
            pipe.sadd(self._index, agent_id)
            await pipe.execute()
        found = await self.get(agent_id)
        assert found is not None  # written just above
        return found

    async def hello(
        self, agent_id: str, *, workspace: str | None, provider: str, labels: dict[str, str], version: str,
        hostname: str,
    ) -> None:  # fmt: skip
        """Record what a connecting agent says of itself; ``provider`` only where the registration has none.

        A removed agent stays removed (its state is not touched).
        """
        key = self._key(agent_id)
        if await self._redis.hget(key, "state") == "removed":
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, "provider", provider)
            pipe.hset(key, mapping={"state": "joined", "workspace": workspace or "", "agent_labels": json.dumps(labels),
                                    "version": version, "hostname": hostname})  # fmt: skip
            pipe.persist(key)
            pipe.sadd(self._index, agent_id)
            await pipe.execute()

    async def removed(self, agent_id: str) -> None:
        """``levers9 machine remove`` removed the agent: its registration stays, marked removed, for good."""
        key = self._key(agent_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "state", "removed")
            pipe.persist(key)
            pipe.sadd(self._index, agent_id)
            pipe.delete(self._conn(agent_id))
            await pipe.execute()

    async def seen(self, agent_id: str, *, replica: str, now: float, presence_s: float) -> None:
        """The agent spoke on ``replica``'s stream at ``now``; it counts as connected there for ``presence_s``."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._key(agent_id), "last_seen", repr(now))
            pipe.set(self._conn(agent_id), replica, px=max(1, int(presence_s * 1000)))
            await pipe.execute()

    async def seen_many(self, heard: dict[str, float], *, replica: str, presence_s: float) -> None:
        """:meth:`seen` for many agents in one round trip (a replica's heartbeats, written once a second)."""
        if not heard:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for agent_id, now in heard.items():
                pipe.hset(self._key(agent_id), "last_seen", repr(now))
                pipe.set(self._conn(agent_id), replica, px=max(1, int(presence_s * 1000)))
            await pipe.execute()

    async def last_seen(self, agent_ids: list[str]) -> dict[str, float | None]:
        """Each agent's last heartbeat (None: no registration any more), without reading its inventory."""
        if not agent_ids:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for agent_id in agent_ids:
                pipe.hget(self._key(agent_id), "last_seen")
            values = await pipe.execute()
        found: dict[str, float | None] = {}
        for agent_id, value in zip(agent_ids, values, strict=True):
            try:
                found[agent_id] = float(value) if value is not None else None
            except ValueError:
                found[agent_id] = 0.0
        return found

    async def ids(self) -> set[str]:
        return {str(member) for member in await self._redis.smembers(self._index)}

    async def inventory(self, agent_id: str, *, capacity: dict[str, Any], machines: list[str]) -> None:
        await self._redis.hset(
            self._key(agent_id), mapping={"capacity": json.dumps(capacity), "machines": json.dumps(machines)}
        )

    async def release(self, agent_id: str, *, replica: str) -> None:
        """The stream on ``replica`` ended: the agent is connected nowhere, unless it already reconnected elsewhere."""
        with contextlib.suppress(Exception):
            await self._redis.eval(_RELEASE, 1, self._conn(agent_id), replica)

    async def owner(self, agent_id: str) -> str | None:
        """The replica holding the agent's stream; None when no replica has heard from it lately."""
        value = await self._redis.get(self._conn(agent_id))
        return str(value) if value else None

    async def get(self, agent_id: str) -> AgentRecord | None:
        fields = await self._redis.hgetall(self._key(agent_id))
        return _record(agent_id, {str(k): str(v) for k, v in fields.items()}) if fields else None

    async def all(self) -> list[AgentRecord]:
        """Every registered agent (pending ones too); ids whose registration expired leave the index."""
        ids = sorted(str(member) for member in await self._redis.smembers(self._index))
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for agent_id in ids:
                pipe.hgetall(self._key(agent_id))
            rows = [{str(k): str(v) for k, v in row.items()} for row in await pipe.execute()]
        gone = [agent_id for agent_id, fields in zip(ids, rows, strict=True) if not fields]
        if gone:
            await self._redis.srem(self._index, *gone)
        return [_record(agent_id, fields) for agent_id, fields in zip(ids, rows, strict=True) if fields]
