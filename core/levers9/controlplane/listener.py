"""The HTTP listeners' sockets: each connection counted, capped in all and per client address, before any
protocol sees it.

asyncio's server accepts connections by calling ``accept()`` on the listening socket it was handed (uvicorn
hands it the one :func:`levers9.controlplane.server._listen` binds), so :class:`Listener` is that socket and
its ``accept`` is where the caps hold. The connections it returns are :class:`Connection` sockets, which
tell the listener when they close, whoever closes them (the front, uvicorn's protocol, a TLS transport).

What a new connection meets:

- **Over the cap per client address** (``per_client``; 0: none): refused, accepted and closed at once, on a
  plain-text listener after a ``503`` with ``connection: close``. An IPv6 client is its /64 (one host
  commonly holds a whole /64, so each of its addresses alone would be no cap); an IPv4 address mapped into
  IPv6 is that IPv4 address.
- **At the cap in all** (``cap``): the connection that has waited longest without sending one complete
  request head (a slow or silent client; see :meth:`Listener.proven`) is evicted to make room: shut down,
  so its transport reads the end of the stream and closes as every other connection does. A client that
  sent a request is never evicted; with none to evict, the new connection is refused like the above.
- **Evictions not yet closed**: at most :data:`~levers9.controlplane.limits.SLACK` above the cap; past
  that the listener stops accepting for the pass (asyncio tries again on its next one), so its descriptors
  never exceed ``cap + SLACK``.
- **Out of descriptors** all the same (``EMFILE``, something else holds them): asyncio pauses the listener
  for a second, and this socket keeps asyncio from trying again within that second (its accept loop would
  otherwise log the failure once per queued connection, thousands of lines a second).

Nothing here logs per connection: refusals, evictions and the protocols' timeouts are counted (``counts``,
and ``on_event`` for the metrics), and written as one line per :data:`REPORT_EVERY_S` in which any
happened: the burst's summary, whatever its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from levers9.controlplane.limits import SLACK

__all__ = ["EVENTS", "REPORT_EVERY_S", "Connection", "Listener", "client_of", "quiet_accept_failures"]

log = logging.getLogger(__name__)

#: how often the burst line is written, at most, per listener
REPORT_EVERY_S = 10.0
#: connections refused within one ``accept`` call before the pass ends (the loop's other work runs between)
_REFUSALS_PER_CALL = 64
#: addresses remembered per report, to name the one refused most (an attacker with many cannot grow it)
_ADDRESSES_PER_REPORT = 1024
#: what is counted: refusals (per_client, cap, descriptors), evictions, and the protocols' timeouts
EVENTS = ("per_client", "cap", "descriptors", "evicted", "header_timeout", "body_timeout")
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_WAITING, _PROVEN, _EVICTED = 0, 1, 2
#: the message asyncio's accept loop hands its exception handler when accept fails for want of descriptors
_ACCEPT_FAILED = "socket.accept() out of system resource"
#: the descriptors of the open listeners, for quiet_accept_failures
_listening: set[int] = set()


def _refusal(text: bytes) -> bytes:
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\nretry-after: 1\r\n\r\n%s" % (len(text), text)
    )


_REFUSE_PER_CLIENT = _refusal(b"too many connections from this address\n")
_REFUSE_CAP = _refusal(b"too many connections\n")


def client_of(host: str) -> str:
    """The client a peer address counts as: an IPv4 address itself, an IPv6 address its /64 (see above)."""
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return f"{ipaddress.IPv6Address(int(ip) >> 64 << 64)}/64"


class Connection(socket.socket):
    """An accepted connection of a :class:`Listener`; its first ``close`` gives its place back."""

    __slots__ = ("_client", "_listener", "_state")

    _listener: Listener | None
    _client: str
    _state: int

    def close(self) -> None:
        listener = getattr(self, "_listener", None)  # unset on a socket made otherwise (dup)
        if listener is not None:
            self._listener = None
            listener._release(self)
        super().close()

    def __del__(self) -> None:
        # asyncio always closes its transports' sockets; a connection dropped without that (a protocol factory
        # that raised) would keep its place for ever, and this class's finalizer replaces the socket's own
        self.close()


class Listener(socket.socket):
    """A listening TCP socket whose ``accept`` holds the caps (see the module's docstring).

    ``cap`` and ``per_client`` may be changed at any time; None for ``cap`` means no cap (what the tests
    that serve on it without limits use). ``name`` names it in the log; ``answer`` writes the 503 to those
    refused (only where the listener speaks plain HTTP).
    """

    def __init__(
        self, family: int, *, cap: int | None = None, per_client: int = 0, name: str = "HTTP", answer: bool = True
    ) -> None:
        super().__init__(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.cap = cap
        self.per_client = per_client
        self.name = name
        self.answer = answer
        #: connections open now (evicted ones until they close)
        self.open = 0
        #: of those, evicted and not yet closed
        self.evicting = 0
        self.by_client: dict[str, int] = {}
        #: connections that have not sent a complete request head, oldest first: the ones evicted at the cap
        self.waiting: dict[int, Connection] = {}
        #: events since the start (see EVENTS)
        self.counts: Counter[str] = Counter()
        #: told of every event, for the metrics
        self.on_event: Callable[[str], None] | None = None
        self._report: Counter[str] = Counter()
        self._refused_from: Counter[str] = Counter()
        self._report_due: asyncio.TimerHandle | None = None
        self._paused_until = 0.0
        _listening.add(self.fileno())

    # ------------------------------------------------------------------ asyncio's side

    def accept(self) -> tuple[socket.socket, Any]:
        refused = 0
        while True:
            if self.cap is not None and self.open >= self.cap + SLACK:
                raise ConnectionAbortedError  # evictions are closing: the next pass finds room
            fd, address = self._accept_one()
            client = client_of(str(address[0])) if isinstance(address, tuple) and address else ""
            reason = self._room(client)
            if reason is None:
                conn = Connection(self.family, self.type, self.proto, fileno=fd)
                conn._listener = self
                conn._client = client
                conn._state = _WAITING
                self.open += 1
                self.by_client[client] = self.by_client.get(client, 0) + 1
                self.waiting[fd] = conn
                if socket.getdefaulttimeout() is None and self.gettimeout():
                    conn.setblocking(True)  # as socket.accept does
                return conn, address
            self._refuse(fd, reason)
            self.event(reason)
            if len(self._refused_from) < _ADDRESSES_PER_REPORT or client in self._refused_from:
                self._refused_from[client] += 1
            refused += 1
            if refused >= _REFUSALS_PER_CALL:
                raise ConnectionAbortedError  # asyncio ends this pass; the rest are refused on the next

    def _accept_one(self) -> tuple[int, Any]:
        if self._paused_until and time.monotonic() < self._paused_until:
            raise ConnectionAbortedError  # asyncio paused this listener a moment ago: not again in this pass
        try:
            return self._accept()  # type: ignore[attr-defined, no-any-return]
        except OSError as exc:
            if exc.errno not in _OUT_OF_RESOURCES:
                raise
            self._paused_until = time.monotonic() + 1.0
            self.event("descriptors")
            raise  # asyncio stops reading this listener for a second

    def _room(self, client: str) -> str | None:
        """None when a connection from ``client`` may be held now (after an eviction, at the cap); else why not."""
        if self.per_client and self.by_client.get(client, 0) >= self.per_client:
            return "per_client"
        if self.cap is not None and self.open - self.evicting >= self.cap:
            if not self.waiting:
                return "cap"
            oldest = next(iter(self.waiting))
            self._evict(self.waiting.pop(oldest))
        return None

    def _evict(self, conn: Connection) -> None:
        conn._state = _EVICTED
        self.evicting += 1
        self.event("evicted")
        # its transport reads the end of the stream and closes it (an OSError: the client reset it already,
        # and its transport is closing it too)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _refuse(self, fd: int, reason: str) -> None:
        try:
            if self.answer:
                # a fresh connection's send buffer is empty: this short write never blocks
                os.write(fd, _REFUSE_PER_CLIENT if reason == "per_client" else _REFUSE_CAP)
        except OSError:
            pass  # the client is gone already
        finally:
            os.close(fd)

    def open_now(self) -> float:
        """Connections open now (for the metrics)."""
        return float(self.open)

    # ------------------------------------------------------------------ the protocols' side

    def proven(self, fd: int) -> None:
        """The connection on ``fd`` sent a complete request head: never evicted from now on."""
        conn = self.waiting.pop(fd, None)
        if conn is not None:
            conn._state = _PROVEN

    def event(self, what: str) -> None:
        """Count ``what`` (one of :data:`EVENTS`), for the metrics and the next burst line."""
        self.counts[what] += 1
        self._report[what] += 1
        if self.on_event is not None:
            self.on_event(what)
        if self._report_due is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a test calling accept itself): the line now
                self._write_report()
                return
            self._report_due = loop.call_later(REPORT_EVERY_S, self._write_report)

    def _release(self, conn: Connection) -> None:
        self.open -= 1
        left = self.by_client.get(conn._client, 1) - 1
        if left > 0:
            self.by_client[conn._client] = left
        else:
            self.by_client.pop(conn._client, None)
        if conn._state == _WAITING:
            self.waiting.pop(conn.fileno(), None)
        elif conn._state == _EVICTED:
            self.evicting -= 1

    # ------------------------------------------------------------------ the burst line

    def _write_report(self) -> None:
        self._report_due = None
        counts, self._report = self._report, Counter()
        refused_from, self._refused_from = self._refused_from, Counter()
        if not counts:
            return
        log.warning("%s", self.report_line(counts, refused_from))

    def report_line(self, counts: Counter[str], refused_from: Counter[str]) -> str:
        """The burst line of ``counts`` (events by name) and ``refused_from`` (refusals by client address)."""
        port = self.getsockname()[1] if self.fileno() >= 0 else "?"
        parts = []
        refusals = []
        if counts["per_client"]:
            most, n = refused_from.most_common(1)[0] if refused_from else ("?", 0)
            refusals.append(f"{counts['per_client']} over {self.per_client} from one address (most: {most}, {n})")
        if counts["cap"]:
            refusals.append(f"{counts['cap']} at the cap of {self.cap} with none waiting to evict")
        if refusals:
            parts.append(f"refused {counts['per_client'] + counts['cap']} connections ({'; '.join(refusals)})")
        if counts["evicted"]:
            parts.append(f"evicted {counts['evicted']} that had sent no request head, to make room")
        timeouts = [
            f"{counts[k]} waiting for a request's {k.split('_')[0]}"
            for k in ("header_timeout", "body_timeout")
            if counts[k]
        ]
        if timeouts:
            parts.append(f"closed {' and '.join(timeouts)}")
        if counts["descriptors"]:
            parts.append(f"found no file descriptor free {counts['descriptors']} times (paused a second each)")
        return f"{self.name} listener :{port}, in the last {REPORT_EVERY_S:.0f} s: {'; '.join(parts)}"

    def close(self) -> None:
        if self._report_due is not None:
            self._report_due.cancel()
            self._write_report()
        _listening.discard(self.fileno())
        super().close()


def quiet_accept_failures(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Leave the failures of a :class:`Listener`'s accept for want of descriptors to its burst line: asyncio's
    exception handler no longer logs them (with a traceback each). Everything else goes where it went.
    Returns what puts the loop's previous handler back."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        sock = context.get("socket")
        if context.get("message") == _ACCEPT_FAILED and sock is not None and sock.fileno() in _listening:
            return  # counted, and reported once per burst, by the listener
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return lambda: loop.set_exception_handler(previous)
