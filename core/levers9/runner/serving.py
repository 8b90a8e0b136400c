"""Inside an endpoint's container: the HTTP server the gateway proxies to.

The gateway forwards each request as it came, and this server answers it in
the container, so a request costs one proxy hop and no pickling; the
container keeps serving between requests for as long as the gateway keeps it.
Two interfaces:

* ``function``: the handler is called per request. A JSON object body
  becomes keyword arguments, a JSON array positional ones, and a query string
  (when there is no body) keyword arguments as strings. The return value goes
  back as JSON; a generator's items are streamed as they come, one JSON value
  per line (bytes and str as they are).
* ``asgi``: the handler is called once, with no arguments, and returns an
  ASGI 3 application, which is then served (a FastAPI or Starlette app).

Every error this server answers itself is JSON, ``{"error": {"type": ...,
"message": ...}}``, of a type listed in :mod:`levers9.runner.http_errors` (the
same the gateway uses): a malformed request ``invalid_request``, a body that
is not JSON or nests too deeply to be read ``invalid_json`` (400, never a
crash), arguments the function's signature does not take ``invalid_arguments``
(422, naming the signature, before the function runs), the function raising
``handler_error`` (500, with ``exception``
naming its class), a return value that is not JSON ``result_not_json``.

The server is a small HTTP/1.1 implementation on asyncio, with keep-alive and
chunked bodies both ways: the runner must work in any image, so it imports
only the standard library (and that table of error types). Sync handlers run in a thread pool as wide as the
stub's ``tasks_per_container``; coroutines and ASGI apps run on the server's
loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

from levers9.runner import http_errors as errors

__all__ = ["MAX_BODY_BYTES", "HttpServer", "function_app"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the largest request body the function interface reads (an ASGI app reads what it wants)
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class _BadRequest(Exception):
    pass


class HttpServer:
    """Serves one ASGI app on ``host:port`` from a thread of its own; start() returns once it listens."""

    def __init__(self, app: App, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="levers9-http", daemon=True)
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._server: asyncio.base_events.Server | None = None
        #: what the app's lifespan startup stored, copied into every request's scope (ASGI's lifespan state)
        self._state: dict[str, Any] = {}
        self._lifespan: _Lifespan | None = None

    def start(self, timeout: float | None = None) -> None:
        """Run the app's lifespan startup (if it has one), then listen; raises if either fails.

        No timeout by default: a startup may load a model for minutes, and the worker bounds the
        container's start as a whole.
        """
        self._thread.start()
        if not self._listening.wait(timeout):
            raise OSError(f"the HTTP server did not listen on {self.host}:{self.port} within {timeout:g} s")
        if self._error is not None:
            raise OSError(f"the HTTP server could not start on {self.host}:{self.port}: {self._error}")

    def stop(self) -> None:
        """Stop listening, end the open connections and the thread; requests in flight are dropped."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._lifespan is not None:
            await self._lifespan.shutdown()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._lifespan = self.loop.run_until_complete(_Lifespan.start(self.app, self._state))
            self._server = self.loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, self.port, reuse_address=True)
            )
        except BaseException as exc:
            self._error = exc
            self._listening.set()
            return
        self._listening.set()
        try:
            self.loop.run_forever()
        finally:
            self._server.close()
            self.loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = writer.get_extra_info("peername")
        client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    await _refuse(writer, f"the request's head is over {MAX_HEAD_BYTES} bytes")
                    return
                try:
                    keep = await self._request(head, reader, writer, client)
                except _BadRequest as exc:
                    await _refuse(writer, str(exc))
                    return
                if not keep:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    async def _request(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: tuple[str, int] | None,
    ) -> bool:
        method, target, version, headers, length, chunked, close = _read_head(head)
        path, _, query = target.partition("?")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version.removeprefix("HTTP/"),
            "method": method.upper(),
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": headers,
            "client": client,
            "server": (self.host, self.port),
        }
        if self._lifespan is not None:
            scope["state"] = dict(self._state)
        body = _Body(reader, length, chunked)
        response = _Response(writer, close)

        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if body.done and delivered:
                await response.finished.wait()
                return {"type": "http.disconnect"}
            delivered = True
            data = await body.read()
            return {"type": "http.request", "body": data, "more_body": not body.done}

        try:
            await self.app(scope, receive, response.send)
        except _BadRequest:
            if response.started:
                return False
            raise
        except Exception as exc:
            if response.gone:
                return False  # the client went away mid-response: nothing to tell the app's log
            traceback.print_exc()
            if not response.started:
                await _error(
                    response.send,
                    errors.HANDLER_ERROR,
                    f"{type(exc).__name__}: {str(exc)[:4000]}",
                    exception=type(exc).__name__,
                )
                return not close
            return False  # half a response went out: the connection cannot be reused
        if not response.started:
            await _error(response.send, errors.HANDLER_ERROR, "the app ended without answering the request")
        if not response.complete:
            await response.send({"type": "http.response.body", "body": b""})
        while not body.done:  # what the app did not read, so the next request starts where it should
            await body.read()
        return not close


