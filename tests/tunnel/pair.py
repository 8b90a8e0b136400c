"""Two tunnel ends joined in memory, every frame through its protobuf form, and local TCP servers to reach."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from levers9.tunnel.frames import Frame, from_message, to_message
from levers9.tunnel.mux import Mux, TunnelStream
from levers9.tunnel.streams import relay

_END = None


class Channel:
    """One direction of the pair; counts what crossed it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.data_bytes = 0

    async def send(self, frame: Frame) -> None:
        message = to_message(frame)
        self.data_bytes += len(message.data)
        await self.queue.put(message.SerializeToString())

    async def frames(self) -> AsyncIterator[Frame]:
        from levers9.proto.v1 import worker_pb2

        while (raw := await self.queue.get()) is not _END:
            yield from_message(worker_pb2.TunnelFrame.FromString(raw))

    def end(self) -> None:
        self.queue.put_nowait(_END)


class Pair:
    """A controlplane end (opens streams) and a worker end (accepts them with ``on_open``)."""

    def __init__(self, on_open: Callable[[TunnelStream], object], *, window: int = 256 * 1024) -> None:
        self.down = Channel()  # controlplane -> worker
        self.up = Channel()  # worker -> controlplane
        self.near = Mux(self.down.send, name="near", initiator=True, window=window)
        self.far = Mux(self.up.send, name="far", initiator=False, on_open=on_open, window=window)  # type: ignore[arg-type]
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Pair:
        self.tasks = [
            asyncio.create_task(self.near.run(self.up.frames())),
            asyncio.create_task(self.far.run(self.down.frames())),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.near.close()
        self.far.close()
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def connect_locally(stream: TunnelStream) -> None:
    """The worker's answer to an open: a TCP connection to host:port, relayed."""
    reader, writer = await asyncio.open_connection(stream.host, stream.port)
    stream.accept()
    await relay(stream, reader, writer)
