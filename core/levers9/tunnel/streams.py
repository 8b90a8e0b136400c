"""A tunnel stream as an asyncio reader/writer pair, and a relay between a tunnel stream and a TCP connection.

:func:`open_connection` is ``asyncio.open_connection`` over a tunnel: the
gateway's HTTP client uses what it answers exactly as a TCP connection (the
methods it calls are those of ``asyncio.StreamReader`` and
``asyncio.StreamWriter``; ``get_extra_info("socket")`` is None, there is no
socket). Closing the writer before both halves ended resets the stream, as
closing a socket with unread data does.

:func:`relay` is the far end: it copies bytes both ways between a tunnel
stream and a local TCP connection until both directions ended, passing each
half-close on, and waiting for the other side's reader (tunnel credit one way,
the socket's ``drain`` the other) so neither direction buffers without bound.
A failure on either side resets the stream and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib

from levers9.tunnel.mux import Mux, TunnelStream

__all__ = ["TunnelReader", "TunnelWriter", "open_connection", "relay"]

_CHUNK = 64 * 1024


class TunnelReader:
    """The reading half of a tunnel stream, with ``asyncio.StreamReader``'s methods."""

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream

    async def read(self, n: int = -1) -> bytes:
        return await self.stream.read(n)

    async def readexactly(self, n: int) -> bytes:
        return await self.stream.readexactly(n)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        return await self.stream.readuntil(separator)

    async def readline(self) -> bytes:
        try:
            return await self.stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial

    def at_eof(self) -> bool:
        return self.stream.at_eof()


class TunnelWriter:
    """The writing half of a tunnel stream, with ``asyncio.StreamWriter``'s methods."""

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.stream.write(data)

    def writelines(self, data: list[bytes]) -> None:
        for piece in data:
            self.stream.write(piece)

    async def drain(self) -> None:
        await self.stream.drain()

    def write_eof(self) -> None:
        self.stream.write_eof()

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.stream.close()

    def is_closing(self) -> bool:
        return self.stream.is_closing()

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.stream.get_extra_info(name, default)


async def open_connection(
    mux: Mux, host: str, port: int, *, timeout_s: float = 10.0
) -> tuple[TunnelReader, TunnelWriter]:
    """A connection to ``host:port`` on the tunnel's other side; StreamReset/TunnelClosed/TimeoutError otherwise."""
    stream = await mux.open(host, port, timeout_s=timeout_s)
    return TunnelReader(stream), TunnelWriter(stream)


async def relay(stream: TunnelStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy both ways between ``stream`` and a TCP connection until both directions ended, then close both."""

    async def outward() -> None:  # the connection's bytes into the tunnel
        while data := await reader.read(_CHUNK):
            stream.write(data)
            await stream.drain()
        stream.write_eof()
        await stream.wait_sent()  # the peer has all of it before the stream is closed

    async def inward() -> None:  # the tunnel's bytes into the connection
        while data := await stream.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    tasks = [asyncio.create_task(outward()), asyncio.create_task(inward())]
    try:
        for next_done in asyncio.as_completed(tasks):
            await next_done  # the first failure ends both
    except (OSError, asyncio.IncompleteReadError) as exc:
        stream.reset(f"the connection to {stream.host}:{stream.port} failed: {exc or type(exc).__name__}")
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        stream.close()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
