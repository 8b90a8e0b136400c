"""Forwarding one HTTP request to a container, over kept-alive connections.

Every gateway request crosses this, so it is a small HTTP/1.1 client on
asyncio streams rather than a general-purpose one: connections to each
container are pooled and reused, the request body is read whole (bounded)
and sent with a length, and the response is passed on as it arrives, so a
streaming endpoint streams through the gateway. Hop-by-hop headers and the
caller's ``Authorization`` (a levers9 token, which user code must never see)
are not forwarded.

A request is sent at most once to a container that may have read it. A
kept-alive connection is checked before it is used: one the container closed
or reset meanwhile (it restarted its server, or died) is dropped and another
taken. The kernel may not have delivered that close yet (a container that
died a moment ago): a request written there is answered with a reset, which
means the container's end was closed with the request unread, so it is sent
once more on a fresh connection. Any other failure once the request is
written (the connection ends without an answer: the container had the request
when it died) is the caller's, :class:`UpstreamError` with ``refused`` false.
Only a connection that could not be made at all raises with ``refused`` true,
which is safe to try on another container.

Addresses are ``host:port``, connected over TCP (the fast path), or
``tunnel://WORKER_ID/HOST:PORT`` for a container of a worker the controlplane
cannot connect to: those are opened with the ``tunnel`` connector the
Upstream was given (:meth:`levers9.services.tunnels.TunnelRegistry.connect_address`),
a stream through the worker's own connection that reads and writes as a TCP
connection does. A tunnel stream the worker could not connect, or a tunnel
that ended before the stream opened, is refused (``refused`` true). A tunnel
another replica holds is reached through a relay to it, which reads and
writes the same way. A worker whose tunnel no replica holds within the connect
timeout (it is dialling again) raises :class:`UpstreamError` with
``elsewhere`` true, naming the worker (the gateway answers 502 with that message).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = [
    "DROP_FROM_RESPONSE",
    "MAX_REQUEST_BYTES",
    "Reader",
    "RequestTooLarge",
    "TunnelConnector",
    "Upstream",
    "UpstreamError",
    "UpstreamTimeout",
    "Writer",
    "quiet",
    "request_bytes",
]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: the largest request body the gateway forwards
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: idle connections kept per container
MAX_IDLE_PER_ADDRESS = 64
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"authorization",
    b"host",
    b"content-length",
}
#: what is not passed on from a container's response (the framing is the gateway's own)
DROP_FROM_RESPONSE = _HOP_BY_HOP - {b"authorization", b"host"}
_TUNNEL = "tunnel://"


class Reader(Protocol):
    """What the upstream reads a connection with: ``asyncio.StreamReader``, or a tunnel stream's reader."""

    async def readuntil(self, separator: bytes = ..., /) -> bytes: ...

    async def readexactly(self, n: int, /) -> bytes: ...

    async def read(self, n: int = ..., /) -> bytes: ...

    def at_eof(self) -> bool: ...


class Writer(Protocol):
    """What the upstream writes a connection with: ``asyncio.StreamWriter``, or a tunnel stream's writer."""

    def write(self, data: bytes, /) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None, /) -> Any: ...


#: opens a ``tunnel://`` address within the timeout given
TunnelConnector = Callable[[str, float], Awaitable[tuple[Reader, Writer]]]


