"""The worker's side of a sandbox: processes and files in a container, over its runner's connection.

A :class:`SandboxSession` takes the connection :meth:`RunnerClient.connect
<levers9.worker.warm.runner_client.RunnerClient.connect>` made to a runner in
sandbox mode and drives it with the requests of
:mod:`levers9.runner.sandbox_wire`: one task reads every frame the runner sends
and hands each to the request or the process it belongs to; requests may be
in flight several at once, from any number of tasks.

The container is untrusted. Every header is checked field by field, answers
must be of the kind the request expects and carry a ``req`` in flight, output
must be for a process the session started and stay within the window the
session granted, and payloads are read with a size limit. Anything else is a
:class:`~levers9.runner.frames.ProtocolError`: the session stops trusting the
connection, closes it, and every pending request and process ends with
:class:`SandboxGone` saying so.

Errors:

* :class:`SandboxError` (``op``, ``code``, ``path``): the runner refused or
  failed one request (a missing file, a relative path, too many processes);
  the session goes on.
* :class:`SandboxGone`: the connection ended (the container exited, was
  killed, or broke the protocol); every request in flight and every process
  still running fails with it, with the reason, and so does every later call.
  Nothing waits forever on a sandbox that is gone.

Output is buffered per process up to the ``window`` given to :meth:`exec`;
once it is full the process blocks on its pipe until its output is read with
:meth:`SandboxProcess.output` (see :mod:`levers9.runner.sandbox_wire`).

Detaching (a snapshot, :meth:`levers9.worker.sandboxes.Sandboxes.snapshot`):
:meth:`SandboxSession.detach` asks the runner to hang up while its processes
run on; the session ends, but its processes do not fail: they are handed to the
next session, on a new connection to the same runner or to a restored copy of
it, by :meth:`SandboxSession.attach`, which also adopts the processes the
runner knows and this side does not (a restored sandbox's). A reader of a
process's output waiting meanwhile just waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from levers9.runner import frames
from levers9.runner import sandbox_wire as wire
from levers9.runner.sandbox_wire import FileEntry, ProcessInfo

__all__ = ["FileEntry", "OutputChunk", "ProcessInfo", "SandboxError", "SandboxGone", "SandboxProcess", "SandboxSession"]

T = TypeVar("T")

#: the largest payload a sandbox's runner sends: a file chunk or an output frame
MAX_PAYLOAD_BYTES = max(wire.FILE_CHUNK_BYTES, wire.MAX_OUTPUT_FRAME_BYTES)


class SandboxError(Exception):
    """The runner refused or failed one request; ``code`` is an errno name or one of ``sandbox_wire.ERROR_CODES``."""

    def __init__(self, op: str, code: str, message: str, path: str = "") -> None:
        super().__init__(message)
        self.op = op
        self.code = code
        self.path = path


class SandboxGone(SandboxError):
    """The sandbox's connection ended: its container exited, was killed, or broke the protocol."""

    def __init__(self, reason: str) -> None:
        super().__init__("", "SandboxGone", reason)


@dataclass(frozen=True)
class OutputChunk:
    """Output of a process: one whole line (ending in ``\\n``), or, when ``partial``, the start of a line."""

    stream: str
    data: bytes
    partial: bool


_END = object()


