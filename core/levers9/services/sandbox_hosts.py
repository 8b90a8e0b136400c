"""What every replica knows about sandboxes, in Redis: where each worker serves them, and which sandbox is where.

A worker of a pool with ``sandboxes`` serves them on its loopback
(:mod:`levers9.worker.sandbox_api`) and opens every session with the port and
the bearer secret of that server. Any replica may be asked about any sandbox,
and the tunnel to the worker may be held by another, so both live in Redis:

* ``<prefix>sandbox-api:<worker_id>`` -> ``{"port", "secret"}``, the secret
  sealed with the controlplane's secret key (:meth:`SecretBox.seal
  <levers9.state.crypto.SecretBox.seal>`, bound to the worker: a row copied
  to another worker's key does not unseal). Written at each session's start
  (a restarted worker makes a new secret), deleted when a lookup finds the
  worker gone; it expires :data:`HOST_TTL_S` after the last session started,
  so a worker lost without anyone asking leaves nothing for long.
* ``<prefix>sandbox:<id>`` -> ``{"workspace", "worker", "pool", "created", "hold"}`` (``hold``: its hold on
  the worker's room in the scheduler, :meth:`WorkerRegistry.hold_sandbox
  <levers9.state.redis.workers.WorkerRegistry.hold_sandbox>`)
  and ``port:<n>`` -> the address its worker reaches an exposed port at,
  and ``<prefix>sandboxes:<workspace_id>``, the set of a workspace's sandbox
  ids. A record is made when a worker created the sandbox; once the sandbox is
  seen ended (by a request, or its worker gone) it expires after
  :data:`ENDED_TTL_S`, so a late request still hears why it ended.

Invariants: a sandbox id names one worker for its whole life (a sandbox never
moves; a snapshot restored elsewhere is a new sandbox); a workspace's set
holds only ids whose records carry that workspace, and ids whose records
expired are dropped from it when listed. Nothing here decides who may see
what: :mod:`levers9.services.sandboxes` checks the workspace.

Failures: a Redis error is the caller's (the REST API answers 500 and logs
it); a sealed secret that does not unseal (the key rotated away, the row
altered) is :class:`~levers9.state.crypto.DecryptionError`, answered as a
worker that cannot be reached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from levers9.state.crypto import SecretBox

__all__ = ["ENDED_TTL_S", "HOST_TTL_S", "SandboxHost", "SandboxHosts", "SandboxRecord"]

#: how long a worker's server stays known after its last session started
HOST_TTL_S = 30 * 24 * 3600
#: how long an ended sandbox's record is kept
ENDED_TTL_S = 24 * 3600


@dataclass(frozen=True)
class SandboxHost:
    """Where a worker serves its sandboxes: ``127.0.0.1:port`` on its machine, through its tunnel."""

    worker_id: str
    port: int
    secret: str = field(repr=False)


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    workspace_id: str
    worker_id: str
    pool: str
    #: seconds since the epoch
    created_at: float
    #: the hold on its worker's room in the scheduler ("" for none): released when it ends
    hold: str = ""
    #: the canonical type of its GPUs ("" for none; their count is in its worker's info)
    gpu: str = ""


class SandboxHosts:
    """The workers' sandbox servers and the sandboxes' records, shared by the replicas (see the module)."""

    def __init__(self, redis: Redis, box: SecretBox, *, prefix: str = "l9:") -> None:
        self.redis = redis
        self.box = box
        self.prefix = prefix

    def _host_key(self, worker_id: str) -> str:
        return f"{self.prefix}sandbox-api:{worker_id}"

    def _record_key(self, sandbox_id: str) -> str:
        return f"{self.prefix}sandbox:{sandbox_id}"

    def _workspace_key(self, workspace_id: str) -> str:
        return f"{self.prefix}sandboxes:{workspace_id}"

    @staticmethod
    def _context(worker_id: str) -> str:
        return f"sandbox-api:{worker_id}"

    # ------------------------------------------------------------------ hosts

    async def announce(self, worker_id: str, port: int, secret: str) -> None:
        """Record where ``worker_id`` serves its sandboxes (a worker's session starts with this)."""
        if not 0 < port < 65536 or not secret:
            raise ValueError(f"worker {worker_id} announced a sandbox server without a port or a secret")
        sealed = self.box.seal(secret, context=self._context(worker_id)).decode()
        value = json.dumps({"port": port, "secret": sealed})
        await self.redis.set(self._host_key(worker_id), value, ex=HOST_TTL_S)

    async def host(self, worker_id: str) -> SandboxHost | None:
        raw = await self.redis.get(self._host_key(worker_id))
        if raw is None:
            return None
        stored = json.loads(raw)
        secret = self.box.unseal(str(stored["secret"]).encode(), context=self._context(worker_id))
        return SandboxHost(worker_id, int(stored["port"]), secret)

    async def serving(self, worker_ids: list[str]) -> set[str]:
        """Those of ``worker_ids`` that announced a sandbox server."""
        if not worker_ids:
            return set()
        found = await self.redis.mget([self._host_key(w) for w in worker_ids])
        return {w for w, raw in zip(worker_ids, found, strict=True) if raw is not None}

    async def forget(self, worker_id: str) -> None:
        await self.redis.delete(self._host_key(worker_id))

    # ---------------------------------------------------------------- records

    async def record(self, record: SandboxRecord) -> None:
        mapping = {
            "workspace": record.workspace_id,
            "worker": record.worker_id,
            "pool": record.pool,
            "created": repr(record.created_at),
            "hold": record.hold,
            "gpu": record.gpu,
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._record_key(record.id), mapping=mapping)  # type: ignore[arg-type]
            pipe.sadd(self._workspace_key(record.workspace_id), record.id)
            await pipe.execute()

    async def find(self, sandbox_id: str) -> SandboxRecord | None:
        fields = await self.redis.hgetall(self._record_key(sandbox_id))
        if not fields:
            return None
        value = {_text(k): _text(v) for k, v in fields.items()}
        return SandboxRecord(
            id=sandbox_id,
            workspace_id=value.get("workspace", ""),
            worker_id=value.get("worker", ""),
            pool=value.get("pool", ""),
            created_at=float(value.get("created") or 0.0),
            hold=value.get("hold", ""),
            gpu=value.get("gpu", ""),
        )

    async def of_workspace(self, workspace_id: str) -> list[SandboxRecord]:
        """The workspace's sandboxes still on record, oldest first; ids whose records expired are dropped."""
        ids = sorted(_text(i) for i in await self.redis.smembers(self._workspace_key(workspace_id)))
        records: list[SandboxRecord] = []
        gone: list[str] = []
        for sandbox_id in ids:
            found = await self.find(sandbox_id)
            if found is None or found.workspace_id != workspace_id:
                gone.append(sandbox_id)
            else:
                records.append(found)
        if gone:
            await self.redis.srem(self._workspace_key(workspace_id), *gone)
        return sorted(records, key=lambda r: r.created_at)

    async def expose(self, sandbox_id: str, port: int, address: str) -> None:
        """Port ``port`` of the sandbox is served by the gateway, at ``address`` as its worker reaches it."""
        await self.redis.hset(self._record_key(sandbox_id), f"port:{port}", address)

    async def exposed(self, sandbox_id: str) -> dict[int, str]:
        """The sandbox's exposed ports -> their addresses on its worker."""
        fields = await self.redis.hgetall(self._record_key(sandbox_id))
        found: dict[int, str] = {}
        for key, value in fields.items():
            name = _text(key)
            if name.startswith("port:") and name[5:].isdigit():
                found[int(name[5:])] = _text(value)
        return found

    async def ended(self, record: SandboxRecord) -> None:
        """The sandbox ended: its record is kept :data:`ENDED_TTL_S` more (never shortened by a later call)."""
        key = self._record_key(record.id)
        if await self.redis.ttl(key) < 0:
            await self.redis.expire(key, ENDED_TTL_S)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