class UpstreamError(Exception):
    """The container could not be reached or broke the response.

    ``sent``: the caller saw part of the response. ``refused``: no connection could be made, so nothing of
    the request reached the container (it may be sent to another). ``elsewhere``: the container is
    reached through its worker's tunnel, which no controlplane replica holds now (the worker is dialling
    again): nothing is known to be wrong with the container itself.
    """

    def __init__(self, message: str, *, sent: bool, refused: bool = False, elsewhere: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.refused = refused
        self.elsewhere = elsewhere


class UpstreamTimeout(Exception):
    """The container did not begin its response within the stub's timeout."""


class RequestTooLarge(Exception):
    pass


class Upstream:
    """Connections to containers' HTTP servers, pooled per ``host:port``."""

    def __init__(self, *, connect_timeout_s: float = 5.0, tunnel: TunnelConnector | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.tunnel = tunnel
        self._idle: dict[str, list[tuple[Reader, Writer]]] = {}

    async def close(self) -> None:
        for connections in self._idle.values():
            for _, writer in connections:
                writer.close()
        self._idle.clear()

    def forget(self, address: str) -> None:
        """Drop the idle connections to a container that has gone."""
        for _, writer in self._idle.pop(address, []):
            writer.close()

    async def read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_REQUEST_BYTES:
                raise RequestTooLarge(f"the request body is over {MAX_REQUEST_BYTES} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def forward(
        self,
        address: str,
        scope: dict[str, Any],
        body: bytes,
        send: Send,
        *,
        path: str,
        timeout_s: float = 0.0,
    ) -> int:
        """Send the request to ``address`` with ``path`` (and the query string); pass the response to ``send``.

        Returns the response's status. ``timeout_s`` (0: none) bounds the wait for the response to begin;
        once it has begun, a streamed response may take as long as it takes.
        """
        client = scope.get("client")
        request = request_bytes(
            scope["method"],
            path,
            scope.get("query_string", b""),
            address,
            scope["headers"],
            body,
            client[0] if client else None,
        )
        connection = self._take(address)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(address)
        reader, writer = connection
        try:
            try:
                writer.write(request)
                status_line = await self._status_line(reader, writer, address, timeout_s)
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                if not reused:
                    raise
                # a kept-alive connection whose close had not arrived yet: reset, the request unread
                writer.close()
                reader, writer = await self._connect(address)
                writer.write(request)
                status_line = await self._status_line(reader, writer, address, timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            # the request went out: the container may have begun it, so it is never sent again
            writer.close()
            why = str(exc) or type(exc).__name__
            raise UpstreamError(f"the container at {address} broke off before answering: {why}", sent=False) from None
        try:
            keep, status = await self._relay(status_line, reader, send, scope["method"] == "HEAD")
        except _BrokenResponse as exc:
            writer.close()
            raise UpstreamError(f"the container at {address} broke its response: {exc}", sent=exc.sent) from None
        except BaseException:
            writer.close()
            raise
        if keep:
            self._give_back(address, reader, writer)
        else:
            writer.close()
        return status

    @staticmethod
    async def _status_line(reader: Reader, writer: Writer, address: str, timeout_s: float) -> bytes:
        if not timeout_s:
            return await reader.readuntil(b"\r\n")
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout_s)
        except TimeoutError:
            writer.close()  # the request may still be running in the container: never reuse this connection
            raise UpstreamTimeout(
                f"the container at {address} did not begin to answer within {timeout_s:g} s"
            ) from None

    async def _relay(self, status_line: bytes, reader: Reader, send: Send, head_only: bool) -> tuple[bool, int]:
        """Pass one response on; whether the connection can carry another request, and the status."""
        sent = False
        try:
            parts = status_line.split(b" ", 2)
            status = int(parts[1])
            raw_head = await reader.readuntil(b"\r\n\r\n")
            headers, length, chunked, keep = _response_head(raw_head, keep=parts[0] == b"HTTP/1.1")
            await send({"type": "http.response.start", "status": status, "headers": headers})
            sent = True
            if head_only or status in (204, 304) or 100 <= status < 200:
                await send({"type": "http.response.body", "body": b""})
                return keep, status
            if chunked:
                await _relay_chunked(reader, send)
                return keep, status
            if length is not None:
                await _relay_length(reader, send, length)
                return keep, status
            await _relay_until_closed(reader, send)
            return False, status
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise _BrokenResponse(str(exc) or type(exc).__name__, sent) from None

    def _take(self, address: str) -> tuple[Reader, Writer] | None:
        """An idle connection to ``address`` that is still open; those the container closed are dropped."""
        idle = self._idle.get(address)
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof() and quiet(writer):
                return reader, writer
            writer.close()
        return None

    def _give_back(self, address: str, reader: Reader, writer: Writer) -> None:
        idle = self._idle.setdefault(address, [])
        if len(idle) < MAX_IDLE_PER_ADDRESS:
            idle.append((reader, writer))
        else:
            writer.close()

    async def _connect(self, address: str) -> tuple[Reader, Writer]:
        if address.startswith(_TUNNEL):
            return await self._connect_tunnel(address)
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), limit=1 << 20), self.connect_timeout_s
            )
        except (OSError, TimeoutError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            raise UpstreamError(
                f"cannot connect to the container at {address}: {why}", sent=False, refused=True
            ) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _connect_tunnel(self, address: str) -> tuple[Reader, Writer]:
        if self.tunnel is None:
            raise UpstreamError(
                f"cannot connect to the container at {address}: this gateway has no tunnels", sent=False
            )
        try:
            return await self.tunnel(address, self.connect_timeout_s)
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError) as exc:
            # the worker could not connect to the container, or the tunnel ended: nothing reached it
            why = str(exc) or type(exc).__name__
            raise UpstreamError(
                f"cannot connect to the container at {address}: {why}", sent=False, refused=True
            ) from None
        except (OSError, ValueError) as exc:  # no tunnel from that worker to this replica
            raise UpstreamError(f"cannot reach the container at {address}: {exc}", sent=False, elsewhere=True) from None


