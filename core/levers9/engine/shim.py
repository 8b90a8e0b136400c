"""The per-container shim: the process that waits for a container and writes down how it ended.

The runtime hooks are stateless calls from worker threads, and a detached
``runc run`` leaves nobody to collect the exit status. So each container gets
a small supervisor, started in its own session so the worker can restart
without killing its containers: it runs the runtime in the foreground with the
container's output going to a log file, waits, notes whether the memory cgroup
killed it, writes ``exit.json`` atomically, and deletes the container.
``exit.json`` holds the exit code and whether the cgroup saw an OOM kill; the
container's start and end times are the modification times of ``child.pid``
(written as the runtime starts) and of ``exit.json`` (written once it ended),
so the script forks nothing on that path but the runtime (and the rename).

It sits on every container's start-up path, so the supervisor itself is the
POSIX shell script ``shim.sh`` next to this module (sh starts in about a
millisecond; a Python interpreter in 10 to 30). This module builds its command
line and reads what it leaves behind.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CHILD_FILE", "EXIT_FILE", "LOG_FILE", "PID_FILE", "SCRIPT", "command"]

EXIT_FILE = "exit.json"
LOG_FILE = "output.log"
PID_FILE = "shim.pid"
CHILD_FILE = "child.pid"
SCRIPT = Path(__file__).resolve().with_name("shim.sh")


def command(
    *,
    runtime: Sequence[str],
    action: Sequence[str],
    container_id: str,
    state_dir: Path,
    cgroup: str,
    delete: bool = True,
) -> list[str]:
    """The shim's argv. ``runtime`` is the binary with its global flags; ``action`` what to run in the foreground.

    ``delete`` runs ``runtime delete --force ID`` afterwards (OCI runtimes); the process runtime has nothing to delete.
    """
    return [
        "/bin/sh",
        str(SCRIPT),
        container_id,
        os.fspath(state_dir),
        cgroup or "-",
        "1" if delete else "0",
        str(len(runtime)),
        *runtime,
        *action,
    ]
