"""The per-container shim: the process that waits for a container and writes down how it ended.

The runtime hooks are stateless calls from worker threads, and a detached
``runc run`` leaves nobody to collect the exit status. So each container gets
a small supervisor, started in its own session so the worker can restart
without killing its containers: it runs the runtime in the foreground with the
container's output going to a log file, waits, reads whether the memory cgroup
killed it, writes ``exit.json`` atomically, and deletes the container.

Run as ``python -m levers9.containers.shim ARGS``; see :func:`command`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CHILD_FILE", "EXIT_FILE", "LOG_FILE", "PID_FILE", "command", "main", "oom_killed"]

EXIT_FILE = "exit.json"
LOG_FILE = "output.log"
PID_FILE = "shim.pid"
CHILD_FILE = "child.pid"

_CGROUP_ROOT = Path("/sys/fs/cgroup")


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
        sys.executable, "-m", "levers9.containers.shim",
        "--id", container_id, "--state-dir", str(state_dir), "--cgroup", cgroup,
        "--runtime", json.dumps(list(runtime)), "--action", json.dumps(list(action)),
        *([] if delete else ["--no-delete"]),
    ]  # fmt: skip


def oom_killed(cgroup: str, root: Path = _CGROUP_ROOT) -> bool:
    """Whether the kernel's OOM killer acted in the container's memory cgroup (v1 or v2)."""
    if not cgroup.strip("/"):
        return False  # no cgroup of its own (the process runtime): never read the root's counters
    for path, key in ((root / "memory" / cgroup.lstrip("/") / "memory.oom_control", "oom_kill"),
                      (root / cgroup.lstrip("/") / "memory.events", "oom_kill")):  # fmt: skip
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value) > 0
    return False


def _write_exit(state_dir: Path, payload: dict[str, object]) -> None:
    tmp = state_dir / f".{EXIT_FILE}.tmp"
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, state_dir / EXIT_FILE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="levers9.containers.shim")
    parser.add_argument("--id", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--cgroup", required=True)
    parser.add_argument("--runtime", required=True, type=json.loads)
    parser.add_argument("--action", required=True, type=json.loads)
    parser.add_argument("--no-delete", action="store_true")
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir
    runtime: list[str] = args.runtime
    (state_dir / PID_FILE).write_text(str(os.getpid()))
    # The container is ended through the runtime's kill, never by signalling the shim.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)

    started = time.time()
    with open(state_dir / LOG_FILE, "ab", buffering=0) as log, open(os.devnull, "rb") as stdin:
        try:
            proc = subprocess.Popen(
                [*runtime, *args.action], stdin=stdin, stdout=log, stderr=log, start_new_session=True
            )
            (state_dir / CHILD_FILE).write_text(str(proc.pid))
            # Polled while it runs as well as after: runsc removes the cgroup as the sandbox ends.
            oom = False
            while True:
                try:
                    code = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    oom = oom or oom_killed(args.cgroup)
            error = None
        except OSError as exc:
            code, error, oom = 127, f"could not run {[*runtime, *args.action][0]}: {exc}", False
            log.write(f"levers9: {error}\n".encode())
    oom = oom or oom_killed(args.cgroup)
    if code < 0:
        code = 128 - code  # killed by a signal: report it the way runc and shells do (137 for SIGKILL)
    _write_exit(state_dir, {"exit_code": code, "oom_killed": oom, "started_at": started,
                            "finished_at": time.time(), "error": error})  # fmt: skip
    if not args.no_delete:
        subprocess.run([*runtime, "delete", "--force", args.id], capture_output=True, timeout=60, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