class SandboxProcess:
    """A process started in the sandbox: its output as it comes, its end, and signals."""

    def __init__(self, session: SandboxSession, process: int, pid: int, argv: list[str], window: int) -> None:
        self.session = session
        #: the sandbox's own id for it (from 1), not the OS pid
        self.id = process
        #: the pid inside the container
        self.pid = pid
        self.argv = argv
        self.window = window
        self.exit_code: int | None = None
        self._exited = asyncio.Event()
        self._queue: asyncio.Queue[OutputChunk | object] = asyncio.Queue()
        #: bytes sent by the runner and not yet given back as ``consumed``: at most ``window``
        self._outstanding = 0
        #: bytes handed out by :meth:`output` not yet given back
        self._uncredited = 0
        self._gone: SandboxGone | None = None
        #: its end was learnt from an ``attached`` list: the runner's held ``exited`` may still come, once
        self._end_listed = False

    async def output(self) -> AsyncIterator[OutputChunk]:
        """Its output, stdout and stderr in the order they came, line by line, until it ends.

        Raises :class:`SandboxGone` when the sandbox goes first. Read it once: each chunk is handed out once.
        """
        while True:
            item = await self._queue.get()
            if item is _END:
                self._queue.put_nowait(_END)  # a second reader ends too
                if self._gone is not None:
                    raise self._gone
                return
            assert isinstance(item, OutputChunk)
            self._uncredited += len(item.data)
            # credit in batches, and whenever the reader has caught up (so a nearly full window never stalls)
            if self._uncredited >= self.window // 4 or self._queue.empty():
                count, self._uncredited = self._uncredited, 0
                await self.session._consumed(self, count)
            yield item

    async def read_all(self) -> tuple[bytes, bytes]:
        """All its stdout and stderr, once it has ended."""
        out: dict[str, list[bytes]] = {name: [] for name in wire.STREAMS}
        async for chunk in self.output():
            out[chunk.stream].append(chunk.data)
        return b"".join(out["stdout"]), b"".join(out["stderr"])

    async def wait(self) -> int:
        """Its exit status (minus the signal that ended it). Raises :class:`SandboxGone` when the sandbox goes first."""
        await self._exited.wait()
        if self.exit_code is None:
            assert self._gone is not None
            raise self._gone
        return self.exit_code

    async def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Signal its process group; whether it still ran."""
        return await self.session.kill(self.id, sig)

    async def status(self) -> ProcessInfo:
        return await self.session.status(self.id)

    @property
    def running(self) -> bool:
        """Whether it still runs as far as the session knows (no ``exited`` yet, and the sandbox is not gone)."""
        return not self._exited.is_set()

    # ----------------------------------------------------------------- from the session's reader

    def _moved(self, session: SandboxSession) -> None:
        """It now belongs to ``session``, on a new connection whose window starts full."""
        self.session = session
        self._outstanding = 0
        self._uncredited = 0

    def _output(self, stream: str, data: bytes, partial: bool) -> None:
        self._outstanding += len(data)
        if self._outstanding > self.window:
            raise frames.ProtocolError(
                f"process {self.id} sent {self._outstanding} bytes of output unconsumed, over its window of "
                f"{self.window}"
            )
        if not partial:
            lines = data.split(b"\n")
            if lines[-1]:
                raise frames.ProtocolError(f"an output frame of process {self.id} not marked partial ends mid-line")
            for line in lines[:-1]:
                self._queue.put_nowait(OutputChunk(stream, line + b"\n", False))
        else:
            self._queue.put_nowait(OutputChunk(stream, data, True))

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self._queue.put_nowait(_END)
        self._exited.set()

    def _fail(self, gone: SandboxGone) -> None:
        if self._exited.is_set():
            return
        self._gone = gone
        self._queue.put_nowait(_END)
        self._exited.set()


class SandboxSession:
    """One sandbox's runner connection; :meth:`start` it, then call its methods from any task; :meth:`close` it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, name: str = "sandbox") -> None:
        self.name = name
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[frames.Frame]]] = {}
        self._processes: dict[int, SandboxProcess] = {}
        #: exec and run_code requests in flight: the window and argv of the process their answer starts
        self._starts: dict[int, tuple[int, list[str]]] = {}
        self._gone: SandboxGone | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._ended = asyncio.Event()
        #: processes to take over at ``attached`` (those of the session before)
        self._carry: dict[int, SandboxProcess] = {}
        #: set once the runner answered ``detached``: the session's end fails none of its processes
        self._detached = False

    def start(self) -> SandboxSession:
        self._task = asyncio.ensure_future(self._read())
        self._task.set_name(f"levers9-sandbox-{self.name}")
        return self

    @property
    def gone(self) -> SandboxGone | None:
        """Why the connection ended, or None while it is up."""
        return self._gone

    async def wait_ended(self) -> SandboxGone:
        """Wait until the connection has ended (for whatever reason) and say why."""
        await self._ended.wait()
        assert self._gone is not None
        return self._gone

    async def detach(self) -> dict[int, SandboxProcess]:
        """Ask the runner to hang up and wait for the next worker, its processes running on; they are returned,
        for :meth:`attach` on the next session. SandboxError ``Unsupported`` from a runner without a signal
        directory (the session goes on)."""
        await self._request("detach", parse=_nothing)
        await self.close(f"the sandbox {self.name} was detached for a snapshot")
        return dict(self._processes)

    async def attach(self, carry: dict[int, SandboxProcess] | None = None) -> list[SandboxProcess]:
        """Take over the processes of a detached runner: ``carry`` (those of the session before, with the
        output they buffered) and the others it lists; the held output follows. Returns them, oldest first."""
        self._carry = dict(carry or {})
        try:
            numbers = await self._request("attach", parse=lambda a: [p.process for p in _process_list(a)])
        finally:
            self._carry = {}
        return [self._processes[n] for n in numbers]

    async def configure(self, env: dict[str, str]) -> None:
        """Set variables (and secrets) for every process started after this, over the container's own."""
        await self._request("configure", env=dict(env), parse=_nothing)

    async def close(self, reason: str = "") -> None:
        """Hang up: the runner kills its processes and ends (and the container with it)."""
        self._end(SandboxGone(reason or f"the sandbox {self.name} was closed"))
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ----------------------------------------------------------------- processes

    async def exec(
        self,
        *argv: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        window: int = wire.DEFAULT_WINDOW_BYTES,
    ) -> SandboxProcess:
        """Start ``argv`` (no shell); its output comes from :meth:`SandboxProcess.output` as it is written."""
        if not argv:
            raise ValueError("exec: argv is empty; give the program and its arguments")
        return await self._start("exec", list(argv), window, argv=list(argv), cwd=cwd, env=env or {})

    async def run_code(
        self,
        code: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        window: int = wire.DEFAULT_WINDOW_BYTES,
    ) -> SandboxProcess:
        """Run ``code`` with the container's Python (``python -c code``)."""
        return await self._start("run_code", ["python", "-c", code], window, code=code, cwd=cwd, env=env or {})

    async def _start(self, op: str, command: list[str], window: int, **fields: Any) -> SandboxProcess:
        if not wire.MIN_WINDOW_BYTES <= window <= wire.MAX_WINDOW_BYTES:
            raise ValueError(f"{op}: window must be from {wire.MIN_WINDOW_BYTES} to {wire.MAX_WINDOW_BYTES} bytes")
        return await self._request(
            op, window=window, **fields, starts=(window, command), parse=lambda a: self._processes[_int(a, "process")]
        )

    async def kill(self, process: int, sig: int = signal.SIGKILL) -> bool:
        return await self._request("kill", process=process, signal=int(sig), parse=lambda a: _bool(a, "running"))

    async def status(self, process: int) -> ProcessInfo:
        return await self._request("status", process=process, parse=lambda a: wire.process_from(a.header.get("info")))

    async def list_processes(self) -> list[ProcessInfo]:
        return await self._request("list", parse=_process_list)

    # ----------------------------------------------------------------- files

    async def write_file(self, path: str, data: bytes, *, mode: int | None = None, append: bool = False) -> int:
        """Create or replace the file at ``path`` (its directory must exist), or add to its end with ``append``;
        its size after."""
        _check_path("write_file", path)
        size = 0
        for start in range(0, max(len(data), 1), wire.FILE_CHUNK_BYTES):
            chunk = data[start : start + wire.FILE_CHUNK_BYTES]
            size = await self._request(
                "write_file", chunk, path=path, append=append or start > 0, mode=mode, parse=lambda a: _int(a, "size")
            )
        return size

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The whole file at ``path``, read a chunk at a time; :class:`SandboxError` ``EFBIG`` past ``max_bytes``."""
        parts: list[bytes] = []
        offset = 0
        async for data in self.read_chunks(path):
            parts.append(data)
            offset += len(data)
            if max_bytes is not None and offset > max_bytes:
                raise SandboxError("read_file", "EFBIG", f"read_file {path}: the file is over {max_bytes} bytes", path)
        return b"".join(parts)

    async def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        """The file at ``path`` a chunk (at most ``sandbox_wire.FILE_CHUNK_BYTES``) at a time; a file that cannot
        be read fails at the first step, before any of it is handed out."""
        _check_path("read_file", path)
        offset = 0
        while True:
            data, eof = await self._request(
                "read_file", path=path, offset=offset, length=wire.FILE_CHUNK_BYTES, parse=_file_chunk
            )
            offset += len(data)
            yield data
            if eof:
                return

    async def list_files(self, path: str) -> list[FileEntry]:
        """The entries of the directory ``path``, by name (at most ``sandbox_wire.MAX_LIST_ENTRIES``)."""
        _check_path("list_files", path)
        return await self._request("list_files", path=path, parse=_listing)

    async def stat_file(self, path: str) -> FileEntry:
        _check_path("stat_file", path)
        return await self._request("stat_file", path=path, parse=lambda a: wire.entry_from(a.header.get("entry")))

    async def create_directory(self, path: str, *, parents: bool = True) -> None:
        _check_path("mkdir", path)
        await self._request("mkdir", path=path, parents=parents, parse=_nothing)

    async def delete_file(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file, or a directory and all it holds with ``recursive``."""
        _check_path("delete", path)
        await self._request("delete", path=path, recursive=recursive, parse=_nothing)

    # ----------------------------------------------------------------- the wire

    async def _request(
        self,
        op: str,
        payload: bytes = b"",
        *,
        parse: Callable[[frames.Frame], T],
        starts: tuple[int, list[str]] | None = None,
        **fields: Any,
    ) -> T:
        """Send a request and wait for its answer, read by ``parse``; a broken answer ends the session."""
        if self._gone is not None:
            raise self._gone
        req = next(self._ids)
        future: asyncio.Future[frames.Frame] = asyncio.get_running_loop().create_future()
        self._pending[req] = (op, future)
        if starts is not None:
            self._starts[req] = starts
        try:
            await self._send(op, payload, req=req, **fields)
            answer = await future
        finally:
            self._pending.pop(req, None)
            self._starts.pop(req, None)
        try:
            if answer.kind == "failed":
                error = frames.Frame("error", answer.object("error"))
                raise SandboxError(op, error.text("code"), error.text("message"), error.text("path", ""))
            return parse(answer)
        except frames.ProtocolError as exc:
            raise self._broken(f"its answer to {op}: {exc}") from None

    async def _send(self, kind: str, payload: bytes = b"", **fields: Any) -> None:
        async with self._write_lock:
            try:
                await frames.write_frame(self._writer, kind, payload, **fields)
            except (OSError, ConnectionError) as exc:
                self._end(SandboxGone(f"the sandbox {self.name}'s connection failed: {exc}"))
                raise self._gone from exc  # type: ignore[misc]

    async def _consumed(self, process: SandboxProcess, count: int) -> None:
        process._outstanding = max(0, process._outstanding - count)  # carried output was counted before a move
        if self._gone is None:
            with contextlib.suppress(SandboxGone):
                await self._send("consumed", process=process.id, bytes=count)

    async def _read(self) -> None:
        try:
            while True:
                self._dispatch(await frames.read_frame(self._reader, max_payload=MAX_PAYLOAD_BYTES))
        except (asyncio.IncompleteReadError, OSError, ConnectionError):
            self._end(SandboxGone(f"the sandbox {self.name} ended: its container exited or its connection broke"))
        except frames.ProtocolError as exc:
            self._end(SandboxGone(f"the sandbox {self.name}'s runner broke the protocol: {exc}"))
            self._writer.close()

    def _dispatch(self, frame: frames.Frame) -> None:
        if frame.kind == "output":
            stream = frame.text("stream")
            if stream not in wire.STREAMS:
                raise frames.ProtocolError(f"an output frame names the stream {stream!r}")
            self._process(frame)._output(stream, frame.payload, _bool(frame, "partial"))
            return
        if frame.kind == "exited":
            code = frame.header.get("code")
            if isinstance(code, bool) or not isinstance(code, int):
                raise frames.ProtocolError(f"an exited frame's code is {code!r}, expected an integer")
            listed = self._processes.get(_int(frame, "process"))
            if listed is not None and listed._end_listed and listed.exit_code == code:
                listed._end_listed = False  # the held end of a process attach already listed as ended
                return
            self._process(frame)._exit(code)
            return
        req = frame.header.get("req")
        entry = self._pending.get(req) if isinstance(req, int) and not isinstance(req, bool) else None
        if entry is None or not isinstance(req, int):
            raise frames.ProtocolError(f"a {frame.kind!r} frame answers no request in flight (req {req!r})")
        op, future = entry
        if frame.kind not in (wire.REQUESTS[op], "failed"):
            raise frames.ProtocolError(f"{op} was answered {frame.kind!r}, expected {wire.REQUESTS[op]!r} or 'failed'")
        if frame.kind == "started":
            number, pid = _int(frame, "process"), _int(frame, "pid")
            if number in self._processes:
                raise frames.ProtocolError(f"process id {number} was given twice")
            window, argv = self._starts[req]
            self._processes[number] = SandboxProcess(self, number, pid, argv, window)
        if frame.kind == "detached":  # before the hang-up that follows it ends the session
            self._detached = True
        if frame.kind == "attached":  # before the held output that follows it
            self._adopt(_process_list(frame))
        if not future.done():
            future.set_result(frame)

    def _adopt(self, listed: list[ProcessInfo]) -> None:
        for info in listed:
            process = self._carry.pop(info.process, None)
            if process is None:
                process = SandboxProcess(self, info.process, info.pid, list(info.argv), wire.DEFAULT_WINDOW_BYTES)
            else:
                process._moved(self)
            if not info.running and process.running:
                process._end_listed = True
                process._exit(info.exit_code if info.exit_code is not None else -1)
            self._processes[info.process] = process
        for process in self._carry.values():  # the runner forgot it (ended long ago): it will hear no more
            process._fail(SandboxGone(f"the sandbox {self.name}'s runner no longer knows process {process.id}"))

    def _process(self, frame: frames.Frame) -> SandboxProcess:
        number = _int(frame, "process")
        process = self._processes.get(number)
        if process is None or process.exit_code is not None:
            raise frames.ProtocolError(f"a {frame.kind!r} frame for process {number}, which is not running")
        return process

    def _broken(self, message: str) -> SandboxGone:
        gone = SandboxGone(f"the sandbox {self.name}'s runner broke the protocol: {message}")
        self._end(gone)
        self._writer.close()
        return gone

    def _end(self, gone: SandboxGone) -> None:
        if self._gone is not None:
            return
        self._gone = gone
        self._ended.set()
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(gone)
        if not self._detached:  # a detached session's processes run on, for the next session
            for process in self._processes.values():
                process._fail(gone)


