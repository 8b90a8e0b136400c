"""One multiplexed tunnel: many byte streams over one message channel, each with its own flow control.

:class:`Mux` is the same on both ends. It is given a coroutine that sends
one frame and, in :meth:`Mux.run`, the frames that arrive; it knows nothing of
gRPC (see :mod:`levers9.tunnel.frames` for the frames and their wire form), so
it is tested over an in-memory pair. One end opens streams
(:meth:`Mux.open`, "connect to host:port over there"); the other accepts them
with the ``on_open`` handler it was given, which answers with
:meth:`TunnelStream.accept` or :meth:`TunnelStream.refuse`.

Flow control. Each side of each stream announces a window (:data:`WINDOW`
bytes by default). The other side sends at most that many bytes ahead of
what the reader has read: a reader grants :class:`~levers9.tunnel.frames.Credit`
as it reads. So a stream whose reader is slow or stopped holds at most a
window of its data on the receiving side and stops its sender; the frames
of every other stream keep flowing. A writer's own buffer is bounded by
whoever writes: :meth:`TunnelStream.drain` waits while more than a window is
buffered. One sender task sends every frame, control frames first, then data
of the streams that have both data and credit, one frame each in turn, so a
big transfer does not hold back small ones.

Invariants: a stream's frames are sent in the order they were made; data is
never sent beyond the credit granted; a frame of a stream that is gone is
ignored (it was in flight when the stream was reset or finished).

Failures. A stream the peer resets, or refuses to open, fails its reader, its
writer and its opener with :class:`StreamReset` (a ``ConnectionResetError``)
carrying the peer's reason. When the tunnel ends (the channel ends or breaks,
or :meth:`Mux.close`), every stream still open fails with
:class:`TunnelClosed` saying why, and later opens raise it. Data beyond the
window the peer was granted is a protocol error: that stream is reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable

from levers9.tunnel.frames import MAX_DATA, Close, Credit, Data, Frame, Open, Opened, Reset

__all__ = ["WINDOW", "Mux", "OnOpen", "Send", "StreamReset", "TunnelClosed", "TunnelStream"]

log = logging.getLogger(__name__)

#: the bytes of one stream a side buffers before its reader has read them
WINDOW = 256 * 1024


class StreamReset(ConnectionResetError):
    """The peer reset the stream, or refused to open it; the message is its reason."""


class TunnelClosed(ConnectionResetError):
    """The tunnel ended; every stream on it fails with this."""


Send = Callable[[Frame], Awaitable[None]]
OnOpen = Callable[["TunnelStream"], Awaitable[None]]


class TunnelStream:
    """One byte stream of a tunnel: read, write, half-close, reset. Made by :class:`Mux` only."""

    def __init__(self, mux: Mux, stream_id: int, host: str, port: int, *, send_credit: int) -> None:
        self.mux = mux
        self.id = stream_id
        self.host = host
        self.port = port
        self._inbox = bytearray()
        self._eof = False  # the peer closed its half
        self._error: ConnectionResetError | None = None
        self._readable = asyncio.Event()
        #: bytes read since the last credit granted
        self._unacked = 0
        #: bytes the peer may still send
        self._receive_window = mux.window
        self._outbox = bytearray()
        self._send_credit = send_credit
        self._eof_wanted = False
        self._eof_sent = False
        self._finished = asyncio.Event()  # our half ended: everything sent, then the close (or a failure)
        self._drained = asyncio.Event()
        self._drained.set()
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._accepted = False

    def __repr__(self) -> str:
        return f"<TunnelStream {self.id} {self.host}:{self.port}>"

    # ------------------------------------------------------------------ reading

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is buffered for -1) once some are there; b"" at end of stream."""
        while not self._inbox:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait_readable()
        size = len(self._inbox) if n < 0 else min(n, len(self._inbox))
        return self._consume(size)

    async def readexactly(self, n: int) -> bytes:
        while len(self._inbox) < n:
            if self._error is not None:
                raise self._error
            if self._eof:
                partial = self._consume(len(self._inbox))
                raise asyncio.IncompleteReadError(partial, n)
            if len(self._inbox) >= self.mux.window:  # more than a window: read it in pieces
                head = self._consume(len(self._inbox))
                return head + await self.readexactly(n - len(head))
            await self._wait_readable()
        return self._consume(n)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        """Up to and with ``separator``; it must come within a window (else ``asyncio.LimitOverrunError``)."""
        start = 0
        while True:
            found = self._inbox.find(separator, start)
            if found >= 0:
                return self._consume(found + len(separator))
            if self._error is not None:
                raise self._error
            if self._eof:
                partial = self._consume(len(self._inbox))
                raise asyncio.IncompleteReadError(partial, None)
            if len(self._inbox) >= self.mux.window:
                raise asyncio.LimitOverrunError(
                    f"no {separator!r} within the tunnel's window of {self.mux.window} bytes", len(self._inbox)
                )
            start = max(0, len(self._inbox) - len(separator) + 1)
            await self._wait_readable()

    def at_eof(self) -> bool:
        return self._eof and not self._inbox

    async def _wait_readable(self) -> None:
        self._readable.clear()
        await self._readable.wait()

    def _consume(self, n: int) -> bytes:
        data = bytes(self._inbox[:n])
        del self._inbox[:n]
        self._unacked += n
        # grant credit in quarter windows, not per read: at most a quarter of the window waits to be granted
        if self._unacked >= self.mux.window // 4 and not self._eof and self._error is None:
            self._receive_window += self._unacked
            self.mux._control(Credit(self.id, self._unacked))
            self._unacked = 0
        return data

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer ``data`` to send as credit allows; :meth:`drain` bounds the buffer."""
        if self._error is not None:
            raise self._error
        if self._eof_wanted:
            raise ConnectionResetError(f"tunnel stream {self.id}: write after write_eof")
        if data:
            self._outbox += data
            if len(self._outbox) > self.mux.window:
                self._drained.clear()
            self.mux._sendable(self)

    async def drain(self) -> None:
        """Wait until at most a window is buffered to send."""
        while True:
            if self._error is not None:
                raise self._error
            if self._drained.is_set():
                return
            await self._drained.wait()

    def write_eof(self) -> None:
        """End this side's half once what is buffered is sent; the peer reads end-of-file."""
        if self._error is None and not self._eof_wanted:
            self._eof_wanted = True
            self.mux._sendable(self)

    def can_write_eof(self) -> bool:
        return True

    async def wait_sent(self) -> None:
        """Wait until this half ended: all written data sent, then the close (after :meth:`write_eof`)."""
        await self._finished.wait()
        if self._error is not None and not self._eof_sent:
            raise self._error

    def is_closing(self) -> bool:
        return self._error is not None or self._eof_wanted

    def close(self) -> None:
        """Done with the stream: forgotten when both halves ended cleanly, else reset (its data dropped)."""
        if self._error is not None:
            return
        if self._eof and self._eof_sent and not self._inbox:
            self._fail(ConnectionResetError(f"tunnel stream {self.id} is closed"))
            return
        self.reset("closed by its user")

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str, default: object = None) -> object:
        if name == "peername":
            return (self.host, self.port)
        return default

    def reset(self, reason: str) -> None:
        """Abandon the stream: the peer's side fails with ``reason``; ours with a reset."""
        if self._error is not None:
            return
        self._fail(StreamReset(f"tunnel stream {self.id} was reset here: {reason}"))
        self.mux._control(Reset(self.id, reason))

    # ------------------------------------------------------------------ opening (the accepting side)

    def accept(self) -> None:
        """The connection asked for is made: tell the opener."""
        if not self._accepted and self._error is None:
            self._accepted = True
            self.mux._control(Opened(self.id, self.mux.window))

    def refuse(self, reason: str) -> None:
        """The connection asked for cannot be made; the opener fails with ``reason``."""
        self.reset(reason)

    # ------------------------------------------------------------------ from the mux

    def _fail(self, error: ConnectionResetError) -> None:
        if self._error is None:
            self._error = error
        self._outbox.clear()
        self._readable.set()
        self._drained.set()
        self._finished.set()
        if not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # retrieved: an opener that timed out does not leave it unread
        self.mux._forget(self)

    def _receive(self, data: bytes) -> None:
        if len(data) > self._receive_window:
            self.reset(f"the peer sent {len(data)} bytes with {self._receive_window} of window left")
            return
        self._receive_window -= len(data)
        self._inbox += data
        self._readable.set()

    def _remote_eof(self) -> None:
        self._eof = True
        self._readable.set()
        if self._eof_sent:
            self.mux._forget(self)

    def _next_frame(self) -> Frame | None:
        """The next frame this stream may send now (data within credit, or its close), if any."""
        if self._error is not None:
            return None
        if self._outbox and self._send_credit > 0 and self._opened.done():
            size = min(len(self._outbox), self._send_credit, MAX_DATA)
            chunk = bytes(self._outbox[:size])
            del self._outbox[:size]
            self._send_credit -= size
            if len(self._outbox) <= self.mux.window:
                self._drained.set()
            return Data(self.id, chunk)
        if not self._outbox and self._eof_wanted and not self._eof_sent and self._opened.done():
            self._eof_sent = True
            self._finished.set()
            if self._eof:
                self.mux._forget(self)
            return Close(self.id)
        return None

    def _has_frame(self) -> bool:
        if self._error is not None or not self._opened.done():
            return False
        return bool(self._outbox and self._send_credit > 0) or (
            not self._outbox and self._eof_wanted and not self._eof_sent
        )


