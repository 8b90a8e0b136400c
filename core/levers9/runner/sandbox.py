"""The runner of a sandbox: processes and files inside the container, driven by the worker's frames.

The requests, answers and bounds are :mod:`levers9.runner.sandbox_wire`'s.
Here is how the runner keeps them:

* One thread reads the worker's frames and answers them in order; file
  operations run on it (a big file is read and written in chunks the worker
  asks for one at a time, so no answer is bigger than a chunk).
* Each process gets a thread per pipe, which reads its output and sends it as
  ``output`` frames, and a thread that waits for its end and sends ``exited``
  once both pipes are done. Frames from all threads go out whole through the
  connection's lock (:class:`Sender`).
* A process starts in a session of its own, so ``kill`` signals its whole
  process group, children included; the worker hanging up ends the runner,
  which kills every group it started (and, as PID 1 of the container, the
  container ends with it).
* As PID 1 of the container the runner inherits processes whose parent
  ended (a shell's background job), and reaps them, so none stays a zombie.
* A runner with a signal directory can detach (``detach``; see
  :mod:`~levers9.runner.sandbox_wire`): its :class:`Relay` holds the frames
  nobody asked for (output, ends) while no worker is attached, so nothing is
  lost or sent to a connection that is going away, and its processes keep
  running; :func:`levers9.runner.main.main_sandbox` then waits for the go
  file and listens again.
* The runner's own variables (its token, port, mode) are not passed to the
  processes, and the runner's Python tree is taken off their ``PYTHONPATH``.

Failures: an operation the operating system refuses (a missing file, a
directory where a file was expected, no permission) or the runner refuses (a
relative path, an unknown process, too many processes) is answered ``failed``
naming the operation and the path; the connection goes on. A frame that is not
a request, or one without an integer ``req``, is a broken worker:
:class:`~levers9.runner.frames.ProtocolError`, and the runner ends.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from levers9.runner import frames, variables
from levers9.runner import sandbox_wire as wire

__all__ = ["Refused", "Relay", "SandboxRunner", "Sender", "child_environment", "serve_sandbox"]

#: variables of the runner that its processes do not get
RUNNER_VARIABLES = (
    variables.ENV_PORT,
    variables.ENV_TOKEN,
    variables.ENV_HANDLER,
    variables.ENV_PYTHON,
    variables.ENV_HOST,
    variables.ENV_SOCKET,
    variables.ENV_READY,
    variables.ENV_GO,
    wire.ENV_MODE,
    wire.ENV_MAX_PROCESSES,
)


#: an answer: its kind, payload and fields (``req`` is added)
_Answer = tuple[str, bytes, dict[str, Any]]


#: seconds between looks for orphans while the runner has no child at all
ORPHAN_POLL_S = 0.2


class Sender(Protocol):
    """The connection to the worker; ``send`` is safe to call from several threads at once."""

    def send(self, kind: str, payload: bytes = b"", **fields: Any) -> None: ...


class Relay:
    """The runner's connection to whichever worker is attached; a :class:`Sender`.

    Answers go out on the current connection at once (:meth:`send`). Frames nobody asked for (a
    process's output and end) go through :meth:`send_unasked`, which waits while output is held: from
    ``detach`` until the next worker's ``attach`` (and until the first connection exists).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._channel: Sender | None = None
        self._flowing = False

    def connect(self, channel: Sender) -> None:
        """A new worker's connection: answers go to it; held output stays held until :meth:`flow`."""
        with self._cond:
            self._channel = channel

    def send(self, kind: str, payload: bytes = b"", **fields: Any) -> None:
        with self._cond:
            channel = self._channel
        if channel is None:
            raise OSError("no worker is connected")
        channel.send(kind, payload, **fields)

    def send_unasked(self, kind: str, payload: bytes = b"", **fields: Any) -> None:
        with self._cond:
            while not self._flowing or self._channel is None:
                self._cond.wait()
            self._channel.send(kind, payload, **fields)  # under the lock: hold() waits for a frame under way

    def hold(self) -> None:
        """Stop unasked frames; returns once none is being sent."""
        with self._cond:
            self._flowing = False

    def flow(self) -> None:
        with self._cond:
            self._flowing = True
            self._cond.notify_all()


class Refused(Exception):
    """A request the runner answers ``failed``: ``code`` as in :mod:`~levers9.runner.sandbox_wire`."""

    def __init__(self, code: str, message: str, path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


def child_environment(base: dict[str, str], given: dict[str, str], runner_tree: str) -> dict[str, str]:
    """The environment of a process: the container's without the runner's own, and ``given`` over it."""
    env = {k: v for k, v in base.items() if k not in RUNNER_VARIABLES}
    if "PYTHONPATH" in env:
        kept = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and os.path.abspath(p) != runner_tree]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    env.update(given)
    return env


class _Window:
    """How many more bytes of a process's output may be sent before the worker consumes some."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._available = size
        self._cond = threading.Condition()
        self._closed = False

    def take(self, n: int) -> bool:
        """Wait until ``n`` bytes may be sent and count them sent; False once the window is closed."""
        with self._cond:
            while self._available < n and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._available -= n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self._available = min(self.size, self._available + n)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Pending:
    """A pipe's output not yet sent: the start of a line, and when it came."""

    def __init__(self) -> None:
        self.data = bytearray()
        #: when the oldest byte still here was read, and when the pipe last gave anything
        self.since = 0.0
        self.heard = time.monotonic()

    def add(self, chunk: bytes, now: float) -> None:
        if not self.data:
            self.since = now
        self.data += chunk
        self.heard = now

    def take(self, n: int) -> bytes:
        taken = bytes(self.data[:n])
        del self.data[:n]
        self.since = self.heard
        return taken

    def due(self, now: float) -> bool:
        """A partial line has waited :data:`FLUSH_DELAY_S`: it is sent as it is."""
        return bool(self.data) and now >= self.since + wire.FLUSH_DELAY_S

    def drained(self, exited_at: float | None, now: float) -> bool:
        return exited_at is not None and now >= max(exited_at, self.heard) + wire.EXIT_DRAIN_S

    def timeout(self, exited_at: float | None) -> float | None:
        """How long to wait for the pipe: until a partial line is due, or the drain after the exit is over."""
        now = time.monotonic()
        waits = []
        if self.data:
            waits.append(self.since + wire.FLUSH_DELAY_S - now)
        if exited_at is not None:
            waits.append(max(exited_at, self.heard) + wire.EXIT_DRAIN_S - now)
        return max(0.0, min(waits)) if waits else None


@dataclass(eq=False)
class _Process:
    id: int
    argv: list[str]
    cwd: str
    popen: subprocess.Popen[bytes]
    window: _Window
    started_at: float = field(default_factory=time.time)
    exit_code: int | None = None
    #: monotonic time of the exit; the pipes' readers stop after :data:`EXIT_DRAIN_S` of silence past it
    exited_at: float | None = None
    pumps: list[threading.Thread] = field(default_factory=list)
    #: written to by the reaper when the process ends, so readers waiting on a silent pipe see it
    wake: tuple[int, int] = field(default_factory=os.pipe)

    def info(self) -> wire.ProcessInfo:
        return wire.ProcessInfo(
            process=self.id,
            pid=self.popen.pid,
            argv=tuple(self.argv),
            cwd=self.cwd,
            running=self.exit_code is None,
            exit_code=self.exit_code,
            started_at=self.started_at,
        )


class SandboxRunner:
    """The process table and file operations of one sandbox; :meth:`serve` answers the worker's requests."""

    def __init__(
        self,
        sender: Sender,
        *,
        max_processes: int = wire.DEFAULT_MAX_PROCESSES,
        python: str = sys.executable,
        environ: dict[str, str] | None = None,
        reap_orphans: bool | None = None,
    ) -> None:
        self.sender = sender
        #: output and ends go here: held while detached when the sender is a Relay
        self._unasked = sender.send_unasked if isinstance(sender, Relay) else sender.send
        #: set by ``detach``: :meth:`serve` returns without ending the processes
        self.detached = False
        self._reaping = False
        self.max_processes = max_processes
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        self._runner_tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._lock = threading.Lock()
        self._processes: dict[int, _Process] = {}
        self._ended: collections.deque[int] = collections.deque()
        self._next_id = 1
        self._closing = False
        #: as PID 1 of its container the runner inherits every orphaned process, and must reap them
        self.reap_orphans = os.getpid() == 1 if reap_orphans is None else reap_orphans
        self._handlers: dict[str, Callable[[frames.Frame], _Answer | None]] = {
            "exec": self._exec,
            "run_code": self._run_code,
            "kill": self._kill,
            "status": self._status,
            "list": self._list,
            "write_file": self._write_file,
            "read_file": self._read_file,
            "list_files": self._list_files,
            "stat_file": self._stat_file,
            "mkdir": self._mkdir,
            "delete": self._delete,
            "detach": self._detach,
            "attach": self._attach,
            "configure": self._configure,
        }

    # ----------------------------------------------------------------- the loop

    def serve(self, stream: BinaryIO) -> int:
        """Answer requests until the worker hangs up (or says ``shutdown``); then end every process.

        After ``detach`` it returns with :attr:`detached` set and the processes left running.
        """
        if self.reap_orphans and not self._reaping:
            self._reaping = True
            threading.Thread(target=self._reap_orphans, name="sandbox-orphans", daemon=True).start()
        self.detached = False
        try:
            while True:
                frame = frames.recv_frame(stream)
                if frame is None or frame.kind == "shutdown":
                    return 0
                self.handle(frame)
                if self.detached:
                    return 0
        finally:
            if not self.detached:
                self.close()

    def handle(self, frame: frames.Frame) -> None:
        if frame.kind == "consumed":
            self._consumed(frame)
            return
        handler = self._handlers.get(frame.kind)
        if handler is None:
            raise frames.ProtocolError(f"unexpected frame {frame.kind!r} from the worker in a sandbox")
        req = frame.header.get("req")
        if not isinstance(req, int) or isinstance(req, bool):
            raise frames.ProtocolError(f"frame {frame.kind!r}: field 'req' is {type(req).__name__}, expected int")
        try:
            answer = handler(frame)
        except Refused as exc:
            self._failed(req, frame.kind, exc.code, exc.message, exc.path)
            return
        except OSError as exc:
            path = exc.filename if isinstance(exc.filename, str) else str(frame.header.get("path", ""))
            code = errno.errorcode.get(exc.errno or 0, "OSError")
            self._failed(req, frame.kind, code, f"{frame.kind} {path}: {exc.strerror or exc}", path)
            return
        if answer is not None:  # None: the handler answered itself
            kind, payload, fields = answer
            self.sender.send(kind, payload, req=req, **fields)

    def _failed(self, req: int, op: str, code: str, message: str, path: str) -> None:
        self.sender.send("failed", req=req, op=op, error={"code": code, "message": message[:4000], "path": path})

    def close(self) -> None:
        """Kill every process group it started (what ended may have left children running); end their threads."""
        with self._lock:
            self._closing = True
            everything = list(self._processes.values())
            running = [p for p in everything if p.exit_code is None]
        for proc in everything:
            with contextlib.suppress(OSError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.window.close()
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)

    # ----------------------------------------------------------------- processes

    def _exec(self, frame: frames.Frame) -> None:
        argv = frame.header.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or len(argv) > wire.MAX_ARGV_ITEMS
            or not all(isinstance(a, str) and "\0" not in a for a in argv)
        ):
            raise Refused(
                "BadRequest", f"exec: argv must be a non-empty list of strings without NUL, got {_show(argv)}"
            )
        self._start(list(argv), frame)

    def _run_code(self, frame: frames.Frame) -> None:
        code = frame.header.get("code")
        if not isinstance(code, str) or "\0" in code:
            raise Refused("BadRequest", f"run_code: code must be a string without NUL, got {_show(code)}")
        self._start([self.python, "-c", code], frame)

    def _start(self, argv: list[str], frame: frames.Frame) -> None:
        op = frame.kind
        cwd = frame.header.get("cwd") or "/"
        if (why := wire.bad_path(cwd)) is not None:
            raise Refused("BadPath", f"{op}: cwd: {why}", str(cwd))
        if not os.path.isdir(cwd):
            raise Refused("ENOENT", f"{op}: the working directory {cwd} does not exist or is not a directory", cwd)
        env = frame.header.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
            for k, v in env.items()
        ):
            raise Refused("BadRequest", f"{op}: env must be an object of string names (without '=') to strings")
        window = frame.header.get("window", wire.DEFAULT_WINDOW_BYTES)
        if (
            isinstance(window, bool)
            or not isinstance(window, int)
            or not (wire.MIN_WINDOW_BYTES <= window <= wire.MAX_WINDOW_BYTES)
        ):
            raise Refused(
                "BadRequest",
                f"{op}: window must be a byte count from {wire.MIN_WINDOW_BYTES} to {wire.MAX_WINDOW_BYTES}, "
                f"got {_show(window)}",
            )
        with self._lock:
            running = sum(1 for p in self._processes.values() if p.exit_code is None)
            if running >= self.max_processes:
                raise Refused(
                    "TooManyProcesses",
                    f"{op}: the sandbox already runs {running} processes, its most at once "
                    f"({wire.ENV_MAX_PROCESSES}={self.max_processes}); wait for one to end or kill one",
                )
            try:
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=child_environment(self.environ, env, self._runner_tree),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                reason = exc.strerror or str(exc)
                code = errno.errorcode.get(exc.errno or 0, "ExecFailed")
                raise Refused(code, f"{op}: could not start {argv[0]!r}: {reason}", argv[0]) from None
            proc = _Process(id=self._next_id, argv=argv, cwd=cwd, popen=popen, window=_Window(window))
            self._next_id += 1
            self._processes[proc.id] = proc
        # the answer goes out before any output can: the worker knows the process before its first line
        self.sender.send("started", req=frame.header["req"], process=proc.id, pid=popen.pid)
        assert popen.stdout is not None
        assert popen.stderr is not None
        proc.pumps = [
            threading.Thread(target=self._pump, args=(proc, name, pipe), name=f"sandbox-{proc.id}-{name}", daemon=True)
            for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr))
        ]
        for pump in proc.pumps:
            pump.start()
        threading.Thread(target=self._reap, args=(proc,), name=f"sandbox-{proc.id}-wait", daemon=True).start()

    def _pump(self, proc: _Process, name: str, pipe: BinaryIO) -> None:
        """Send one pipe's output as ``output`` frames: whole lines, or a partial line when it waits or is long."""
        fd = pipe.fileno()
        line = _Pending()
        try:
            while True:
                watched = [fd] if proc.exited_at is not None else [fd, proc.wake[0]]
                ready, _, _ = select.select(watched, [], [], line.timeout(proc.exited_at))
                if fd not in ready:
                    now = time.monotonic()
                    if line.due(now) and not self._emit(proc, name, line.take(len(line.data)), partial=True):
                        return
                    if line.drained(proc.exited_at, now):
                        break  # ended, and something it left behind holds the pipe open without writing
                    continue
                chunk = os.read(fd, wire.READ_BYTES)
                if not chunk:
                    break
                line.add(chunk, time.monotonic())
                whole = line.data.rfind(b"\n") + 1
                if whole and not self._emit(proc, name, line.take(whole), partial=False):
                    return
                while len(line.data) >= wire.MAX_LINE_BYTES:
                    if not self._emit(proc, name, line.take(wire.MAX_LINE_BYTES), partial=True):
                        return
            if line.data:
                self._emit(proc, name, line.take(len(line.data)), partial=True)
        except OSError:
            pass  # the worker is gone; the runner is ending
        finally:
            pipe.close()

    def _emit(self, proc: _Process, name: str, data: bytes, *, partial: bool) -> bool:
        """Send output once the window has room (blocking this pipe meanwhile); False when the runner ends."""
        if not proc.window.take(len(data)):
            return False
        self._unasked("output", data, process=proc.id, stream=name, partial=partial)
        return True

    def _reap(self, proc: _Process) -> None:
        code = proc.popen.wait()
        proc.exited_at = time.monotonic()
        os.write(proc.wake[1], b"x")
        for pump in proc.pumps:
            pump.join()
        for end in proc.wake:
            os.close(end)
        with self._lock:
            proc.exit_code = code
            self._ended.append(proc.id)
            while len(self._ended) > wire.MAX_EXITED_KEPT:
                self._processes.pop(self._ended.popleft(), None)
            closing = self._closing
        if not closing:
            with contextlib.suppress(OSError):
                self._unasked("exited", process=proc.id, code=code)

    def _reap_orphans(self) -> None:
        """Reap the processes the runner inherited (a background child whose parent ended), never its own.

        Its own are reaped by their ``Popen``; an orphan left unreaped would stay a zombie for the
        sandbox's life. ``WNOWAIT`` looks at an ended child without reaping it, so one of the runner's own
        is left to its ``Popen``; they are in the table before the lock is let go, so none is mistaken.
        """
        while not self._closing:
            try:
                ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                time.sleep(ORPHAN_POLL_S)  # no child at all now
                continue
            if ended is None:
                continue
            with self._lock:
                ours = any(p.popen.pid == ended.si_pid and p.popen.returncode is None for p in self._processes.values())
            if ours:
                time.sleep(0.01)  # its own reaper collects it
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(ended.si_pid, 0)

    def _process(self, frame: frames.Frame) -> _Process:
        number = frame.header.get("process")
        if isinstance(number, bool) or not isinstance(number, int):
            raise Refused("BadRequest", f"{frame.kind}: process must be an integer id, got {_show(number)}")
        with self._lock:
            proc = self._processes.get(number)
        if proc is None:
            raise Refused("NoSuchProcess", f"{frame.kind}: the sandbox has no process {number}")
        return proc

    def _kill(self, frame: frames.Frame) -> _Answer:
        proc = self._process(frame)
        sig = wire.signal_number(frame.header.get("signal", int(signal.SIGKILL)))
        if sig is None:
            raise Refused("BadRequest", f"kill: signal must be a signal number, got {_show(frame.header['signal'])}")
        running = proc.exit_code is None
        with contextlib.suppress(ProcessLookupError):  # the group has ended since
            os.killpg(proc.popen.pid, sig)
        return "done", b"", {"running": running}

    def _status(self, frame: frames.Frame) -> _Answer:
        return "process", b"", {"info": self._process(frame).info().fields()}

    def _list(self, frame: frames.Frame) -> _Answer:
        with self._lock:
            infos = [p.info().fields() for p in self._processes.values()]
        return "processes", b"", {"processes": infos}

    def _configure(self, frame: frames.Frame) -> _Answer:
        env = frame.header.get("env")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise Refused("BadRequest", f"configure: env must map strings to strings, got {_show(env)}")
        with self._lock:
            self.environ.update(env)
        return "done", b"", {}

    def _detach(self, frame: frames.Frame) -> _Answer:
        if not isinstance(self.sender, Relay):
            raise Refused(
                "Unsupported",
                "detach: this runner has no signal directory to wait in; only a sandbox created for snapshots detaches",
            )
        self.sender.hold()
        self.detached = True
        return "detached", b"", {}

    def _attach(self, frame: frames.Frame) -> None:
        with self._lock:
            everything = list(self._processes.values())
            infos = [p.info().fields() for p in everything]
        for proc in everything:
            proc.window.give(proc.window.size)  # what the old connection had in flight was the old worker's
        self.sender.send("attached", req=frame.header["req"], processes=infos)
        if isinstance(self.sender, Relay):
            self.sender.flow()

    def _consumed(self, frame: frames.Frame) -> None:
        number, count = frame.header.get("process"), frame.header.get("bytes")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (number, count)):
            raise frames.ProtocolError("frame 'consumed': process and bytes must be integers")
        with self._lock:
            proc = self._processes.get(int(number))  # type: ignore[arg-type]
        if proc is not None:
            proc.window.give(int(count))  # type: ignore[arg-type]

    # ----------------------------------------------------------------- files

    def _path(self, frame: frames.Frame) -> str:
        path = frame.header.get("path")
        if (why := wire.bad_path(path)) is not None:
            raise Refused("BadPath", f"{frame.kind}: {why}", path if isinstance(path, str) else "")
        assert isinstance(path, str)
        return path

    def _flag(self, frame: frames.Frame, key: str, default: bool) -> bool:
        value = frame.header.get(key, default)
        if not isinstance(value, bool):
            raise Refused("BadRequest", f"{frame.kind}: {key} must be true or false, got {_show(value)}")
        return value

    def _write_file(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        append = self._flag(frame, "append", False)
        mode = frame.header.get("mode")
        if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777):
            raise Refused("BadRequest", f"write_file: mode must be permission bits (0 to 0o7777), got {_show(mode)}")
        parent = os.path.dirname(path.rstrip("/")) or "/"
        if not os.path.isdir(parent):
            raise Refused(
                "ENOENT",
                f"write_file {path}: the directory {parent} does not exist; create it first (create_directory)",
                path,
            )
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(path, flags, 0o644 if mode is None else mode)
        try:
            view = memoryview(frame.payload)
            while view:
                view = view[os.write(fd, view) :]
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return "done", b"", {"size": size}

    def _read_file(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        offset, length = frame.header.get("offset", 0), frame.header.get("length", wire.FILE_CHUNK_BYTES)
        for key, value in (("offset", offset), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise Refused("BadRequest", f"read_file: {key} must be a byte count, got {_show(value)}")
        if length > wire.FILE_CHUNK_BYTES:
            raise Refused("BadRequest", f"read_file: length {length} is over the chunk of {wire.FILE_CHUNK_BYTES}")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not hang the runner
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise Refused("EISDIR", f"read_file {path}: is a directory (list_files lists it)", path)
            if not stat.S_ISREG(info.st_mode):
                raise Refused("EINVAL", f"read_file {path}: not a regular file (a device, FIFO or socket)", path)
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        return "file_data", data, {"size": info.st_size, "eof": len(data) < length}

    def _list_files(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        entries = []
        with os.scandir(path) as found:
            for item in found:
                entries.append(_entry(item.path, item.name))
                if len(entries) > wire.MAX_LIST_ENTRIES:
                    break
        entries.sort(key=lambda e: e.name)
        truncated = len(entries) > wire.MAX_LIST_ENTRIES
        return (
            "listing",
            b"",
            {"entries": [e.fields() for e in entries[: wire.MAX_LIST_ENTRIES]], "truncated": truncated},
        )

    def _stat_file(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        os.stat(path)  # a dangling link is "not found" here, as it is to open()
        return "stat", b"", {"entry": _entry(path, os.path.basename(path.rstrip("/")) or "/").fields()}

    def _mkdir(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        if self._flag(frame, "parents", True):
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path)
        return "done", b"", {}

    def _delete(self, frame: frames.Frame) -> _Answer:
        path = self._path(frame)
        recursive = self._flag(frame, "recursive", False)
        if os.path.normpath(path) == "/":
            raise Refused("BadPath", "delete: refusing to delete / (terminate the sandbox instead)", path)
        if os.path.isdir(path) and not os.path.islink(path):
            if not recursive:
                raise Refused("EISDIR", f"delete {path}: is a directory; pass recursive=True to delete it", path)
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return "done", b"", {}


def _entry(path: str, name: str) -> wire.FileEntry:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = os.lstat(path)  # a dangling link is listed as itself
    return wire.FileEntry(
        name=name,
        path=path,
        size=info.st_size,
        mode=info.st_mode,
        is_dir=stat.S_ISDIR(info.st_mode),
        mtime=info.st_mtime,
    )


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def max_processes_from(environ: dict[str, str]) -> int:
    """``LEVERS9_SANDBOX_MAX_PROCESSES``, or the default; ValueError naming it when it is not a count."""
    raw = environ.get(wire.ENV_MAX_PROCESSES, "")
    if not raw:
        return wire.DEFAULT_MAX_PROCESSES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{wire.ENV_MAX_PROCESSES} must be a whole number of 1 or more, got {raw!r}")
    return value


def serve_sandbox(sender: Sender, stream: BinaryIO) -> int:
    """The runner's sandbox mode, once the worker is connected: answer until it hangs up."""
    runner = SandboxRunner(sender, max_processes=max_processes_from(dict(os.environ)))
    return runner.serve(stream)
