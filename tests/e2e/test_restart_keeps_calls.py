"""A restarted controlplane waits for its workers: a long call running across the restart is neither killed nor rerun.

With the embedded Redis a restart forgets every worker. A probe saw the new
controlplane stop the live local workers 0.6 s after it started, before they
could register again, and queue their calls anew: a 90 s call killed and run
again, 48 of 1,200 calls run twice. Here `levers9 up` is killed (SIGKILL: its
workers keep running) and started again while one call runs; the call must
finish once, on the worker that started it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.fixtures.levers9_up import Up, _processes_mentioning

pytestmark = pytest.mark.timeout(300)

PROGRAM = """
import os, time, levers9

@levers9.function(cpu=0.25, timeout=240)
def long(marker):
    with open(marker, "a") as f:  # one line per start of the call
        f.write(f"{{os.getpid()}}\\n")
    time.sleep({seconds})
    return os.getpid()

call = long.spawn({marker!r})
print("SPAWNED", call.task_id, flush=True)
print("RESULT", call.get(timeout=240), flush=True)
"""


def _status(up: Up, task_id: str) -> str:
    listed = json.loads(up.levers9("tasks", "--json").stdout or "[]")
    return next((str(t["status"]) for t in listed if t["id"] == task_id), "")


def _workers(up: Up) -> set[int]:
    return {pid for pid, cmd in _processes_mentioning(str(up.root)) if cmd.endswith("levers9 worker")}


def test_a_call_running_across_a_restart_is_neither_killed_nor_run_again(levers9_up: Up) -> None:
    levers9_up.start(wait_workers=1)
    marker = levers9_up.exchange / "starts.log"
    program = levers9_up.root / "long_call.py"
    program.write_text(PROGRAM.format(seconds=25, marker=str(marker)))
    app = subprocess.Popen(
        [sys.executable, str(program)],
        env=levers9_up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=levers9_up.root,
    )
    try:
        assert app.stdout is not None
        spawned = app.stdout.readline().split()
        assert spawned[:1] == ["SPAWNED"], app.stderr.read() if app.stderr else ""
        task_id = spawned[1]
        deadline = time.monotonic() + 120
        # running, and recorded so (a start is stored within ~50 ms: one killed before that is pending, and
        # runs again, as no worker can show that it holds a call SQL never saw it start)
        while not (marker.exists() and marker.read_text().strip() and _status(levers9_up, task_id) == "running"):
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.2)
        workers = _workers(levers9_up)
        assert workers, "the local pool's worker"
        levers9_up.kill()  # SIGKILL: no shutdown of any kind; the worker keeps running its call
        levers9_up.start(wait_workers=0)
        levers9_up.wait_workers(1, timeout=60)
        out, err = app.communicate(timeout=240)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err + levers9_up.log()[-3000:]
    starts = marker.read_text().split()
    assert len(starts) == 1, f"the call started {len(starts)} times: {starts}\n{levers9_up.log()[-3000:]}"
    assert out.split("RESULT", 1)[1].split()[0] == starts[0], "the result is the first run's"
    assert workers <= _workers(levers9_up), "the worker that ran the call was not stopped"
    tasks = {t["id"]: t for t in json.loads(levers9_up.levers9("tasks", "--json").stdout)}
    assert tasks[task_id]["status"] == "complete"
    assert tasks[task_id]["attempts"] == 0, "the call was not queued again"