class Mux:
    """Both ends of a tunnel run one: ``initiator`` numbers its streams odd, the other even."""

    def __init__(
        self,
        send: Send,
        *,
        name: str,
        initiator: bool,
        on_open: OnOpen | None = None,
        window: int = WINDOW,
    ) -> None:
        if window < 4 * MAX_DATA:
            raise ValueError(f"a tunnel window must be at least {4 * MAX_DATA} bytes, got {window}")
        self.name = name
        self.window = window
        self._send = send
        self._on_open = on_open
        self._next_id = 1 if initiator else 2
        self._streams: dict[int, TunnelStream] = {}
        self._controls: deque[Frame] = deque()
        self._ready: deque[TunnelStream] = deque()
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self._closed: str | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def closed(self) -> str | None:
        """Why the tunnel ended; None while it is open."""
        return self._closed

    def streams(self) -> int:
        """Streams open now."""
        return len(self._streams)

    async def run(self, incoming: AsyncIterable[Frame]) -> None:
        """Send and receive until the channel ends or breaks, or :meth:`close`; then fail every open stream."""
        reader = asyncio.create_task(self._read(incoming), name=f"tunnel {self.name} reader")
        sender = asyncio.create_task(self._send_loop(), name=f"tunnel {self.name} sender")
        ended = asyncio.create_task(self._wait_ended())
        reason = "the tunnel was closed"
        try:
            done, _ = await asyncio.wait({reader, sender, ended}, return_when=asyncio.FIRST_COMPLETED)
            for task in (reader, sender):
                if task in done and not task.cancelled():
                    error = task.exception()
                    reason = f"the tunnel broke: {error}" if error else "the peer ended the tunnel"
                    break
        finally:
            for task in (reader, sender, ended):
                task.cancel()
            for task in (reader, sender, ended):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.close(reason)

    async def _wait_ended(self) -> None:
        await self._ended.wait()

    def close(self, reason: str = "the tunnel was closed") -> None:
        """End the tunnel: every open stream fails with :class:`TunnelClosed` (``reason``)."""
        if self._closed is not None:
            return
        self._closed = reason
        for stream in list(self._streams.values()):
            stream._fail(TunnelClosed(f"tunnel {self.name}: {reason}"))
        self._streams.clear()
        for task in self._handlers:
            task.cancel()
        self._ended.set()

    async def open(self, host: str, port: int, *, timeout_s: float = 10.0) -> TunnelStream:
        """A stream connected to ``host:port`` on the other side; StreamReset when it refuses, TimeoutError."""
        if self._closed is not None:
            raise TunnelClosed(f"tunnel {self.name}: {self._closed}")
        stream_id = self._next_id
        self._next_id += 2
        stream = TunnelStream(self, stream_id, host, port, send_credit=0)
        self._streams[stream_id] = stream
        self._control(Open(stream_id, host, port, self.window))
        try:
            await asyncio.wait_for(asyncio.shield(stream._opened), timeout_s)
        except TimeoutError:
            stream.reset(f"not opened within {timeout_s:g} s")
            raise TimeoutError(f"tunnel {self.name}: {host}:{port} was not opened within {timeout_s:g} s") from None
        except asyncio.CancelledError:
            stream.reset("the opener went away")
            raise
        return stream

    # ------------------------------------------------------------------ internals

    def _control(self, frame: Frame) -> None:
        if self._closed is None:
            self._controls.append(frame)
            self._wake.set()

    def _sendable(self, stream: TunnelStream) -> None:
        if stream._has_frame() and stream not in self._ready:
            self._ready.append(stream)
            self._wake.set()

    def _forget(self, stream: TunnelStream) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._controls or self._ready:
                if self._controls:
                    await self._send(self._controls.popleft())
                    continue
                stream = self._ready.popleft()
                frame = stream._next_frame()
                if frame is not None:
                    await self._send(frame)
                if stream._has_frame():
                    self._ready.append(stream)  # one frame each in turn

    async def _read(self, incoming: AsyncIterable[Frame]) -> None:
        async for frame in incoming:
            self._receive(frame)

    def _receive(self, frame: Frame) -> None:
        if isinstance(frame, Open):
            self._accept(frame)
            return
        stream = self._streams.get(frame.stream)
        if stream is None:
            return  # in flight when the stream ended
        match frame:
            case Data(_, data):
                stream._receive(data)
            case Credit(_, amount):
                stream._send_credit += amount
                self._sendable(stream)
            case Opened(_, window):
                stream._send_credit = window
                if not stream._opened.done():
                    stream._opened.set_result(None)
                self._sendable(stream)
            case Close():
                stream._remote_eof()
            case Reset(_, reason):
                stream._fail(StreamReset(f"{stream.host}:{stream.port}: {reason}"))

    def _accept(self, frame: Open) -> None:
        if frame.stream in self._streams or frame.stream % 2 == self._next_id % 2:
            self._control(Reset(frame.stream, f"stream id {frame.stream} is not the opener's to take"))
            return
        if self._on_open is None:
            self._control(Reset(frame.stream, "this side of the tunnel accepts no streams"))
            return
        stream = TunnelStream(self, frame.stream, frame.host, frame.port, send_credit=frame.window)
        stream._opened.set_result(None)
        self._streams[frame.stream] = stream
        task = asyncio.create_task(self._handle(stream, self._on_open), name=f"tunnel {self.name} {stream}")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, stream: TunnelStream, on_open: OnOpen) -> None:
        try:
            await on_open(stream)
        except asyncio.CancelledError:
            stream.reset("the tunnel's far side is going away")
            raise
        except Exception as exc:
            log.debug("tunnel %s: stream %s failed: %s", self.name, stream, exc)
            stream.reset(str(exc) or type(exc).__name__)
            return
        if not stream._accepted:
            stream.refuse("not accepted")