class _Lifespan:
    """An app's ASGI lifespan: startup before the first request, shutdown when the server stops."""

    def __init__(self, task: asyncio.Task[None], messages: asyncio.Queue[Message]) -> None:
        self.task = task
        self.messages = messages
        self.shut_down = asyncio.Event()

    @classmethod
    async def start(cls, app: App, state: dict[str, Any]) -> _Lifespan | None:
        """Start the app's lifespan; None when the app has none (it returns or raises at once, as ASGI allows)."""
        messages: asyncio.Queue[Message] = asyncio.Queue()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lifespan: _Lifespan | None = None

        async def receive() -> Message:
            return await messages.get()

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete" and not started.done():
                started.set_result(None)
            elif kind == "lifespan.startup.failed" and not started.done():
                started.set_exception(RuntimeError(f"the app's startup failed: {message.get('message', '')}"))
            elif kind.startswith("lifespan.shutdown") and lifespan is not None:
                lifespan.shut_down.set()

        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": state}
        task = asyncio.ensure_future(app(scope, receive, send))
        messages.put_nowait({"type": "lifespan.startup"})
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            with contextlib.suppress(Exception):
                task.result()  # an app without a lifespan (the function interface) raises or returns
            return None
        started.result()
        lifespan = cls(task, messages)
        return lifespan

    async def shutdown(self) -> None:
        self.messages.put_nowait({"type": "lifespan.shutdown"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.shut_down.wait(), 10.0)


class _Body:
    def __init__(self, reader: asyncio.StreamReader, length: int | None, chunked: bool) -> None:
        self.reader = reader
        self.remaining = length or 0
        self.chunked = chunked
        self.done = not chunked and not self.remaining

    async def read(self) -> bytes:
        if self.done:
            return b""
        if not self.chunked:
            data = await self.reader.read(min(self.remaining, 1 << 20))
            if not data:
                raise ConnectionError("the client went away mid-body")
            self.remaining -= len(data)
            self.done = self.remaining == 0
            return data
        size_line = await self.reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadRequest("malformed chunk size") from None
        if size == 0:
            while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            self.done = True
            return b""
        data = await self.reader.readexactly(size)
        await self.reader.readexactly(2)
        return data


class _Response:
    def __init__(self, writer: asyncio.StreamWriter, close: bool) -> None:
        self.writer = writer
        self.close = close
        self.started = False
        self.complete = False
        self.chunked = False
        self.finished = asyncio.Event()
        #: the client went away while the response was being sent
        self.gone = False
        self._head: tuple[int, list[tuple[bytes, bytes]]] | None = None

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self._head = (int(message["status"]), [(bytes(k), bytes(v)) for k, v in message.get("headers", [])])
            return
        if kind != "http.response.body":
            return
        if self.complete:
            return
        body = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        if self._head is not None:
            status, headers = self._head
            self._head = None
            names = {k.lower() for k, _ in headers}
            if b"content-length" not in names:
                if more:
                    self.chunked = True
                    headers.append((b"transfer-encoding", b"chunked"))
                else:
                    headers.append((b"content-length", str(len(body)).encode()))
            if self.close:
                headers.append((b"connection", b"close"))
            reason = _REASONS.get(status, "")
            lines = [f"HTTP/1.1 {status} {reason}".encode()] + [k + b": " + v for k, v in headers]
            self.writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        if self.chunked:
            if body:
                self.writer.write(b"%x\r\n%b\r\n" % (len(body), body))
            if not more:
                self.writer.write(b"0\r\n\r\n")
        elif body:
            self.writer.write(body)
        if not more:
            self.complete = True
            self.finished.set()
        try:
            await self.writer.drain()
        except ConnectionError:
            self.gone = True  # the client hung up mid-response: the app's failure to send is not the app's fault
            raise


def _read_head(head: bytes) -> tuple[str, str, str, list[tuple[bytes, bytes]], int | None, bool, bool]:
    """The request line's method, target and version, the headers (names lowered), the Content-Length, whether
    the body is chunked, and whether the connection closes after this request.

    :raises _BadRequest: a malformed request line or header line, or a Content-Length that is not a number.
    """
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ", 2)
    except ValueError:
        raise _BadRequest("malformed request line") from None
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    close = version == "HTTP/1.0"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise _BadRequest("malformed header line")
        name = name.strip().lower()
        value = value.strip()
        headers.append((name, value))
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise _BadRequest("Content-Length is not a number") from None
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            close = value.lower() == b"close" or (close and value.lower() != b"keep-alive")
    return method, target, version, headers, length, chunked, close


async def _refuse(writer: asyncio.StreamWriter, message: str) -> None:
    """Answer a malformed request 400 ``invalid_request`` and close the connection (where would the next start?)."""
    body = errors.error_body(errors.INVALID_REQUEST, message)
    writer.write(
        f"HTTP/1.1 400 {_REASONS[400]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()


# --------------------------------------------------------------------------- the function interface


def function_app(handler: Callable[..., Any], concurrency: int) -> App:
    """An ASGI app that calls ``handler`` per request: JSON in, its return value as JSON (or a stream) out."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="levers9-call")
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own __call__)
    )
    signature = _signature(handler)
    name = getattr(handler, "__name__", "the function")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await _read_body(receive, send)
        if raw is None:
            return
        arguments = await _arguments(raw, scope["query_string"], send)
        if arguments is None:
            return
        args, kwargs = arguments
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                # the caller's mistake, not the function's: said before the function runs, with what it takes
                await _error(send, errors.INVALID_ARGUMENTS, f"{exc}; it takes {name}{signature}")
                return
        loop = asyncio.get_running_loop()
        try:
            if is_async:
                result = await handler(*args, **kwargs)
            else:
                result = await loop.run_in_executor(pool, lambda: handler(*args, **kwargs))
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            traceback.print_exc()
            await _error(
                send, errors.HANDLER_ERROR, f"{type(exc).__name__}: {str(exc)[:4000]}", exception=type(exc).__name__
            )
            return
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            await _stream(send, result, loop, pool)
            return
        await _answer_json(send, result)

    return app


def _signature(handler: Callable[..., Any]) -> inspect.Signature | None:
    """The handler's signature, its annotations evaluated where they can be (``x: int``, not ``x: 'int'``);
    None for a callable without one, whose own TypeError is then all there is."""
    try:
        return inspect.signature(handler, eval_str=True)  # the container's Python may be older than 3.10's
    except (NameError, SyntaxError, TypeError, ValueError):
        pass
    try:
        return inspect.signature(handler)
    except (TypeError, ValueError):
        return None


async def _read_body(receive: Receive, send: Send) -> bytes | None:
    """The whole request body; None when it is over :data:`MAX_BODY_BYTES` (answered 413 then)."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            await _error(send, errors.TOO_LARGE, f"the request body is over {MAX_BODY_BYTES} bytes")
            return None
        if not message.get("more_body"):
            return b"".join(chunks)


async def _arguments(raw: bytes, query_string: bytes, send: Send) -> tuple[list[Any], dict[str, Any]] | None:
    """The handler's positional and keyword arguments: from a JSON body (an object: keywords, an array:
    positional, anything else: the one positional), else from the query string; None when the body is not JSON
    (answered ``invalid_json`` then)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if raw.strip():
        try:
            value = json.loads(raw)
        except RecursionError:
            await _error(send, errors.INVALID_JSON, errors.TOO_DEEP_MESSAGE)
            return None
        except ValueError as exc:
            await _error(send, errors.INVALID_JSON, f"the body is not JSON: {exc}")
            return None
        if isinstance(value, dict):
            kwargs = value
        elif isinstance(value, list):
            args = value
        else:
            args = [value]
    elif query_string:
        kwargs = dict(parse_qsl(query_string.decode("latin-1")))
    return args, kwargs


async def _answer_json(send: Send, result: Any) -> None:
    """The handler's return value as JSON, or ``result_not_json`` when it is not."""
    try:
        body = json.dumps(result).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        why = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        problem = f"the return value ({type(result).__name__}) is not JSON: {why}"
        print(problem, file=sys.stderr)
        await _error(send, errors.RESULT_NOT_JSON, problem)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _stream(send: Send, result: Any, loop: asyncio.AbstractEventLoop, pool: concurrent.futures.Executor) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/x-ndjson")]})
    done = object()
    try:
        while True:
            if inspect.isasyncgen(result):
                try:
                    item = await result.__anext__()
                except StopAsyncIteration:
                    break
            else:
                item = await loop.run_in_executor(pool, next, result, done)
                if item is done:
                    break
            await send({"type": "http.response.body", "body": _item_bytes(item), "more_body": True})
    except Exception:
        traceback.print_exc()  # the status went out already; the stream just ends
    await send({"type": "http.response.body", "body": b""})


def _item_bytes(item: Any) -> bytes:
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    if isinstance(item, str):
        return item.encode()
    return json.dumps(item).encode() + b"\n"


async def _error(send: Send, kind: str, message: str, **extra: str) -> None:
    """Answer an error of type ``kind`` (see :mod:`levers9.runner.http_errors`) with its status."""
    status = errors.ERROR_TYPES[kind]
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": errors.error_body(kind, message, **extra)})
