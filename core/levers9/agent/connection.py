"""The agent's gRPC side: Join, and the Connect stream held open, dialled again whenever it breaks.

Invariants:

* **TLS only**, verified against the CA the join command carried (or the
  system's store): a ``grpc://`` address is refused (:class:`InsecureRefused`,
  a ``ValueError``) unless the agent was told ``--insecure`` (development
  only).
* **One stream at a time.** Hello first, then Welcome is awaited; then the
  handler's session runs (inventory, heartbeats every ``Welcome.heartbeat_s``)
  while orders are handed to it as they come, and every Ping is answered with
  a Heartbeat. Messages go out through one queue and one writer, in order.
* **Reconnecting**: any other end of the stream (the controlplane restarted,
  the network broke, the stream was cut for silence) is logged once with its
  reason and dialled again after an exponential back-off with full jitter
  (first about 0.5 s, never more than :data:`BACKOFF_CAP_S`), reset once a
  Welcome arrives. Each try dials the next of the controlplane's addresses
  after the one the last try used, so a replica that is lost is tried again
  only after every other one.
* **A frozen replica is left within** :data:`KEEPALIVE_S` + :data:`KEEPALIVE_TIMEOUT_S`
  **(16 s)**. A replica stopped by SIGSTOP, or on a host that stalled, closes
  nothing and its kernel still acknowledges every segment, so neither the
  heartbeats nor TCP_USER_TIMEOUT notice; only an answer that the replica's
  own process must give does. The agent sends a gRPC keepalive ping every
  :data:`KEEPALIVE_S` and gives the stream up when its answer is late by
  :data:`KEEPALIVE_TIMEOUT_S`, well inside the three heartbeat periods after
  which the other replicas would judge the agent's machines gone. A replica
  that accepts the connection but never sends its Welcome is left after
  :data:`WELCOME_TIMEOUT_S`.

  Why pings and not an answer to each heartbeat: a gRPC ping is a 17-byte
  HTTP/2 frame that the controlplane's C core acknowledges on its own, without
  the Python event loop, which is where the controlplane's cost per agent lies
  (bench/RESULTS.md, "Agent machines": about 270 µs of the controlplane per
  message, half of it on the event loop; gRPC pings every 15 s instead of
  300 s from 1,000 workers changed nothing measurable). An answered heartbeat
  would add one message each way per heartbeat, and would still find a frozen
  replica only a heartbeat period (30 s) later: 20 s would need heartbeats
  every 10-15 s, several times the messages. 1,000 agents send about 83 pings
  a second; bench/agents.py measured no difference in the controlplane's CPU
  between pings every 12 s and every 300 s (bench/RESULTS.md, "Agents that
  ping every 12 s": 2.45-2.75% against 2.87%). The pings stay above the
  controlplane's ``grpc.http2.min_ping_interval_without_data_ms`` (10 s),
  below which it would close the connection for pinging too often.
* **A refused credential ends the agent**: UNAUTHENTICATED or
  PERMISSION_DENIED from the controlplane (a revoked or removed machine, a
  join token already spent) raises :class:`CredentialRefused` with the
  controlplane's own words; the CLI exits with code 3 and never retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from levers9.__about__ import __version__
from levers9.agent.credentials import AgentCredential
from levers9.backoff import delay_s
from levers9.proto.target import TargetError, parse_targets
from levers9.proto.tls import system_roots
from levers9.proto.v1 import agent_pb2, agent_pb2_grpc

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_INITIAL_S",
    "CHANNEL_OPTIONS",
    "KEEPALIVE_S",
    "KEEPALIVE_TIMEOUT_S",
    "WELCOME_TIMEOUT_S",
    "CredentialRefused",
    "InsecureRefused",
    "SessionHandler",
    "connect_forever",
    "join",
    "open_channel",
]

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.5
#: the longest wait between two tries to reconnect (jittered below it): as a worker's, so a restarted controlplane
#: hears from every agent within its return grace (levers9.scheduler.restart.RETURN_GRACE_MIN_S, 20 s) and judges
#: none of their machines gone
BACKOFF_CAP_S = 15.0
#: how long Welcome may take after Hello: a frozen replica (SIGSTOP, a stalled host) accepts the connection (its
#: kernel answers) and then says nothing; long enough for a controlplane that a whole fleet dials at once (1,000
#: streams took 18.6 s at 50 in flight on two cores, bench/RESULTS.md), whose late ones go to the next address
WELCOME_TIMEOUT_S = 15.0
#: how often the agent pings the replica its stream is on (gRPC keepalive, answered by the replica's gRPC transport,
#: not its Python). Above the controlplane's grpc.http2.min_ping_interval_without_data_ms (10 s), below which the
#: controlplane would close the connection for pinging too often
KEEPALIVE_S = 12.0
#: how long a ping may go unanswered before the stream is given up and the next address dialled. gRPC also sets
#: TCP_USER_TIMEOUT to this, so a host that vanished (no RST, no FIN) is found by the next heartbeat or ping. Both
#: grpc.keepalive_timeout_ms and grpc.http2.ping_timeout_ms are set: with the first alone, grpcio 1.85 waits for
#: the second (60 s by default) before it takes an unanswered ping for a dead connection
KEEPALIVE_TIMEOUT_S = 4.0
#: the channel options of every agent (the benchmark's simulated agents use them too)
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
Send = Callable[[agent_pb2.AgentMessage], None]


class CredentialRefused(Exception):
    """The controlplane refused the join token or the agent's credential: the agent must stop (exit code 3)."""


