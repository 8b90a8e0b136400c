"""The program inside every container of a stub: ``python -m levers9.runner.main``.

It loads the stub's cloudpickled function once, then serves the calls the
worker sends over one authenticated TCP connection, one at a time, for as
long as the container lives; a warm container thus pays the interpreter's
start and the function's imports once, not per call.

Protocol (frames as in :mod:`levers9.runner.frames`):

* the worker connects and sends ``hello`` with the container's token; any
  other first frame, or a wrong token, closes that connection and the runner
  keeps listening (another container on the bridge must not be able to lock
  the worker out). After a good ``hello`` the runner stops listening and
  answers ``ready``;
* ``call`` (``task_id``; payload: cloudpickled ``(args, kwargs)``) is answered
  by any number of ``log`` frames (``task_id``, ``stream``; payload: output
  bytes) while the function runs, then one ``result`` (``task_id``, ``status``
  ``complete`` with the cloudpickled value, or ``error`` with an ``error``
  object and the cloudpickled exception when it could be pickled);
* ``serve`` (``task_id``, ``interface``, ``port``, ``concurrency``,
  ``ports``) turns the container into an endpoint's or a box's: the runner
  starts the HTTP server of :mod:`levers9.runner.serving` on ``port`` (or, for
  a box, runs the handler and waits until its ``ports`` accept connections),
  answers ``serving``, and from then on sends only the output (``log`` frames
  of that task); a box whose handler returns sends its ``result``;
* the connection ending, or ``shutdown``, ends the runner.

With ``LEVERS9_RUNNER_MODE=sandbox`` there is no handler (``LEVERS9_HANDLER_FILE``
is not read): after ``ready`` (which then says ``mode``: ``sandbox``) the runner
serves a sandbox's processes and files (:mod:`levers9.runner.sandbox`, frames of
:mod:`levers9.runner.sandbox_wire`) until the worker hangs up, and kills every
process it started as it ends. Any other mode is refused at start (exit 2).

Only the standard library, cloudpickle and the frames module are imported:
this is on every container's start-up path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import importlib
import inspect
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, BinaryIO

from levers9.payloads import JSON_CALL, PayloadTooLarge
from levers9.runner import frames
from levers9.runner.sandbox_wire import ENV_MODE, MODE_FUNCTION, MODE_SANDBOX
from levers9.runner.variables import (
    ENV_GO,
    ENV_HANDLER,
    ENV_HOST,
    ENV_PORT,
    ENV_PYTHON,
    ENV_READY,
    ENV_SOCKET,
    ENV_TOKEN,
)

# untyped; imported by name so the type checker needs no stubs for it
cloudpickle: Any = importlib.import_module("cloudpickle")

__all__ = [
    "ENV_GO",
    "ENV_HANDLER",
    "ENV_HOST",
    "ENV_PORT",
    "ENV_PYTHON",
    "ENV_READY",
    "ENV_SOCKET",
    "ENV_TOKEN",
    "main",
]


#: seconds a connection may take to say hello before the runner drops it and listens again
HELLO_TIMEOUT_S = 10.0
#: the worker shows these to people; a runaway message or traceback must not exceed a frame header
MAX_MESSAGE_CHARS = 16_000
MAX_TRACEBACK_CHARS = 64_000

_THIS_FILE = os.path.abspath(__file__)


@dataclass(frozen=True)
class Failure:
    """What a call that failed reports: plain text for the worker, plus the exception for the caller."""

    type: str
    message: str
    traceback: str = ""
    exception: bytes = b""

    def fields(self) -> dict[str, str]:
        return {
            "type": self.type[:200],
            "message": _clip(self.message, MAX_MESSAGE_CHARS),
            "traceback": _clip(self.traceback, MAX_TRACEBACK_CHARS),
        }


class _Terminated(BaseException):
    """SIGTERM: unwinds through user code (running its ``finally`` blocks) but is never reported as its error."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


# --------------------------------------------------------------------------- output capture


