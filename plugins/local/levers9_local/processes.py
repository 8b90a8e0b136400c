"""Starting, finding and stopping worker processes that outlive the controlplane that started them.

A local worker must survive its controlplane: ``levers9 up`` may be killed
with SIGKILL and started again, and the new controlplane must find the workers
the old one left (through ``levers9_list_machines``) and be able to stop them.
Two things make that safe.

**Workers are never our children.** They are started through a short-lived
launcher (``_launch.py``): the controlplane starts the launcher, the launcher
starts the worker in a new session and exits, and the controlplane reaps the
launcher. The worker is re-parented to init (or the nearest subreaper), which
reaps it when it exits, so a worker that dies on its own never lingers as a
zombie of a long-running controlplane, and a worker started before a restart
is in the same position as one started after it. Starting the worker directly
with ``start_new_session=True`` would make every worker a child of the
controlplane until it restarts, and its exit would leave a zombie until someone
remembered to wait for it. Both forks go through :mod:`subprocess`, never a bare
``os.fork()``: the controlplane runs hooks in threads, and forking a threaded
Python process can deadlock the child on a lock another thread held.

**A pid is never trusted alone.** Pids are reused, and a controlplane that comes
back after hours may find a recorded pid now belongs to someone's editor. Every
record keeps the process's start time (``/proc/<pid>/stat`` field 22, in clock
ticks since boot) and the boot id; a process counts as the worker only while
all three match. Signals go through a pidfd opened and then re-checked, so the
check and the signal are about the same process.

The worker's *session* (its pid, since it was started with ``setsid``) is what
gets stopped: the worker and every process it started, whatever process groups
those made. A session id, like a process group id, cannot be handed to a new
process while any member still uses it, which is what makes it safe to signal
the members of a session whose leader has already exited.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LaunchError",
    "ProcStat",
    "WorkerProcess",
    "boot_id",
    "is_running",
    "launch",
    "read_stat",
    "session_members",
    "stop_session",
]

_LAUNCHER = Path(__file__).with_name("_launch.py")
#: the launcher only starts a process and reads one /proc file; past this it is wedged
_LAUNCH_TIMEOUT_S = 30.0
#: how often stop_session looks whether the session is empty
_POLL_S = 0.05
#: after SIGKILL only a process stuck in the kernel (D state) survives; waiting longer will not help
KILL_WAIT_S = 10.0
# Process states that mean "exited": zombie, dead.
_EXITED = frozenset({"Z", "X", "x"})


#: errors of fork and exec that say "not now" rather than "never": the host is out of processes or memory
_TRANSIENT = frozenset({errno.EAGAIN, errno.ENOMEM})


class LaunchError(Exception):
    """The worker could not be started, with the OS's reason.

    ``transient`` tells a host that is out of processes or memory (try
    elsewhere, or later) from a command that can never run (missing, not
    executable, a log that cannot be opened).
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` this module relies on."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    #: clock ticks after boot at which the process started; with the boot id, it names one process for good
    start_time: int

    @property
    def exited(self) -> bool:
        return self.state in _EXITED


@dataclass(frozen=True)
class WorkerProcess:
    """Enough to recognise a started worker later, from any process, after any restart."""

    pid: int
    start_time: int
    boot_id: str


@functools.cache
def boot_id() -> str:
    """This boot's id: start times count from boot, so they mean nothing across a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat line, parsed; None when there is no such process (any more)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise
    # The command name (field 2) is in parentheses and may itself contain spaces and parentheses,
    # so split after the last ')'. What follows starts with field 3, the state.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start_time=int(fields[19]),
    )


def _all_stats() -> list[ProcStat]:
    stats: list[ProcStat] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_stat(int(entry))
            if stat is not None:
                stats.append(stat)
    return stats


def is_running(worker: WorkerProcess) -> bool:
    """True while the worker's own process is alive (not exited, and not a newer process with its pid)."""
    if worker.boot_id != boot_id():
        return False
    stat = read_stat(worker.pid)
    return stat is not None and not stat.exited and stat.start_time == worker.start_time


def session_members(worker: WorkerProcess) -> list[ProcStat]:
    """The live processes of the worker's session: the worker and whatever it started that is still running.

    The session id is the worker's pid. While any member lives, that number
    cannot be given to a new process; so if a process with that pid exists and
    is not the worker, the worker and its whole session are gone and the number
    now belongs to someone else, who must be left alone.
    """
    if worker.boot_id != boot_id():
        return []
    leader = read_stat(worker.pid)
    if leader is not None and leader.start_time != worker.start_time:
        return []
    return [
        stat
        for stat in _all_stats()
        if stat.session == worker.pid and not stat.exited and stat.start_time >= worker.start_time
    ]


def _signal(member: ProcStat, signum: int) -> None:
    """Send ``signum`` to ``member`` only if the pid still names that same process."""
    try:
        pidfd = os.pidfd_open(member.pid)
    except ProcessLookupError:
        return
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        pidfd = -1  # a kernel before 5.3: fall back to a plain kill right after the check
    try:
        # Checked after opening the pidfd: if the stat still matches now, the pidfd is that process.
        now = read_stat(member.pid)
        if now is None or now.start_time != member.start_time or now.session != member.session:
            return
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(member.pid, signum)
    except ProcessLookupError:
        pass
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _wait_empty(worker: WorkerProcess, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not session_members(worker):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def stop_session(worker: WorkerProcess, grace_s: float, kill_wait_s: float = KILL_WAIT_S) -> bool:
    """SIGTERM the worker's session, SIGKILL what is left after ``grace_s``; True once nothing of it runs.

    False means something survived SIGKILL for ``kill_wait_s`` (a process stuck
    in the kernel); the caller should keep its record so a later call retries.
    """
    members = session_members(worker)
    if not members:
        return True
    for member in members:
        _signal(member, signal.SIGTERM)
        # A stopped process (SIGSTOP, a debugger let go) would hold SIGTERM pending for the whole grace period.
        _signal(member, signal.SIGCONT)
    if _wait_empty(worker, grace_s):
        return True
    # Scan again: the worker may have started processes while it was shutting down.
    for member in session_members(worker):
        _signal(member, signal.SIGKILL)
    return _wait_empty(worker, kill_wait_s)


def launch(command: Sequence[str], env: Mapping[str, str], log_path: Path) -> WorkerProcess:
    """Start ``command`` detached (new session, stdin from /dev/null, output appended to ``log_path``).

    ``env`` is the worker's whole environment; it reaches the worker through
    the launcher's environment, never through an argument or a file, because
    it carries the machine token.

    :raises LaunchError: the command could not be executed, or no process could be started.
    :raises RuntimeError: the launcher itself failed (a bug, or a host out of processes).
    """
    request = json.dumps({"command": list(command), "log": str(log_path)})
    try:
        launcher = subprocess.Popen(
            # -I -S: the launcher needs only the standard library, and should not pay for site-packages.
            [sys.executable, "-I", "-S", str(_LAUNCHER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            close_fds=True,
            text=True,
        )
    except OSError as exc:
        if exc.errno in _TRANSIENT:
            raise LaunchError(f"cannot start a process: {exc.strerror}", transient=True) from None
        raise
    try:
        out, err = launcher.communicate(request, timeout=_LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.communicate()
        raise RuntimeError(f"the worker launcher did not answer within {_LAUNCH_TIMEOUT_S:g} s") from None
    try:
        answer = json.loads(out)
    except ValueError:
        raise RuntimeError(
            f"the worker launcher exited with status {launcher.returncode} and no answer: {err.strip() or out.strip()}"
        ) from None
    if "error" in answer:
        raise LaunchError(str(answer["error"]), transient=answer.get("errno") in _TRANSIENT)
    return WorkerProcess(pid=int(answer["pid"]), start_time=int(answer["start_time"]), boot_id=boot_id())
