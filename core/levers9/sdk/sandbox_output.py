"""A sandbox process's output: one NDJSON reader on the wire, split into stdout, stderr and both, line by line.

The controlplane streams both of a process's streams on one route
(``GET /sandboxes/{id}/processes/{process}/output``), and hands each piece out once, to one reader at a
time. So the SDK reads it once per process, in the background on the sandbox loop
(:func:`read_output`), and :class:`ProcessOutput` keeps what came: the lines of stdout, of stderr, and of
both in the order they came. Any number of :class:`SandboxProcessStream` views iterate them, each from
its own place, from synchronous code (blocking on a condition) or async code (awaiting a future woken
from the loop), as the lines arrive.

Assembling lines: a piece is ``{"stream", "data", "encoding", "partial"}``. Its bytes (``data`` as UTF-8,
or base64 when the process wrote bytes that are not UTF-8 text, or a multi-byte character was cut) are
appended to that stream's buffer and every whole line is taken off it; a ``partial`` piece is the start
of a line that goes on in the next piece of the same stream, so it is held until the line ends. When the
process ends, what is left of a line without its newline becomes the stream's last line. Lines are
decoded as UTF-8 with undecodable bytes replaced, and keep their ``"\\n"``.

The stream ends with ``{"exit": code}`` (the exit status, or minus the signal that ended the process),
or ``{"error": {...}}`` when the sandbox went first: the error is raised by every view once it has read
the lines before it, and by ``wait``. A stream that breaks off is an error too (the sandbox's state, read
then, says why). Invariant: a view never waits for output that cannot come: after the end (exit, error,
or the reader failing) every waiter is woken.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from levers9.sdk.sandbox_errors import SandboxError, SandboxProcessError, is_type, stream_error

__all__ = ["STREAMS", "ProcessOutput", "SandboxProcessStream", "read_output"]

#: the streams of a process, and the name of the view of both
STREAMS = ("stdout", "stderr")
BOTH = "logs"


class ProcessOutput:
    """What one process wrote, as lines, and how it ended; fed on the sandbox loop, read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.lines: dict[str, list[str]] = {name: [] for name in (*STREAMS, BOTH)}
        #: the stream of each line of ``lines[BOTH]``, in the same order
        self.origins: list[str] = []
        self._pending = {name: bytearray() for name in STREAMS}
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.done = False
        #: futures of async waiters, each with its loop: set (from any thread) when something changes
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # ------------------------------------------------------------------ feeding (the reader)

    def feed(self, piece: dict[str, Any]) -> None:
        """Take one output piece of the wire; whole lines become readable at once."""
        stream = piece.get("stream")
        if stream not in STREAMS:
            raise ValueError(f"an output piece names stream {stream!r}, not stdout or stderr")
        data = piece.get("data", "")
        raw = base64.b64decode(data) if piece.get("encoding") == "base64" else str(data).encode()
        with self._lock:
            buffer = self._pending[stream]
            buffer += raw
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                self._add(stream, bytes(buffer[start : end + 1]))
                start = end + 1
            del buffer[:start]
        self._wake()

    def finish(self, exit_code: int | None = None, error: BaseException | None = None) -> None:
        """The process ended (``exit_code``), or its output can no longer come (``error``); wakes every waiter."""
        with self._lock:
            if self.done:
                return
            for stream in STREAMS:
                if self._pending[stream]:
                    self._add(stream, bytes(self._pending[stream]))
                    self._pending[stream].clear()
            self.exit_code = exit_code
            self.error = error
            self.done = True
        self._wake()

    def _add(self, stream: str, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        self.lines[stream].append(text)
        self.lines[BOTH].append(text)
        self.origins.append(stream)

    def _wake(self) -> None:
        with self._lock:
            self._changed.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits there any more
                loop.call_soon_threadsafe(_resolve, future)

    # ------------------------------------------------------------------ reading

    def tagged(self, index: int) -> tuple[tuple[str, str] | None, bool]:
        """((stream, line) at ``index`` of both streams, or None; whether no more can come)."""
        with self._lock:
            if index < len(self.origins):
                return (self.origins[index], self.lines[BOTH][index]), False
            return None, self.done

    def take(self, view: str, index: int) -> tuple[str | None, bool]:
        """(the line at ``index`` of ``view`` or None, whether no more can come)."""
        with self._lock:
            lines = self.lines[view]
            if index < len(lines):
                return lines[index], False
            return None, self.done

    def wait_sync(self, view: str, index: int, timeout: float | None = None) -> bool:
        """Block until ``view`` has a line at ``index`` or the output is done; False when ``timeout`` passed."""
        with self._changed:
            return self._changed.wait_for(lambda: index < len(self.lines[view]) or self.done, timeout)

    async def wait_async(self, view: str, index: int) -> None:
        """Wait, from any event loop, until ``view`` has a line at ``index`` or the output is done."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if index < len(self.lines[view]) or self.done:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        await future

    def wait_done_sync(self, timeout: float | None = None) -> bool:
        """Block until the output is done; False when ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: self.done, timeout)

    async def wait_done_async(self) -> None:
        """Wait, from any event loop, until the output is done."""
        while not self.done:
            await self.wait_async(BOTH, len(self.lines[BOTH]))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SandboxProcessStream:
    """A process's stdout, stderr or both (``logs``), line by line as they come; read once, like a file.

    Iterate it (``for line in p.stdout``, or ``async for`` from async code) for each line as the process
    writes it, with its ``"\\n"``; ``read()`` (``await read_aio()``) waits for the process to end and
    returns everything not iterated yet. The iteration ends when the process does; if the sandbox went
    first, or the output could not be read, it raises that error after the lines that came.
    """

    def __init__(self, output: ProcessOutput, view: str, start: Callable[[], None]) -> None:
        self._output = output
        self._view = view
        self._start = start
        self._index = 0

    def __repr__(self) -> str:
        return f"<SandboxProcessStream {self._view}>"

    def _end(self) -> None:
        if self._output.error is not None:
            raise self._output.error

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self._start()
        while True:
            line, done = self._output.take(self._view, self._index)
            if line is not None:
                self._index += 1
                return line
            if done:
                self._end()
                raise StopIteration
            self._output.wait_sync(self._view, self._index)

    def __aiter__(self) -> SandboxProcessStream:
        return self

    async def __anext__(self) -> str:
        self._start()
        while True:
            line, done = self._output.take(self._view, self._index)
            if line is not None:
                self._index += 1
                return line
            if done:
                self._end()
                raise StopAsyncIteration
            await self._output.wait_async(self._view, self._index)

    def read(self) -> str:
        """Everything not iterated yet, once the process has ended."""
        return "".join(self)

    async def read_aio(self) -> str:
        """``read`` for async code."""
        return "".join([line async for line in self])


