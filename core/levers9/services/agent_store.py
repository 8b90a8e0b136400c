"""What every replica knows about the agents: their registration, last inventory, last heartbeat, and where each is connected.

Kept in Redis, so an agent connected to one replica is listed (and sent
orders) from every other. Keys, under the controlplane's prefix:

* ``agent:<id>`` (hash): ``provider``, ``workspace`` (empty: an operator's
  agent), ``labels`` (the issuer's, JSON), ``agent_labels`` (the agent's own,
  JSON), ``state`` (``pending`` until it joins, then ``joined``; ``removed``
  after ``levers9 machine remove``, for good: Hello never turns it back),
  ``capacity`` and ``machines`` (its last inventory, JSON), ``version`` and
  ``hostname``. A pending registration expires with its join token; a joined
  one stays;
* ``agents`` (set): every agent id with a registration;
* ``agents:seen`` (hash): agent id -> ``<last_seen>|<until>|<replica>``: when
  the agent last spoke (epoch seconds), until when it counts as connected
  (three heartbeats on), and the name of the replica holding its stream.
  ``until`` 0 and no replica: connected nowhere. One hash for every agent, so
  a replica writes a second's worth of heartbeats in one ``HSET`` and reads
  every agent's in one ``HMGET``: the cost of a heartbeat does not grow with
  a command of its own.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["AgentRecord", "AgentStore", "Seen"]

#: compare-and-release: a replica ends only its own claim on an agent's stream, never a newer one's (ARGV[2]
#: empty: whoever holds it); when the agent was last seen stays
_RELEASE = """
local seen = redis.call('HGET', KEYS[1], ARGV[1])
if not seen then return 0 end
local last, _, replica = string.match(seen, '^([^|]*)|([^|]*)|(.*)$')
if last == nil or (ARGV[2] ~= '' and replica ~= ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], last .. '|0|')
return 1
"""


@dataclass(frozen=True)
class Seen:
    """An agent's entry in ``agents:seen``."""

    #: epoch seconds it last spoke
    last: float
    #: it counts as connected until then (epoch seconds); 0: connected nowhere
    until: float
    #: the replica holding its stream ("" for none)
    replica: str

    def encode(self) -> str:
        return f"{self.last!r}|{self.until!r}|{self.replica}"

    @classmethod
    def decode(cls, value: str | bytes | None) -> Seen | None:
        if not value:
            return None
        if isinstance(value, bytes):
            value = value.decode()
        last, _, rest = value.partition("|")
        until, _, replica = rest.partition("|")
        try:
            seen = cls(float(last), float(until or 0), replica)
        except ValueError:
            return None
        return seen if math.isfinite(seen.last) and math.isfinite(seen.until) else None


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


def _record(agent_id: str, fields: dict[str, str], seen: Seen | None) -> AgentRecord:
    issuer: dict[str, str] = _json(fields.get("labels"), {})
    own: dict[str, str] = _json(fields.get("agent_labels"), {})
    return AgentRecord(
        id=agent_id,
        provider=fields.get("provider", ""),
        workspace=fields.get("workspace") or None,
        labels={**own, **issuer},
        joined=fields.get("state") == "joined",
        removed=fields.get("state") == "removed",
        capacity=_json(fields.get("capacity"), {}),
        machines=_json(fields.get("machines"), []),
        last_seen=seen.last if seen is not None else 0.0,
        version=fields.get("version", ""),
        hostname=fields.get("hostname", ""),
    )


