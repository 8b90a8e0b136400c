"""Reaching a controlplane that has several replicas: every address at once, the first that answers wins.

:func:`dial` opens a channel to each address of a context and sends each a
``WhoAmI`` probe; the first replica that answers anything at all (even
UNAUTHENTICATED or UNIMPLEMENTED: something speaking gRPC is there) wins, and
the other attempts are cancelled and their channels closed. The preferred
address starts first and each next one :data:`STAGGER_S` later, or at once
when every attempt started so far has failed, so a healthy first replica is
the one used while a dead one costs a fraction of a second, not a timeout.

An address fails in one of these ways (:class:`Failure`, ``kind``):

* ``refused``: nothing listens there (TCP connection refused);
* ``silent``: it accepted TCP but gave no gRPC answer within the probe's
  deadline (a stopped process, a black hole);
* ``untrusted``, ``speaks-tls``, ``speaks-plain``: the TLS handshake cannot
  succeed (a certificate the context's CA bundle does not trust; a plain-text
  client at a TLS port, found by a TLS hello of our own; TLS at a plain-text
  port). These are *fatal*: trying again cannot help, so callers report them
  at once instead of retrying for ``reconnect_s``;
* ``unavailable``: anything else gRPC reports as UNAVAILABLE.

Every failure carries a one-line ``message`` naming the address and what to
do. No channel outlives :func:`dial` except the winner's, which the caller owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import grpc
import grpc.aio

from levers9.proto.target import parse_target
from levers9.proto.tls import certificate_untrusted
from levers9.proto.v1 import controlplane_pb2
from levers9.sdk.channel import control_plane, open_channel, untrusted_message
from levers9.sdk.context import Context

__all__ = ["PROBE_S", "STAGGER_S", "Failure", "Reached", "dial", "unreached_message"]

#: how long the next address waits for the ones started before it, so that a healthy first one is preferred
STAGGER_S = 0.25
#: how long one address may take to answer the probe (a black-holed address) before it counts as silent
PROBE_S = 10.0
#: how long the TLS hello sent to tell whether a port speaks TLS may take
_TLS_CHECK_S = 3.0

Kind = Literal["refused", "silent", "untrusted", "speaks-tls", "speaks-plain", "unavailable"]
_FATAL: frozenset[str] = frozenset({"untrusted", "speaks-tls", "speaks-plain"})


@dataclass
class Reached:
    """The replica that answered first: its position in the addresses given, and its open channel."""

    index: int
    channel: grpc.aio.Channel


@dataclass
class Failure:
    """Why one address did not answer."""

    index: int
    target: str
    kind: Kind
    message: str
    error: grpc.aio.AioRpcError

    @property
    def fatal(self) -> bool:
        """Whether trying this address again cannot help (a TLS handshake that cannot succeed)."""
        return self.kind in _FATAL


async def dial(
    ctx: Context,
    addresses: Sequence[str] | None = None,
    *,
    prefer: int = 0,
    probe_s: float = PROBE_S,
    stagger_s: float = STAGGER_S,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Reached | list[Failure]:
    """The first of ``addresses`` (default: the context's) to answer, or why each failed, in the order they failed."""
    listed = list(addresses if addresses is not None else ctx.addresses)
    order = [(prefer + k) % len(listed) for k in range(len(listed))]
    attempts: dict[asyncio.Task[Reached | Failure], int] = {}
    failures: list[Failure] = []
    started = 0
    try:
        while True:
            if started < len(order) and not attempts:
                index = order[started]
                attempts[asyncio.create_task(_attempt(ctx, index, listed[index], probe_s, metadata))] = started
                started += 1
                continue
            done, _ = await asyncio.wait(
                attempts, timeout=stagger_s if started < len(order) else None, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:  # the ones in flight are slow: start the next as well
                index = order[started]
                attempts[asyncio.create_task(_attempt(ctx, index, listed[index], probe_s, metadata))] = started
                started += 1
                continue
            winners: list[tuple[int, Reached]] = []
            for task in done:
                rank = attempts.pop(task)
                outcome = task.result()
                if isinstance(outcome, Reached):
                    winners.append((rank, outcome))
                else:
                    failures.append(outcome)
            if winners:
                winners.sort(key=lambda pair: pair[0])
                for _, extra in winners[1:]:
                    await extra.channel.close()
                return winners[0][1]
            if not attempts and started == len(order):
                return failures
    finally:
        for task in attempts:
            task.cancel()
        for task in attempts:
            with contextlib.suppress(asyncio.CancelledError):
                outcome = await task
                if isinstance(outcome, Reached):
                    await outcome.channel.close()


def unreached_message(ctx: Context, failures: Sequence[Failure]) -> str:
    """One message for a dial that reached no replica: the fatal reason if any, else what each address did."""
    fatal = next((f for f in failures if f.fatal), None)
    if fatal is not None:
        return fatal.message
    targets = ", ".join(f.target for f in sorted(failures, key=lambda f: f.index))
    if all(f.kind == "refused" for f in failures):
        return f"no levers9 controlplane at {targets}: start one with `levers9 up` or check the context ({ctx.name!r})"
    return "cannot reach the controlplane: " + "; ".join(f.message for f in sorted(failures, key=lambda f: f.index))


async def _attempt(
    ctx: Context, index: int, address: str, probe_s: float, metadata: tuple[tuple[str, str], ...]
) -> Reached | Failure:
    channel = open_channel(ctx, address)
    kept = False
    try:
        try:
            await control_plane(channel).WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=metadata, timeout=probe_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return await _failure(ctx, index, address, exc, probe_s)
        kept = True
        return Reached(index, channel)
    finally:
        if not kept:
            await channel.close()


async def _failure(ctx: Context, index: int, address: str, exc: grpc.aio.AioRpcError, probe_s: float) -> Failure:
    target, tls = parse_target(address)
    details = (exc.details() or "").strip()
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Failure(index, target, "silent", f"{target} accepted no gRPC answer within {probe_s:g} s", exc)
    if "Connection refused" in details:
        return Failure(index, target, "refused", f"{target} refused the connection (nothing listens there)", exc)
    if tls and certificate_untrusted(details):
        return Failure(index, target, "untrusted", untrusted_message(ctx, target), exc)
    if tls and ("WRONG_VERSION_NUMBER" in details or "wrong version number" in details):
        message = (
            f"{target} speaks plain text, not TLS: use grpc://{target} in context {ctx.name!r} "
            f"(`levers9 context add {ctx.name} --grpc grpc://{target}`), or give the controlplane a certificate"
        )
        return Failure(index, target, "speaks-plain", message, exc)
    if not tls and await _speaks_tls(target):
        message = (
            f"{target} speaks TLS: use grpcs://{target} and --ca-file in context {ctx.name!r} "
            f"(`levers9 context add {ctx.name} --grpc grpcs://{target} --ca-file CA.pem`)"
        )
        return Failure(index, target, "speaks-tls", message, exc)
    return Failure(index, target, "unavailable", f"{target}: {details or exc.code().name}", exc)


async def _speaks_tls(target: str) -> bool:
    """Whether ``target`` answers a TLS hello with TLS (its certificate unchecked: only the protocol is asked)."""
    host, _, port = target.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not port.isdigit():
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=context), _TLS_CHECK_S)
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "")  # the server answered in TLS, refusing something of ours
    except (OSError, TimeoutError):
        return False
    writer.transport.abort()  # no TLS close_notify exchange: a peer that never sends one would hold it 30 s
    return True
