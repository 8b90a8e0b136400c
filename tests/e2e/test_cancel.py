"""Cancelling a running call through `levers9 up`: over REST and over gRPC (`levers9 cancel`), the call's process ends.

REST and gRPC cancel through one operation (levers9.services.tasks.cancel_task),
which tells the worker running the call to end it and wakes whoever waits for
its outcome. Answering ``cancelled`` while the process (and what it started)
kept running until its worker died was the bug: the test looks for the call's
process and its child in /proc, not just at the task's status; and a client
watching the call (as ``call.get()`` does) must hear ``cancelled`` on both.

Both tests share one `levers9 up` (:func:`shared_up`): each cancels only the
call it started, found by its own pid file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

#: a call that starts a child process, writes both pids where the test can read them, and waits forever
PROGRAM = """
import os, subprocess, sys, time, levers9

@levers9.function()
def stubborn(pid_file):
    child = subprocess.Popen(["sleep", "3600"])
    with open(pid_file + ".tmp", "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}")
    os.rename(pid_file + ".tmp", pid_file)
    time.sleep(3600)

call = stubborn.spawn({pid_file!r})
print("TASK", call.task_id)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie has ended: it only waits for its parent to read its status)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_stubborn(up: Up, pid_file: Path) -> tuple[str, list[int]]:
    """Spawn the call; once it runs, its task id and the pids of its process and child."""
    done = up.python(PROGRAM.format(pid_file=str(pid_file)))
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.split("TASK", 1)[1].strip()
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"the call never started:\n{up.log()[-3000:]}"
        time.sleep(0.1)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(_alive(p) for p in pids)
    return task_id, pids


def _wait_gone(pids: list[int], up: Up, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            left = [p for p in pids if _alive(p)]
            pytest.fail(f"processes {left} still run {timeout} s after the cancel:\n{up.log()[-3000:]}")
        time.sleep(0.1)


class _Watcher:
    """A client waiting for the task's outcome over gRPC's Watch, as ``call.get()`` does, in a thread."""

    def __init__(self, up: Up, task_id: str) -> None:
        self.events: list[controlplane_pb2.TaskEvent] = []
        self.error: grpc.RpcError | None = None
        self._channel = grpc.insecure_channel(f"127.0.0.1:{up.grpc_port}")
        stub = controlplane_pb2_grpc.ControlPlaneStub(self._channel)  # type: ignore[no-untyped-call]
        self._stream = stub.Watch(
            controlplane_pb2.WatchRequest(task_ids=[task_id]), metadata=(("authorization", f"Bearer {up.token()}"),)
        )
        self._thread = threading.Thread(target=self._read, name="watcher", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                self.events.append(event)
        except grpc.RpcError as exc:
            self.error = exc

    def outcome(self, up: Up, timeout: float = 30) -> controlplane_pb2.TaskEvent:
        """The one event the watch ends with; fails if it is still waiting after ``timeout`` seconds."""
        self._thread.join(timeout)
        try:
            if self._thread.is_alive():
                self._stream.cancel()
                pytest.fail(f"the watcher was still waiting {timeout} s after the cancel:\n{up.log()[-3000:]}")
            assert self.error is None, self.error
            [event] = self.events
            return event
        finally:
            self._channel.close()


def _task(up: Up, task_id: str) -> dict[str, object]:
    r = httpx.get(
        f"http://127.0.0.1:{up.http_port}/api/v1/tasks/{task_id}",
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=10,
    )
    r.raise_for_status()
    body: dict[str, object] = r.json()
    return body


def test_cancel_over_rest_ends_the_calls_process_and_its_children(shared_up: Up) -> None:
    up = shared_up
    task_id, pids = _start_stubborn(up, up.exchange / "rest.pids")
    watcher = _Watcher(up, task_id)
    assert not watcher.events  # it runs: nothing to tell yet
    r = httpx.post(
        f"http://127.0.0.1:{up.http_port}/api/v1/tasks/{task_id}/cancel",
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["cancelled"] is True
    assert r.json()["task"]["status"] == "cancelled"
    _wait_gone(pids, up)
    assert _task(up, task_id)["status"] == "cancelled"
    event = watcher.outcome(up)
    assert (event.task_id, event.status) == (task_id, "cancelled")


def test_levers9_cancel_ends_the_calls_process_and_its_children(shared_up: Up) -> None:
    up = shared_up
    task_id, pids = _start_stubborn(up, up.exchange / "cli.pids")
    watcher = _Watcher(up, task_id)
    assert not watcher.events  # it runs: nothing to tell yet
    done = up.levers9("cancel", task_id)  # gRPC's CancelTask
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cancelled {task_id}"
    _wait_gone(pids, up)
    assert _task(up, task_id)["status"] == "cancelled"
    event = watcher.outcome(up)
    assert (event.task_id, event.status) == (task_id, "cancelled")
    again = up.levers9("cancel", task_id)
    assert again.returncode == 0, again.stderr
    assert "had already finished" in again.stderr
    missing = up.levers9("cancel", "task_nope")
    assert missing.returncode == 1
    assert "task 'task_nope' does not exist" in missing.stderr
