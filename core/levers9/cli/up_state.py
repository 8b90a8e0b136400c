"""Which `levers9 up` runs for a levers9 home, so that `levers9 down` can stop it.

`up` writes ``HOME/up.json`` (its pid, its start time as the kernel counts it, its addresses) once it serves, and
removes it when it ends. `down` stops only the process the file names, and only while that process is still the
same one (its start time matches): a pid the kernel gave to another program since is never signalled. A file left
by an `up` that was killed names a process that is gone, and is removed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["UpState", "clear", "read", "record"]


@dataclass(frozen=True)
class UpState:
    pid: int
    #: the process's start time in clock ticks after boot (/proc/PID/stat field 22): a pid and this name one process
    started: int
    grpc: str
    http: str


def _path(home: Path) -> Path:
    return home / "up.json"


def _started(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def record(home: Path, grpc: str, http: str) -> UpState:
    """Say that this process is `up` for ``home``."""
    pid = os.getpid()
    state = UpState(pid=pid, started=_started(pid) or 0, grpc=grpc, http=http)
    home.mkdir(parents=True, exist_ok=True)
    path = _path(home)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(state)))
    temporary.replace(path)
    return state


def clear(home: Path) -> None:
    """This process's `up` is over: remove the file when it still names this process."""
    found = read(home)
    if found is not None and found.pid == os.getpid():
        _path(home).unlink(missing_ok=True)


def read(home: Path) -> UpState | None:
    """The `up` running for ``home``; None when none is (a stale file is removed)."""
    path = _path(home)
    try:
        data = json.loads(path.read_text())
        state = UpState(int(data["pid"]), int(data["started"]), str(data["grpc"]), str(data["http"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if _started(state.pid) != state.started:
        path.unlink(missing_ok=True)  # the process is gone, or the pid is another program's now
        return None
    return state
