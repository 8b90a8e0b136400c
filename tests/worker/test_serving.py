"""The HTTP server inside an endpoint's container, on a real socket: the function interface and plain ASGI apps."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from levers9.runner.http_errors import ERROR_TYPES
from levers9.runner.serving import App, HttpServer, function_app
from tests.fixtures.http_wire import request_body
from tests.fixtures.levers9_up import free_port


@pytest.fixture
def serve() -> Iterator[Callable[[App], str]]:
    servers: list[HttpServer] = []

    def start(app: App) -> str:
        port = free_port()
        server = HttpServer(app, "127.0.0.1", port)
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop()


def _raw(url: str, *requests: bytes, read_for: float = 1.0) -> bytes:
    """Send raw bytes on one connection and read what comes back within ``read_for`` seconds."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        for request in requests:
            conn.sendall(request)
        conn.settimeout(0.2)
        data = b""
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            data += chunk
        return data


def test_json_in_json_out_with_kwargs_args_and_query(serve: Callable[[App], str]) -> None:
    def add(a: int, b: int = 10) -> dict[str, int]:
        return {"sum": a + b}

    url = serve(function_app(add, concurrency=2))
    assert httpx.post(url, json={"a": 1, "b": 2}).json() == {"sum": 3}
    assert httpx.post(url, json=[5, 6]).json() == {"sum": 11}
    assert httpx.post(url, json=7).json() == {"sum": 17}
    assert httpx.get(url, params={"a": "x", "b": "y"}).json() == {"sum": "xy"}  # query values are strings
    answer = httpx.post(url, json={"a": 1})
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["content-length"] == str(len(answer.content))


def test_errors_are_answered_with_their_kind(serve: Callable[[App], str]) -> None:
    def picky(x: int) -> object:
        if x < 0:
            raise ValueError("x must not be negative")
        return object() if x == 0 else x

    url = serve(function_app(picky, concurrency=1))
    bad_json = httpx.post(url, content=b"{nope")
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["type"] == "invalid_json"
    raised = httpx.post(url, json={"x": -1})
    assert raised.status_code == 500
    assert raised.json()["error"] == {
        "type": "handler_error",
        "message": "ValueError: x must not be negative",
        "exception": "ValueError",
    }
    # arguments the signature does not take are the caller's mistake: 422 with the signature, the function not run
    missing = httpx.post(url, json={"y": 1})
    assert missing.status_code == 422
    assert missing.json()["error"] == {
        "type": "invalid_arguments",
        "message": "missing a required argument: 'x'; it takes picky(x: int) -> object",
    }
    too_many = httpx.post(url, json=[1, 2])
    assert (too_many.status_code, too_many.json()["error"]["type"]) == (422, "invalid_arguments")

    def greet(name: str = "you") -> str:
        return f"hello, {name}"

    unknown = httpx.post(serve(function_app(greet, concurrency=1)), json={"z": 1})
    assert unknown.status_code == 422
    assert unknown.json()["error"]["message"] == (
        "got an unexpected keyword argument 'z'; it takes greet(name: str = 'you') -> str"
    )
    not_json = httpx.post(url, json={"x": 0})
    assert (not_json.status_code, not_json.json()["error"]["type"]) == (500, "result_not_json")
    assert httpx.post(url, json={"x": 3}).json() == 3  # and it still serves


def test_every_error_the_container_answers_is_a_listed_type_with_its_status(serve: Callable[[App], str]) -> None:
    """One table names every error type (levers9.runner.http_errors); the container answers each with its status."""

    def echo(x: object = None) -> object:
        return x

    url = serve(function_app(echo, concurrency=1))
    answers = [
        httpx.post(url, content=b"{nope"),
        httpx.post(url, json={"y": 1}),
        httpx.post(url, content=b"[" * 100_000 + b"]" * 100_000),
    ]
    for answer in answers:
        kind = answer.json()["error"]["type"]
        assert (answer.status_code, answer.headers["content-type"]) == (ERROR_TYPES[kind], "application/json")


def test_a_body_nested_too_deeply_is_a_400_json_error_and_the_server_keeps_serving(
    serve: Callable[[App], str],
) -> None:
    def echo(x: object = None) -> object:
        return x

    url = serve(function_app(echo, concurrency=1))
    for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"x": ' * 100_000 + b"1" + b"}" * 100_000):
        answer = httpx.post(url, content=deep)
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["error"]["type"] == "invalid_json"
        assert "nest too deeply" in answer.json()["error"]["message"]
    assert httpx.post(url, json={"x": [[1]]}).json() == [[1]]  # and it still serves