class Channel:
    """The authenticated connection, shared by the serving loop and every thread that prints."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        #: the call whose output is being captured, or None between calls
        self.task_id: str | None = None

    def send(self, kind: str, payload: bytes = b"", **fields: Any) -> None:
        with self._lock:
            frames.send_frame(self.sock, kind, payload, **fields)

    def send_log(self, stream: str, data: bytes) -> bool:
        """Send output as the current call's; False when no call is running (or the worker is gone)."""
        task_id = self.task_id
        if task_id is None:
            return False
        try:
            self.send("log", data, task_id=task_id, stream=stream)
        except OSError:
            return False
        return True


class _Sink(io.RawIOBase):
    """The bottom of ``sys.stdout``/``sys.stderr``: the current call's log, else the container's own output."""

    def __init__(self, name: str, fd: int) -> None:
        super().__init__()
        self.stream = name
        self.fd = fd
        self.channel: Channel | None = None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The container's own output: what a subprocess handed ``sys.stdout`` writes to, uncaptured."""
        return self.fd

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        if self.channel is None or not self.channel.send_log(self.stream, chunk):
            _write_fd(self.fd, chunk)
        return len(chunk)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # the container's log is gone; output has nowhere to go


def _capture(name: str, fd: int) -> tuple[io.TextIOWrapper, _Sink]:
    sink = _Sink(name, fd)
    buffered = io.BufferedWriter(sink, buffer_size=8192)
    text = io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace", line_buffering=True)
    return text, sink


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # user code closed or replaced the stream
            stream.flush()


# --------------------------------------------------------------------------- the function


def _expected_python(expected: str) -> Failure | None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not expected or expected == here:
        return None
    return Failure(
        "PythonVersionMismatch",
        f"the function was pickled with Python {expected}, this image runs {here}; "
        f"deploy it from Python {here} or use an image with Python {expected}",
    )


def load_handler(path: str, expected_python: str) -> tuple[Callable[..., Any] | None, Failure | None]:
    """The function, or why every call will fail: checked once, when the container starts."""
    mismatch = _expected_python(expected_python)
    if mismatch is not None:
        return None, mismatch  # unpickling code objects of another Python would crash or mislead
    try:
        with open(path, "rb") as f:
            handler = cloudpickle.load(f)
    except Exception as exc:
        return None, _failure(exc, prefix="loading the function failed: " + _not_in_containers(exc))
    if not callable(handler):
        return None, Failure("TypeError", f"the stub's handler is a {type(handler).__name__}, not a callable")
    return handler, None


def _not_in_containers(exc: BaseException) -> str:
    """Why a levers9 module the function (its pickle, its code, its arguments) asks for is missing here.

    Empty for any other failure. Only the runner's tree is mounted (:mod:`levers9.worker.warm.launch`).
    """
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if not name or not name.startswith("levers9."):
        return ""
    return (
        f"{name} is not in containers: a container has only levers9.runner, levers9.payloads and "
        "levers9.ready() of levers9 (docs/security.md), so a function cannot call another one (or itself) "
        "through its decorated name there; "
    )


def _json_arguments(data: bytes) -> tuple[list[Any], dict[str, Any]]:
    """A JSON call's arguments: ``{"args": [...], "kwargs": {...}}`` as the gateway wrote them."""
    value = json.loads(data)
    return list(value.get("args", [])), dict(value.get("kwargs", {}))


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's code down, without the runner's and asyncio's frames above it."""
    tb: TracebackType | None = exc.__traceback__
    asyncio_dir = os.path.join(os.path.dirname(os.__file__), "asyncio")
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if filename != _THIS_FILE and not filename.startswith(asyncio_dir):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _pickled_exception(exc: BaseException) -> bytes:
    """Best effort: only bytes the caller can load again, else nothing."""
    try:
        data = bytes(cloudpickle.dumps(exc))
        cloudpickle.loads(data)
    except Exception:
        return b""
    return data if len(data) <= frames.MAX_PAYLOAD_BYTES else b""


def _failure(exc: BaseException, *, prefix: str = "") -> Failure:
    return Failure(type(exc).__name__, prefix + str(exc), _user_traceback(exc), _pickled_exception(exc))


