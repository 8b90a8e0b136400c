"""The gateway's short path (levers9.gateway.shortpath) behind the real HTTP front and uvicorn, to real sockets.

The containers are asyncio servers scripted per test (what a container's server does on the wire: answer,
stream, close early, reset, stay silent). The gateway's lookup and the serving autoscaler are stand-ins of
their short-path methods (``at_hand``, ``try_acquire``, ``release``): what is checked is what the caller
receives, what the container receives, which requests the ASGI path got instead, and how each slot was
released. The whole path, lookup and autoscaler included, runs in tests/e2e/test_gateway.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from levers9.controlplane.http_front import FrontProtocol
from levers9.controlplane.server import _listen
from levers9.gateway.autoscaler import Container, ServedStub
from levers9.gateway.routes import AtHand
from levers9.gateway.shortpath import ShortPath
from levers9.services.stubs import StubSettings
from tests.fixtures.http_wire import connect, read_response

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Plane:
    """The serving autoscaler's short-path methods, over one container."""

    container: Container
    released: list[bool] = field(default_factory=list)
    on_gone: list[Callable[[str], None]] = field(default_factory=list)

    def try_acquire(self, stub_id: str) -> Container | None:
        self.container.in_flight += 1
        return self.container

    def release(self, container: Container, *, broken: bool = False) -> None:
        container.in_flight -= 1
        self.released.append(broken)


@dataclass
class Lookup:
    """The gateway's ``at_hand``: one endpoint, ``/endpoint/hello``; None (not at hand) for anything else."""

    timeout_s: float = 0.0

    def at_hand(self, path: str, headers: list[tuple[bytes, bytes]]) -> AtHand | None:
        if not path.startswith("/endpoint/hello"):
            return None
        settings = StubSettings(kind="endpoint", name="hello", timeout_s=self.timeout_s)
        return AtHand("endpoint", ServedStub("stub_1", "ws_1", settings), "/", None)


@dataclass
class Setup:
    port: int
    plane: Plane
    #: paths the ASGI path answered
    asgi: list[str]


