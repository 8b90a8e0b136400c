"""A worker's tunnel reached from another replica: two real gRPC servers, a real Redis, the worker's real tunnel.

Replica "a" holds the worker's tunnel; replica "b" is asked for the worker's
container and relays through "a" (``Replica.Relay``). Checked: bytes both ways
(megabytes, an echo), a half-close passed on, a container the worker cannot
connect to is refused as such, a relay without the replicas' credential (none,
a wrong one, a user's bearer token) is UNAUTHENTICATED, over TLS the relay verifies the
holder with the listeners' CA (another CA's certificate is refused), a holder that is gone
is waited past until the worker opens its tunnel elsewhere, and nobody holding
the tunnel is a NoTunnel naming the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from redis.asyncio import Redis

from levers9.controlplane.grpc_replica import RelayDialer, ReplicaService
from levers9.proto.v1 import replica_pb2, replica_pb2_grpc, worker_pb2, worker_pb2_grpc
from levers9.services.tunnel_holders import RelayFailed, TunnelHolders, replica_credentials
from levers9.services.tunnels import NoTunnel, TunnelRegistry
from levers9.state.redis.connect import connect
from levers9.tunnel import frames
from levers9.worker.tunnel import hold_tunnel
from tests.fixtures.ports import free_port
from tests.fixtures.tls import Issued, TestCA

pytestmark = pytest.mark.timeout(60)

WORKER = "wkr_relay"
KEYS = [b"k" * 32, b"o" * 32]  # the current key, and an older one still accepted
CREDENTIALS = replica_credentials(KEYS)


class TunnelOnly(worker_pb2_grpc.WorkerServicer):
    """The worker's Tunnel rpc as the controlplane serves it, less the authentication (tested end to end)."""

    def __init__(self, registry: TunnelRegistry) -> None:
        self.registry = registry

    async def Tunnel(self, request_iterator: AsyncIterator[worker_pb2.TunnelFrame], context: Any) -> None:
        async def incoming() -> AsyncIterator[frames.Frame]:
            async for message in request_iterator:
                yield frames.from_message(message)

        async def send(frame: frames.Frame) -> None:
            await context.write(frames.to_message(frame))

        await self.registry.serve(WORKER, incoming(), send)


@dataclass
class Replica:
    name: str
    port: int
    server: grpc.aio.Server
    tunnels: TunnelRegistry
    holders: TunnelHolders
    relays: RelayDialer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def _replica(
    redis: Redis,
    name: str,
    prefix: str,
    *,
    credential: str = CREDENTIALS[0],
    tls: Issued | None = None,
    ca_pem: str = "",
) -> Replica:
    port = free_port()
    holders = TunnelHolders(redis, replica=name, address=f"127.0.0.1:{port}", prefix=prefix)
    relays = RelayDialer(credential, tls=tls is not None, ca_pem=ca_pem)
    tunnels = TunnelRegistry(holders, relays)
    server = grpc.aio.server()
    add_worker: Any = worker_pb2_grpc.add_WorkerServicer_to_server
    add_worker(TunnelOnly(tunnels), server)
    add_replica: Any = replica_pb2_grpc.add_ReplicaServicer_to_server
    add_replica(ReplicaService(tunnels, CREDENTIALS), server)
    if tls is not None:
        server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(tls.key_pem, tls.cert_pem)]))
    else:
        server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    holders.start(tunnels.held)
    return Replica(name, port, server, tunnels, holders, relays)


async def _stop(replica: Replica) -> None:
    await replica.relays.close()
    await replica.holders.close(replica.tunnels.held())
    replica.tunnels.close()
    await replica.server.stop(0)


@contextlib.asynccontextmanager
async def _worker_tunnel(replica: Replica, ca_pem: bytes | None = None) -> AsyncIterator[None]:
    """The worker's tunnel to ``replica``, held until the block ends (over TLS with ``ca_pem``)."""
    if ca_pem is None:
        opened = grpc.aio.insecure_channel(replica.address)
    else:
        opened = grpc.aio.secure_channel(replica.address, grpc.ssl_channel_credentials(root_certificates=ca_pem))
    async with opened as channel:
        factory: Any = worker_pb2_grpc.WorkerStub
        holding = asyncio.create_task(hold_tunnel(factory(channel), lambda: []))
        try:
            async with asyncio.timeout(10):
                while not replica.tunnels.has(WORKER):
                    await asyncio.sleep(0.02)
            yield
        finally:
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holding