class Executor:
    """Runs calls of one function; coroutines share one event loop for the container's life."""

    def __init__(self, handler: Callable[..., Any] | None, problem: Failure | None) -> None:
        self.handler = handler
        self.problem = problem
        self._loop: Any = None

    def run(self, args_payload: bytes, max_result: int = frames.MAX_PAYLOAD_BYTES) -> bytes | Failure:
        """The call's pickled (or JSON) value, or its failure; a value over ``max_result`` bytes is a failure."""
        answer = self._run(args_payload)
        if isinstance(answer, Failure):
            if len(answer.exception) > max_result:  # the caller still gets the type, message and traceback
                return dataclasses.replace(answer, exception=b"")
            return answer
        if len(answer) > max_result:
            return Failure(
                "PayloadTooLarge", str(PayloadTooLarge("the function's return value", len(answer), max_result))
            )
        return answer

    def _run(self, args_payload: bytes) -> bytes | Failure:
        if self.handler is None:
            assert self.problem is not None
            return self.problem
        as_json = args_payload.startswith(JSON_CALL)
        try:
            if as_json:
                args, kwargs = _json_arguments(args_payload[len(JSON_CALL) :])
            else:
                args, kwargs = cloudpickle.loads(args_payload)
            result = self.handler(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._await(result)
        except _Terminated:
            raise
        except BaseException as exc:  # SystemExit from user code is the call's error, not the container's end
            return _failure(exc, prefix=_not_in_containers(exc))
        if as_json:
            try:
                return JSON_CALL + json.dumps(result).encode()
            except (TypeError, ValueError) as exc:
                return _failure(exc, prefix=f"the function's return value ({type(result).__name__}) is not JSON: ")
        try:
            return bytes(cloudpickle.dumps(result))
        except Exception as exc:
            return _failure(exc, prefix=f"the function's return value ({type(result).__name__}) could not be pickled: ")

    def _await(self, awaitable: Any) -> Any:
        if self._loop is None:
            import asyncio  # only async functions pay for it

            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

        async def wait() -> Any:
            return await awaitable

        return self._loop.run_until_complete(wait())


# --------------------------------------------------------------------------- serving


def accept_worker(host: str, port: int, token: str, *, unix_path: str | None = None) -> tuple[socket.socket, BinaryIO]:
    """The worker's connection, once it proved it holds the token; other connections are dropped."""
    if unix_path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_path)  # left by the container this one was restored from
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(unix_path)
        listener.listen()
    else:
        listener = socket.create_server((host, port))
    with listener:
        while True:
            conn, _ = listener.accept()
            if unix_path is None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(HELLO_TIMEOUT_S)
            stream = conn.makefile("rb")
            try:
                hello = frames.recv_frame(stream, max_payload=0)
            except (OSError, frames.ProtocolError):
                hello = None
            if hello is not None and hello.kind == "hello" and _token_matches(hello.header.get("token"), token):
                conn.settimeout(None)
                return conn, stream
            stream.close()
            conn.close()


def wait_for_go(ready: str, go: str) -> str:
    """Say start-up is done, wait until the worker says to serve (it checkpoints meanwhile); the token to expect.

    Polled, not waited on with inotify: a restored container carries on from here, in a new
    container whose files are new, and a poll needs nothing to survive the restore. The go file
    holds the container's token: a restored runner still has the token of the container it was
    checkpointed from in its environment.
    """
    with open(ready, "w"):
        pass
    while not os.path.exists(go):
        time.sleep(0.005)
    with open(go) as f:
        return f.read().strip()


def _token_matches(given: object, token: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode())


