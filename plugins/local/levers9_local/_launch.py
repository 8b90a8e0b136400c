"""The middle process of a worker's double fork: start the worker in its own session, report it, exit.

Run as a script (``python -I -S _launch.py``) by :func:`levers9_local.processes.launch`,
never imported: it uses the standard library only, so it starts in a few
milliseconds. It reads ``{"command": [...], "log": "<path>"}`` on stdin, and
the worker's environment is its own. It answers one JSON line on stdout:
``{"pid": ..., "start_time": ...}``, or ``{"error": "...", "errno": ...}`` when
the command cannot be executed.

The start time is read here, while the worker is still this process's child:
until this process exits, no one else can reap the worker, so its pid cannot
have been reused and the start time is certainly the worker's own. Exiting
without waiting is the point: the worker is handed to init, which reaps it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def _answer(payload: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> None:
    request = json.loads(sys.stdin.read())
    command = [str(part) for part in request["command"]]
    # Dispositions set to "ignore" survive exec; the worker must start with the defaults whatever
    # the controlplane ignored, so that SIGTERM and SIGKILL after it mean what terminate expects.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        _answer({"error": f"cannot open the worker log {request['log']}: {exc.strerror}", "errno": exc.errno})
        return
    try:
        worker = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        _answer({"error": f"cannot start {command[0]}: {exc.strerror or exc}", "errno": exc.errno})
        return
    fields = Path(f"/proc/{worker.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    # fields[0] is stat field 3 (state), so field 22 (starttime) is fields[19].
    _answer({"pid": worker.pid, "start_time": int(fields[19])})


if __name__ == "__main__":
    main()
    # Leave at once: the worker must not be waited for, and nothing else is left to do.
    os._exit(0)