def test_a_generator_streams_chunked_and_an_async_handler_runs_on_the_loop(serve: Callable[[App], str]) -> None:
    def count(n: int) -> Iterator[Any]:
        yield from ({"i": i} for i in range(n))
        yield "text\n"
        yield b"bytes\n"

    async def later(x: int) -> int:
        await asyncio.sleep(0.01)
        return x + 1

    streamed = _raw(
        serve(function_app(count, concurrency=1)), b'POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\n{"n": 2}'
    )
    head, _, body = streamed.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert b"application/x-ndjson" in head
    assert body.endswith(b"0\r\n\r\n")
    assert b'{"i": 0}\n' in body
    assert b"text\n" in body
    assert b"bytes\n" in body
    assert httpx.post(serve(function_app(later, concurrency=1)), json=[1]).json() == 2


def test_keep_alive_serves_requests_in_order_on_one_connection_and_reads_chunked_bodies(
    serve: Callable[[App], str],
) -> None:
    def echo(value: str) -> str:
        return value

    url = serve(function_app(echo, concurrency=1))
    chunked = b'POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n4\r\n["ab\r\n3\r\nc"]\r\n0\r\n\r\n'
    plain = b'POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n["def"]'
    out = _raw(url, chunked, plain)
    assert out.count(b"HTTP/1.1 200 OK") == 2
    assert out.index(b'"abc"') < out.index(b'"def"')
    closing = _raw(url, b'POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 5\r\n\r\n["z"]')
    assert b"connection: close" in closing
    assert closing.endswith(b'"z"')


def test_malformed_requests_get_a_400_json_error_and_the_server_keeps_serving(serve: Callable[[App], str]) -> None:
    url = serve(function_app(lambda: "ok", concurrency=1))
    malformed = {
        b"NONSENSE\r\n\r\n": "malformed request line",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n": "malformed header line",
        b"POST / HTTP/1.1\r\ncontent-length: many\r\n\r\n": "Content-Length is not a number",
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n": "malformed chunk size",
    }
    for request, message in malformed.items():
        head, _, body = _raw(url, request).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), head
        assert b"content-type: application/json" in head
        assert json.loads(body) == {"error": {"type": "invalid_request", "message": message}}
        assert httpx.get(url).json() == "ok"


def test_an_asgi_app_gets_path_query_headers_and_body(serve: Callable[[App], str]) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(receive)
        seen = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "header": dict(scope["headers"]).get(b"x-thing", b"").decode(),
            "body": body.decode(),
        }
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-answer", b"yes")]})
        await send({"type": "http.response.body", "body": json.dumps(seen).encode()})

    url = serve(app)
    answer = httpx.put(f"{url}/a%20b/c?q=1", content=b"data", headers={"x-thing": "t"})
    assert answer.status_code == 201
    assert answer.headers["x-answer"] == "yes"
    assert answer.json() == {"method": "PUT", "path": "/a b/c", "query": "q=1", "header": "t", "body": "data"}


def test_an_app_that_fails_before_answering_gets_a_500(serve: Callable[[App], str]) -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    url = serve(broken)
    answer = httpx.get(url)
    assert answer.status_code == 500
    assert answer.json() == {
        "error": {"type": "handler_error", "message": "RuntimeError: boom", "exception": "RuntimeError"}
    }
    assert httpx.get(url).status_code == 500  # the connection and the server survive it


def test_an_asgi_apps_lifespan_runs_before_the_first_request_and_at_stop() -> None:
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    events.append("startup")
                    scope["state"]["model"] = "loaded"
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    events.append("shutdown")
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["state"]["model"].encode()})

    port = free_port()
    server = HttpServer(app, "127.0.0.1", port)
    server.start()
    try:
        assert events == ["startup"]
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "loaded"
    finally:
        server.stop()
    assert events == ["startup", "shutdown"]


def test_an_asgi_app_whose_startup_fails_does_not_serve() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no model file"})

    server = HttpServer(app, "127.0.0.1", 0)
    with pytest.raises(OSError, match="startup failed: no model file"):
        server.start()
    server.stop()
