"""A replica that is stopped (SIGTERM) ends its long-lived streams at once, instead of waiting out the grace.

Two real ``levers9 server`` replicas (tests/fixtures/replicas.py) with the calls' grace at a stop raised to
60 s (``$LEVERS9_STOP_GRACE_S``). The pool's one worker holds its session on replica 0 (the first address it
is given) and runs a call that waits for a file; a client watches that call and follows its output on
replica 0. Replica 0 is sent SIGTERM: it must exit within 30 s (a bound on a hang: before the change, gRPC
waited for the session, its tunnel and the client's streams to end by themselves, that is the whole 60 s).
Both client streams end with UNAVAILABLE, "controlplane replica stopping" (on which the SDK opens them again
on another replica), the worker registers with replica 1 while its call still runs, and the call, released
then, returns its result to the program (whose SDK follows it on replica 1), run only once.

What the test measures (the stop's duration) is printed, never asserted beyond the hang bound.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from tests.fixtures.replicas import Replicas

pytestmark = pytest.mark.timeout(300)

#: the calls' grace at a stop, raised so that a stop that waits for the streams cannot pass for a quick one
GRACE_S = 60
#: the bound on the stop: far under the grace (a normal stop takes about a second)
STOP_BOUND_S = 30

PROGRAM = """
import pathlib
import time
import levers9

@levers9.function(cpu=0.25)
def gated(x: int) -> int:
    with open({runs!r}, "a") as runs:
        runs.write("ran\\n")
    print("waiting for the gate", flush=True)
    while not pathlib.Path({gate!r}).exists():
        time.sleep(0.1)
    return x * x

print("result", gated.remote(7), flush=True)
"""


class _Stream:
    """A client's stream on one replica (``Watch`` of a task, or ``StreamLogs`` following it), read in a thread
    until it ends; how it ended."""

    def __init__(self, address: str, token: str, task_id: str, *, logs: bool = False) -> None:
        self.error: grpc.RpcError | None = None
        self.messages = 0
        self._channel = grpc.insecure_channel(address.removeprefix("grpc://"))
        stub = controlplane_pb2_grpc.ControlPlaneStub(self._channel)  # type: ignore[no-untyped-call]
        metadata = (("authorization", f"Bearer {token}"),)
        if logs:
            self._stream = stub.StreamLogs(
                controlplane_pb2.StreamLogsRequest(task_id=task_id, follow=True), metadata=metadata
            )
        else:
            self._stream = stub.Watch(controlplane_pb2.WatchRequest(task_ids=[task_id]), metadata=metadata)
        self._thread = threading.Thread(target=self._read, name="stream", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for _ in self._stream:
                self.messages += 1
        except grpc.RpcError as exc:
            self.error = exc

    def ended(self, timeout: float) -> grpc.RpcError | None:
        """The error the stream ended with (None: OK); fails if it is still open after ``timeout``."""
        self._thread.join(timeout)
        alive = self._thread.is_alive()
        if alive:
            self._stream.cancel()
            self._thread.join(10)
        self._channel.close()
        assert not alive, f"the stream was still open {timeout} s after the replica stopped"
        return self.error


def _wait(what: str, ready: Callable[[], bool], replicas: Replicas, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout} s:\n{replicas.logs()}")
        time.sleep(0.1)


REGISTERED = "registered for pool"


def _holder(replicas: Replicas) -> int:
    """The replica whose log has the latest registration of a worker (lines start with their time)."""
    latest = [
        max((line[:23] for line in r.log().splitlines() if REGISTERED in line), default="") for r in replicas.replicas
    ]
    assert any(latest), replicas.logs()
    return latest.index(max(latest))


def test_a_stopped_replica_ends_its_streams_at_once_and_its_worker_goes_on_elsewhere(replicas: Replicas) -> None:
    replicas.extra_env["LEVERS9_STOP_GRACE_S"] = str(GRACE_S)
    replicas.start_all()  # one worker, whose session is on replica 0 (the first address it dials)
    # calls run as nobody, who cannot enter the test's directory: the call's files are in one it may use
    shared = Path(tempfile.mkdtemp(prefix="levers9-stop-"))
    shared.chmod(0o777)
    runs, gate = shared / "runs", shared / "gate"
    program = replicas.popen(PROGRAM.format(runs=str(runs), gate=str(gate)))
    try:

        def running() -> bool:
            assert program.poll() is None, program.communicate()[1][-3000:]
            return runs.exists()

        _wait("the call running on the worker", running, replicas)
        # the worker reports the start after the call began: the API says so a moment after the file appears
        _wait("the call listed as running", lambda: len(replicas.api("/tasks?status=running")) == 1, replicas)
        [task] = replicas.api("/tasks?status=running")
        # the worker dials replica 0 first, but on a loaded machine a registration may have gone to replica 1:
        # the replica stopped is the one holding its session now (its latest registration)
        held = _holder(replicas)
        other = 1 - held
        watch = _Stream(replicas.addresses[held], replicas.token, str(task["id"]))
        logs = _Stream(replicas.addresses[held], replicas.token, str(task["id"]), logs=True)
        # the call's first output line came through: both streams (the watch opened first) are open there
        _wait(f"the call's output on replica {held}", lambda: logs.messages > 0, replicas, timeout=60)
        before = replicas.replicas[other].log().count(REGISTERED)

        began = time.monotonic()
        replicas.stop(held, timeout=STOP_BOUND_S)  # fails the test past the bound
        took = time.monotonic() - began

        for stream in (watch, logs):
            error = stream.ended(timeout=10)
            assert error is not None, "the stream ended with OK, not UNAVAILABLE"
            assert error.code() is grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
            assert "controlplane replica stopping" in (error.details() or ""), error.details()
        stopped_log = replicas.replicas[held].log()
        assert "going on without it" not in stopped_log, stopped_log[-3000:]  # no step of the stop hit its deadline
        _wait(
            f"the worker's registration with replica {other}",
            lambda: replicas.replicas[other].log().count(REGISTERED) > before,
            replicas,
            timeout=60,
        )
        assert program.poll() is None, program.communicate()[1][-3000:]  # the call still runs: nothing failed it

        gate.touch()
        out, err = program.communicate(timeout=120)
        assert program.returncode == 0, err[-3000:] + replicas.logs()
        assert "result 49" in out, out + err[-3000:]
        assert runs.read_text() == "ran\n"  # run once: the worker said it runs it when it registered again
    finally:
        if program.poll() is None:
            program.kill()
            program.communicate(timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
    print(f"replica {held} stopped {took:.1f} s after SIGTERM (grace {GRACE_S} s)")
