"""The gateway's short path: an endpoint or box request in the steady state, relayed below ASGI.

The HTTP front (:mod:`levers9.controlplane.http_front`) offers it every simple request first. It takes
one only when everything is at hand now (:meth:`GatewayApp.at_hand`: a token verified lately, the
deployment resolved, the stub read; then a free slot on a ready container, reached over TCP): the
request goes out on a kept-alive connection of its own pool (:class:`_Link`), and the container's
response is passed on as it arrives, its framing redone (its length kept, chunked otherwise), with no
task, no ASGI message and no stream per request. Anything else, and every error answer the ASGI path
would give before a container has the request, is left to the ASGI path (:class:`GatewayApp`), which
fills the caches; so the two decide the same way, and the short path never answers what it has not
relayed.

What it answers itself, exactly as :meth:`GatewayApp._proxy` does (same statuses, same error bodies,
same metrics, the slot released the same way):

- a container that breaks off before its response began: 502, and the container is released as
  broken (it gets no more requests; the scaler replaces it);
- one that breaks off after: the caller's connection is closed (it cannot tell where the response
  ends), the container released as broken;
- one that does not begin to answer within the stub's ``timeout``: 504, the connection to it dropped;
- a caller that goes away: the connection to the container is dropped (never reused mid-response)
  and the slot released, counted as 499.

Two cases go back to the ASGI path with nothing sent to the caller: a connection that cannot be made
(the ASGI path tries again, and finds the container refused), and a kept-alive connection the container
reset before answering (a reset means the request was not read, so sending it again is safe; the ASGI
path does exactly that once). A request is otherwise sent at most once.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol

import httptools

from levers9.gateway.upstream import DROP_FROM_RESPONSE, quiet, request_bytes
from levers9.runner import http_errors as errors

if TYPE_CHECKING:
    from levers9.gateway.autoscaler import Container, ServingAutoscaler
    from levers9.gateway.routes import AtHand, GatewayApp
    from levers9.services.metrics import Metrics

__all__ = ["Caller", "Exchange", "ShortPath"]

#: idle connections kept per container (as the ASGI path's pool)
MAX_IDLE_PER_ADDRESS = 64
#: headers that make uvicorn rewrite the caller's address: the ASGI path handles those requests
_FORWARDED = frozenset({b"x-forwarded-for", b"x-forwarded-proto", b"forwarded"})
_NO_BODY = (204, 304)
_TUNNEL = "tunnel://"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class Caller(Protocol):
    """The front's side of one caller's connection, as the short path uses it."""

    client: tuple[str, int] | None

    def default_head(self) -> bytes:
        """The head lines every response carries (the server's date), each ending in CRLF."""

    def write(self, data: bytes) -> None: ...

    def finish(self) -> None:
        """The response is complete: the connection goes on to its next request."""

    def fall_back(self) -> None:
        """Nothing was sent: the ASGI path answers the request instead."""

    def abort(self) -> None:
        """The response cannot be finished: the connection is closed."""


class ShortPath:
    """Endpoint and box requests in the steady state, relayed over a pool of kept-alive connections."""

    def __init__(
        self,
        gateway: GatewayApp,
        plane: ServingAutoscaler,
        *,
        metrics: Metrics | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.gateway = gateway
        self.plane = plane
        self.metrics = metrics
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[_Link]] = {}
        self._connecting: set[asyncio.Task[None]] = set()
        plane.on_gone.append(self.forget)

    def take(
        self, caller: Caller, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Exchange | None:
        """Relay the request when everything is at hand; None (nothing done) for the ASGI path to answer."""
        if method == "HEAD":
            return None
        for name, _ in headers:
            if name in _FORWARDED:
                return None
        at = self.gateway.at_hand(path, headers)
        if at is None:
            return None
        container = self.plane.try_acquire(at.stub.stub_id)
        if container is None:
            return None
        address = container.address if at.port is None else container.ports.get(at.port, "")
        if not address or address.startswith(_TUNNEL):
            self.plane.release(container)
            return None
        client_host = caller.client[0] if caller.client else None
        request = request_bytes(method, at.path, query, address, headers, body, client_host)
        exchange = Exchange(self, caller, at, container, address, request, method)
        link = self._take_link(address)
        if link is not None:
            exchange.send(link, reused=True)
        else:
            task = asyncio.get_running_loop().create_task(self._connect(exchange))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        return exchange

    def forget(self, address: str) -> None:
        """Drop the idle connections to a container that has gone."""
        for link in self._idle.pop(address, []):
            link.close()

    def close(self) -> None:
        for links in self._idle.values():
            for link in links:
                link.close()
        self._idle.clear()
        for task in self._connecting:
            task.cancel()

    async def _connect(self, exchange: Exchange) -> None:
        host, _, port = exchange.address.rpartition(":")
        try:
            _, link = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(lambda: _Link(self, exchange.address), host, int(port)),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError, ValueError):
            exchange.give_back()  # the ASGI path connects again, and handles a refusal
            return
        exchange.send(link, reused=False)

    def _take_link(self, address: str) -> _Link | None:
        """An idle connection to ``address`` still open and quiet; those the container closed are dropped."""
        idle = self._idle.get(address)
        while idle:
            link = idle.pop()
            if not link.closed and link.transport is not None and quiet(link.transport):
                return link
            link.close()
        return None

    def _give_back_link(self, link: _Link) -> None:
        idle = self._idle.setdefault(link.address, [])
        if len(idle) < MAX_IDLE_PER_ADDRESS and not link.closed:
            idle.append(link)
        else:
            link.close()


class _Link(asyncio.Protocol):
    """One kept-alive connection to a container; carries one exchange at a time."""

    def __init__(self, pool: ShortPath, address: str) -> None:
        self.pool = pool
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:
            self.close()  # bytes nobody asked for: the connection cannot carry another request
            return
        self.exchange.received(data)

    def eof_received(self) -> bool | None:
        return False  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.lost(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Exchange:
    """One request relayed to a container and its response passed back; the callbacks of httptools' parser."""

    def __init__(
        self,
        pool: ShortPath,
        caller: Caller,
        at: AtHand,
        container: Container,
        address: str,
        request: bytes,
        method: str,
    ) -> None:
        self.pool = pool
        self.caller = caller
        self.at = at
        self.container = container
        self.address = address
        self.request = request
        self.method = method
        self.started = time.monotonic()
        self.link: _Link | None = None
        self.reused = False
        self.timer: asyncio.TimerHandle | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.out: list[bytes] = []
        self.received_any = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.head_sent = False
        self.chunked = False
        #: the container's response has neither a length nor chunks: it ends when the connection does
        self.until_close = False
        self.finished = False
        #: set when the response ended: whether the connection to the container may carry another request
        self.keep: bool | None = None

    # ------------------------------------------------------------------ the request

    def send(self, link: _Link, *, reused: bool) -> None:
        if self.finished:  # the caller went away while the connection was made
            self.pool._give_back_link(link)
            return
        self.link = link
        self.reused = reused
        link.exchange = self
        assert link.transport is not None
        link.transport.write(self.request)
        timeout_s = self.at.stub.settings.timeout_s
        if timeout_s:
            self.timer = asyncio.get_running_loop().call_later(timeout_s, self._timed_out)

    def give_back(self) -> None:
        """Nothing reached the container: its slot is released and the ASGI path answers the request."""
        if self.finished:
            return
        self.finished = True
        self._cancel_timer()
        self.pool.plane.release(self.container)
        self.caller.fall_back()

    # ------------------------------------------------------------------ the response

    def received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.keep is None:
                self._broken(f"the container at {self.address} broke its response: {exc}")
                return
            self.keep = False  # the response ended, then came bytes nobody asked for: the connection goes
        if self.out:
            self.caller.write(b"".join(self.out))
            self.out.clear()
            self.head_sent = True
        if self.keep is not None:  # the response ended in these bytes
            self._complete(self.keep)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.finished:
            raise ValueError("bytes after the end of the response")
        self._cancel_timer()
        status = self.status = self.parser.get_status_code()
        if status < 200:
            raise ValueError(f"an interim response ({status}) the gateway does not pass on")
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status)), self.caller.default_head()]
        length: bytes | None = None
        chunked = False
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            if name in DROP_FROM_RESPONSE:
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        if status not in _NO_BODY:
            if length is not None and not chunked:
                lines.append(b"content-length: %s\r\n" % length)
            else:
                self.chunked = True
                self.until_close = not chunked
                lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        self.out.append(b"".join(lines))
        if self.pool.metrics is not None:
            self.pool.metrics.http_answered(
                f"/{self.at.kind}/{{name}}", self.method, status, time.monotonic() - self.started
            )

    def on_body(self, body: bytes) -> None:
        if not self.finished:
            self.out.append(b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body)

    def on_message_complete(self) -> None:
        if self.finished:
            return
        if self.chunked:
            self.out.append(b"0\r\n\r\n")
        # received(), which called the parser, writes what is left and then completes
        self.keep = bool(self.parser.should_keep_alive()) and not self.until_close
        self.finished = True

    def _complete(self, keep: bool) -> None:
        self.keep = None
        link, self.link = self.link, None
        if link is not None:
            link.exchange = None
            if keep:
                self.pool._give_back_link(link)
            else:
                link.close()
        self._end(self.status, broken=False)
        self.caller.finish()

    # ------------------------------------------------------------------ what goes wrong

    def lost(self, exc: Exception | None) -> None:
        """The connection to the container ended before the response did."""
        if self.finished:
            return
        self.link = None
        if self.until_close and self.head_sent:  # the end of a response without a length: complete
            self.caller.write(b"0\r\n\r\n")
            self.finished = True
            self._end(self.status, broken=False)
            self.caller.finish()
            return
        if not self.received_any and self.reused and isinstance(exc, ConnectionResetError):
            self.give_back()  # a kept-alive connection reset with the request unread: sent once more
            return
        why = str(exc) if exc else "the connection was closed"
        self._broken(f"the container at {self.address} broke off before answering: {why}")

    def _stop(self) -> None:
        """This exchange ends before its response did: no timer, and the connection to the container is
        closed (never reused: the container may still be answering, or running the request)."""
        self.finished = True
        self._cancel_timer()
        link, self.link = self.link, None
        if link is not None:
            link.exchange = None
            link.close()

    def _broken(self, message: str) -> None:
        if self.finished:
            return
        self._stop()
        if self.head_sent:
            self._end(502, broken=True)
            self.caller.abort()
            return
        self._answer(errors.BAD_GATEWAY, message)
        self._end(502, broken=True)
        self.caller.finish()

    def _timed_out(self) -> None:
        if self.finished:
            return
        self.timer = None
        self._stop()
        settings = self.at.stub.settings
        self._answer(
            errors.TIMEOUT,
            f"the container at {self.address} did not begin to answer within "
            f"{settings.timeout_s:g} s (the {settings.kind}'s timeout)",
        )
        self._end(errors.ERROR_TYPES[errors.TIMEOUT], broken=False)
        self.caller.finish()

    def caller_gone(self) -> None:
        """The caller went away: the connection to the container is dropped mid-response, the slot released."""
        if self.finished:
            return
        self._stop()
        self._end(499, broken=False)

    def pause(self) -> None:
        if self.link is not None and self.link.transport is not None:
            self.link.transport.pause_reading()

    def resume(self) -> None:
        if self.link is not None and self.link.transport is not None:
            self.link.transport.resume_reading()

    def _answer(self, kind: str, message: str) -> None:
        status = errors.ERROR_TYPES[kind]
        body = errors.error_body(kind, message)
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status)), self.caller.default_head()]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
        self.caller.write(b"".join(head) + body)
        if self.pool.metrics is not None:
            self.pool.metrics.http_answered(
                f"/{self.at.kind}/{{name}}", self.method, status, time.monotonic() - self.started
            )

    def _end(self, status: int, *, broken: bool) -> None:
        self.pool.plane.release(self.container, broken=broken)
        if self.pool.metrics is not None:
            self.pool.metrics.gateway_answered(self.at.kind, status, time.monotonic() - self.started)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"")