class AgentStore:
    def __init__(self, redis: Redis, *, prefix: str = "l9:", clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._prefix = prefix
        self._index = f"{prefix}agents"
        self._seen = f"{prefix}agents:seen"
        self._clock = clock

    @property
    def prefix(self) -> str:
        """The controlplane's Redis key prefix (the agent channel is ``<prefix>agents``)."""
        return self._prefix

    def _key(self, agent_id: str) -> str:
        return f"{self._prefix}agent:{agent_id}"

    async def register(
        self, agent_id: str, *, provider: str, workspace: str | None, labels: dict[str, str], ttl_s: float
    ) -> None:
        """A pending agent, issued a join token valid for ``ttl_s``: forgotten with the token unless it joins."""
        key = self._key(agent_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "provider": provider,
                    "workspace": workspace or "",
                    "labels": json.dumps(labels),
                    "state": "pending",
                },
            )
            pipe.expire(key, max(1, math.ceil(ttl_s)) + 60)
            pipe.sadd(self._index, agent_id)
            await pipe.execute()

    async def joined(self, agent_id: str, *, workspace: str | None, version: str, hostname: str) -> AgentRecord:
        """The agent spent its join token: its registration stays for good. Returns it as it now is."""
        key = self._key(agent_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key, mapping={"state": "joined", "workspace": workspace or "", "version": version, "hostname": hostname}
            )
            pipe.persist(key)
            pipe.sadd(self._index, agent_id)
            await pipe.execute()
        found = await self.get(agent_id)
        assert found is not None  # written just above
        return found

    async def hello(
        self,
        agent_id: str,
        *,
        workspace: str | None,
        provider: str,
        labels: dict[str, str],
        version: str,
        hostname: str,
    ) -> None:
        """Record what a connecting agent says of itself; ``provider`` only where the registration has none.

        A removed agent stays removed (its state is not touched).
        """
        key = self._key(agent_id)
        if await self._redis.hget(key, "state") == "removed":
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, "provider", provider)
            pipe.hset(
                key,
                mapping={
                    "state": "joined",
                    "workspace": workspace or "",
                    "agent_labels": json.dumps(labels),
                    "version": version,
                    "hostname": hostname,
                },
            )
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
            await pipe.execute()
        await self.release(agent_id, replica="")

    async def seen(self, agent_id: str, *, replica: str, now: float, presence_s: float) -> None:
        """The agent spoke on ``replica``'s stream at ``now``; it counts as connected there for ``presence_s``."""
        await self.seen_many({agent_id: now}, replica=replica, presence_s=presence_s)

    async def seen_many(self, heard: dict[str, float], *, replica: str, presence_s: float) -> None:
        """:meth:`seen` for many agents in one command (a replica's heartbeats, written once a second)."""
        if heard:
            await self._redis.hset(
                self._seen,
                mapping={agent_id: Seen(now, now + presence_s, replica).encode() for agent_id, now in heard.items()},
            )

    async def last_seen(self, agent_ids: list[str]) -> dict[str, float | None]:
        """Each agent's last heartbeat (None: never heard from), without reading its inventory; one command."""
        if not agent_ids:
            return {}
        values = await self._redis.hmget(self._seen, agent_ids)
        found: dict[str, float | None] = {}
        for agent_id, value in zip(agent_ids, values, strict=True):
            seen = Seen.decode(value)
            found[agent_id] = seen.last if seen is not None else None
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
            await self._redis.eval(_RELEASE, 1, self._seen, agent_id, replica)

    async def owner(self, agent_id: str) -> str | None:
        """The replica holding the agent's stream; None when no replica has heard from it lately."""
        seen = Seen.decode(await self._redis.hget(self._seen, agent_id))
        if seen is None or not seen.replica or seen.until < self._clock():
            return None
        return seen.replica

    async def get(self, agent_id: str) -> AgentRecord | None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._key(agent_id))
            pipe.hget(self._seen, agent_id)
            fields, seen = await pipe.execute()
        if not fields:
            return None
        return _record(agent_id, {str(k): str(v) for k, v in fields.items()}, Seen.decode(seen))

    async def all(self) -> list[AgentRecord]:
        """Every registered agent (pending ones too); ids whose registration expired leave the index."""
        ids = sorted(str(member) for member in await self._redis.smembers(self._index))
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for agent_id in ids:
                pipe.hgetall(self._key(agent_id))
            pipe.hmget(self._seen, ids)
            *found, seen = await pipe.execute()
        rows = [{str(k): str(v) for k, v in row.items()} for row in found]
        gone = [agent_id for agent_id, fields in zip(ids, rows, strict=True) if not fields]
        if gone:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.srem(self._index, *gone)
                pipe.hdel(self._seen, *gone)
                await pipe.execute()
        return [
            _record(agent_id, fields, Seen.decode(when))
            for agent_id, fields, when in zip(ids, rows, seen, strict=True)
            if fields
        ]
