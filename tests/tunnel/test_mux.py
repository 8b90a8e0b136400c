"""The multiplexed tunnel over an in-memory pair, reaching real TCP servers on loopback through it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from levers9.tunnel.frames import Data
from levers9.tunnel.mux import WINDOW, Mux, StreamReset, TunnelClosed, TunnelStream
from levers9.tunnel.streams import open_connection
from tests.tunnel.pair import Pair, connect_locally

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
        await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def wait_until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {limit_s} s: {what}")
        await asyncio.sleep(0.01)


async def test_many_streams_at_once_each_get_their_own_bytes() -> None:
    async with tcp_server(echo) as port, Pair(connect_locally) as pair:

        async def one(i: int) -> bytes:
            reader, writer = await open_connection(pair.near, "127.0.0.1", port)
            payload = (f"stream {i}:".encode() + os.urandom(3000 + i * 517)) * 3
            for k in range(0, len(payload), 1000):
                writer.write(payload[k : k + 1000])
                await asyncio.sleep(0)
            writer.write_eof()
            got = b""
            while data := await reader.read():
                got += data
            assert reader.at_eof()
            writer.close()
            assert got == payload
            return got

        results = await asyncio.gather(*(one(i) for i in range(60)))
        assert len(results) == 60
        await wait_until(lambda: pair.near.streams() == 0 and pair.far.streams() == 0, "every stream forgotten")


async def test_a_reader_that_stops_holds_one_window_and_does_not_stop_the_other_streams() -> None:
    produced = 32 * 1024 * 1024  # well over what loopback sockets buffer
    written = 0

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):
            while written < produced:
                writer.write(chunk)
                await writer.drain()
                written += len(chunk)
        writer.close()

    async with tcp_server(firehose) as hose, tcp_server(echo) as port, Pair(connect_locally) as pair:
        stalled_reader, stalled_writer = await open_connection(pair.near, "127.0.0.1", hose)
        stalled = stalled_reader.stream
        # never read: the far side sends one window, then waits for credit
        await wait_until(lambda: len(stalled._inbox) == WINDOW, "the stalled stream's window filled")

        reader, writer = await open_connection(pair.near, "127.0.0.1", port)
        big = os.urandom(3 * 1024 * 1024)
        writer.write(big)
        writer.write_eof()
        got = bytearray()
        while data := await reader.read():
            got += data
        assert bytes(got) == big  # 3 MiB each way went past the stalled stream

        assert len(stalled._inbox) == WINDOW  # no more than its window came while nobody read
        assert written < produced  # and the firehose is held back, not buffered somewhere without bound

        # reading it now lets everything through
        total = 0
        while data := await stalled_reader.read():
            total += len(data)
        assert total == produced
        stalled_writer.close()


async def test_large_transfer_arrives_whole() -> None:
    async with tcp_server(echo) as port, Pair(connect_locally) as pair:
        reader, writer = await open_connection(pair.near, "127.0.0.1", port)
        payload = os.urandom(24 * 1024 * 1024)

        async def send() -> None:
            for k in range(0, len(payload), 1 << 20):
                writer.write(payload[k : k + (1 << 20)])
                await writer.drain()  # bounded: at most a window waits in the writer
                assert len(writer.stream._outbox) <= WINDOW
            writer.write_eof()

        digest = hashlib.sha256()
        size = 0
        sender = asyncio.create_task(send())
        while data := await reader.readexactly(min(65536, len(payload) - size)) if size < len(payload) else b"":
            digest.update(data)
            size += len(data)
        await sender
        assert await reader.read() == b""
        assert size == len(payload)
        assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()


async def test_reset_from_the_opener_closes_the_far_connection() -> None:
    closed = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello\n")
        await writer.drain()
        await reader.read()  # until the tunnel's side goes away
        closed.set()
        writer.close()

    async with tcp_server(hold) as port, Pair(connect_locally) as pair:
        reader, writer = await open_connection(pair.near, "127.0.0.1", port)
        assert await reader.readuntil(b"\n") == b"hello\n"
        writer.close()  # before the far side ended: a reset
        await asyncio.wait_for(closed.wait(), 10)
        assert writer.is_closing()
        with pytest.raises(ConnectionResetError):
            await reader.read()
        await wait_until(lambda: pair.far.streams() == 0, "the far side forgot the stream")


async def test_reset_from_the_far_side_fails_the_opener_with_its_reason() -> None:
    async def abort(stream: TunnelStream) -> None:
        stream.accept()
        assert await stream.readexactly(4) == b"ping"
        stream.reset("the container went away")

    async with Pair(abort) as pair:
        reader, writer = await open_connection(pair.near, "10.0.0.1", 80)
        writer.write(b"ping")
        with pytest.raises(StreamReset, match="the container went away"):
            await reader.read()
        with pytest.raises(StreamReset):
            writer.write(b"more")


async def test_half_close_both_ways() -> None:
    async def answer_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await reader.read()  # everything until our end-of-file
        writer.write(b"you said " + got)
        writer.close()

    async with tcp_server(answer_after_eof) as port, Pair(connect_locally) as pair:
        reader, writer = await open_connection(pair.near, "127.0.0.1", port)
        writer.write(b"all of this")
        writer.write_eof()  # our half ends; theirs goes on until the server answered
        answer = b""
        while data := await reader.read():
            answer += data
        assert answer == b"you said all of this"
        assert reader.at_eof()
        writer.close()
        await wait_until(lambda: pair.near.streams() == 0 and pair.far.streams() == 0, "the stream forgotten")


async def test_open_refused_names_the_reason() -> None:
    async with tcp_server(echo) as port:
        pass  # nothing listens there now
    async with Pair(connect_locally) as pair:
        with pytest.raises(StreamReset, match=f"127.0.0.1:{port}"):
            await open_connection(pair.near, "127.0.0.1", port)
        assert pair.near.streams() == 0


async def test_a_dead_peer_ends_every_stream_with_an_error() -> None:
    async with tcp_server(echo) as port, Pair(connect_locally) as pair:
        opened = [await open_connection(pair.near, "127.0.0.1", port) for _ in range(5)]
        for reader, writer in opened:
            writer.write(b"abc")
            assert await reader.readexactly(3) == b"abc"
        pair.up.end()  # the worker's end of the channel is gone
        for reader, writer in opened:
            with pytest.raises(TunnelClosed, match="the peer ended the tunnel"):
                await reader.read()
            with pytest.raises(TunnelClosed):
                writer.write(b"x")
        with pytest.raises(TunnelClosed):
            await open_connection(pair.near, "127.0.0.1", port)
        assert pair.near.closed == "the peer ended the tunnel"


async def test_data_beyond_the_window_resets_that_stream_only() -> None:
    async def hold(stream: TunnelStream) -> None:
        stream.accept()
        await stream.read()

    async with Pair(hold, window=WINDOW) as pair:
        _, victim = await open_connection(pair.near, "10.0.0.1", 1)
        other_reader, other = await open_connection(pair.near, "10.0.0.1", 2)
        far = pair.far._streams[victim.stream.id]
        # a peer that ignores its window: more than a window in one go
        far_mux: Mux = pair.far
        await far_mux._send(Data(victim.stream.id, b"y" * 65536))
        for _ in range(4):
            await far_mux._send(Data(victim.stream.id, b"y" * 65536))
        await wait_until(lambda: victim.stream._error is not None, "the stream reset")
        assert "window" in str(victim.stream._error)
        await wait_until(lambda: far._error is not None, "the far side told")
        other.write(b"still fine")
        other.write_eof()
        assert pair.near.closed is None
        assert not other_reader.at_eof()
