"""The agent hub: joining agents, their streams, orders sent down them and acknowledgements awaited, inventories.

Agents (joined machines, attached clusters) dial out to the ``Agent`` gRPC
service (:mod:`levers9.controlplane.grpc_agent` translates; everything is
decided here); provider plugins reach them through :class:`AgentHub`. Joining
(a single-use token spent for the agent's own credential) is
:mod:`levers9.services.agent_join`.

Streams. An agent connects with its credential; its first message is Hello
(its provider must be the one it joined for), answered by Welcome with
``heartbeat_s``. It then reports its inventory and heartbeats; every message
it sends counts as a heartbeat. A stream re-checks its credential in SQL at
most every ``CREDENTIAL_RECHECK_S`` (5 min), so a token revoked behind the
hub's back cuts the agent off within that; ``machine remove`` cuts it at once
(:meth:`AgentHub.disconnect`). Heartbeats are written to Redis in one batch per
replica every ``PRESENCE_FLUSH_S`` (1 s); Hello, inventories and acks at once.
One watchdog per replica looks at every open stream three times a heartbeat
period: a stream silent for twice ``heartbeat_s`` is sent a Ping; silent for
three times, it is ended (:class:`AgentLapsed`) and the agent counts as
disconnected everywhere. A stream ended a period ago whose transport stopped
reading it (the peer died mid-write) is closed by the watchdog itself. A stream
only waits for what to send. These keep a thousand idle agents cheap: per heartbeat, no SQL, no Redis command of
its own and no timer (bench/RESULTS.md, "Agent machines").

Orders. :meth:`AgentHub.send` gives each order a fresh id and keeps it
pending until its acknowledgement or the caller's timeout. It raises
:class:`~levers9.hooks.errors.InsufficientCapacity` naming the agent when the
agent is connected nowhere (another agent may serve), ``TimeoutError`` when no
acknowledgement comes in time, and for a refusing acknowledgement the
provider error its ``error_kind`` names (a plain ``ProviderError`` for none or
an unknown kind). Orders are idempotent by id: every pending order is sent
again when its agent reconnects (to any replica), and the agent acknowledges
an order it already carried out without doing it again.

Cutting a stream. :meth:`AgentHub.disconnect` (:func:`publish_disconnect`
without a hub) ends an agent's stream at once, on whichever replica holds it,
with :class:`AgentCut`: how ``levers9 machine remove`` cuts off a revoked agent,
whose Hello is refused from then on.

Replicas. An agent holds one stream, to one replica; ``send`` may be called on
any. Orders, acknowledgements and "agent connected" notices travel on one
Redis channel (``<prefix>agents``): the replica holding the agent's stream
delivers an order published there, and the replica awaiting an
acknowledgement takes it from there. Which replica holds a stream, and every
agent's registration, inventory and last heartbeat, are in Redis
(:mod:`levers9.services.agent_store`); each replica keeps a copy refreshed
every heartbeat period and on every inventory, so :meth:`AgentHub.inventories`
answers without I/O. A message lost between replicas costs the caller a
timeout, never a doubled order.

Workspaces. An agent belongs to the workspace of whoever issued its join token
(its credential in SQL says so); ``inventories(workspace=)`` lists only that
workspace's agents (None: the operator's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from levers9.cancelling import raise_if_cancelling
from levers9.gpu.catalog import canonical
from levers9.gpu.normalize import normalize
from levers9.hooks.context import AgentAck, AgentInventory, AgentOrder
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest, ProviderError
from levers9.services.agent_join import AgentIdentity, authenticate_agent, check_labels, removed_message
from levers9.services.agent_messages import (
    ANY_WORKSPACE,
    ERROR_KINDS,
    AgentCut,
    AgentLapsed,
    AgentProtocolError,
    AnyWorkspace,
    Command,
    InventoryReport,
    OrderCommand,
    Ping,
    Welcome,
    json_object,
    publish_disconnect,
)
from levers9.services.agent_store import AgentRecord, AgentStore
from levers9.services.auth import PermissionDenied as AccessDenied
from levers9.services.auth import Unauthenticated
from levers9.state.redis.channel import listen
from levers9.state.sql.models import new_id
from levers9.state.sql.records import TokenKind

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from levers9.services.core import Services

__all__ = [
    "ANY_WORKSPACE",
    "HEARTBEAT_S",
    "AgentCut",
    "AgentHub",
    "AgentLapsed",
    "AgentProtocolError",
    "AgentSession",
    "Command",
    "InventoryReport",
    "OrderCommand",
    "Ping",
    "Welcome",
    "json_object",
    "open_session",
    "publish_disconnect",
]

log = logging.getLogger(__name__)

#: how often an agent heartbeats (its gRPC pings, levers9.agent.connection.KEEPALIVE_S, find a frozen replica)
HEARTBEAT_S = 30.0
#: heartbeats are written to Redis together, this often (presence lasts three heartbeat periods)
PRESENCE_FLUSH_S = 1.0
#: a stream re-checks its agent's credential in SQL at most this often (``machine remove`` and revocation
#: through the hub cut a stream at once; a token revoked otherwise is noticed within this)
CREDENTIAL_RECHECK_S = 300.0
#: every this many refresh periods a replica re-reads every agent's whole record; in between, heartbeats only
_FULL_REFRESH_EVERY = 6


# ---------------------------------------------------------------------------------------------- the hub


async def open_session(services: Services, hub: AgentHub, token: str | None) -> AgentSession:
    """A stream for the agent behind ``token``; each later message re-checks the token (revocation cuts it off)."""
    identity = await authenticate_agent(services, token)

    async def recheck() -> None:
        await services.auth.verify(token, TokenKind.AGENT)

    return hub.attach(identity, recheck)


@dataclass
class _Pending:
    agent_id: str
    command: OrderCommand
    future: asyncio.Future[AgentAck]


class AgentHub:
    """This replica's side of every agent (see the module docstring); one per controlplane process."""

    def __init__(
        self,
        redis: Redis,
        *,
        name: str,
        prefix: str = "l9:",
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (math.isfinite(heartbeat_s) and heartbeat_s > 0):
            raise ValueError(f"heartbeat_s must be a positive number of seconds, got {heartbeat_s}")
        self.store = AgentStore(redis, prefix=prefix, clock=clock)
        self.heartbeat_s = heartbeat_s
        self.name = name
        self._redis = redis
        self._channel = f"{prefix}agents"
        self._clock = clock
        self._sessions: dict[str, AgentSession] = {}
        #: every stream open on this replica, greeted or not (the watchdog's round)
        self._open: set[AgentSession] = set()
        self._pending: dict[str, _Pending] = {}
        self._known: dict[str, AgentRecord] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: heartbeats heard on this replica since the last flush to Redis: agent id -> epoch seconds
        self._heard: dict[str, float] = {}
        self._refreshes = 0

    async def start(self) -> None:
        with contextlib.suppress(Exception):
            await self.refresh()
        subscribed = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._listen(subscribed), name="agent hub listener"),
            asyncio.create_task(self._refresh_loop(), name="agent hub refresh"),
            asyncio.create_task(self._presence_loop(), name="agent hub presence"),
            asyncio.create_task(self._watch_loop(), name="agent hub watchdog"),
        ]
        # an order published by another replica before this one listens would be lost: wait (briefly) for it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscribed.wait(), 5.0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        for session in {*self._open, *self._sessions.values()}:
            session.end()

    # -------------------------------------------------------------------------- what plugins call

    async def send(self, order: AgentOrder, *, timeout: float) -> AgentAck:
        """Send ``order`` and wait for its acknowledgement (see the module docstring for what it raises)."""
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        try:
            json.dumps(order.payload)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"the {order.kind} order's payload for agent {order.agent_id} is not JSON: {exc}"
            ) from None
        command = OrderCommand(order.order_id or new_id("ord"), order.kind, dict(order.payload))
        future: asyncio.Future[AgentAck] = asyncio.get_running_loop().create_future()
        self._pending[command.order_id] = _Pending(order.agent_id, command, future)
        try:
            await self._deliver(order.agent_id, command)
            try:
                ack = await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"agent {order.agent_id} did not acknowledge the {order.kind} order {command.order_id} "
                    f"within {timeout:g} s"
                ) from None
        finally:
            self._pending.pop(command.order_id, None)
        if ack.ok:
            return ack
        error = ERROR_KINDS.get(ack.error_kind or "", ProviderError)
        raise error(f"agent {order.agent_id} refused the {order.kind} order: {ack.error or 'no reason given'}")

    def inventories(
        self, provider: str | None = None, *, workspace: str | AnyWorkspace | None = ANY_WORKSPACE
    ) -> list[AgentInventory]:
        """Every joined agent's last inventory, of ``provider``'s agents and ``workspace``'s only when given."""
        now = self._clock()
        found = []
        for record in sorted(self._known.values(), key=lambda r: r.id):
            if not record.joined or (provider is not None and record.provider != provider):
                continue
            if not isinstance(workspace, AnyWorkspace) and record.workspace != workspace:
                continue
            found.append(
                AgentInventory(
                    agent_id=record.id,
                    provider=record.provider,
                    workspace=record.workspace,
                    connected=self._connected(record, now),
                    last_seen=record.last_seen,
                    labels=dict(record.labels),
                    capacity=dict(record.capacity),
                    machines=list(record.machines),
                )
            )
        return found

    def _connected(self, record: AgentRecord, now: float) -> bool:
        return record.last_seen > 0 and now - record.last_seen <= 3 * self.heartbeat_s

    async def disconnect(self, agent_id: str, reason: str) -> None:
        """End ``agent_id``'s stream at once, here and on every other replica (see the module docstring)."""
        self._cut(agent_id, reason)
        await publish_disconnect(self._redis, self.store.prefix, agent_id, reason, sender=self.name)

    def _cut(self, agent_id: str, reason: str) -> None:
        if (session := self._sessions.get(agent_id)) is not None:
            session.cut(reason)
        if (record := self._known.get(agent_id)) is not None:
            self._known[agent_id] = replace(record, joined=False)

    async def refresh(self, *, full: bool = True) -> None:
        """Read every agent's registration, inventory and last heartbeat from Redis.

        Every heartbeat period a replica reads only the heartbeats of the agents it knows, and the whole
        record of any it does not (inventories reach it through the ``inv`` notices); every
        ``_FULL_REFRESH_EVERY`` periods, and when ``full``, everything.
        """
        if full:
            self._known = {record.id: record for record in await self.store.all()}
            return
        ids = await self.store.ids()
        known = [agent_id for agent_id in ids if agent_id in self._known]
        seen = await self.store.last_seen(known)
        fresh = {
            agent_id: replace(self._known[agent_id], last_seen=max(self._known[agent_id].last_seen, when or 0.0))
            for agent_id, when in seen.items()
        }
        for agent_id in ids - set(known):
            if (record := await self.store.get(agent_id)) is not None:
                fresh[agent_id] = record
        self._known = fresh

    # -------------------------------------------------------------------------- streams (the transport's side)

    def attach(self, identity: AgentIdentity, recheck: Callable[[], Awaitable[object]]) -> AgentSession:
        """A new stream of ``identity``'s agent; it starts receiving orders once it said Hello."""
        session = AgentSession(self, identity, recheck)
        self._open.add(session)
        return session

    def _greeted(self, session: AgentSession) -> None:
        agent_id = session.identity.agent_id
        old = self._sessions.get(agent_id)
        if old is not None and old is not session:
            old.end()  # the agent dialled again: its old stream is dead or about to be
        self._sessions[agent_id] = session
        session.push(Welcome(agent_id, self.heartbeat_s))
        for pending in list(self._pending.values()):
            if pending.agent_id == agent_id:
                session.push(pending.command)

    def _detached(self, session: AgentSession) -> None:
        self._open.discard(session)
        if self._sessions.get(session.identity.agent_id) is session:
            del self._sessions[session.identity.agent_id]

    def _remember(self, record: AgentRecord) -> None:
        self._known[record.id] = record

    def _seen_locally(self, agent_id: str, now: float) -> None:
        if (record := self._known.get(agent_id)) is not None:
            self._known[agent_id] = replace(record, last_seen=now)

    async def _acked(self, agent_id: str, ack: AgentAck) -> None:
        pending = self._pending.get(ack.order_id)
        if pending is None:
            await self._publish({"t": "ack", "agent": agent_id, "ack": ack.model_dump()})
            return
        self._resolve(agent_id, ack)

    def _resolve(self, agent_id: str, ack: AgentAck) -> None:
        pending = self._pending.get(ack.order_id)
        if pending is None:
            return
        if pending.agent_id != agent_id:
            log.warning(
                "agent %s acknowledged order %s, which was sent to %s: ignored",
                agent_id,
                ack.order_id,
                pending.agent_id,
            )
            return
        if not pending.future.done():
            pending.future.set_result(ack)

    async def _deliver(self, agent_id: str, command: OrderCommand) -> None:
        session = self._sessions.get(agent_id)
        if session is not None and session.live:
            session.push(command)
            return
        owner = await self.store.owner(agent_id)
        if owner is None or owner == self.name:
            raise InsufficientCapacity(self._not_connected(agent_id))
        await self._publish({"t": "order", "agent": agent_id, "order": asdict(command)})

    def _not_connected(self, agent_id: str) -> str:
        record = self._known.get(agent_id)
        if record is None:
            return f"agent {agent_id} is not known to this controlplane (never joined, or removed)"
        if record.last_seen <= 0:
            return f"agent {agent_id} is not connected (it never connected)"
        ago = max(0.0, self._clock() - record.last_seen)
        return f"agent {agent_id} is not connected (last heard from {ago:.0f} s ago)"

    # -------------------------------------------------------------------------- between replicas

    async def _publish(self, message: dict[str, Any]) -> None:
        try:
            await self._redis.publish(self._channel, json.dumps({"from": self.name, **message}))
        except Exception as exc:  # the waiting caller times out; the order is sent again when the agent reconnects
            log.warning("could not publish an agent %s message: %s", message.get("t"), exc)

    async def _up(self, agent_id: str) -> None:
        await self._publish({"t": "up", "agent": agent_id})

    async def _listen(self, subscribed: asyncio.Event) -> None:
        await listen(self._redis, self._channel, self._on_message, what="agent channel", subscribed=subscribed)

    async def _on_message(self, data: str) -> None:
        try:
            message = json.loads(data)
            if message.get("from") == self.name:
                return
            kind, agent_id = message.get("t"), str(message.get("agent", ""))
            if kind == "order":
                session = self._sessions.get(agent_id)
                if session is not None and session.live:
                    order = message["order"]
                    session.push(OrderCommand(str(order["order_id"]), str(order["kind"]), dict(order["payload"])))
            elif kind == "ack":
                self._resolve(agent_id, AgentAck.model_validate(message["ack"]))
            elif kind == "up":
                for pending in list(self._pending.values()):
                    if pending.agent_id == agent_id:
                        await self._publish({"t": "order", "agent": agent_id, "order": asdict(pending.command)})
            elif kind == "cut":
                self._cut(agent_id, str(message.get("reason", "")) or "the controlplane ended this agent's stream")
            elif kind == "inv":
                record = await self.store.get(agent_id)
                if record is not None:
                    self._remember(record)
        except Exception:
            log.exception("an agent message from another replica could not be handled: %.200s", data)

    async def _presence_loop(self) -> None:
        while True:
            await asyncio.sleep(PRESENCE_FLUSH_S)
            await self._flush_presence()

    async def _flush_presence(self) -> None:
        heard, self._heard = self._heard, {}
        try:
            await self.store.seen_many(heard, replica=self.name, presence_s=3 * self.heartbeat_s)
        except Exception as exc:
            raise_if_cancelling(exc)
            log.warning("could not record %d agents' heartbeats: %s", len(heard), exc)

    async def _watch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat_s / 3)
            now = loop.time()
            for session in list(self._open):
                if session.watch(now):  # ended, yet its transport never closed it (a stream abandoned mid-write)
                    with contextlib.suppress(Exception):
                        await session.close()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            self._refreshes += 1
            try:
                await self.refresh(full=self._refreshes % _FULL_REFRESH_EVERY == 0)
            except Exception as exc:
                raise_if_cancelling(exc)
                log.warning("could not read the agents' inventories: %s", exc)


