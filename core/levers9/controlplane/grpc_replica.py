"""The Replica gRPC service, and its client: one replica relays a gateway connection through another's tunnel.

:class:`ReplicaService` is the holder's side of ``Replica.Relay``. It accepts
only the replicas' credential (metadata ``x-levers9-replica``, see
:mod:`levers9.services.tunnel_holders`; anything else is UNAUTHENTICATED, a
user's token included, before a byte is read), then opens ``host:port``
through the worker's tunnel held here
(:meth:`~levers9.services.tunnels.TunnelRegistry.connect_here`, never relayed
on, so relays cannot loop) and copies bytes both ways. The first answer says
how opening went: ``opened``; ``refused`` (the worker could not connect:
nothing reached the container, so the gateway may try another); ``no_tunnel``
(this replica holds none of that worker's now). The caller's end of its
stream is passed on as a half-close; the container's end ends the call.

:class:`RelayDialer` is the other side, the ``relay`` a
:class:`~levers9.services.tunnels.TunnelRegistry` is given: it dials the
holder's ``listen.replica_address`` (TLS with the listeners' CA when they
serve TLS; one channel per holder, kept), and hands the gateway's upstream an
ordinary ``asyncio`` reader/writer pair over a local socket pair, copied
to and from the call by one task per connection (so everything the upstream
does with a TCP connection, including noticing a close while idle, works
unchanged). The relay adds no security decision of its own: the gateway has
already decided who may reach the container, and the address it opens is the
one the worker reported, which the holder would open for its own gateway.

Failures: a holder that cannot be reached, refuses the credential, or holds no
tunnel of the worker raises :class:`~levers9.services.tunnel_holders.RelayFailed`
(the registry waits and looks again); ``refused`` raises
``ConnectionRefusedError`` with the worker's reason. A call that breaks
midway ends the connection as a reset TCP connection would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from levers9.proto.v1 import replica_pb2, replica_pb2_grpc
from levers9.services.tunnel_holders import CREDENTIAL_METADATA, RelayFailed, credential_accepted
from levers9.services.tunnels import NoTunnel, TunnelRegistry

__all__ = ["RelayDialer", "ReplicaService"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
_CHUNK = 64 * 1024
#: how long the holder waits for a tunnel it is asked for (one re-opening after a blip)
_HOLDER_WAIT_S = 1.0


class ReplicaService(replica_pb2_grpc.ReplicaServicer):
    """The holder's side of a relay (see the module's docstring)."""

    def __init__(self, tunnels: TunnelRegistry, credentials: Sequence[str]) -> None:
        self.tunnels = tunnels
        self.credentials = list(credentials)

    async def Relay(
        self, request_iterator: AsyncIterator[replica_pb2.RelayChunk], context: Context
    ) -> AsyncIterator[replica_pb2.RelayChunk]:
        given = dict(context.invocation_metadata() or ()).get(CREDENTIAL_METADATA, "")
        if not credential_accepted(str(given), self.credentials):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "Replica.Relay is for controlplane replicas: no valid replica credential",
            )
            return
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "open":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a relay's first message is `open`")
            return
        target = first.open
        try:
            reader, writer = await self.tunnels.connect_here(
                target.worker_id, target.host, target.port, timeout_s=_HOLDER_WAIT_S
            )
        except NoTunnel as exc:
            yield replica_pb2.RelayChunk(no_tunnel=str(exc))
            return
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError) as exc:
            yield replica_pb2.RelayChunk(refused=str(exc) or type(exc).__name__)
            return

        async def inward() -> None:  # the caller's bytes into the tunnel stream
            async for chunk in request_iterator:
                if chunk.data:
                    writer.write(chunk.data)
                    await writer.drain()
            writer.write_eof()

        pushing = asyncio.create_task(inward())
        try:
            yield replica_pb2.RelayChunk(opened=True)
            while data := await reader.read(_CHUNK):
                yield replica_pb2.RelayChunk(data=data)
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.info("relay to worker %s's %s:%d broke: %s", target.worker_id, target.host, target.port, exc)
        finally:
            pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pushing
            writer.close()


class RelayDialer:
    """Opens relays through other replicas (see the module's docstring); :meth:`close` ends them all."""

    def __init__(self, credential: str, *, tls: bool = False, ca_pem: str = "") -> None:
        self.credential = credential
        self.tls = tls
        self.ca_pem = ca_pem
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._pumps: set[asyncio.Task[None]] = set()

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            if self.tls:
                credentials = grpc.ssl_channel_credentials(root_certificates=self.ca_pem.encode() or None)
                channel = grpc.aio.secure_channel(address, credentials)
            else:
                channel = grpc.aio.insecure_channel(address)
            self._channels[address] = channel
        return channel

    async def __call__(
        self, address: str, worker_id: str, host: str, port: int, timeout_s: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        factory: Any = replica_pb2_grpc.ReplicaStub  # generated, unannotated
        stub = factory(self._channel(address))
        call = stub.Relay(metadata=[(CREDENTIAL_METADATA, self.credential)])
        try:
            async with asyncio.timeout(timeout_s):
                await call.write(
                    replica_pb2.RelayChunk(open=replica_pb2.RelayOpen(worker_id=worker_id, host=host, port=port))
                )
                first = await call.read()
        except (grpc.RpcError, TimeoutError, grpc.aio.UsageError) as exc:
            call.cancel()
            raise RelayFailed(_why(exc)) from None
        kind = None if first is grpc.aio.EOF else first.WhichOneof("kind")
        if kind != "opened":
            call.cancel()
            if kind == "refused":
                raise ConnectionRefusedError(first.refused)
            raise RelayFailed(first.no_tunnel if kind == "no_tunnel" else "the relay ended before it opened")
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        try:
            reader, writer = await asyncio.open_connection(sock=ours, limit=1 << 20)
        except BaseException:
            ours.close()
            theirs.close()
            call.cancel()
            raise
        pump = asyncio.create_task(_pump(call, theirs), name=f"relay-{worker_id}-{host}:{port}")
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return reader, writer

    async def close(self) -> None:
        for pump in list(self._pumps):
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def _why(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


async def _pump(call: Any, sock: socket.socket) -> None:
    """Copy between the relay call and the socket the upstream's connection is the other end of."""
    loop = asyncio.get_running_loop()

    async def outward() -> None:  # the upstream's bytes to the holder
        try:
            while data := await loop.sock_recv(sock, _CHUNK):
                await call.write(replica_pb2.RelayChunk(data=data))
        except OSError:  # the upstream dropped the connection: so does the relay
            call.cancel()
            return
        await call.done_writing()

    async def inward() -> None:  # the container's bytes to the upstream
        while (chunk := await call.read()) is not grpc.aio.EOF:
            if chunk.data:
                await loop.sock_sendall(sock, chunk.data)
        sock.shutdown(socket.SHUT_WR)

    sending = asyncio.create_task(outward())
    try:
        await inward()
        # the container's side ended: the upstream closes its end, which ends ``outward``
        with contextlib.suppress(Exception):
            await sending
    except (OSError, grpc.RpcError, grpc.aio.UsageError) as exc:
        log.debug("a relay ended: %s", exc)
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sending
        call.cancel()
        sock.close()
