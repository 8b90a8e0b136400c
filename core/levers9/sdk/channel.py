"""The gRPC channel to a controlplane, its call metadata, and errors a person can act on.

The SDK and every client command go through here, so that a context means the
same address, TLS choice, message limits and keepalive everywhere, and a
refused connection reads as "is the controlplane running?" rather than a gRPC
status dump.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import grpc
import grpc.aio

from levers9.payloads import MESSAGE_MAX_BYTES
from levers9.proto.target import parse_target
from levers9.proto.v1 import controlplane_pb2_grpc
from levers9.sdk.context import ENV_TOKEN, Context

__all__ = [
    "KEEPALIVE_TIME_MS",
    "MAX_MESSAGE_BYTES",
    "call_metadata",
    "control_plane",
    "explain",
    "open_channel",
    "parse_target",
]

#: batches of inline payloads travel in one message, so the default 4 MiB is too small (see levers9.payloads)
MAX_MESSAGE_BYTES = MESSAGE_MAX_BYTES
#: an Invoke waiting for a GPU or a followed log can be silent for minutes; pinging keeps NATs
#: and load balancers (AWS NLB drops idle flows after 350 s) from cutting it. The server must
#: accept pings this often (its grpc.http2.min_ping_interval_without_data_ms at most this).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000

# Where Linux distributions keep the system CA bundle, for when Python's own default is absent.
_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)


def open_channel(ctx: Context) -> grpc.aio.Channel:
    """A channel to ``ctx``'s controlplane; call it inside the event loop that will use the channel."""
    target, tls = parse_target(ctx.grpc)
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # Only calls in flight need keeping alive; an idle channel pinging would be refused.
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if tls:
        credentials = grpc.ssl_channel_credentials(root_certificates=_system_roots())
        return grpc.aio.secure_channel(target, credentials, options=options)
    return grpc.aio.insecure_channel(target, options=options)


def control_plane(channel: grpc.aio.Channel) -> controlplane_pb2_grpc.ControlPlaneStub:
    """The ControlPlane stub on ``channel``."""
    # The generated class has no annotations; going through Any keeps strict typing quiet
    # here, in one place, however the generated code changes.
    factory: Any = controlplane_pb2_grpc.ControlPlaneStub
    stub: controlplane_pb2_grpc.ControlPlaneStub = factory(channel)
    return stub


def call_metadata(ctx: Context) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries: the bearer token, when the context has one."""
    if not ctx.token:
        return ()
    return (("authorization", f"Bearer {ctx.token}"),)


def explain(exc: grpc.aio.AioRpcError, ctx: Context) -> str:
    """One message for a person: what went wrong talking to ``ctx``'s controlplane and what to try."""
    target, _ = parse_target(ctx.grpc)
    code = exc.code()
    details = (exc.details() or "").strip()
    if code == grpc.StatusCode.UNAVAILABLE:
        message = f"cannot reach the controlplane at {target} (is `levers9 up` or `levers9 server` running?)"
        return f"{message}\n  {details}" if details else message
    if code == grpc.StatusCode.UNAUTHENTICATED:
        source = f"${ENV_TOKEN}" if os.environ.get(ENV_TOKEN) else f"context {ctx.name!r}"
        hint = (
            f"the controlplane at {target} did not accept the token of {source}"
            f"{': ' + details if details else ''}; "
            f"set a valid one with `levers9 context add {ctx.name} --grpc {ctx.grpc} --token TOKEN`"
        )
        return hint
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the controlplane at {target} did not answer in time{': ' + details if details else ''}"
    return details or f"the controlplane at {target} answered {code.name}"


def _system_roots() -> bytes | None:
    """The system's CA certificates, so a controlplane behind a company CA works like any HTTPS site.

    gRPC otherwise trusts only the roots it ships. ``None`` falls back to those
    (``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` still overrides them).
    """
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, *_CA_BUNDLES):
        if candidate and os.path.isfile(candidate):
            try:
                with open(candidate, "rb") as handle:
                    return handle.read()
            except OSError:
                continue
    return None