async def _echo() -> asyncio.Server:
    """The worker's container: echoes until the caller's half-close, then says how much it read and closes."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        total = 0
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                total += len(data)
                writer.write(data)
                await writer.drain()
            writer.write(b"<read %d>" % total)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_replica_relays_through_the_one_holding_the_workers_tunnel(redis: Redis) -> None:
    prefix = f"t{free_port()}:"
    a = await _replica(redis, "a", prefix)
    b = await _replica(redis, "b", prefix)
    echo = await _echo()
    echo_port = echo.sockets[0].getsockname()[1]
    try:
        async with _worker_tunnel(a):
            assert await b.holders.holder(WORKER) == ("a", a.address)
            reader, writer = await b.tunnels.connect(WORKER, "127.0.0.1", echo_port, timeout_s=5)
            big = bytes(range(256)) * 12_000  # 3 MB, more than any window on the way
            writer.write(big)
            await writer.drain()
            assert await reader.readexactly(len(big)) == big
            writer.write_eof()  # passed on as a half-close: the container answers, then ends
            assert await reader.read() == b"<read %d>" % len(big)
            assert reader.at_eof()
            writer.close()

            # nothing listens there: the worker's refusal, as a refused connection
            with pytest.raises(ConnectionRefusedError, match="cannot connect"):
                await b.tunnels.connect(WORKER, "127.0.0.1", free_port(), timeout_s=5)
    finally:
        echo.close()
        await _stop(b)
        await _stop(a)
    assert await redis.get(f"{prefix}tunnel:{WORKER}") is None  # the tunnel ended: its entry went with it


async def test_a_relay_without_the_replicas_credential_is_unauthenticated(redis: Redis) -> None:
    prefix = f"t{free_port()}:"
    a = await _replica(redis, "a", prefix)
    echo = await _echo()
    echo_port = echo.sockets[0].getsockname()[1]
    try:
        async with _worker_tunnel(a):
            for credential in ("", "0" * 64, CREDENTIALS[0][:-1] + "x"):
                dialer = RelayDialer(credential)
                try:
                    with pytest.raises(RelayFailed, match="UNAUTHENTICATED"):
                        await dialer(a.address, WORKER, "127.0.0.1", echo_port, 5)
                finally:
                    await dialer.close()
            # a user's token is no credential here; a call without any metadata neither
            async with grpc.aio.insecure_channel(a.address) as channel:
                factory: Any = replica_pb2_grpc.ReplicaStub
                stub = factory(channel)
                opening = replica_pb2.RelayChunk(
                    open=replica_pb2.RelayOpen(worker_id=WORKER, host="127.0.0.1", port=echo_port)
                )
                for metadata in ([("authorization", "Bearer l9u_user_token")], []):
                    call = stub.Relay(iter([opening]), metadata=metadata, timeout=10)
                    # the status the replica answered with: reading instead may raise the client's own failure
                    # to send the opening chunk into a call the replica already ended (INTERNAL, under load)
                    code = await call.code()
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, await call.details())
            # the older key's credential is accepted (a rotation does not split the replicas)
            older = RelayDialer(CREDENTIALS[1])
            try:
                reader, writer = await older(a.address, WORKER, "127.0.0.1", echo_port, 5)
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"
                writer.close()
            finally:
                await older.close()
    finally:
        echo.close()
        await _stop(a)


async def test_a_gone_holder_is_waited_past_and_nobody_holding_is_a_no_tunnel(redis: Redis) -> None:
    prefix = f"t{free_port()}:"
    b = await _replica(redis, "b", prefix)
    c = await _replica(redis, "c", prefix)
    echo = await _echo()
    echo_port = echo.sockets[0].getsockname()[1]
    try:
        with pytest.raises(NoTunnel, match=f"worker {WORKER} .*no controlplane replica holds one"):
            await b.tunnels.connect(WORKER, "127.0.0.1", echo_port, timeout_s=0.5)

        # the holder named in Redis died without removing its entries (SIGKILL): nothing answers there
        await redis.set(f"{prefix}tunnel:{WORKER}", "gone", px=30_000)
        await redis.set(f"{prefix}replica:gone:relay", f"127.0.0.1:{free_port()}", px=30_000)
        with pytest.raises(NoTunnel, match=r"replica gone at 127\.0\.0\.1:\d+, recorded as holding it"):
            await b.tunnels.connect(WORKER, "127.0.0.1", echo_port, timeout_s=1)

        # meanwhile the worker opens its tunnel again, to c: the waiting request goes through c
        connecting = asyncio.create_task(b.tunnels.connect(WORKER, "127.0.0.1", echo_port, timeout_s=10))
        await asyncio.sleep(0.3)
        assert not connecting.done()
        async with _worker_tunnel(c):
            reader, writer = await connecting
            writer.write(b"again")
            assert await reader.readexactly(5) == b"again"
            writer.close()
    finally:
        echo.close()
        await _stop(c)
        await _stop(b)


async def test_over_tls_a_relay_verifies_the_holder_with_the_listeners_ca(redis: Redis) -> None:
    prefix = f"t{free_port()}:"
    ca, stranger = TestCA(), TestCA("another CA")
    ca_pem = ca.pem.decode()
    a = await _replica(redis, "a", prefix, tls=ca.issue(), ca_pem=ca_pem)
    b = await _replica(redis, "b", prefix, tls=ca.issue(), ca_pem=ca_pem)
    echo = await _echo()
    echo_port = echo.sockets[0].getsockname()[1]
    try:
        async with _worker_tunnel(a, ca.pem):
            reader, writer = await b.tunnels.connect(WORKER, "127.0.0.1", echo_port, timeout_s=5)
            writer.write(b"over tls")
            assert await reader.readexactly(8) == b"over tls"
            writer.close()
            # a replica trusting another CA does not take this holder for a replica
            doubting = RelayDialer(CREDENTIALS[0], tls=True, ca_pem=stranger.pem.decode())
            try:
                with pytest.raises(RelayFailed, match="UNAVAILABLE"):
                    await doubting(a.address, WORKER, "127.0.0.1", echo_port, 5)
            finally:
                await doubting.close()
    finally:
        echo.close()
        await _stop(b)
        await _stop(a)