async def read_output(
    lines: Callable[[], Any],
    output: ProcessOutput,
    *,
    what: str,
    sandbox_id: str,
    on_busy: Callable[[SandboxError], Awaitable[int | None]],
    on_break: Callable[[SandboxError], Awaitable[SandboxError]],
) -> None:
    """Read one process's NDJSON output into ``output`` until its end; never raises.

    ``lines()`` is an async context manager yielding the stream's lines. ``on_busy`` is awaited when
    another reader holds the output (409 OutputBusy): it returns the process's exit code however it can
    learn it, and the views raise the busy error. ``on_break`` turns a stream that broke off (or never
    opened) into the error to report, reading the sandbox's state for the reason.
    """
    try:
        async with lines() as stream:
            async for text in stream:
                if not text.strip():
                    continue
                record = json.loads(text)
                if "exit" in record:
                    output.finish(exit_code=int(record["exit"]))
                    return
                if "error" in record:
                    output.finish(error=stream_error(record["error"], what=what, sandbox_id=sandbox_id))
                    return
                output.feed(record)
        output.finish(error=await on_break(SandboxError(f"{what}: the output stream ended without the exit status")))
    except SandboxProcessError as exc:
        if not is_type(exc, "OutputBusy"):
            output.finish(error=exc)
            return
        try:
            code = await on_busy(exc)
        except SandboxError as later:
            output.finish(error=later)
            return
        output.finish(exit_code=code, error=exc)
    except SandboxError as exc:
        output.finish(error=await on_break(exc))
    except (ValueError, KeyError, TypeError) as exc:
        output.finish(error=SandboxError(f"{what}: a line of the output stream is not what the API sends: {exc}"))
    except BaseException as exc:  # cancelled with the loop, or a bug: the views must still end
        output.finish(error=SandboxError(f"{what}: reading the output failed: {exc!r}"))
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise
