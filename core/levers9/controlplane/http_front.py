"""The HTTP listener's front: simple HTTP/1.1 requests served on a short path, anything else by uvicorn.

Every gateway request crosses the controlplane's HTTP listener, and uvicorn's path costs a task, a
request-response cycle and two socket writes per response. This protocol (handed to uvicorn as its
``http`` class, so uvicorn still owns the listener, TLS, the graceful shutdown and its date header)
serves the requests that are simple, with the same ASGI app uvicorn would call, and writes each
response's head and body in one write when the body comes whole.

A request is simple when its head is well-formed by the strict rules below and it carries nothing that
needs more than a body read whole: ``HTTP/1.1``, an origin-form ASCII target, header names that are
HTTP tokens, no folded lines, no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, at most one
``Content-Length`` of digits and at most :data:`MAX_BODY` bytes, a head of at most :data:`MAX_HEAD`
bytes. The first request that is not simple, and every one after it on that connection, is uvicorn's:
the connection is handed to uvicorn's own protocol between two requests, with the bytes not yet
served, exactly as uvicorn hands a connection to its WebSocket protocol. So what this module does not
parse (malformed requests, chunked uploads, HTTP/1.0, upgrades) is answered by uvicorn as before, and
no request is ever read two ways.

Invariants: requests on one connection are answered in order, one at a time (a pipelined request
waits in the buffer, and reading pauses while more than :data:`MAX_BUFFER` bytes wait); a response
the app leaves unfinished closes the connection; an app that fails before answering is answered 500
and the connection closed, as uvicorn does; an idle connection is closed after uvicorn's
``timeout_keep_alive``; a request head not whole ``header_timeout_s`` after its first byte, or a body
that pauses longer than ``body_timeout_s``, is answered 408 and the connection closed
(:mod:`levers9.controlplane.http_deadlines`, which also gives uvicorn's protocol the same deadlines for the
connections handed to it); the connection's listener is told when its first complete head arrives (from
then on it is never evicted to make room, :mod:`levers9.controlplane.listener`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from typing import Any

from levers9.controlplane.http_deadlines import GuardedHttpTools, listener_fd, timed_out, timeouts
from levers9.controlplane.listener import Listener
from levers9.gateway.shortpath import Exchange, ShortPath

__all__ = ["MAX_BODY", "MAX_BUFFER", "MAX_HEAD", "FrontProtocol"]

log = logging.getLogger(__name__)

#: the largest request head served here (a larger one goes to uvicorn, which answers it)
MAX_HEAD = 16 * 1024
#: the largest request body served here; a larger one goes to uvicorn, which streams it to the app
MAX_BODY = 1024 * 1024
#: bytes of pipelined requests buffered before reading pauses
MAX_BUFFER = MAX_HEAD + MAX_BODY
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: header lines, each ending in CRLF: a token, a colon, then no control character but tab (so no folding)
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*")
#: request headers that make a request not simple
_NOT_SIMPLE = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_NO_BODY = (204, 304)
_REASONS = {
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    204: b"No Content",
    301: b"Moved Permanently",
    302: b"Found",
    304: b"Not Modified",
    307: b"Temporary Redirect",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    413: b"Content Too Large",
    422: b"Unprocessable Content",
    429: b"Too Many Requests",
    499: b"Client Closed Request",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


#: uvicorn's default headers list and the head lines made of it
_joined: tuple[object, bytes] = (None, b"")


class _Request:
    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query", "raw_path")

    def __init__(
        self,
        method: str,
        raw_path: bytes,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        self.keep_alive = keep_alive


class FrontProtocol(asyncio.Protocol):
    """One HTTP connection; built by uvicorn as its ``http`` protocol class (same arguments as its own)."""

    def __init__(
        self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.closing = False
        self.handed_off = False
        self.read_paused = False
        self.disconnected = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        #: the connection's one timer: the keep-alive, header and body deadlines (see _check)
        self.timer: asyncio.TimerHandle | None = None
        self.header_timeout, self.body_timeout = timeouts(config)
        #: how long the timer sleeps at most while no deadline is near, so that none it looks at is ever late
        self.recheck = min(config.timeout_keep_alive, self.header_timeout, self.body_timeout)
        #: when the caller last sent something, or the last response ended (the loop's clock)
        self.active = 0.0
        #: when the first byte of the request head being read arrived
        self.head_since = 0.0
        #: the listener to tell when the first complete head arrives (None after, or without one), and our fd there
        self.unproven: Listener | None = None
        self.fd = -1
        #: offered every simple request first (the gateway's short path), when the config carries one
        self.short: ShortPath | None = getattr(config, "short_path", None)
        self.request: _Request | None = None
        #: the next request's head, parsed, while its body is still arriving: (request, body length, body start)
        self.head: tuple[_Request, int, int] | None = None
        self.exchange: Exchange | None = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server_state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") is not None else "http"
        self.unproven, self.fd = listener_fd(self.config, transport)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._cancel_timer()
        self.disconnected.set()
        self.writable.set()
        if self.exchange is not None:
            self.exchange.caller_gone()
            self.exchange = None

    def data_received(self, data: bytes) -> None:
        self.active = self.loop.time()
        if not self.buffer:
            self.head_since = self.active
        self.buffer += data
        if not self.busy:
            self._next()
        elif len(self.buffer) > MAX_BUFFER and not self.read_paused:
            self.read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        if not self.busy:
            self._close()
        return None

    def pause_writing(self) -> None:
        self.writable.clear()
        if self.exchange is not None:
            self.exchange.pause()

    def resume_writing(self) -> None:
        self.writable.set()
        if self.exchange is not None:
            self.exchange.resume()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now when idle, after the response in flight otherwise."""
        self.closing = True
        if not self.busy:
            self._close()

    # ------------------------------------------------------------------ requests

    def _next(self) -> None:
        """Serve the next buffered request, or hand the connection to uvicorn when it is not simple."""
        if self.closing or self.handed_off or self.transport is None or self.transport.is_closing():
            return
        if self.read_paused and len(self.buffer) <= MAX_BUFFER:
            self.read_paused = False  # (also when what is left is the start of a request: its rest is to come)
            self.transport.resume_reading()
        if not self.buffer:
            self._arm_idle_timer()
            return
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n", 0, MAX_HEAD)
            if end < 0:
                # a head too long, or bytes no request line starts with (a TLS handshake sent to this plain-text
                # listener, as docker and skopeo try first): uvicorn's to refuse now, not at the header timeout
                if len(self.buffer) >= MAX_HEAD or not 0x41 <= self.buffer[0] <= 0x5A:
                    self._hand_off()
                return  # the rest of the head is still to come
            parsed = self._parse(bytes(self.buffer[:end]))
            if parsed is None:
                self._hand_off()
                return
            self.head = (*parsed, end + 4)
            if self.unproven is not None:
                self.unproven.proven(self.fd)
                self.unproven = None
            due = self.active + self.body_timeout  # the body's deadline, when it is still to come
            if len(self.buffer) < end + 4 + parsed[1] and (self.timer is None or self.timer.when() > due):
                self._arm(due)
        request, length, start = self.head
        if len(self.buffer) < start + length:
            return  # the rest of the body is still to come: the head is kept, parsed once
        self.head = None
        request.body = bytes(self.buffer[start : start + length])
        del self.buffer[: start + length]
        self.busy = True
        self.request = request
        if self.short is not None and not self.config.root_path:
            exchange = self.short.take(self, request.method, request.path, request.query, request.headers, request.body)
            if exchange is not None:
                self.exchange = exchange
                return
        self._start_app(request)

    def _start_app(self, request: _Request) -> None:
        task = self.loop.create_task(self._serve(request))
        tasks = self.server_state.tasks  # held there (the loop keeps only weak references), as uvicorn does
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _parse(self, head: bytes) -> tuple[_Request, int] | None:
        """The request of a simple head, and its body's length; None when the head is not simple."""
        first, _, rest = head.partition(b"\r\n")
        parts = first.split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not _TARGET.fullmatch(parts[1]):
            return None
        if rest and not _HEADER_LINES.fullmatch(rest + b"\r\n"):
            return None  # no colon, a folded line, a name that is not a token, or a control character
        method = parts[0].decode("latin-1")
        if method not in _METHODS:
            return None
        headers: list[tuple[bytes, bytes]] = []
        length = 0
        lengths = 0
        keep_alive = True
        for line in rest.split(b"\r\n") if rest else ():
            name, _, value = line.partition(b":")
            name = name.lower()
            value = value.strip(b" \t")
            if name in _NOT_SIMPLE:
                return None
            if name == b"content-length":
                lengths += 1
                if lengths > 1 or not value.isdigit() or len(value) > 8:
                    return None
                length = int(value)
                if length > MAX_BODY:
                    return None
            elif name == b"connection" and b"close" in value.lower():
                keep_alive = False
            headers.append((name, value))
        raw_path, _, query = parts[1].partition(b"?")
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        return _Request(method, raw_path, path, query, headers, keep_alive), length

    def _scope(self, request: _Request) -> dict[str, Any]:
        root = self.config.root_path
        return {
            "type": "http",
            "asgi": {"version": self.config.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": request.method,
            "root_path": root,
            "path": root + request.path,
            "raw_path": root.encode("ascii") + request.raw_path,
            "query_string": request.query,
            "headers": request.headers,
            "state": self.app_state.copy(),
        }

    async def _serve(self, request: _Request) -> None:
        response = _Response(self, request)
        scope = self._scope(request)
        try:
            await self.app(scope, response.receive, response.send)
        except BaseException as exc:
            if not response.started:
                log.error("the HTTP app failed before answering %s %s", request.method, scope["path"], exc_info=exc)
                response.write_error()
            else:
                log.error("the HTTP app failed while answering %s %s", request.method, scope["path"], exc_info=exc)
            self._close()
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
            return
        finally:
            self.server_state.total_requests += 1
        if not response.complete:
            self._close()  # the app left the response unfinished: the caller cannot tell where it ends
            return
        self._done(response.keep_alive)

    def _done(self, keep_alive: bool) -> None:
        """The current request is answered: on to the next, or the connection closes."""
        request, self.request, self.exchange = self.request, None, None
        self.busy = False
        if not keep_alive or request is None or not request.keep_alive or self.closing:
            self._close()
            return
        if self.buffer:
            self.head_since = self.loop.time()  # a pipelined head: its time starts now, not while we answered
        self._next()

    # ------------------------------------------------------------------ the short path's caller

    def default_head(self) -> bytes:
        """uvicorn's default headers (its date, once a second), as head lines; joined once per list uvicorn makes."""
        global _joined
        headers = self.server_state.default_headers
        if _joined[0] is not headers:
            _joined = (headers, b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers))
        return _joined[1]

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def finish(self) -> None:
        self.server_state.total_requests += 1
        self._done(True)

    def fall_back(self) -> None:
        self.exchange = None
        if self.request is not None and not self.disconnected.is_set():
            self._start_app(self.request)
        else:
            self.busy = False

    def abort(self) -> None:
        self.exchange = None
        self._close()

    # ------------------------------------------------------------------ the connection

    def _hand_off(self) -> None:
        """uvicorn's protocol takes the connection from here on, beginning with the bytes not yet served."""
        assert self.transport is not None
        self.handed_off = True
        self._cancel_timer()
        self.server_state.connections.discard(self)
        protocol = GuardedHttpTools(
            config=self.config, server_state=self.server_state, app_state=self.app_state, _loop=self.loop
        )
        pending = bytes(self.buffer)
        self.buffer.clear()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        protocol.continue_head(self.head_since)
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if pending:
            protocol.data_received(pending)

    def _close(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _arm_idle_timer(self) -> None:
        """Note the connection idle from now; its timer (one per connection, re-armed when it fires early, so
        a busy connection sets no timer per request) closes it after ``timeout_keep_alive``."""
        self.active = self.loop.time()
        if self.timer is None:
            self._arm(self.active + self.recheck)

    def _arm(self, due: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(due, self._check)

    def _check(self) -> None:
        """The timer: close the connection past a deadline of what it is doing, else sleep until the next one.

        Idle (nothing buffered): ``timeout_keep_alive`` after the last byte or response. Reading a head: the
        header timeout after its first byte. Reading a body: the body timeout after the last byte. Answering:
        no deadline. Between deadlines it sleeps at most ``recheck``, the shortest of the three, so a state
        entered meanwhile never finds its deadline already passed unnoticed.
        """
        self.timer = None
        now = self.loop.time()
        if self.busy:
            due = now + self.recheck
        elif not self.buffer:
            due = self.active + self.config.timeout_keep_alive
            if now >= due:
                self._close()
                return
            due = min(due, now + self.recheck)
        elif self.head is None:
            due = self.head_since + self.header_timeout
            if now >= due:
                self._time_out("head", self.header_timeout)
                return
        else:
            due = self.active + self.body_timeout
            if now >= due:
                self._time_out("body", self.body_timeout)
                return
        self.timer = self.loop.call_at(due, self._check)

    def _time_out(self, what: str, seconds: float) -> None:
        """The client owed a request's ``what`` for ``seconds``: answered 408 (no response is under way) and closed."""
        listener = getattr(self.config, "listener", None)
        if isinstance(listener, Listener):
            listener.event("header_timeout" if what == "head" else "body_timeout")
        self.write(timed_out(what, seconds))
        self._close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Response:
    """One request's ASGI ``receive`` and ``send``, writing to its connection."""

    __slots__ = (
        "body_sent",
        "chunked",
        "complete",
        "front",
        "head",
        "keep_alive",
        "remaining",
        "request",
        "started",
        "status",
    )

    def __init__(self, front: FrontProtocol, request: _Request) -> None:
        self.front = front
        self.request = request
        self.status = 0
        self.head = b""
        self.started = False
        self.complete = False
        self.keep_alive = True
        self.chunked = False
        self.remaining: int | None = None
        self.body_sent = False

    async def receive(self) -> dict[str, Any]:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.request.body, "more_body": False}
        await self.front.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        front = self.front
        if not front.writable.is_set():
            await front.writable.wait()
        if front.disconnected.is_set():
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', but got {kind!r}")
            self._start(message["status"], message.get("headers", []))
            return
        if self.complete:
            return
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', but got {kind!r}")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        head, self.head = self.head, b""
        if self.request.method == "HEAD" or self.status in _NO_BODY:
            data = self._head_only(head, body, more)
        else:
            data = self._framed(head, body, more)
        assert front.transport is not None
        if data:
            front.transport.write(data)
        if not more:
            self.complete = True

    def _head_only(self, head: bytes, body: bytes, more: bool) -> bytes:
        """A HEAD answer or a status without a body: the head alone, with the length a GET would have had."""
        if self.status not in _NO_BODY and self.remaining is None and not self.chunked and not more:
            head = head[:-2] + b"content-length: %d\r\n\r\n" % len(body)  # what a GET would have had
            self.remaining = 0
        return head  # the body is never sent

    def _framed(self, head: bytes, body: bytes, more: bool) -> bytes:
        """The head still unsent and this piece of the body, framed by content-length or chunked encoding.

        :raises RuntimeError: the app sent more or less than the content-length it declared.
        """
        if self.remaining is None and not self.chunked:
            if more:  # no length, and more to come: chunked
                self.chunked = True
                head = head[:-2] + b"transfer-encoding: chunked\r\n\r\n"
            else:  # the whole body in one message: its length is known
                head = head[:-2] + b"content-length: %d\r\n\r\n" % len(body)
                self.remaining = len(body)
        if self.chunked:
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + (b"" if more else b"0\r\n\r\n")
        elif self.remaining is not None:
            self.remaining -= len(body)
            if self.remaining < 0:
                raise RuntimeError("response content longer than its content-length")
            if not more and self.remaining:
                raise RuntimeError("response content shorter than its content-length")
        return head + body

    def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        reason = _REASONS.get(status, b"")
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        for name, value in [*self.front.server_state.default_headers, *headers]:
            if not _TOKEN.fullmatch(name) or _VALUE_BAD.search(value):
                raise RuntimeError(f"invalid HTTP header {name!r}: {value!r}")
            lowered = name.lower()
            if lowered == b"content-length":
                self.remaining = int(value)
            elif lowered == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked = True
            elif lowered == b"connection" and b"close" in value.lower():
                self.keep_alive = False
            lines.append(b"%s: %s\r\n" % (lowered, value))
        if not self.request.keep_alive and self.keep_alive:
            self.keep_alive = False
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)

    def write_error(self) -> None:
        assert self.front.transport is not None
        body = b"Internal Server Error"
        self.front.transport.write(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.complete = True


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