def serve(channel: Channel, stream: BinaryIO, executor: Executor) -> int:
    """Answer calls until the worker hangs up; the exit status of the runner."""
    while True:
        frame = frames.recv_frame(stream)
        if frame is None or frame.kind == "shutdown":
            return 0
        if frame.kind == "serve":
            return serve_http(channel, stream, executor, frame)
        if frame.kind != "call":
            raise frames.ProtocolError(f"unexpected frame {frame.kind!r} from the worker")
        task_id = frame.text("task_id")
        _flush_output()  # what was printed before the call belongs to the container's log
        channel.task_id = task_id
        max_result = frame.header.get("max_result", frames.MAX_PAYLOAD_BYTES)
        if not isinstance(max_result, int) or max_result < 0:
            raise frames.ProtocolError(f"frame 'call': max_result must be a byte count, got {max_result!r}")
        try:
            answer = executor.run(frame.payload, max_result)
        finally:
            _flush_output()
            channel.task_id = None
        if isinstance(answer, Failure):
            channel.send("result", answer.exception, task_id=task_id, status="error", error=answer.fields())
        else:
            channel.send("result", answer, task_id=task_id, status="complete")


def serve_http(channel: Channel, stream: BinaryIO, executor: Executor, order: frames.Frame) -> int:
    """Serve HTTP (or run a box) until the worker hangs up; what ``serve`` asks, see the module's docstring."""
    task_id = order.text("task_id")
    interface = order.text("interface", "function")
    channel.task_id = task_id  # every request's output is the serving task's
    if executor.handler is None:
        assert executor.problem is not None
        channel.send(
            "result", executor.problem.exception, task_id=task_id, status="error", error=executor.problem.fields()
        )
        return _wait_hang_up(stream)
    if interface == "box":
        return _run_box(channel, stream, executor.handler, task_id, [int(p) for p in order.header.get("ports", [])])
    from levers9.runner import serving

    try:
        app = (
            executor.handler()
            if interface == "asgi"
            else serving.function_app(executor.handler, int(order.header.get("concurrency", 1)))
        )
        if interface == "asgi" and not callable(app):
            raise TypeError(f"the ASGI handler returned a {type(app).__name__}, not an ASGI application")
        server = serving.HttpServer(app, os.environ.get(ENV_HOST, "0.0.0.0"), int(order.header["port"]))
        server.start()
    except Exception as exc:
        failure = _failure(exc, prefix="starting the HTTP server failed: ")
        channel.send("result", failure.exception, task_id=task_id, status="error", error=failure.fields())
        return _wait_hang_up(stream)
    channel.send("serving", task_id=task_id, port=server.port)
    try:
        return _wait_hang_up(stream)
    finally:
        server.stop()


def _run_box(channel: Channel, stream: BinaryIO, handler: Callable[..., Any], task_id: str, ports: list[int]) -> int:
    """Run a box's handler (a server that never returns) and say when its ports accept connections."""

    def run() -> None:
        try:
            result = handler()
            if inspect.isawaitable(result):
                import asyncio

                async def wait() -> Any:
                    return await result

                asyncio.run(wait())
        except BaseException as exc:
            failure = _failure(exc)
            _flush_output()
            with contextlib.suppress(OSError):
                channel.send("result", failure.exception, task_id=task_id, status="error", error=failure.fields())
            return
        _flush_output()
        with contextlib.suppress(OSError):
            channel.send("result", cloudpickle.dumps(None), task_id=task_id, status="complete")

    thread = threading.Thread(target=run, name="levers9-box", daemon=True)
    thread.start()
    waiting = set(ports)
    while waiting:
        if not thread.is_alive():
            return _wait_hang_up(stream)  # it ended before serving; its result went out
        for port in list(waiting):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                waiting.discard(port)
        if waiting:
            time.sleep(0.05)
    channel.send("serving", task_id=task_id, port=0)
    return _wait_hang_up(stream)


