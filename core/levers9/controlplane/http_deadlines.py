"""How long an HTTP client may take to send a request, on either protocol of the HTTP listeners.

A client that opens a connection and sends its request head a byte at a time (or never) holds a connection
and a descriptor for as long as the server waits; uvicorn waits for ever. So a request's head must be
complete ``header_timeout_s`` after its first byte (after the connection opened, for the first request),
and its body must not pause for longer than ``body_timeout_s`` between two reads; past either the
connection is answered ``408`` with ``connection: close`` where no response of its own has begun, and
closed. Idle connections between requests are uvicorn's ``timeout_keep_alive``'s; the app's own time
answering is not limited here, and neither is a pause while uvicorn has stopped reading (a body the app
has not taken yet, as the gateway's while it waits for a container): the client cannot send then, and its
body's clock starts again when reading resumes. A connection upgraded to another protocol (WebSocket)
leaves these deadlines behind.

Both protocols keep these deadlines: the front (:mod:`levers9.controlplane.http_front`) for the requests it
serves, and :class:`GuardedHttpTools`, uvicorn's own protocol with them, for the connections the front hands
over (from the request it does not serve on, with the time its head began) and for the metrics listener.
Each also tells its :class:`~levers9.controlplane.listener.Listener` when its connection first sent a
complete head: from then on it is never evicted to make room. A timeout is counted on the listener
(``header_timeout``, ``body_timeout``), never logged per connection.

One timer per connection, set while the client owes bytes; it fires at the earliest deadline and looks
again at what the connection is doing then, so no timer is set per request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from levers9.controlplane.listener import Listener

__all__ = ["BODY_TIMEOUT_S", "HEADER_TIMEOUT_S", "GuardedHttpTools", "listener_fd", "timed_out", "timeouts"]

#: the default for a request head to arrive whole, counted from its first byte
HEADER_TIMEOUT_S = 10.0
#: the default longest pause in a request body
BODY_TIMEOUT_S = 30.0

_IDLE, _HEAD, _BODY, _APP = 0, 1, 2, 3


def timeouts(config: Any) -> tuple[float, float]:
    """The header and body timeouts a uvicorn config carries (``header_timeout_s``, ``body_timeout_s``)."""
    return (
        float(getattr(config, "header_timeout_s", HEADER_TIMEOUT_S)),
        float(getattr(config, "body_timeout_s", BODY_TIMEOUT_S)),
    )


def listener_fd(config: Any, transport: asyncio.BaseTransport) -> tuple[Listener | None, int]:
    """The config's listener (``listener``) and the connection's descriptor there; (None, -1) without one."""
    listener = getattr(config, "listener", None)
    sock = transport.get_extra_info("socket")
    if not isinstance(listener, Listener) or sock is None:
        return None, -1
    return listener, int(sock.fileno())


def timed_out(what: str, seconds: float) -> bytes:
    """The 408 answered when a request's ``what`` (head, body) did not arrive within ``seconds``."""
    text = b"the request's %s did not arrive within %g s\n" % (what.encode(), seconds)
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (len(text), text)
    )


class _Flow(FlowControl):
    """uvicorn's flow control, noting when reading resumes: the client could not send while it was paused."""

    def __init__(self, transport: asyncio.Transport, owner: GuardedHttpTools) -> None:
        super().__init__(transport)
        self._owner = owner

    def resume_reading(self) -> None:
        if self.read_paused:
            owner = self._owner
            owner.arrived = owner.loop.time()
            if owner.phase == _HEAD:
                owner.since = owner.arrived  # a pipelined head cut short by the pause: its time starts now
        super().resume_reading()


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the header and body timeouts and its listener told of each head."""

    def __init__(
        self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_timeout, self.body_timeout = timeouts(config)
        self.phase = _HEAD  # a new connection owes its first request's head
        #: when the head being read began
        self.since = self.loop.time()
        #: when the client last sent something
        self.arrived = self.since
        self.deadline: asyncio.TimerHandle | None = None
        self.due = 0.0
        #: told when the first complete head arrives; None after that
        self.unproven: Listener | None = None
        self.fd = -1

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self)
        self.unproven, self.fd = listener_fd(self.config, transport)
        self.since = self.arrived = self.loop.time()
        self._arm(self.since + self.header_timeout)

    def continue_head(self, since: float) -> None:
        """Handed over mid-head (by the front): the head began at ``since``, not when this protocol took over."""
        self.since = since
        self._arm(since + self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.arrived = self.loop.time()
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.phase != _HEAD:
            self.phase = _HEAD
            self.since = self.arrived
        if self.deadline is None:
            self._arm(self.since + self.header_timeout)

    def on_headers_complete(self) -> None:
        self.phase = _BODY
        if self.unproven is not None:
            self.unproven.proven(self.fd)
            self.unproven = None
        due = self.arrived + self.body_timeout
        if self.deadline is None or self.due > due:
            self._arm(due)
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        self.phase = _APP  # the WebSocket protocol's from here on
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().handle_websocket_upgrade()

    def on_message_complete(self) -> None:
        self.phase = _APP
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self.phase == _APP:
            self.phase = _IDLE  # uvicorn's keep-alive timer has the connection now
        super().on_response_complete()

    # ------------------------------------------------------------------ the timer

    def _arm(self, due: float) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.due = due
        self.deadline = self.loop.call_at(due, self._check)

    def _check(self) -> None:
        self.deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused and self.phase in (_HEAD, _BODY):
            self._arm(now + min(self.header_timeout, self.body_timeout))  # not reading: the client cannot send
            return
        if self.phase == _HEAD:
            due = self.since + self.header_timeout
            if now >= due and self.cycle is not None and not self.cycle.response_complete:
                due = now + self.header_timeout  # a pipelined head, behind a response still being written
        elif self.phase == _BODY:
            due = self.arrived + self.body_timeout
        else:
            return  # the app's turn, or idle: uvicorn's keep-alive timer, and a new head arms this again
        if now < due:
            self._arm(due)
            return
        what, seconds = ("head", self.header_timeout) if self.phase == _HEAD else ("body", self.body_timeout)
        listener = getattr(self.config, "listener", None)
        if isinstance(listener, Listener):
            listener.event(f"{'header' if what == 'head' else 'body'}_timeout")
        # a head's request has no response yet (the one before it is complete); a body's has, once the app began it
        cycle = self.cycle
        if cycle is None or (cycle.response_complete if what == "head" else not cycle.response_started):
            self.transport.write(timed_out(what, seconds))
        self.transport.close()
