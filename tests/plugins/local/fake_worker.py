"""A stand-in for ``levers9 worker``, started by the local provider in tests.

Usage: ``fake_worker.py OUT_DIR [MODE]``. It reports through files in
``OUT_DIR`` named after its ``LEVERS9_MACHINE_ID``:

* ``<id>.ready``: its pid, written once its signal handlers are in place (a
  SIGTERM before that would kill it by default and prove nothing);
* ``<id>.events``: one line per SIGTERM received.

MODE ``fail`` prints why it cannot work, as a worker refused by its
controlplane would, and exits with status 2 at once. MODE ``exit`` (default) exits on SIGTERM; ``ignore`` notes SIGTERM and keeps
running, so only SIGKILL stops it; ``child`` exits on SIGTERM but first
starts a child (MODE ``stubborn``) that ignores SIGTERM and writes its pid to
``<id>.child``, to check that terminate reaches what the worker started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType


def publish(path: Path, text: str) -> None:
    """Write ``path`` in one step: a test polling for it must never read it half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def main() -> None:
    out = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "exit"
    machine_id = os.environ["LEVERS9_MACHINE_ID"]

    def on_term(signum: int, frame: FrameType | None) -> None:
        with open(out / f"{machine_id}.events", "a") as events:
            events.write(f"TERM {os.getpid()}\n")
        if mode in ("exit", "child"):
            sys.exit(0)

    if mode == "fail":
        print("levers9 worker: the controlplane refused this worker: the join token was already used", flush=True)
        sys.exit(2)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        publish(out / f"{machine_id}.child", str(os.getpid()))
    else:
        signal.signal(signal.SIGTERM, on_term)
    if mode == "child":
        subprocess.Popen([sys.executable, __file__, str(out), "stubborn"])
        while not (out / f"{machine_id}.child").exists():
            time.sleep(0.01)
    if mode != "stubborn":
        print(f"fake worker {machine_id} running as pid {os.getpid()}", flush=True)
        publish(out / f"{machine_id}.ready", str(os.getpid()))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