class InsecureRefused(ValueError):
    """A plain-text controlplane address without ``--insecure``, or an address that cannot be read."""


class SessionHandler(Protocol):
    """What the agent does on a stream (:mod:`levers9.agent.daemon` implements it)."""

    async def session(self, send: Send, heartbeat_s: float) -> None:
        """Runs while the stream is up (inventories, heartbeats); cancelled when it ends."""

    def order(self, order: agent_pb2.Order, send: Send) -> None:
        """An order arrived; acknowledge it through ``send`` (the stream up when it is done)."""


def open_channel(controlplane: str, *, ca_pem: str | None, insecure: bool, attempt: int = 0) -> grpc.aio.Channel:
    """A channel to one of ``controlplane``'s replicas (the ``attempt``-th, round robin).

    :raises InsecureRefused: a plain-text address without ``insecure``, or an address that cannot be read.
    """
    try:
        targets, tls = parse_targets(controlplane)
    except TargetError as exc:
        raise InsecureRefused(f"--controlplane {controlplane!r}: {exc}") from None
    options = list(CHANNEL_OPTIONS)
    target = targets[attempt % len(targets)]
    if tls:
        roots = ca_pem.encode() if ca_pem else system_roots()
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots), options)
    if not insecure:
        raise InsecureRefused(
            f"--controlplane {controlplane!r} is plain text (grpc://): the agent talks to the controlplane over TLS "
            "only; use grpcs://host:port (with --ca or --ca-b64 when its certificate is not publicly signed), or "
            "--insecure on a development machine"
        )
    return grpc.aio.insecure_channel(target, options)


def _address(controlplane: str, attempt: int) -> str:
    """The address :func:`open_channel` dials for ``attempt`` (for the log), as the list names it."""
    try:
        targets, tls = parse_targets(controlplane)
    except TargetError:
        return controlplane
    return f"{'grpcs' if tls else 'grpc'}://{targets[attempt % len(targets)]}"


def _details(exc: grpc.aio.AioRpcError) -> str:
    return exc.details() or exc.code().name