def request_bytes(
    method: str,
    path: str,
    query: bytes,
    address: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    client_host: str | None,
) -> bytes:
    """A request as sent to the container at ``address``: hop-by-hop headers and the caller's token left out,
    ``x-forwarded-for`` extended with ``client_host``, the body sent with its length."""
    target = path.encode("latin-1", "replace") + (b"?" + query if query else b"")
    authority = address.rpartition("/")[2] if address.startswith(_TUNNEL) else address
    head = [b"%s %s HTTP/1.1" % (method.encode(), target), b"host: " + authority.encode()]
    forwarded_for = b""
    for name, value in headers:
        if name in _HOP_BY_HOP:
            continue
        if name == b"x-forwarded-for":
            forwarded_for = value + b", "
            continue
        head.append(name + b": " + value)
    if client_host:
        head.append(b"x-forwarded-for: " + forwarded_for + client_host.encode())
    head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def quiet(writer: Writer | asyncio.BaseTransport) -> bool:
    """Whether an idle kept-alive connection has nothing to read: no end, no reset, no stray bytes.

    The event loop learns of a peer's FIN or RST only on its next poll; this asks the kernel now, so a
    connection to a container that has just died is not written to.
    """
    sock = writer.get_extra_info("socket")
    if sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


class _BrokenResponse(Exception):
    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def _response_head(raw_head: bytes, *, keep: bool) -> tuple[list[tuple[bytes, bytes]], int | None, bool, bool]:
    """The headers to pass on (hop-by-hop ones dropped, the content-length restated), the content-length, whether
    the body is chunked, and whether the connection stays open (``keep``: what the HTTP version implies).

    :raises ValueError: a content-length that is not a number.
    """
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    for line in raw_head[:-4].split(b"\r\n"):
        if not line:
            continue
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            keep = value.lower() != b"close"
        if name in DROP_FROM_RESPONSE:
            continue
        headers.append((name, value))
    if length is not None and not chunked:
        headers.append((b"content-length", str(length).encode()))
    return headers, length, chunked, keep


async def _relay_chunked(reader: Reader, send: Send) -> None:
    """A chunked body, chunk by chunk, up to its last chunk and trailers."""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            break
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _relay_length(reader: Reader, send: Send, length: int) -> None:
    """A body of ``length`` bytes, in pieces of 64 KiB."""
    remaining = length
    while remaining > 65536:
        data = await reader.readexactly(65536)
        remaining -= len(data)
        await send({"type": "http.response.body", "body": data, "more_body": True})
    data = await reader.readexactly(remaining) if remaining else b""
    await send({"type": "http.response.body", "body": data})


async def _relay_until_closed(reader: Reader, send: Send) -> None:
    """A body of neither length nor chunks: it ends when the container closes the connection."""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