@contextlib.asynccontextmanager
async def _container(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _gateway(container_port: int, *, timeout_s: float = 0.0) -> AsyncIterator[Setup]:
    plane = Plane(Container("task_1", "stub_1", "worker_1", f"127.0.0.1:{container_port}", {}))
    asgi: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        asgi.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-path", b"asgi")]})
        await send({"type": "http.response.body", "body": b"asgi"})

    short = ShortPath(Lookup(timeout_s), plane, connect_timeout_s=2.0)  # type: ignore[arg-type]
    config = uvicorn.Config(app, http=FrontProtocol, lifespan="off", log_level="warning")
    config.short_path = short  # type: ignore[attr-defined]
    server = uvicorn.Server(config)
    sock = _listen("127.0.0.1", 0)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield Setup(sock.getsockname()[1], plane, asgi)
    finally:
        short.close()
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


GET = b"GET /endpoint/hello HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer secret\r\n\r\n"


async def test_requests_are_relayed_on_one_kept_alive_connection_without_the_token() -> None:
    seen: list[bytes] = []
    connections = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                head, body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            seen.append(head + body)
            out = json.dumps({"n": len(seen), "body": body.decode()}).encode()
            writer.write(
                b"HTTP/1.1 201 Created\r\nx-from: container\r\nconnection: keep-alive\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(out), out)
            )

    async with _container(answer) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        for n in (1, 2):
            writer.write(
                b"POST /endpoint/hello?q=1 HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer secret\r\n"
                b"content-length: 5\r\n\r\nhello"
            )
            status, headers, body = await read_response(reader)
            assert status == 201
            assert headers[b"x-from"] == b"container"
            assert b"connection" not in headers  # hop-by-hop: not passed on
            assert json.loads(body) == {"n": n, "body": "hello"}
    assert connections == 1
    assert gw.asgi == []
    assert gw.plane.released == [False, False]
    assert gw.plane.container.in_flight == 0
    first = seen[0].lower()
    assert first.startswith(b"post /?q=1 http/1.1\r\n")
    assert b"authorization" not in first
    assert b"x-forwarded-for: 127.0.0.1" in first


async def test_chunked_and_close_delimited_responses_are_passed_on_chunked() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\none \r\n3\r\ntwo\r\n0\r\n\r\n")
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async with _container(answer) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        assert (await read_response(reader))[2] == b"one two"
        writer.write(GET)
        _status, headers, body = await read_response(reader)
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"until the end"
        writer.write(b"GET /other HTTP/1.1\r\nhost: gw\r\n\r\n")  # the caller's connection goes on
        assert (await read_response(reader))[2] == b"asgi"
    assert gw.plane.released == [False, False]


async def test_a_container_that_closes_before_answering_is_answered_502_and_released_broken() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async with _container(hang_up) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        status, headers, body = await read_response(reader)
        assert status == 502
        assert headers[b"content-type"] == b"application/json"
        assert json.loads(body)["error"]["type"] == "bad_gateway"
        writer.write(b"GET /other HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert (await read_response(reader))[2] == b"asgi"
    assert gw.plane.released == [True]


async def test_a_response_cut_short_closes_the_callers_connection() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.close()

    async with _container(half) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await asyncio.wait_for(reader.read(), 10) == b"only part"  # and then the end
    assert gw.plane.released == [True]


async def test_a_container_that_does_not_begin_to_answer_in_time_is_answered_504() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(30)

    async with _container(silent) as port, _gateway(port, timeout_s=0.3) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        status, _, body = await read_response(reader)
        assert status == 504
        assert "did not begin to answer within 0.3 s" in json.loads(body)["error"]["message"]
    assert gw.plane.released == [False]


async def test_a_kept_alive_connection_reset_before_answering_sends_the_request_through_the_asgi_path() -> None:
    served = 0

    async def once_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await _read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the second request arrives: reset, unread (SO_LINGER 0)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async with _container(once_then_reset) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        assert (await read_response(reader))[2] == b"ok"
        writer.write(GET)
        assert (await read_response(reader))[2] == b"asgi"
    assert served == 1
    assert gw.asgi == ["/endpoint/hello"]
    assert gw.plane.released == [False, False]


async def test_a_connection_that_cannot_be_made_sends_the_request_through_the_asgi_path() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with _gateway(closed_port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        assert (await read_response(reader))[2] == b"asgi"
    assert gw.asgi == ["/endpoint/hello"]
    assert gw.plane.released == [False]


async def test_a_caller_that_goes_away_mid_response_frees_the_slot_and_the_container_connection() -> None:
    container_closed = asyncio.Event()

    async def slow_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # until the gateway drops the connection
        container_closed.set()

    async with _container(slow_stream) as port, _gateway(port) as gw:
        async with connect(gw.port) as (reader, writer):
            writer.write(GET)
            await asyncio.wait_for(reader.readuntil(b"first\r\n"), 10)
        await asyncio.wait_for(container_closed.wait(), 10)
        for _ in range(200):
            if gw.plane.released:
                break
            await asyncio.sleep(0.01)
        assert gw.plane.released == [False]
        assert gw.plane.container.in_flight == 0


async def test_what_is_not_at_hand_and_head_requests_go_to_the_asgi_path() -> None:
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise AssertionError("the container was reached")

    async with _container(never) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(b"GET /endpoint/other HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert (await read_response(reader))[2] == b"asgi"
        writer.write(b"HEAD /endpoint/hello HTTP/1.1\r\nhost: gw\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.write(b"GET /endpoint/hello HTTP/1.1\r\nhost: gw\r\nx-forwarded-for: 10.0.0.1\r\n\r\n")
        assert (await read_response(reader))[2] == b"asgi"
    assert gw.asgi == ["/endpoint/other", "/endpoint/hello", "/endpoint/hello"]
    assert gw.plane.released == []


@pytest.mark.parametrize("pieces", [1, 3])
async def test_a_response_arriving_in_pieces_is_passed_on_whole(pieces: int) -> None:
    payload = b"x" * 300_000

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        data = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
        step = len(data) // pieces + 1
        for i in range(0, len(data), step):
            writer.write(data[i : i + step])
            await writer.drain()
            await asyncio.sleep(0.02)
        await reader.read()

    async with _container(big) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        writer.write(GET)
        status, _headers, body = await read_response(reader)
        assert status == 200
        assert body == payload
    assert gw.plane.released == [False]


async def test_bytes_after_the_end_of_a_response_retire_that_connection() -> None:
    connections = 0

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nextra")
        await writer.drain()
        await reader.read()

    async with _container(chatty) as port, _gateway(port) as gw, connect(gw.port) as (reader, writer):
        for _ in range(2):
            writer.write(GET)
            assert (await read_response(reader))[2] == b"ok"
    assert connections == 2
    assert gw.plane.released == [False, False]