# ---------------------------------------------------------------------------------------------- one stream


class AgentSession:
    """One agent's stream on this replica: what it said (the transport calls in) and what to send it."""

    def __init__(self, hub: AgentHub, identity: AgentIdentity, recheck: Callable[[], Awaitable[object]]) -> None:
        self.hub = hub
        self.identity = identity
        self._recheck = recheck
        self._outbox: asyncio.Queue[Command | None] = asyncio.Queue()
        self._greeted = False
        self._ended = False
        self._ended_at = math.inf
        self._cut_reason: str | None = None
        self._lapsed: str | None = None
        self._last = asyncio.get_running_loop().time()
        self._pinged_at = -math.inf
        self._checked = self._last  # the credential was checked when the stream opened

    @property
    def live(self) -> bool:
        """Greeted, not ended, and heard from within three heartbeat periods."""
        silent = asyncio.get_running_loop().time() - self._last
        return self._greeted and not self._ended and silent <= 3 * self.hub.heartbeat_s

    def push(self, command: Command) -> None:
        if not self._ended:
            self._outbox.put_nowait(command)

    def end(self) -> None:
        """Stop sending to this stream (the agent dialled again, or this replica stops)."""
        if not self._ended:
            self._ended, self._ended_at = True, asyncio.get_running_loop().time()
        self._outbox.put_nowait(None)

    def cut(self, reason: str) -> None:
        """End this stream on purpose: :meth:`commands` raises :class:`AgentCut` with ``reason``."""
        if not self._ended:
            self._cut_reason = reason
            self.end()

    async def _touch(self, *, at_once: bool = True) -> None:
        """The agent spoke: re-check its credential (at most every ``CREDENTIAL_RECHECK_S``) and record it,
        in Redis now (``at_once``: Hello, inventories, acks) or with the next batch (heartbeats)."""
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._checked >= CREDENTIAL_RECHECK_S:
            await self._recheck()
            self._checked = loop_now
        now = self.hub._clock()
        self._last = loop_now
        agent_id = self.identity.agent_id
        if at_once:
            await self.hub.store.seen(agent_id, replica=self.hub.name, now=now, presence_s=3 * self.hub.heartbeat_s)
        else:
            self.hub._heard[agent_id] = now
        self.hub._seen_locally(agent_id, now)

    def _require_hello(self, what: str) -> None:
        if not self._greeted:
            raise AgentProtocolError(f"the first message on an agent's stream must be Hello, not {what}")

    async def hello(self, *, version: str, provider: str, labels: Mapping[str, str], hostname: str) -> None:
        if self._greeted:
            raise AgentProtocolError("Hello was already sent on this stream")
        agent_id = self.identity.agent_id
        known = await self.hub.store.get(agent_id)
        if known is not None and known.removed:
            raise Unauthenticated(removed_message(agent_id, known.provider))
        joined_for = known.provider if known is not None else ""
        if joined_for and provider and provider != joined_for:
            raise AccessDenied(f"agent {agent_id} joined for provider {joined_for!r}; its Hello says {provider!r}")
        if not (joined_for or provider):
            raise AgentProtocolError(f"agent {agent_id}: Hello must name the provider the agent serves")
        await self.hub.store.hello(
            agent_id,
            workspace=self.identity.workspace,
            provider=provider or joined_for,
            labels=check_labels(labels, "Hello"),
            version=version[:64],
            hostname=hostname[:255],
        )
        await self._touch()
        record = await self.hub.store.get(agent_id)
        if record is not None:
            self.hub._remember(record)
        self._greeted = True
        self.hub._greeted(self)
        await self.hub._up(agent_id)
        log.info("agent %s connected to %s", agent_id, self.hub.name)

    async def inventory(self, report: InventoryReport) -> None:
        self._require_hello("Inventory")
        gpus: dict[str, int] = {}
        free: dict[str, int] = {}
        for name, count, available in report.gpus:
            gpu = normalize(name) or canonical(name)  # a name no rule pins down: the catalog says why
            gpus[gpu] = gpus.get(gpu, 0) + max(0, count)
            free[gpu] = free.get(gpu, 0) + max(0, min(available, count))
        capacity: dict[str, Any] = {
            "cpu_millicores": report.cpu_millicores,
            "memory_mib": report.memory_mib,
            "gpus": gpus,
            "free": {"cpu_millicores": report.free_cpu_millicores, "memory_mib": report.free_memory_mib, "gpus": free},
        }
        if report.details:
            capacity["details"] = dict(report.details)
        agent_id = self.identity.agent_id
        await self.hub.store.inventory(agent_id, capacity=capacity, machines=list(report.machines))
        await self._touch()
        record = self.hub._known.get(agent_id)
        if record is not None:
            self.hub._remember(replace(record, capacity=capacity, machines=list(report.machines)))
        await self.hub._publish({"t": "inv", "agent": agent_id})

    async def heartbeat(self) -> None:
        self._require_hello("Heartbeat")
        await self._touch(at_once=False)

    async def ack(self, ack: AgentAck) -> None:
        self._require_hello("Ack")
        await self._touch()
        await self.hub._acked(self.identity.agent_id, ack)

    def watch(self, now: float) -> bool:
        """The hub's watchdog looks at this stream (loop time ``now``): a Ping when it is silent for twice the
        heartbeat period, the end (:class:`AgentLapsed`) at three times. True when the stream ended a period ago
        and is still open: its transport stopped iterating :meth:`commands`, so the watchdog closes it."""
        if self._ended:
            return now - self._ended_at > self.hub.heartbeat_s
        period = self.hub.heartbeat_s
        silent = now - self._last
        if silent > 3 * period:
            self._lapsed = (
                f"agent {self.identity.agent_id} sent nothing for {silent:.1f} s (heartbeat every {period:g} s): "
                "disconnected; dial again"
            )
            self.end()
        elif silent > 2 * period and self._pinged_at < self._last:
            self._pinged_at = now
            self.push(Ping())
        return False

    async def commands(self, reader: asyncio.Future[None]) -> AsyncGenerator[Command, None]:
        """What to send the agent, until ``reader`` (the transport's reading of the stream) ends or the agent
        replaced this stream; raises :class:`AgentLapsed` when the agent falls silent, :class:`AgentCut` when
        the controlplane cut it off."""
        reader.add_done_callback(lambda _: self.end())  # the agent's side ended: nothing more goes to it
        try:
            while not reader.done():
                command = await self._outbox.get()
                if command is not None:
                    yield command
                elif self._cut_reason is not None:
                    raise AgentCut(self._cut_reason)
                elif self._lapsed is not None:
                    raise AgentLapsed(self._lapsed)
                elif self._ended:
                    return
        finally:
            await self.close()

    async def close(self) -> None:
        """The stream ended: no more orders go to it, and the agent is connected nowhere unless it dialled again."""
        greeted, self._greeted, self._ended = self._greeted, False, True
        self.hub._detached(self)
        if greeted:  # said before anything is awaited, and the release shielded: a cancelled close still does both
            log.info("agent %s disconnected from %s", self.identity.agent_id, self.hub.name)
            if self.identity.agent_id not in self.hub._sessions:
                await asyncio.shield(self.hub.store.release(self.identity.agent_id, replica=self.hub.name))
