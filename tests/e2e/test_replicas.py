"""Two controlplane replicas on one PostgreSQL and one redis-server: clients and workers fail over between them.

An operator listed both replicas, killed one and left it down; the client must
finish its work through the other (results in order, none lost, none
submitted twice), a worker must register with whichever answers, and a client
that reaches no replica at all must fail after its ``reconnect_s`` naming every
address it tried.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import end_session, free_port
from tests.fixtures.replicas import Replicas

pytestmark = pytest.mark.timeout(400)

PROGRAM = """
import sys
import levers9

@levers9.function(cpu={cpu})
def double(x: int) -> int:
    import time
    time.sleep({sleep} * x)  # results come one by one, however many run at once
    return 2 * x

print("remote", double.remote(1), flush=True)
for value in double.map(range({count})):
    print("result", value, flush=True)
print("after", double.remote(5), flush=True)
"""


def test_a_dead_address_in_the_list_is_passed_over(replicas: Replicas) -> None:
    replicas.count = 1
    replicas.start_all()
    dead = f"grpc://127.0.0.1:{free_port()}"
    done = replicas.python(
        PROGRAM.format(cpu=0.25, sleep=0, count=5), addresses=[dead, replicas.addresses[0]], timeout=180
    )
    assert done.returncode == 0, done.stderr + replicas.logs()
    lines = done.stdout.splitlines()
    assert lines == ["remote 2", *(f"result {2 * i}" for i in range(5)), "after 10"]
    # the CLI passes over the dead address too
    listed = subprocess.run(
        [sys.executable, "-m", "levers9", "tasks", "--json"],
        env=replicas.sdk_env([dead, replicas.addresses[0]], None),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=replicas.root,
    )
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 7


def test_killing_the_replica_a_client_uses_mid_map_loses_nothing(replicas: Replicas) -> None:
    """The client talks to replica 0 (the first listed); it is SIGKILLed after a few results and left down.

    Every call is stored before the kill (one batch), and the later ones take longer (0.5 s per input), so the
    kill lands while the map is still watching: the rest of the results come through replica 1, in order.
    """
    replicas.start_all()
    count = 24
    program = replicas.popen(PROGRAM.format(cpu=0.25, sleep=0.5, count=count))
    try:
        assert program.stdout is not None
        seen: list[str] = []
        while len([line for line in seen if line.startswith("result")]) < 3:
            line = program.stdout.readline()
            assert line, (
                f"the program ended early: {program.wait(30)}\n{program.stderr.read() if program.stderr else ''}"
            )
            seen.append(line.strip())
        replicas.kill(0)
        # read on through the same buffered pipe (communicate() would skip what readline() buffered)
        out = program.stdout.read()
        err = program.stderr.read() if program.stderr is not None else ""
        program.wait(60)
    finally:
        if program.poll() is None:
            program.kill()
            program.wait(10)
    lines = seen + out.splitlines()
    assert program.returncode == 0, "\n".join(lines) + err + replicas.logs()
    assert lines == ["remote 2", *(f"result {2 * i}" for i in range(count)), "after 10"], err
    assert replicas.replicas[1].running


def test_a_client_leaves_the_replica_it_uses_when_that_replica_freezes_mid_map(replicas: Replicas) -> None:
    """SIGSTOP of the client's replica (0): its sockets stay open and the kernel still acknowledges, so only the
    client's pings on its calls find it gone. The map finishes through replica 1 while replica 0 is still stopped.

    The workers (on replica 0 too) leave it by their own pings; ``worker_keepalive_s`` is the default 30 s so
    that they move before replica 1 could judge them gone. The only limit on time is the wait for the program
    while replica 0 is stopped: long enough for pings (12 s and 4 s) and the rest of the map several times
    over, shorter than gRPC's own ping timeout (60 s), which a client that does not set it waits out.
    """
    replicas.worker_keepalive_s = 30
    replicas.start_all()
    count = 24
    program = replicas.popen(PROGRAM.format(cpu=0.25, sleep=0.2, count=count))
    process = replicas.replicas[0].process
    assert process is not None
    stopped = False
    try:
        assert program.stdout is not None
        seen: list[str] = []
        while len([line for line in seen if line.startswith("result")]) < 3:
            line = program.stdout.readline()
            assert line, (
                f"the program ended early: {program.wait(30)}\n{program.stderr.read() if program.stderr else ''}"
            )
            seen.append(line.strip())
        process.send_signal(signal.SIGSTOP)
        stopped = True
        # read on through the same buffered pipe (communicate() would skip what readline() buffered)
        rest: list[str] = []
        reader = threading.Thread(
            target=lambda: rest.extend(program.stdout.read().splitlines()) if program.stdout else None
        )
        reader.start()
        reader.join(55)
        if reader.is_alive():
            program.kill()
            reader.join(10)
            pytest.fail(f"the client stayed on the frozen replica: {seen + rest}\n{replicas.logs()}")
        err = program.stderr.read() if program.stderr is not None else ""
        program.wait(30)
    finally:
        if stopped:
            process.send_signal(signal.SIGCONT)
        if program.poll() is None:
            program.kill()
            program.wait(10)
    lines = seen + rest
    assert program.returncode == 0, "\n".join(lines) + err + replicas.logs()
    assert lines == ["remote 2", *(f"result {2 * i}" for i in range(count)), "after 10"], err


def test_reconnect_s_bounds_how_long_a_call_tries_when_no_replica_answers(tmp_path: Path) -> None:
    # one address refuses, the other accepts TCP and never answers (a listening socket nobody accepts on): not
    # "no controlplane at all", which fails sooner (tests/cli/test_client_dial.py), so reconnect_s decides
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    dead = [f"grpc://127.0.0.1:{free_port()}", f"127.0.0.1:{silent.getsockname()[1]}"]
    program = tmp_path / "app.py"
    program.write_text(
        textwrap.dedent(
            """
            import levers9
            from levers9.sdk.errors import ControlPlaneError

            @levers9.function(cpu=0.25)
            def f() -> int:
                return 1

            try:
                f.remote()
            except ControlPlaneError as exc:
                print("ControlPlaneError:", exc)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(
        LEVERS9_HOME=str(tmp_path / "home"), LEVERS9_GRPC=",".join(dead), LEVERS9_RECONNECT_S="3", LEVERS9_TOKEN="t"
    )
    try:
        done = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    assert "ControlPlaneError: cannot reach the controlplane at any of" in done.stdout, done.stdout + done.stderr
    for address in dead:
        assert address.removeprefix("grpc://") in done.stdout
    assert "reconnect_s" in done.stdout


def test_a_worker_given_two_addresses_registers_through_the_live_one(replicas: Replicas) -> None:
    replicas.count = 1
    replicas.min_workers = replicas.max_workers = 0  # no provider workers: the one worker is started here
    replicas.start_all()
    issued = replicas.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert issued.returncode == 0, issued.stderr
    dead = f"grpc://127.0.0.1:{free_port()}"
    log_path = replicas.root / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "levers9",
                "worker",
                "--controlplane",
                f"{dead}, {replicas.addresses[0]}",
                "--pool",
                "local",
                "--state-dir",
                str(replicas.root / "worker-state"),
            ],
            env={**replicas.env, "LEVERS9_TOKEN": issued.stdout.strip()},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        replicas.wait_workers(1, timeout=60)
        assert worker.poll() is None, log_path.read_text()
        done = replicas.python(PROGRAM.format(cpu=0.25, sleep=0, count=2), timeout=120)
        assert done.returncode == 0, done.stderr + log_path.read_text()[-3000:]
        assert "after 10" in done.stdout
        text = log_path.read_text()
        assert f"controlplane {dead.removeprefix('grpc://')} unreachable" in text, text
    finally:
        end_session(worker)
