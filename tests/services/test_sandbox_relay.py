"""WorkerLink over real sockets: a worker that never answers a streamed request is unreachable after the
answer timeout (an exec that waits must not hang the relay), while a streamed body may take as long as it
takes once its head came, and one connection serves request after request.

The link's ``Connect`` here opens a TCP connection to a local server standing in for the worker's sandbox
server at the far end of its tunnel (what :class:`~levers9.services.tunnels.TunnelRegistry` hands back is
a reader and writer pair all the same).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from levers9.services import sandbox_relay
from levers9.services.sandbox_relay import WorkerLink, WorkerUnreachable

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _link(serve: Serve) -> AsyncIterator[tuple[WorkerLink, list[int]]]:
    """A link whose every worker is the local server running ``serve``; the list counts connections opened."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    opened: list[int] = []

    async def connect(worker_id: str, host: str, _port: int, timeout: float) -> tuple[Any, Any]:
        opened.append(1)
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)

    link = WorkerLink(connect)
    try:
        yield link, opened
    finally:
        await link.close()
        server.close()


async def _head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def test_a_streamed_request_whose_head_never_comes_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_relay, "ANSWER_TIMEOUT_S", 0.5)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        await asyncio.sleep(30)  # reads the request, answers nothing

    async with _link(silent) as (link, _):
        with pytest.raises(WorkerUnreachable, match="worker w1 did not answer in time"):
            await link.request("w1", 1, "secret", "ws1", "POST", "/sandboxes/sb/processes?wait=true", streamed=True)


async def test_a_streamed_body_is_not_timed_out_and_the_connection_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_relay, "ANSWER_TIMEOUT_S", 0.5)
    seen: list[bytes] = []

    async def slow_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await _head(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(
                b"HTTP/1.1 201 Created\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for line in (b'{"process":1}\n', b'{"exit":0}\n'):
                writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                await writer.drain()
                await asyncio.sleep(1)  # longer than the answer timeout, between pieces of the body
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with _link(slow_body) as (link, opened):
        for _ in range(2):
            answer = await link.request("w1", 1, "s3cret", "ws1", "POST", "/p?wait=true", streamed=True)
            assert (answer.status, answer.content_type) == (201, "application/x-ndjson")
            assert await answer.read() == b'{"process":1}\n{"exit":0}\n'
        assert len(opened) == 1
    assert b"authorization: bearer s3cret" in seen[0].lower()
    assert b"levers9-workspace: ws1" in seen[0].lower()
