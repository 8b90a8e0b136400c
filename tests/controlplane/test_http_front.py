"""The HTTP listener's front (levers9.controlplane.http_front) under a real uvicorn, spoken to over raw sockets.

Each test checks what a client sees on the wire, and, where it matters, which protocol held the connection
afterwards: the front for simple requests, uvicorn's own once a request was not simple.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from levers9.controlplane.http_deadlines import GuardedHttpTools
from levers9.controlplane.http_front import MAX_BODY, FrontProtocol
from levers9.controlplane.server import _listen
from tests.fixtures.http_wire import connect, read_response, request_body


@dataclass
class Served:
    port: int
    server: uvicorn.Server
    #: what the app was asked: (method, path, query, body, headers)
    seen: list[tuple[str, str, bytes, bytes, dict[bytes, bytes]]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)

    def protocols(self) -> set[type]:
        return {type(c) for c in self.server.server_state.connections}


async def _app(served: Served, scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = await request_body(receive)
    served.seen.append((scope["method"], scope["path"], scope["query_string"], body, dict(scope["headers"])))
    path = scope["path"]
    if path == "/fail":
        raise RuntimeError("the app failed")
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for piece in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/wait-for-disconnect":
        message = await receive()
        served.disconnects.append(message["type"])
        return
    if path == "/unfinished":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"12345", "more_body": True})
        return
    answer = json.dumps({"method": scope["method"], "path": path, "length": len(body)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    sock = _listen("127.0.0.1", 0)
    holder: list[Served] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await _app(holder[0], scope, receive, send)

    config = uvicorn.Config(app, http=FrontProtocol, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    holder.append(Served(sock.getsockname()[1], server))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield holder[0]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_kept_alive_requests_are_answered_in_order_on_the_front(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        for path in ("/a", "/b?x=1"):
            writer.write(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
            status, headers, body = await read_response(reader)
            assert status == 200
            assert headers[b"content-length"] == str(len(body)).encode()
            assert b"date" in headers  # uvicorn's default headers are kept
            assert json.loads(body)["path"] == path.split("?")[0]
        assert served.protocols() == {FrontProtocol}
    assert [s[2] for s in served.seen] == [b"", b"x=1"]


async def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(
            b"".join(
                b"POST /p%d HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (i, i, b"x" * i) for i in range(1, 6)
            )
        )
        answers = [json.loads((await read_response(reader))[2]) for _ in range(5)]
    assert [(a["path"], a["length"]) for a in answers] == [(f"/p{i}", i) for i in range(1, 6)]


async def test_a_body_sent_in_pieces_reaches_the_app_whole(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(b"PUT /up HTTP/1.1\r\nhost: x\r\ncont")
        await asyncio.sleep(0.05)
        writer.write(b"ent-length: 11\r\n\r\nhello")
        await asyncio.sleep(0.05)
        writer.write(b" world")
        status, _, body = await read_response(reader)
    assert status == 200
    assert json.loads(body)["length"] == 11
    assert served.seen[-1][3] == b"hello world"


async def test_a_request_that_is_not_simple_goes_to_uvicorn_with_the_rest_of_the_connection(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        assert served.protocols() == {FrontProtocol}
        # chunked: the front does not read those; uvicorn does, and keeps the connection
        writer.write(
            b"POST /chunked HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            b"GET /after HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        assert json.loads((await read_response(reader))[2]) == {"method": "POST", "path": "/chunked", "length": 5}
        assert json.loads((await read_response(reader))[2])["path"] == "/after"
        assert served.protocols() == {GuardedHttpTools}
    assert served.seen[1][3] == b"hello"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /x HTTP/1.1\r\nbad header: 1\r\n\r\n",  # a name that is not a token
        b"GET /x HTTP/1.1\r\nhost: x\r\n folded\r\n\r\n",  # obs-fold
        b"POST /x HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",  # two lengths
        b"GET x HTTP/1.1\r\n\r\n",  # not origin-form
    ],
    ids=["bad name", "folded", "two lengths", "target"],
)
async def test_a_malformed_request_is_uvicorns_to_refuse(served: Served, request_bytes: bytes) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(request_bytes)
        status, _, _ = await read_response(reader)
    assert status == 400
    assert served.seen == []


async def test_http_1_0_and_large_bodies_are_served_by_uvicorn(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET /old HTTP/1.0\r\n\r\n")
        assert (await read_response(reader))[0] == 200
    big = b"y" * (MAX_BODY + 1)
    async with connect(served.port) as (reader, writer):
        writer.write(b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
        assert json.loads((await read_response(reader))[2])["length"] == len(big)
        assert served.protocols() == {GuardedHttpTools}


async def test_head_streaming_and_connection_close(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(b"HEAD /h HTTP/1.1\r\nhost: x\r\n\r\nGET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = await read_response(reader, head_only=True)
        assert status == 200
        assert int(headers[b"content-length"]) > 0
        status, headers, body = await read_response(reader)  # the next response follows at once: no HEAD body
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"one two three"
        writer.write(b"GET /last HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        status, headers, _ = await read_response(reader)
        assert status == 200
        assert headers[b"connection"] == b"close"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server


async def test_an_app_that_fails_or_leaves_a_response_unfinished_closes_the_connection(served: Served) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _body = await read_response(reader)
        assert status == 500
        assert headers[b"connection"] == b"close"
        assert await asyncio.wait_for(reader.read(), 10) == b""
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET /unfinished HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = await read_response(reader, head_only=True)
        assert status == 200
        assert await asyncio.wait_for(reader.read(), 10) == b"12345"  # and then the end: the connection closed


async def test_the_app_hears_that_the_client_went_away(served: Served) -> None:
    async with connect(served.port) as (_, writer):
        writer.write(b"GET /wait-for-disconnect HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        while not served.seen:
            await asyncio.sleep(0.01)
    for _ in range(500):
        if served.disconnects:
            break
        await asyncio.sleep(0.01)
    assert served.disconnects == ["http.disconnect"]


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(served: Served) -> None:
    served.server.config.timeout_keep_alive = 1
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        # nothing more is sent: the server closes the connection after a second
        assert await asyncio.wait_for(reader.read(), 10) == b""
