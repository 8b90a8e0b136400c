"""A replica's stable name, claimed in the shared Redis so that no two live replicas use the same one.

The name (``listen.replica_name``, ``levers9 server --replica-name``, default
the host name) stays the same across restarts: it is the ``replica`` label of
every per-replica metric and what the logs call the replica. It is *not* what
the replica is known by in Redis's protocols (the planner lease's holder,
the hub's and the agent hub's sender, the owner of serving containers): that
is :func:`process_identity`, the name with the process id and a random suffix,
new at every start. A restarted replica must never take its dead predecessor's
lease, agents or containers for its own; with one holder name for both, it
would renew a lease it no longer holds as soon as it came back.

Invariant: while a replica runs, the key ``{prefix}replica-name:{name}`` holds
its process identity with a short TTL, renewed every third of it
(:class:`ReplicaNameClaim`), with where it runs (pid, host name, pid
namespace). At start, a key held by another identity means a live replica (or
one that died less than a TTL ago) has the name. A holder on this host, in this
pid namespace, whose pid no longer exists is dead: its key is taken over at
once (a replica killed and restarted by systemd does not wait). A key seen
renewed (its TTL going up) means a live holder: the start refuses with
:class:`ReplicaNameTaken`, naming the setting to change, within a third of the
TTL. A holder that renews nothing is waited out (its key lapses within a TTL). A clean stop deletes
the key, so a rolling restart waits for nothing.

Failures: Redis unreachable at start propagates (the replica cannot start
anyway); during renewal it is logged and retried at the next turn. A key found
held by another identity at renewal (this replica was frozen past the TTL and
another started with the name meanwhile) is logged as an error at each turn:
both replicas' metrics then share a label until one is renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from levers9.config.replica_name import replica_name_problem
from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["TTL_S", "ReplicaNameClaim", "ReplicaNameError", "ReplicaNameTaken", "process_identity", "replica_name"]

log = logging.getLogger(__name__)

#: how long the key outlives its last renewal
TTL_S = 10.0

#: renew when the key still holds this process's identity; take it again when it lapsed (after a freeze)
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
#: take the key over from a holder known dead, only if it still holds it
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
#: delete the key only when it is still this process's
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ReplicaNameError(Levers9Error):
    """The replica cannot have the name it was given (a bad one, or one another live replica holds)."""


class ReplicaNameTaken(ReplicaNameError):
    """Another live replica uses this replica name."""


def replica_name(flag: str | None, configured: str | None) -> str:
    """The name this replica goes by: ``--replica-name``, else ``listen.replica_name``, else the host name."""
    name = flag or configured or socket.gethostname()
    problem = replica_name_problem(name)
    if problem is not None:
        where = "--replica-name" if flag else "listen.replica_name" if configured else "the host name"
        raise ReplicaNameError(f"{where}: {problem}; set listen.replica_name or levers9 server --replica-name")
    return name


def _whereabouts() -> str:
    """This process's host name and pid namespace: where its pid means something."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return f"{socket.gethostname()}|{namespace}"


def _dead(holder: str) -> bool:
    """Whether the holder's value names a process of this host and pid namespace that no longer exists."""
    _, _, rest = holder.partition("|")
    pid, _, where = rest.partition("|")
    if where != _whereabouts() or not pid.isdigit() or "?" in where:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, owned by another user
        return False
    return False


def process_identity(name: str) -> str:
    """What this process is known by in Redis's protocols: the replica name, the pid, a random suffix."""
    return f"{name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ReplicaNameClaim:
    """This replica's hold on its name in Redis: :meth:`claim` at start, renewed in the background, :meth:`release`."""

    def __init__(self, redis: Redis, name: str, identity: str, *, prefix: str = "l9:", ttl_s: float = TTL_S) -> None:
        self.name = name
        self.identity = identity
        self.key = f"{prefix}replica-name:{name}"
        #: what the key holds while this process has the name
        self.value = f"{identity}|{os.getpid()}|{_whereabouts()}"
        self._redis = redis
        self._ttl_ms = int(ttl_s * 1000)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._task: asyncio.Task[None] | None = None

    async def claim(self, *, setting: str = "listen.replica_name or levers9 server --replica-name") -> None:
        """Take the name; ReplicaNameTaken when a live replica holds it.

        A holder is live when its key is seen renewed (its TTL goes up): known within a third of the TTL.
        A holder known dead (this host, this pid namespace, no such pid) is taken over at once; any other
        holder that renews nothing is waited out (at most one TTL: its key lapses).
        """
        deadline = time.monotonic() + self._ttl_ms / 1000 + 1
        holder = None
        told = False
        last_ttl: int | None = None
        while True:
            if await self._redis.set(self.key, self.value, nx=True, px=self._ttl_ms):
                break
            found = await self._redis.get(self.key)
            ttl = await self._redis.pttl(self.key)
            renewed = last_ttl is not None and ttl > last_ttl + 100
            if found is not None:
                value = found.decode() if isinstance(found, bytes) else str(found)
                if holder not in (None, value.partition("|")[0]):
                    renewed = True  # another one took it meanwhile: live too
                holder = value.partition("|")[0]
                if _dead(value) and await self._take_over(keys=[self.key], args=[value, self.value, self._ttl_ms]):
                    log.info(
                        "the replica name %r was held by %s, which is no longer running here: taken over",
                        self.name,
                        holder,
                    )
                    break
            if renewed or time.monotonic() >= deadline:
                raise ReplicaNameTaken(
                    f"the replica name {self.name!r} is in use by another live replica (process {holder}) on this "
                    f"Redis; give each replica its own name with {setting}"
                )
            last_ttl = ttl if ttl >= 0 else None
            if holder is not None and not told:
                told = True
                log.info(
                    "the replica name %r is held by %s: waiting up to %.0f s to see it renewed or lapse",
                    self.name,
                    holder,
                    deadline - time.monotonic(),
                )
            await asyncio.sleep(0.25)
        self._task = asyncio.create_task(self._keep(), name=f"replica name {self.name}")

    async def _keep(self) -> None:
        every = self._ttl_ms / 3000
        while True:
            await asyncio.sleep(every)
            try:
                ok = await self._renew(keys=[self.key], args=[self.value, self._ttl_ms])
            except Exception as exc:  # Redis away for a moment: the next turn tries again
                log.warning("cannot renew the replica name %r: %s", self.name, exc)
                continue
            if not ok:
                log.error(
                    "the replica name %r was taken by another replica while this one did not renew it (frozen or cut "
                    "off from Redis): both now export metrics under it; rename one",
                    self.name,
                )

    async def release(self) -> None:
        """Stop renewing and free the name (only if it is still this process's), so a restart need not wait."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            await self._release(keys=[self.key], args=[self.value])
