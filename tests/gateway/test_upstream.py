"""The gateway's hop to a container, against a real HTTP server: what is forwarded, reused, streamed, refused."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from levers9.gateway.upstream import MAX_REQUEST_BYTES, RequestTooLarge, Upstream, UpstreamError, UpstreamTimeout
from levers9.runner.serving import HttpServer
from tests.fixtures.http_wire import request_body
from tests.fixtures.levers9_up import free_port


class Container:
    """An HTTP server standing in for a container: echoes what it got, streams, or counts its connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = free_port()
        self.server = HttpServer(self.app, "127.0.0.1", self.port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(receive)
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"one ", b"two ", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b""})
            return
        seen = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
            "body": body.decode(),
            "client_port": scope["client"][1] if scope["client"] else None,
        }
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-from", b"container")]})
        await send({"type": "http.response.body", "body": json.dumps(seen).encode()})


@pytest.fixture
async def container() -> AsyncIterator[Container]:
    c = Container()
    c.server.start()
    yield c
    c.server.stop()


def _scope(path: str = "/", method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"a=1",
        "headers": headers or [],
        "client": ("203.0.113.9", 5555),
    }


class Collected:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


async def test_the_callers_token_and_hop_by_hop_headers_stay_behind(container: Container) -> None:
    upstream = Upstream()
    out = Collected()
    headers = [
        (b"authorization", b"Bearer l9_user_secret"),
        (b"connection", b"keep-alive"),
        (b"x-forwarded-for", b"198.51.100.1"),
        (b"x-custom", b"kept"),
        (b"content-length", b"999"),
    ]
    await upstream.forward(container.address, _scope("/", headers=headers), b"hello", out.send, path="/inner/path")
    seen = json.loads(out.body)
    names = [k for k, _ in seen["headers"]]
    assert "authorization" not in names
    assert "connection" not in names
    assert dict(seen["headers"])["x-custom"] == "kept"
    assert dict(seen["headers"])["x-forwarded-for"] == "198.51.100.1, 203.0.113.9"
    assert names.count("content-length") == 1
    assert dict(seen["headers"])["content-length"] == "5"
    assert (seen["path"], seen["query"], seen["body"], seen["method"]) == ("/inner/path", "a=1", "hello", "POST")
    response_names = [k for k, _ in out.headers]
    assert response_names.count(b"content-length") == 1
    assert (b"x-from", b"container") in out.headers
    await upstream.close()


async def test_connections_are_reused_and_a_stale_one_is_replaced(container: Container) -> None:
    upstream = Upstream()
    ports = []
    for _ in range(3):
        out = Collected()
        await upstream.forward(container.address, _scope(), b"", out.send, path="/")
        ports.append(json.loads(out.body)["client_port"])
    assert len(set(ports)) == 1  # one kept-alive connection served all three
    # the container closes its side (a restart of its server, an idle timeout): the next request still goes through
    container.server.stop()
    container.server = HttpServer(container.app, "127.0.0.1", container.port)
    container.server.start()
    out = Collected()
    await upstream.forward(container.address, _scope(), b"", out.send, path="/")
    assert out.status == 200
    assert json.loads(out.body)["client_port"] != ports[0]
    await upstream.close()


async def test_a_streamed_response_is_passed_on_piece_by_piece(container: Container) -> None:
    upstream = Upstream()
    out = Collected()
    await upstream.forward(container.address, _scope("/stream", "GET"), b"", out.send, path="/stream")
    assert out.body == b"one two three"
    pieces = [m for m in out.messages[1:] if m.get("body")]
    assert len(pieces) == 3  # as the container sent them, not gathered into one
    assert all(m.get("more_body") for m in pieces)
    assert out.messages[-1] == {"type": "http.response.body", "body": b""}
    await upstream.close()


