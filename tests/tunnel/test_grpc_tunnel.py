"""The worker's tunnel over real gRPC: opened, used, and opened again after the controlplane's end went away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from levers9.proto.v1 import worker_pb2, worker_pb2_grpc
from levers9.services.tunnels import TunnelRegistry
from levers9.tunnel import frames
from levers9.worker.tunnel import hold_tunnel
from tests.fixtures.ports import free_port


class TunnelOnly(worker_pb2_grpc.WorkerServicer):
    """The Tunnel rpc as the controlplane serves it, less the authentication (tested end to end)."""

    def __init__(self, registry: TunnelRegistry) -> None:
        self.registry = registry
        self.seen_metadata: list[Sequence[tuple[str, str]]] = []

    async def Tunnel(self, request_iterator: AsyncIterator[worker_pb2.TunnelFrame], context: Any) -> None:
        self.seen_metadata.append(tuple(context.invocation_metadata()))

        async def incoming() -> AsyncIterator[frames.Frame]:
            async for message in request_iterator:
                yield frames.from_message(message)

        async def send(frame: frames.Frame) -> None:
            await context.write(frames.to_message(frame))

        await self.registry.serve("wkr_g", incoming(), send)


async def _serve(port: int) -> tuple[grpc.aio.Server, TunnelRegistry, TunnelOnly]:
    registry = TunnelRegistry()
    servicer = TunnelOnly(registry)
    server = grpc.aio.server()
    add: Any = worker_pb2_grpc.add_WorkerServicer_to_server
    add(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, registry, servicer


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def _round_trip(registry: TunnelRegistry, port: int, payload: bytes) -> bytes:
    reader, writer = await registry.connect("wkr_g", "127.0.0.1", port, timeout_s=30)
    writer.write(payload)
    writer.write_eof()
    got = b""
    while data := await reader.read():
        got += data
    writer.close()
    return got


async def test_the_worker_holds_its_tunnel_and_opens_it_again_after_a_break() -> None:
    port = free_port()
    echo = await _echo_server()
    echo_port = echo.sockets[0].getsockname()[1]
    server, registry, servicer = await _serve(port)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    factory: Any = worker_pb2_grpc.WorkerStub
    worker = asyncio.create_task(hold_tunnel(factory(channel), lambda: (("authorization", "Bearer l9_m_x"),)))
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB, more than a window each way
        assert await _round_trip(registry, echo_port, payload) == payload
        assert ("authorization", "Bearer l9_m_x") in servicer.seen_metadata[0]  # the worker's credential

        await server.stop(0)  # the controlplane goes away; another starts on the same address
        server, registry, servicer = await _serve(port)
        assert await _round_trip(registry, echo_port, b"again") == b"again"  # connect waits for the new tunnel
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await channel.close()
        await server.stop(0)
        echo.close()
