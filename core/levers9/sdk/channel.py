"""The gRPC channel to a controlplane, its call metadata, and errors a person can act on.

The SDK and every client command go through here, so that a context means the
same address, TLS choice, trusted CAs, message limits and keepalive
everywhere, and a refused connection reads as "is the controlplane running?"
rather than a gRPC status dump.

A context may list several replicas; :func:`open_channel` opens one channel
to one of them (the first unless told which): moving between replicas is the
client's job (:mod:`levers9.sdk.client`). A TLS channel trusts the context's
``ca_file`` when it has one, else the system trust store; a certificate that
does not verify is reported as such, naming ``ca_file`` and
``$LEVERS9_CA_FILE`` (:func:`explain`). An unreadable ``ca_file`` raises
:class:`~levers9.sdk.context.ContextError` naming the context and the key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from levers9.payloads import MESSAGE_MAX_BYTES
from levers9.proto.target import parse_target, parse_targets
from levers9.proto.tls import certificate_untrusted, read_ca_file, system_roots
from levers9.proto.v1 import controlplane_pb2_grpc
from levers9.sdk.context import ENV_CA_FILE, ENV_TOKEN, Context, ContextError

__all__ = [
    "KEEPALIVE_TIME_MS",
    "MAX_MESSAGE_BYTES",
    "call_metadata",
    "control_plane",
    "credentials",
    "explain",
    "open_channel",
    "parse_target",
    "untrusted_message",
]

#: batches of inline payloads travel in one message, so the default 4 MiB is too small (see levers9.payloads)
MAX_MESSAGE_BYTES = MESSAGE_MAX_BYTES
#: an Invoke waiting for a GPU or a followed log can be silent for minutes: pings on a channel with calls in
#: flight keep NATs and load balancers from cutting it, and find a replica that stopped answering with its
#: sockets open (SIGSTOP, a stalled host: the kernel still acknowledges) within KEEPALIVE_TIME_MS +
#: KEEPALIVE_TIMEOUT_MS (16 s), so the client moves to another replica as a worker does
#: (levers9.worker.dialing). The server must accept pings this often (its
#: grpc.http2.min_ping_interval_without_data_ms, 10 s, at most this).
KEEPALIVE_TIME_MS = 12_000
KEEPALIVE_TIMEOUT_MS = 4_000


def credentials(ctx: Context) -> grpc.ChannelCredentials:
    """TLS credentials trusting ``ctx.ca_file``, else the system's CAs."""
    if ctx.ca_file:
        source = f"${ENV_CA_FILE}" if os.environ.get(ENV_CA_FILE) == ctx.ca_file else f"context {ctx.name!r}: ca_file"
        try:
            roots: bytes | None = read_ca_file(ctx.ca_file, source)
        except ValueError as exc:
            raise ContextError(str(exc)) from None
    else:
        roots = system_roots()
    return grpc.ssl_channel_credentials(root_certificates=roots)


def open_channel(ctx: Context, address: str | None = None) -> grpc.aio.Channel:
    """A channel to ``address`` (default: ``ctx``'s first); call it inside the event loop that will use it."""
    target, tls = parse_target(address if address is not None else ctx.addresses[0])
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # grpcio waits for a ping's answer this long whatever keepalive_timeout_ms says (60 s by default)
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # Only calls in flight need keeping alive; an idle channel pinging would be refused.
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if tls:
        return grpc.aio.secure_channel(target, credentials(ctx), options=options)
    return grpc.aio.insecure_channel(target, options=options)


def control_plane(channel: grpc.aio.Channel) -> controlplane_pb2_grpc.ControlPlaneStub:
    """The ControlPlane stub on ``channel``."""
    # The generated class has no annotations; going through Any keeps strict typing quiet
    # here, in one place, however the generated code changes.
    factory: Any = controlplane_pb2_grpc.ControlPlaneStub
    stub: controlplane_pb2_grpc.ControlPlaneStub = factory(channel)
    return stub


def call_metadata(ctx: Context) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries: the bearer token, when the context has one, and the environment to act
    in, when it is not main."""
    return ctx.credentials()


def untrusted_message(ctx: Context, target: str) -> str:
    """Why a TLS connection was refused on our side, and which setting fixes it."""
    trusted = f"the CA bundle {ctx.ca_file}" if ctx.ca_file else "the system trust store"
    return (
        f"the controlplane's certificate at {target} was not trusted (checked against {trusted}): "
        f"set ca_file in context {ctx.name!r} (`levers9 context add {ctx.name} --ca-file CA.pem ...`) "
        f"or ${ENV_CA_FILE} to the PEM CA bundle that signed it"
    )


def _targets(ctx: Context) -> list[str]:
    try:
        return parse_targets(ctx.grpc)[0]
    except ValueError:
        return [parse_target(a)[0] for a in ctx.addresses]


def explain(exc: grpc.aio.AioRpcError, ctx: Context, tried: Sequence[str] | None = None) -> str:
    """One message for a person: what went wrong talking to ``ctx``'s controlplane and what to try.

    ``tried`` is every address a failing call went to (default: all of the context's); an unreachable
    controlplane names each of them.
    """
    targets = list(tried) if tried else _targets(ctx)
    target = targets[-1] if tried else targets[0]
    code = exc.code()
    details = (exc.details() or "").strip()
    if code == grpc.StatusCode.UNAVAILABLE and certificate_untrusted(details):
        return untrusted_message(ctx, target)
    if code == grpc.StatusCode.UNAVAILABLE:
        where = f"at {target}" if len(targets) == 1 else f"at any of {', '.join(targets)}"
        message = f"cannot reach the controlplane {where} (is `levers9 up` or `levers9 server` running?)"
        return f"{message}\n  {details}" if details else message
    if code == grpc.StatusCode.UNAUTHENTICATED:
        source = f"${ENV_TOKEN}" if os.environ.get(ENV_TOKEN) else f"context {ctx.name!r}"
        hint = (
            f"the controlplane at {target} did not accept the token of {source}"
            f"{': ' + details if details else ''}; "
            f"set a valid one with `levers9 context add {ctx.name} --grpc {ctx.grpc.replace(' ', '')} --token TOKEN`"
        )
        return hint
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the controlplane at {target} did not answer in time{': ' + details if details else ''}"
    return details or f"the controlplane at {target} answered {code.name}"