def _nothing(frame: frames.Frame) -> None:
    return None


def _process_list(frame: frames.Frame) -> list[ProcessInfo]:
    listed = frame.header.get("processes")
    if not isinstance(listed, list):
        raise frames.ProtocolError(f"the process list is {type(listed).__name__}, expected a list")
    return [wire.process_from(item) for item in listed]


def _file_chunk(frame: frames.Frame) -> tuple[bytes, bool]:
    if len(frame.payload) > wire.FILE_CHUNK_BYTES:
        raise frames.ProtocolError(f"a file chunk of {len(frame.payload)} bytes is over {wire.FILE_CHUNK_BYTES}")
    _int(frame, "size")
    return frame.payload, _bool(frame, "eof")


def _listing(frame: frames.Frame) -> list[FileEntry]:
    entries = frame.header.get("entries")
    if not isinstance(entries, list) or len(entries) > wire.MAX_LIST_ENTRIES:
        raise frames.ProtocolError(f"a listing's entries are not a list of at most {wire.MAX_LIST_ENTRIES}")
    _bool(frame, "truncated")
    return [wire.entry_from(e) for e in entries]


def _int(frame: frames.Frame, key: str) -> int:
    value = frame.header.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise frames.ProtocolError(f"frame {frame.kind!r}: field {key!r} is {value!r}, expected a count")
    return value


def _bool(frame: frames.Frame, key: str) -> bool:
    value = frame.header.get(key)
    if not isinstance(value, bool):
        raise frames.ProtocolError(f"frame {frame.kind!r}: field {key!r} is {value!r}, expected true or false")
    return value


def _check_path(op: str, path: str) -> None:
    """Refused here already, naming the path: the runner would refuse it the same way."""
    if (why := wire.bad_path(path)) is not None:
        raise SandboxError(op, "BadPath", f"{op}: {why}", path if isinstance(path, str) else "")