def _wait_hang_up(stream: BinaryIO) -> int:
    while True:
        frame = frames.recv_frame(stream)
        if frame is None or frame.kind == "shutdown":
            return 0


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main() -> int:
    mode = os.environ.get(ENV_MODE) or MODE_FUNCTION
    if mode not in (MODE_FUNCTION, MODE_SANDBOX):
        print(
            f"levers9 runner: {ENV_MODE} is {mode!r}; expected {MODE_FUNCTION!r} or {MODE_SANDBOX!r}", file=sys.stderr
        )
        return 2
    if mode == MODE_SANDBOX:
        return main_sandbox()
    unix_path = os.environ.get(ENV_SOCKET) or None
    try:
        port = 0 if unix_path else int(os.environ[ENV_PORT])
        token = os.environ[ENV_TOKEN]
        handler_file = os.environ[ENV_HANDLER]
    except (KeyError, ValueError) as exc:
        print(
            f"levers9 runner: {ENV_PORT} (or {ENV_SOCKET}), {ENV_TOKEN} and {ENV_HANDLER} must be set ({exc!r})",
            file=sys.stderr,
        )
        return 2
    # as PID 1 of a container, SIGTERM is ignored unless handled
    signal.signal(signal.SIGTERM, _terminate)
    stdout, out_sink = _capture("stdout", 1)
    stderr, err_sink = _capture("stderr", 2)
    sys.stdout, sys.stderr = stdout, stderr
    try:
        executor = Executor(*load_handler(handler_file, os.environ.get(ENV_PYTHON, "")))
        ready, go = os.environ.get(ENV_READY), os.environ.get(ENV_GO)
        if ready and go:
            _flush_output()
            token = wait_for_go(ready, go) or token
        conn, stream = accept_worker(os.environ.get(ENV_HOST, "0.0.0.0"), port, token, unix_path=unix_path)
        channel = Channel(conn)
        out_sink.channel = err_sink.channel = channel
        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        channel.send("ready", python=python, pid=os.getpid())
        return serve(channel, stream, executor)
    except _Terminated:
        return 128 + signal.SIGTERM
    except (OSError, frames.ProtocolError) as exc:
        print(f"levers9 runner: the worker's connection failed: {exc}", file=sys.__stderr__)
        return 1
    finally:
        _flush_output()


def main_sandbox() -> int:
    """The sandbox mode (:mod:`levers9.runner.sandbox`): no handler; processes and files, until the worker hangs up.

    With a signal directory (``LEVERS9_READY_FILE``, ``LEVERS9_GO_FILE``; and ``LEVERS9_RUNNER_SOCKET``, a unix
    socket there instead of a TCP port) the worker may detach it for a snapshot: the runner then creates the
    ready file, waits for the go file holding the token of the worker to come, and listens again.
    """
    from levers9.runner import sandbox  # only sandboxes pay for subprocess and select

    unix_path = os.environ.get(ENV_SOCKET) or None
    try:
        port = 0 if unix_path else int(os.environ[ENV_PORT])
        token = os.environ[ENV_TOKEN]
        max_processes = sandbox.max_processes_from(dict(os.environ))
    except (KeyError, ValueError) as exc:
        print(f"levers9 runner: {ENV_PORT} (or {ENV_SOCKET}) and {ENV_TOKEN} must be set ({exc})", file=sys.stderr)
        return 2
    ready, go = os.environ.get(ENV_READY), os.environ.get(ENV_GO)
    signal.signal(signal.SIGTERM, _terminate)
    relay = sandbox.Relay() if ready and go else None
    runner: sandbox.SandboxRunner | None = None
    try:
        while True:
            conn, stream = accept_worker(os.environ.get(ENV_HOST, "0.0.0.0"), port, token, unix_path=unix_path)
            channel = Channel(conn)
            python = f"{sys.version_info[0]}.{sys.version_info[1]}"
            channel.send("ready", python=python, pid=os.getpid(), mode=MODE_SANDBOX)
            if relay is None:
                return sandbox.SandboxRunner(channel, max_processes=max_processes).serve(stream)
            relay.connect(channel)
            if runner is None:  # the first worker: output flows at once; a later one asks attach first
                runner = sandbox.SandboxRunner(relay, max_processes=max_processes)
                relay.flow()
            runner.serve(stream)
            if not runner.detached:
                return 0
            stream.close()
            conn.close()
            assert ready is not None
            assert go is not None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(go)  # the go of the last attach; the worker writes a new one
            token = wait_for_go(ready, go) or token
    except _Terminated:
        return 128 + signal.SIGTERM
    except (OSError, frames.ProtocolError) as exc:
        print(f"levers9 runner: the worker's connection failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