async def test_an_unreachable_container_raises_before_anything_is_sent() -> None:
    port = free_port()  # nothing listens there: the port was only bound to be picked
    out = Collected()
    with pytest.raises(UpstreamError) as raised:
        await Upstream(connect_timeout_s=1).forward(f"127.0.0.1:{port}", _scope(), b"", out.send, path="/")
    assert raised.value.sent is False
    assert raised.value.refused is True  # nothing reached it: the gateway may send the request elsewhere
    assert f"127.0.0.1:{port}" in str(raised.value)
    assert out.messages == []


async def test_a_kept_alive_connection_to_a_container_that_died_is_not_written_to() -> None:
    """The container answered once, then its process was SIGKILLed: the next request is refused without a byte
    of it written to the dead connection, so the gateway may send it to another container."""
    port = free_port()
    serve = (
        "import time; from levers9.runner.serving import HttpServer, function_app; "
        f"HttpServer(function_app(lambda **kw: 'ok', 1), '127.0.0.1', {port}).start(); time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", serve])
    address = f"127.0.0.1:{port}"
    upstream = Upstream(connect_timeout_s=1)
    try:
        out = Collected()
        for _ in range(100):  # until it listens
            try:
                await upstream.forward(address, _scope(method="GET"), b"", out.send, path="/")
                break
            except UpstreamError:
                await asyncio.sleep(0.1)
        assert out.body == b'"ok"'
        assert upstream._idle[address]  # the connection is kept for the next request
        process.kill()
        process.wait(10)  # gone, and the event loop has not run since: it has not seen the connection end
        with pytest.raises(UpstreamError) as raised:
            await upstream.forward(address, _scope(), b"", Collected().send, path="/")
        assert raised.value.refused is True
        assert raised.value.sent is False
    finally:
        process.kill()
        process.wait(10)
        await upstream.close()


async def test_a_request_the_container_had_when_it_broke_off_is_never_sent_again() -> None:
    """A call runs at most once: a container that read the request and then closed the connection may have
    begun it, so the gateway reports the failure instead of sending the request once more."""
    requests: list[bytes] = []

    async def once_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                requests.append(await reader.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError:
                break
            if len(requests) == 2:
                break  # the second request: read, then gone without an answer
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(once_then_hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream()
    try:
        first = Collected()
        await upstream.forward(f"127.0.0.1:{port}", _scope(), b"", first.send, path="/")
        assert first.status == 200
        second = Collected()
        with pytest.raises(UpstreamError) as raised:
            await upstream.forward(f"127.0.0.1:{port}", _scope(), b"", second.send, path="/")
        assert (raised.value.sent, raised.value.refused) == (False, False)
        assert second.messages == []
        assert len(requests) == 2  # not a third time on a fresh connection
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()


async def test_a_response_cut_short_raises_saying_it_was_partly_sent() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(half, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    out = Collected()
    try:
        with pytest.raises(UpstreamError) as raised:
            await Upstream().forward(f"127.0.0.1:{port}", _scope(), b"", out.send, path="/")
        assert raised.value.sent is True
        assert out.status == 200
    finally:
        server.close()
        await server.wait_closed()


async def test_a_body_over_the_limit_is_refused() -> None:
    chunk = b"x" * (1 << 20)
    sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        sent += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    with pytest.raises(RequestTooLarge):
        await Upstream().read_body(receive)
    assert sent <= MAX_REQUEST_BYTES + len(chunk)


async def test_a_container_that_does_not_begin_to_answer_in_time_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)  # busy with the request, long past the timeout
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    out = Collected()
    upstream = Upstream()
    try:
        with pytest.raises(UpstreamTimeout, match=r"within 0\.3 s"):
            await upstream.forward(f"127.0.0.1:{port}", _scope(), b"", out.send, path="/", timeout_s=0.3)
        assert out.messages == []
        assert upstream._take(f"127.0.0.1:{port}") is None  # that connection is never used again
    finally:
        server.close()
        await server.wait_closed()