async def join(
    controlplane: str,
    join_token: str,
    *,
    ca_pem: str | None,
    insecure: bool,
    stop: asyncio.Event,
    hostname: str | None = None,
) -> AgentCredential | None:
    """Spend ``join_token`` for the agent's credential; None when ``stop`` was set first.

    A controlplane that cannot be reached is dialled again with back-off until it answers.

    :raises CredentialRefused: the controlplane refused the token (used, expired, unknown, removed).
    :raises InsecureRefused: see :func:`open_channel`.
    """
    failures = 0
    while not stop.is_set():
        async with open_channel(controlplane, ca_pem=ca_pem, insecure=insecure, attempt=failures) as channel:
            stub: Any = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]
            request = agent_pb2.JoinRequest(
                join_token=join_token, version=__version__, hostname=hostname or socket.gethostname()
            )
            try:
                joined = await stub.Join(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REFUSED or exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                    raise CredentialRefused(f"the controlplane refused the join token: {_details(exc)}") from None
                failures += 1
                wait = random.uniform(0, delay_s(failures, initial_s=BACKOFF_INITIAL_S, cap_s=BACKOFF_CAP_S))
                log.warning(
                    "could not join at %s (%s: %s); trying again in %.1f s",
                    controlplane,
                    exc.code().name,
                    _details(exc),
                    wait,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                continue
        return AgentCredential(
            agent_id=joined.agent_id,
            token=joined.agent_token,
            controlplane=controlplane,
            provider=joined.provider,
            ca_pem=ca_pem,
            labels=dict(joined.labels),
            workspace=joined.workspace_id or None,
            insecure=insecure,
        )
    return None


async def connect_forever(
    credential: AgentCredential, handler: SessionHandler, stop: asyncio.Event, *, hostname: str | None = None
) -> None:
    """Hold the agent's stream open until ``stop`` is set, dialling again after each failure.

    :raises CredentialRefused: the controlplane refused the credential.
    :raises InsecureRefused: see :func:`open_channel`.
    """
    failures = 0
    attempt = 0  # which address: one further along the list at every try, whatever became of the last one
    while not stop.is_set():
        welcomed = asyncio.Event()
        try:
            await _one_stream(credential, handler, stop, welcomed, hostname or socket.gethostname(), attempt)
            reason = "the controlplane ended the stream"
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _REFUSED:
                raise CredentialRefused(f"the controlplane refused this agent's credential: {_details(exc)}") from None
            reason = f"{exc.code().name}: {_details(exc)}"
        except (TimeoutError, ConnectionError, _ProtocolError) as exc:
            reason = str(exc) or type(exc).__name__
        if stop.is_set():
            return
        failures = 1 if welcomed.is_set() else failures + 1
        wait = random.uniform(0, delay_s(failures, initial_s=BACKOFF_INITIAL_S, cap_s=BACKOFF_CAP_S))
        log.warning(
            "stream to %s lost or not opened (%s); dialling %s in %.1f s",
            _address(credential.controlplane, attempt),
            reason,
            _address(credential.controlplane, attempt + 1),
            wait,
        )
        attempt += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


class _ProtocolError(Exception):
    """The controlplane answered Hello with something other than Welcome."""


async def _one_stream(
    credential: AgentCredential,
    handler: SessionHandler,
    stop: asyncio.Event,
    welcomed: asyncio.Event,
    hostname: str,
    attempt: int,
) -> None:
    outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
    send: Send = outbox.put_nowait
    async with open_channel(
        credential.controlplane, ca_pem=credential.ca_pem, insecure=credential.insecure, attempt=attempt
    ) as channel:
        stub: Any = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(metadata=(("authorization", f"Bearer {credential.token}"),))
        writer = asyncio.create_task(_write(call, outbox), name="agent stream writer")
        tasks: list[asyncio.Task[Any]] = [writer]
        try:
            send(
                agent_pb2.AgentMessage(
                    hello=agent_pb2.Hello(version=__version__, provider=credential.provider, hostname=hostname)
                )
            )
            try:
                first = await asyncio.wait_for(call.read(), WELCOME_TIMEOUT_S)
            except TimeoutError:
                raise _ProtocolError(f"no Welcome within {WELCOME_TIMEOUT_S:g} s of Hello") from None
            if first is grpc.aio.EOF:
                raise _ProtocolError("the controlplane ended the stream before its Welcome")
            if first.WhichOneof("body") != "welcome":
                raise _ProtocolError(f"the controlplane answered Hello with {first.WhichOneof('body')}, not Welcome")
            welcomed.set()
            heartbeat_s = first.welcome.heartbeat_s if first.welcome.heartbeat_s > 0 else 10.0
            log.info(
                "connected to %s as agent %s (heartbeat every %g s)",
                _address(credential.controlplane, attempt),
                first.welcome.agent_id or credential.agent_id,
                heartbeat_s,
            )
            reader = asyncio.create_task(_read(call, handler, send), name="agent stream reader")
            session = asyncio.create_task(handler.session(send, heartbeat_s), name="agent session")
            stopping = asyncio.create_task(stop.wait(), name="agent stop")
            tasks += [reader, session, stopping]
            done, _ = await asyncio.wait({reader, session, writer, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping in done:
                outbox.put_nowait(None)  # the writer closes our side, then the stream is cancelled below
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer, 5)
                return
            for task in done:
                task.result()  # the first failure, as the reason to reconnect
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            call.cancel()


async def _write(call: Any, outbox: asyncio.Queue[agent_pb2.AgentMessage | None]) -> None:
    while True:
        message = await outbox.get()
        if message is None:
            await call.done_writing()
            return
        await call.write(message)


async def _read(call: Any, handler: SessionHandler, send: Send) -> None:
    while True:
        command = await call.read()
        if command is grpc.aio.EOF:  # ended with OK (a failed stream raises from read)
            return
        which = command.WhichOneof("body")
        if which == "order":
            handler.order(command.order, send)
        elif which == "ping":
            send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
        # a Welcome again, or a command of a newer controlplane: nothing to do
