"""What a process costs, read from /proc: CPU seconds over a window (by thread too), RSS and PSS.

Used by ``bench/agents.py``; :class:`ThreadWindow` splits a process's CPU by thread (its main thread, gRPC's
C-core threads by their names, the others). CPU is ``utime + stime`` of ``/proc/<pid>/stat``
(every thread of the process), plus ``cutime + cstime`` (children it has
waited for, such as an ``nvidia-smi`` the agent ran), in clock ticks turned into
seconds; a window's figure is CPU seconds over wall seconds, so 0.01 is 1% of one
core. Memory is ``VmRSS`` of ``/proc/<pid>/status`` and ``Pss`` of
``/proc/<pid>/smaps_rollup`` (a shared page counted by its share), in MiB.

A process that is gone raises ``ProcessLookupError`` naming its pid, so a
benchmark never reports a figure for a process that died in its window.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuWindow", "Memory", "ThreadWindow", "cpu_seconds", "memory"]

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int, path: str | None = None) -> list[str]:
    try:
        raw = Path(path or f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessLookupError(f"process {pid} is gone") from None
    # the command name may hold spaces and parentheses: the fields start after the last ')'
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int, *, children: bool = True) -> float:
    """CPU seconds ``pid`` has used so far (user + system), with its waited-for children's when ``children``."""
    fields = _stat_fields(pid)
    # fields[0] is field 3 (state) of proc(5): utime is field 14, stime 15, cutime 16, cstime 17
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / _TICK


@dataclass(frozen=True)
class Memory:
    rss_mib: float
    pss_mib: float


def _kib(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise ValueError(f"{path} has no {key} line")


def memory(pid: int) -> Memory:
    """``pid``'s resident set and proportional set size now."""
    try:
        rss = _kib(Path(f"/proc/{pid}/status"), "VmRSS")
        pss = _kib(Path(f"/proc/{pid}/smaps_rollup"), "Pss")
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} is gone") from None
    return Memory(rss / 1024, pss / 1024)


class CpuWindow:
    """CPU used by some processes between :meth:`start` and :meth:`stop`, as a fraction of one core each."""

    def __init__(self, pids: dict[str, int], *, children: bool = True) -> None:
        self.pids = pids
        self.children = children
        self._begin: dict[str, float] = {}
        self._t0 = 0.0
        self.wall_s = 0.0
        self.cpu_s: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._begin = {name: cpu_seconds(pid, children=self.children) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        """Each process's share of one core over the window (0.01 is 1%)."""
        end = {name: cpu_seconds(pid, children=self.children) for name, pid in self.pids.items()}
        self.wall_s = time.monotonic() - self._t0
        self.cpu_s = {name: end[name] - self._begin[name] for name in self.pids}
        return {name: used / self.wall_s for name, used in self.cpu_s.items()}


#: thread names gRPC's C core gives its threads (the Python threads keep the process's name)
_GRPC_THREADS = ("event_engine", "grpc", "default-executo", "resolver-execut", "lifeguard")


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = _stat_fields(pid, str(task / "stat"))
            comm = (task / "comm").read_text().strip()
        except (ProcessLookupError, OSError):
            continue
        found[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / _TICK)
    return found


class ThreadWindow:
    """A process's CPU over a window split by thread: its main thread (the asyncio event loop), gRPC's C-core
    threads, and its other threads (SQLite's, thread pools, plugin lanes); shares of one core."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._begin: dict[int, tuple[str, float]] = {}
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._begin = _threads(self.pid)

    def group(self, tid: int, comm: str) -> str:
        if tid == self.pid:
            return "event loop (main thread)"
        if comm.startswith(_GRPC_THREADS):
            return "gRPC C-core threads"
        return "other threads (SQLite, thread pools)"

    def stop(self) -> dict[str, float]:
        end = _threads(self.pid)
        wall = time.monotonic() - self._t0
        shares: dict[str, float] = {}
        for tid, (comm, used) in end.items():
            before = self._begin.get(tid, (comm, 0.0))[1]
            key = self.group(tid, comm)
            shares[key] = shares.get(key, 0.0) + (used - before) / wall
        return shares
