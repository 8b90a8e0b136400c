"""The worker's side of serving through NAT: the port the controlplane tries, and the tunnel it holds open.

:class:`ProbeListener` listens on an ephemeral TCP port on every address and
answers each connection with a random nonce, then closes it. The worker names
the port and the nonce when it registers; the controlplane connects to the
port at the address the worker's call came from. Reached and answered with
the nonce: the gateway can connect to the worker, and its serving containers
are reached directly. Not reached (inbound connections dropped, NAT, a
proxy in between): the controlplane answers ``RegisterResponse.tunnel``.

:func:`hold_tunnel` then holds the ``Tunnel`` stream to the replica the
worker registered with, with the worker's credential, for as long as the
session lasts: each stream the controlplane opens ("connect to host:port")
is connected locally (the worker's serving containers, at the addresses it
reported) and relayed with flow control (:mod:`levers9.tunnel`). A tunnel
that breaks is dialled again with back-off and jitter; a stream that cannot
be connected is refused with the reason (``connection refused``, say), which
the gateway takes as a container that is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from levers9.backoff import Backoff
from levers9.proto.v1 import worker_pb2, worker_pb2_grpc
from levers9.tunnel import frames
from levers9.tunnel.mux import Mux, TunnelStream
from levers9.tunnel.streams import relay

__all__ = ["ProbeListener", "connect_locally", "hold_tunnel"]

log = logging.getLogger(__name__)

#: how long connecting to a serving container through the tunnel may take
CONNECT_TIMEOUT_S = 5.0


class ProbeListener:
    """A TCP port on every address that answers a nonce: what the controlplane tries at registration."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(16)
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; a worker that cannot listen offers no port (``port`` stays 0) and is taken as reachable."""
        try:
            sock = _dual_stack_socket()
            self._server = await asyncio.start_server(self._answer, sock=sock)
        except OSError as exc:
            log.warning("cannot listen for the controlplane's reachability check: %s", exc)
            return
        self.port = sock.getsockname()[1]

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            writer.write(self.nonce.encode())
            await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None


def _dual_stack_socket() -> socket.socket:
    """One listening socket, one port, for IPv6 and IPv4 peers (IPv4 alone where IPv6 is off)."""
    try:
        # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on the connections it accepts
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
        except OSError:
            sock.close()
            raise
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


async def connect_locally(stream: TunnelStream) -> None:
    """Answer a stream the controlplane opened: connect to its host:port here, then relay until both end."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(stream.host, stream.port), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        stream.refuse(f"the worker cannot connect to {stream.host}:{stream.port}: {exc or type(exc).__name__}")
        return
    stream.accept()
    await relay(stream, reader, writer)


async def hold_tunnel(
    stub: worker_pb2_grpc.WorkerStub,
    metadata: Callable[[], Sequence[tuple[str, str]]],
    *,
    name: str = "controlplane",
) -> None:
    """Hold the tunnel until cancelled (the session ended), dialling again with back-off when it breaks."""
    backoff = Backoff(initial_s=0.5, cap_s=15.0, jitter=True)
    while True:
        started = asyncio.get_running_loop().time()
        try:
            reason = await _one_tunnel(stub, metadata(), name)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        if asyncio.get_running_loop().time() - started > 30:
            backoff.reset()  # it held for a while: this is a new break, not one more in a row
        wait = backoff.next_s()
        log.warning("the tunnel to the controlplane ended (%s); opening it again in %.1f s", reason, wait)
        await asyncio.sleep(wait)


async def _one_tunnel(stub: worker_pb2_grpc.WorkerStub, metadata: Sequence[tuple[str, str]], name: str) -> str:
    """Hold one Tunnel call until it ends; why it ended."""
    call = stub.Tunnel(metadata=tuple(metadata))

    async def send(frame: frames.Frame) -> None:
        await call.write(frames.to_message(frame))

    async def incoming() -> AsyncIterator[frames.Frame]:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            assert isinstance(message, worker_pb2.TunnelFrame)
            yield frames.from_message(message)

    mux = Mux(send, name=name, initiator=False, on_open=connect_locally)
    log.info("holding a tunnel to the controlplane: the gateway reaches this worker's containers through it")
    try:
        await mux.run(incoming())
    finally:
        call.cancel()
    if call.done():
        with contextlib.suppress(asyncio.CancelledError):
            code = await call.code()
            if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
                return f"{code.name}: {await call.details()}"
    return mux.closed or "ended"
