"""The frames of a sandbox: processes and files driven by the worker, over the runner's wire.

A sandbox is a container whose runner (``python -m levers9.runner`` with
``LEVERS9_RUNNER_MODE=sandbox``) calls no handler: after the usual ``hello``
and ``ready`` (:mod:`levers9.runner.main`) it serves the requests below until
the worker hangs up, and then ends, taking every process it started with it.
Frames are those of :mod:`levers9.runner.frames`; this module names their
kinds and fields, the limits both sides hold to, and the checks of what the
container sends (the container is untrusted: the worker reads every header
through :func:`entry_from` and :func:`process_from` or field by field, and a
field of the wrong type or a frame the worker did not ask for is a
:class:`~levers9.runner.frames.ProtocolError`, after which the connection is
not trusted further).

Requests (worker to runner). Each carries ``req``, an integer the worker picks,
unique among its requests in flight; the answer carries the same ``req``.

=============  ==============================================  ======================================
kind           fields                                          answer
=============  ==============================================  ======================================
``exec``       ``argv`` (list of strings), ``cwd`` (absolute   ``started``: ``process`` (the
               path, or null for /), ``env`` (strings,         sandbox's own id, from 1), ``pid``
               merged over the container's), ``window``        (the OS pid inside the container)
               (bytes of output the worker buffers)
``run_code``   ``code`` (a string), ``cwd``, ``env``,          ``started``: the container's Python
               ``window``                                      run with ``-c code``
``kill``       ``process``, ``signal`` (default SIGKILL)       ``done``: ``running`` (whether it
                                                               still ran when signalled)
``status``     ``process``                                     ``process``: ``info`` (the fields of
                                                               :class:`ProcessInfo`)
``list``       (none)                                          ``processes``: ``processes`` (a list
                                                               of ``info``), oldest first
``write_file`` ``path``, ``append`` (false: create or          ``done``: ``size`` (the file's size
               truncate), ``mode`` (permission bits of a new   after the write)
               file, or null); payload: the bytes
``read_file``  ``path``, ``offset``, ``length`` (at most       ``file_data``: ``size`` (the file's
               :data:`FILE_CHUNK_BYTES`)                       size), ``eof``; payload: the bytes
``list_files`` ``path`` (a directory)                          ``listing``: ``entries`` (at most
                                                               :data:`MAX_LIST_ENTRIES`, by name),
                                                               ``truncated``
``stat_file``  ``path``                                        ``stat``: ``entry`` (the fields of
                                                               :class:`FileEntry`, as each of
                                                               ``entries``)
``mkdir``      ``path``, ``parents`` (default true)            ``done``
``delete``     ``path``, ``recursive`` (default false)         ``done``
``detach``     (none)                                          ``detached``, then the runner hangs up
                                                               (see *Detaching* below)
``attach``     (none)                                          ``attached``: ``processes`` (as
                                                               ``list``'s); then output flows again
``configure``  ``env`` (strings): merged over the container's  ``done``
               for every process started after it (a warm
               sandbox taken for a create: its variables
               and secrets, which its container was started
               without)
=============  ==============================================  ======================================

Any request may instead be answered ``failed``: ``op`` (the request's kind),
``error`` (an object: ``code``, ``message``, ``path``). ``code`` is an errno
name (``ENOENT``, ``EISDIR``, ``EACCES``, ``ENOTDIR``, ``EEXIST``...) for what
the operating system refused, or one of :data:`ERROR_CODES` for what the runner
refused; ``message`` says what was asked and why it failed, naming the path or
the argument; ``path`` is the path concerned, or ``""``. A failed request
changes nothing else: the connection and the other processes go on.

Without a request (worker to runner): ``consumed`` (``process``, ``bytes``):
the worker has passed on that much of a process's output, so the runner may
send that much more (the flow control below).

From the runner unasked:

* ``output`` (``process``, ``stream``: ``stdout`` or ``stderr``, ``partial``);
  payload: the bytes as the process wrote them. With ``partial`` false the
  payload is one or more whole lines, each ending in ``\\n``; with ``partial``
  true it is the start of a line not yet ended, sent because the process wrote
  nothing more for :data:`FLUSH_DELAY_S`, or the line reached
  :data:`MAX_LINE_BYTES`, or the stream ended; the line goes on in the next
  frame of that stream. Bytes, not text: output is passed on unchanged.
* ``exited`` (``process``, ``code``): the process ended; ``code`` is its exit
  status, or minus the signal that ended it. It comes after the last
  ``output`` of the process.

Detaching (how a sandbox is snapshotted with its processes running, see
:meth:`levers9.worker.sandboxes.Sandboxes.snapshot`). Only a runner started with
a signal directory (``LEVERS9_READY_FILE`` and ``LEVERS9_GO_FILE`` set, and
``LEVERS9_RUNNER_SOCKET`` for its socket) can detach; another answers
``failed`` ``Unsupported``. On ``detach`` the runner stops sending ``output``
and ``exited`` (they wait, and a process whose pipe fills blocks in its write,
as with a full window), answers ``detached``, closes the connection, creates
the ready file and waits for the go file, holding no connection and no
listening socket, so the container can be checkpointed. The go file holds the
token the next worker proves (the same worker's, or a restored copy's new
worker's); the runner then listens again, and after ``hello`` and ``ready``
output stays held until the worker asks ``attach``: the answer lists every
process the runner knows (running and recently ended), every window is full
again (what the old connection had in flight is the old worker's), and the
held ``output`` and ``exited`` frames follow. Output the old worker had
received before ``detached`` is not sent again.

Bounds and what happens at them:

* Output flow control: a process may have at most ``window`` bytes of output
  sent and not yet ``consumed``. When the window is full the runner stops
  reading that process's pipes; once the pipe (the kernel's buffer) is full
  the process blocks in its next write until the worker consumes. Nothing is
  dropped. A worker that never consumes a chatty process's output therefore
  stalls that process, as a pipe nobody reads does; the other processes go
  on. A runner that sends past the window breaks the protocol.
* At most ``max_processes`` processes run at once (``LEVERS9_SANDBOX_MAX_PROCESSES``,
  :data:`DEFAULT_MAX_PROCESSES`); another ``exec`` fails ``TooManyProcesses``.
  The last :data:`MAX_EXITED_KEPT` ended processes stay listed.
* A process's output after its exit is passed on while its pipes keep
  delivering; a pipe left open by a process it started in the background is
  closed once it has been silent for :data:`EXIT_DRAIN_S` after the exit, and
  ``exited`` is sent then (that background process's later writes to it fail
  with EPIPE).
* Paths are absolute, at most :data:`MAX_PATH_CHARS` characters, without NUL:
  anything else is refused ``BadPath`` naming it. They are paths inside the
  container (the runner sees nothing else).
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from typing import Any

from levers9.runner.frames import ProtocolError

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_WINDOW_BYTES",
    "ENV_MAX_PROCESSES",
    "ENV_MODE",
    "ERROR_CODES",
    "EXIT_DRAIN_S",
    "FILE_CHUNK_BYTES",
    "FLUSH_DELAY_S",
    "MAX_ARGV_ITEMS",
    "MAX_EXITED_KEPT",
    "MAX_LINE_BYTES",
    "MAX_LIST_ENTRIES",
    "MAX_OUTPUT_FRAME_BYTES",
    "MAX_PATH_CHARS",
    "MAX_WINDOW_BYTES",
    "MIN_WINDOW_BYTES",
    "MODE_FUNCTION",
    "MODE_SANDBOX",
    "READ_BYTES",
    "REQUESTS",
    "STREAMS",
    "FileEntry",
    "ProcessInfo",
    "bad_path",
    "entry_from",
    "process_from",
    "signal_number",
]

#: the runner's mode: ``function`` (the default: calls of a handler) or ``sandbox`` (this module's requests)
ENV_MODE = "LEVERS9_RUNNER_MODE"
MODE_FUNCTION = "function"
MODE_SANDBOX = "sandbox"
ENV_MAX_PROCESSES = "LEVERS9_SANDBOX_MAX_PROCESSES"
DEFAULT_MAX_PROCESSES = 64
#: ended processes the runner keeps for ``status`` and ``list``; older ones are forgotten
MAX_EXITED_KEPT = 256

#: a partial line is sent once its process has written nothing more for this long
FLUSH_DELAY_S = 0.05
#: a line longer than this is sent in pieces (``partial``)
MAX_LINE_BYTES = 64 * 1024
#: what the runner reads from a pipe at once
READ_BYTES = 16 * 1024
#: the largest payload of one ``output`` frame: a read plus a line carried over from the one before
MAX_OUTPUT_FRAME_BYTES = MAX_LINE_BYTES + READ_BYTES
#: seconds an ended process's pipes may stay silent before the runner closes them
EXIT_DRAIN_S = 0.5

DEFAULT_WINDOW_BYTES = 4 * 1024 * 1024
MIN_WINDOW_BYTES = MAX_OUTPUT_FRAME_BYTES
MAX_WINDOW_BYTES = 64 * 1024 * 1024

#: the most bytes one ``write_file`` or ``file_data`` frame carries
FILE_CHUNK_BYTES = 1024 * 1024
MAX_LIST_ENTRIES = 4096
MAX_PATH_CHARS = 4096
MAX_ARGV_ITEMS = 4096

STREAMS = ("stdout", "stderr")

#: what the worker may ask, and the kind of the answer that succeeds
REQUESTS = {
    "exec": "started",
    "run_code": "started",
    "kill": "done",
    "status": "process",
    "list": "processes",
    "write_file": "done",
    "read_file": "file_data",
    "list_files": "listing",
    "stat_file": "stat",
    "mkdir": "done",
    "delete": "done",
    "detach": "detached",
    "attach": "attached",
    "configure": "done",
}

#: the runner's own refusals (the operating system's are errno names)
ERROR_CODES = {
    "BadPath": "a path that is not absolute, holds NUL or is too long",
    "BadRequest": "a field of the request is missing or of the wrong type; the message names it",
    "NoSuchProcess": "no process of the sandbox has that id (or it ended long ago and was forgotten)",
    "TooManyProcesses": "the sandbox already runs its most processes at once",
    "ExecFailed": "the program could not be started; the message says why",
    "Unsupported": "the runner cannot do this here (detach without a signal directory)",
}


def bad_path(path: object) -> str | None:
    """Why ``path`` is refused, or None for a path the runner accepts."""
    if not isinstance(path, str):
        return f"a path must be a string, got {type(path).__name__}"
    if "\0" in path:
        return f"the path {path!r} holds a NUL character"
    if len(path) > MAX_PATH_CHARS:
        return f"the path {path[:80]!r}... is {len(path)} characters, over {MAX_PATH_CHARS}"
    if not path.startswith("/"):
        return f"the path {path!r} is not absolute: paths in a sandbox start with /"
    return None


@dataclass(frozen=True)
class FileEntry:
    """A file or directory as ``list_files`` and ``stat_file`` report it."""

    name: str
    path: str
    size: int
    #: the whole ``st_mode`` (type and permission bits)
    mode: int
    is_dir: bool
    #: seconds since the epoch
    mtime: float

    def fields(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "size": self.size,
            "mode": self.mode,
            "is_dir": self.is_dir,
            "mtime": self.mtime,
        }


@dataclass(frozen=True)
class ProcessInfo:
    """A process as ``status`` and ``list`` report it."""

    process: int
    pid: int
    argv: tuple[str, ...]
    cwd: str
    running: bool
    #: its exit status (minus the signal that ended it); None while it runs
    exit_code: int | None
    #: seconds since the epoch
    started_at: float

    def fields(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "pid": self.pid,
            "argv": list(self.argv),
            "cwd": self.cwd,
            "running": self.running,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
        }


def _field(obj: dict[str, Any], what: str, key: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(key)
    # bool is an int to isinstance; a count or an id that is true or false is the peer's error
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(f"{what}: field {key!r} is {type(value).__name__}, expected {_names(kind)}")
    return value


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _count(obj: dict[str, Any], what: str, key: str) -> int:
    value = _field(obj, what, key, int)
    if value < 0:
        raise ProtocolError(f"{what}: field {key!r} is {value}, expected a count of 0 or more")
    return int(value)


def _time(obj: dict[str, Any], what: str, key: str) -> float:
    value = float(_field(obj, what, key, (int, float)))
    if not math.isfinite(value):
        raise ProtocolError(f"{what}: field {key!r} is {value}, expected a time")
    return value


def entry_from(value: object) -> FileEntry:
    """A :class:`FileEntry` from the runner's JSON, every field checked."""
    if not isinstance(value, dict):
        raise ProtocolError(f"a file entry is {type(value).__name__}, expected an object")
    what = "a file entry"
    return FileEntry(
        name=_field(value, what, "name", str),
        path=_field(value, what, "path", str),
        size=_count(value, what, "size"),
        mode=_count(value, what, "mode"),
        is_dir=_field(value, what, "is_dir", bool),
        mtime=_time(value, what, "mtime"),
    )


def process_from(value: object) -> ProcessInfo:
    """A :class:`ProcessInfo` from the runner's JSON, every field checked."""
    if not isinstance(value, dict):
        raise ProtocolError(f"a process's status is {type(value).__name__}, expected an object")
    what = "a process's status"
    argv = _field(value, what, "argv", list)
    if not all(isinstance(a, str) for a in argv):
        raise ProtocolError(f"{what}: field 'argv' holds something other than strings")
    running = _field(value, what, "running", bool)
    code = value.get("exit_code")
    ended_without_code = not isinstance(code, int) or isinstance(code, bool)
    if (running and code is not None) or (not running and ended_without_code):
        raise ProtocolError(f"{what}: exit_code {code!r} does not go with running={running}")
    return ProcessInfo(
        process=_count(value, what, "process"),
        pid=_count(value, what, "pid"),
        argv=tuple(argv),
        cwd=_field(value, what, "cwd", str),
        running=running,
        exit_code=code,
        started_at=_time(value, what, "started_at"),
    )


def signal_number(value: object) -> int | None:
    """A signal a ``kill`` may send, or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value in {s.value for s in signal.Signals} else None
