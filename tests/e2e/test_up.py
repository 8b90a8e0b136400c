"""levers9 end to end, as a user meets it: `levers9 up`, then programs that call functions remotely.

Real processes and sockets throughout: the controlplane (`levers9 up`, SQLite
and the embedded Redis), local workers it starts through the `local`
provider, containers of the `process` runtime, and user programs using the
SDK in their own processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import Up, _processes_mentioning, free_port
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_hello_example_runs_through_levers9_run(shared_up: Up) -> None:
    done = shared_up.levers9("run", str(EXAMPLES / "hello.py"))
    assert done.returncode == 0, done.stderr
    assert "7 squared on a levers9 worker: 49" in done.stdout
    assert "squares of 0..9: [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]" in done.stdout
    assert done.stderr == "", done.stderr  # nothing else: no warnings from the SDK's shutdown either


def test_gpu_preference_falls_back_to_cpu_on_a_machine_without_gpus(shared_up: Up) -> None:
    done = shared_up.python(
        """
        import os, levers9

        @levers9.function(gpu=["H100", "cpu"])
        def where_preferred():
            return os.getpid()

        print("RESULT", where_preferred.remote() != os.getpid())
        """
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT True" in done.stdout  # it ran, in another process
    tasks = json.loads(shared_up.levers9("tasks", "--json").stdout)
    [task] = [t for t in tasks if t.get("function") == "where_preferred"]
    assert (task["status"], task["pool"], task["gpu"]) == ("complete", "local", "")


def test_map_over_1000_inputs_returns_1000_results_in_order(shared_up: Up) -> None:
    done = shared_up.python(
        """
        import levers9

        @levers9.function(cpu=0.1, memory=64)
        def double(x):
            return 2 * x

        out = list(double.map(range(1000)))
        assert out == [2 * x for x in range(1000)], out[:20]
        print("OK", len(out))
        """
    )
    assert done.returncode == 0, done.stderr
    assert "OK 1000" in done.stdout


def test_calls_beyond_a_workers_room_wait_in_its_own_queue_and_all_return(levers9_up: Up) -> None:
    """One worker of 2 CPUs, calls of 0.5 CPU: 4 run at once. Once the function is measured as short, the calls
    beyond those 4 are placed in the worker's own queue (the metric counts them) and start there as room frees."""

    levers9_up.max_workers = 1
    levers9_up.start()
    done = levers9_up.python(
        """
        import time, levers9

        @levers9.function(cpu=0.5, memory=64)
        def nap(x):
            time.sleep(0.02)
            return x

        assert list(nap.map(range(8))) == list(range(8))  # measured: short
        out = list(nap.map(range(300)))
        assert out == list(range(300)), out[:20]
        print("OK", len(out))
        """
    )
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    assert "OK 300" in done.stdout
    assert _queued_placements(levers9_up) > 0, "no call was placed in a worker's queue"
    assert len(levers9_up.workers()) == 1


def test_a_remote_exception_is_raised_with_its_remote_traceback(shared_up: Up) -> None:
    done = shared_up.python(
        """
        import levers9

        class Bad(ValueError):
            pass

        @levers9.function()
        def explode(n):
            def inner():
                raise Bad(f"no good: {n}")
            inner()

        try:
            explode.remote(42)
        except Bad as exc:
            print("CAUGHT", type(exc).__name__, exc)
            raise
        """
    )
    assert done.returncode == 1
    assert "CAUGHT Bad no good: 42" in done.stdout, done.stderr
    print(done.stderr)
    # the remote frames, with the user's own function names, are printed as the cause
    assert "Remote traceback" in done.stderr
    assert "in explode" in done.stderr
    assert "in inner" in done.stderr
    assert 'raise Bad(f"no good: {n}")' in done.stderr


def test_a_gpu_no_pool_offers_fails_fast_naming_the_pools(shared_up: Up) -> None:
    done = shared_up.python(
        """
        import levers9

        @levers9.function(gpu="H100")
        def needs_h100():
            return 1

        try:
            needs_h100.remote()
        except levers9.Unschedulable as exc:
            print("REFUSED", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout
    assert "local (CPU, local)" in done.stdout
    assert "CPU only, and the request needs a GPU" in done.stdout
    assert "the pools offer no GPUs" in done.stdout
    # refused at once, not after a wait: nothing of the call is left queued or running
    listed = json.loads(shared_up.levers9("tasks", "--json").stdout or "[]")
    waiting = [t for t in listed if t["function"] == "needs_h100" and t["status"] in ("pending", "running")]
    assert not waiting, waiting


def test_a_worker_killed_mid_task_has_its_task_completed_elsewhere(levers9_up: Up) -> None:
    levers9_up.min_workers = 2
    levers9_up.start()
    marker = levers9_up.exchange / "attempts"
    release = levers9_up.exchange / "release"
    program = levers9_up.root / "slow_app.py"
    program.write_text(
        f"""
import os, time, levers9

@levers9.function(cpu=2)
def slow():
    with open({str(marker)!r}, "a") as f:
        f.write(str(os.getpid()) + "\\n")
    while not os.path.exists({str(release)!r}):  # runs until its first worker is dead
        time.sleep(0.05)
    return "finished"

print("RESULT", slow.remote(), flush=True)
"""
    )
    # the kill has to land between the call starting and finishing, so the program runs in the background
    app = subprocess.Popen(
        [sys.executable, str(program)],
        env=levers9_up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=levers9_up.root,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the call never started"
        os.kill(_worker_running_a_call(levers9_up), signal.SIGKILL)
        release.touch()
        out, err = app.communicate(timeout=240)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err
    assert "RESULT finished" in out
    # started twice: once on the killed worker, then again on another one
    assert len(marker.read_text().splitlines()) == 2
    tasks = json.loads(levers9_up.levers9("tasks", "--json").stdout)
    [task] = [t for t in tasks if t.get("function") == "slow"]
    assert task["status"] == "complete"
    assert task["attempts"] == 1


def _queued_placements(up: Up) -> float:
    """``levers9_placements_queued_total``, summed over its pools: calls placed in a worker's queue so far."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{up.metrics_port}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("levers9_placements_queued_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_worker_killed_with_calls_waiting_in_its_queue_loses_none(levers9_up: Up) -> None:
    """Two workers of 2 CPUs, calls of 1 CPU taking 0.3 s: once measured, calls beyond the 4 running wait in the
    workers' queues. SIGKILL one worker mid-map: what ran and what waited there is placed again, every result
    comes back, in order."""

    levers9_up.min_workers = 2
    levers9_up.start()
    program = levers9_up.root / "queued_app.py"
    program.write_text(
        """
import time, levers9

@levers9.function(cpu=1, memory=64)
def nap(x):
    time.sleep(0.3)
    return x

assert list(nap.map(range(4))) == list(range(4))  # measured: 0.3 s a call
print("RESULT", list(nap.map(range(60))) == list(range(60)), flush=True)
"""
    )
    app = subprocess.Popen(
        [sys.executable, str(program)],
        env=levers9_up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=levers9_up.root,
    )

    try:
        deadline = time.monotonic() + 120
        while _queued_placements(levers9_up) < 4 and time.monotonic() < deadline and app.poll() is None:
            time.sleep(0.1)
        assert _queued_placements(levers9_up) >= 4, "no calls waited in a worker's queue"
        os.kill(_worker_running_a_call(levers9_up), signal.SIGKILL)
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err + levers9_up.log()[-3000:]
    assert "RESULT True" in out


def _tasks_in(up: Up, status: str) -> list[dict[str, object]]:
    """The tasks `levers9 tasks` lists in ``status``."""
    listed = up.levers9("tasks", "--json")
    assert listed.returncode == 0, listed.stderr
    return [task for task in json.loads(listed.stdout) if task.get("status") == status]


def _worker_logs_say(up: Up, text: str) -> bool:
    """Whether the log of one of the local pool's workers (in the state directory) says ``text``."""
    return any(text in log.read_text(errors="replace") for log in (up.root / "state").rglob("*.log"))


def _worker_running_a_call(up: Up) -> int:
    """The pid of the `levers9 worker` whose state directory holds a container right now."""
    for pid, cmd in _processes_mentioning(str(up.root)):
        if not cmd.endswith("-m levers9 worker"):
            continue
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LEVERS9_WORKER_STATE_DIR=")), "")
        if state and list(Path(state).glob("runtime/*/containers/*")):
            return pid
    raise AssertionError("no worker runs a container")


def test_the_controlplane_killed_and_restarted_mid_run_loses_no_task(levers9_up: Up) -> None:
    levers9_up.start()
    program = levers9_up.root / "spawner.py"
    program.write_text(
        """
import json, sys, threading, time, levers9

@levers9.function(cpu=0.25)
def slow(i):
    time.sleep(2)
    return i * i

mapped = []
# a map's calls are followed on the stream that submitted them: it breaks with the controlplane
mapper = threading.Thread(target=lambda: mapped.extend(slow.map(range(12, 18), progress=False)))
mapper.start()
calls = [slow.spawn(i) for i in range(12)]
print("SPAWNED", flush=True)
results = [c.get(timeout=300) for c in calls]
mapper.join(300)
print("RESULTS", json.dumps([results, mapped]), flush=True)
"""
    )
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
        assert app.stdout.readline().strip() == "SPAWNED"
        wait_for(lambda: _tasks_in(levers9_up, "running"), "a call running", 120, levers9_up.log)  # the rest wait
        levers9_up.kill()  # SIGKILL: no shutdown of any kind; the workers keep running
        levers9_up.start(wait_workers=0)  # same home: same SQLite file, same ports
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err
    results, mapped = json.loads(out.split("RESULTS", 1)[1])
    assert results == [i * i for i in range(12)]
    assert mapped == [i * i for i in range(12, 18)]
    tasks = json.loads(levers9_up.levers9("tasks", "--json").stdout)
    mine = [t for t in tasks if t.get("function") == "slow"]
    assert len(mine) == 18
    assert all(t["status"] == "complete" for t in mine)


def test_a_token_of_one_workspace_cannot_read_another_workspaces_tasks(shared_up: Up) -> None:
    import grpc

    from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc

    done = shared_up.python(
        """
        import levers9

        @levers9.function()
        def mine():
            return "private"

        call = mine.spawn()
        assert call.get(timeout=120) == "private"
        print("TASK", call.task_id)
        """
    )
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.split("TASK", 1)[1].strip()
    other = shared_up.levers9("token", "create", "--workspace", "team-b")
    assert other.returncode == 0, other.stderr
    intruder = other.stdout.strip()
    owner = shared_up.token()

    channel = grpc.insecure_channel(f"127.0.0.1:{shared_up.grpc_port}")
    try:
        api = controlplane_pb2_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
        as_b = (("authorization", f"Bearer {intruder}"),)
        as_a = (("authorization", f"Bearer {owner}"),)
        assert api.GetTask(controlplane_pb2.GetTaskRequest(task_id=task_id), metadata=as_a).status == "complete"
        for attempt in (
            lambda: api.GetTask(controlplane_pb2.GetTaskRequest(task_id=task_id), metadata=as_b),
            lambda: list(api.Watch(controlplane_pb2.WatchRequest(task_ids=[task_id]), metadata=as_b)),
            lambda: list(api.StreamLogs(controlplane_pb2.StreamLogsRequest(task_id=task_id), metadata=as_b)),
            lambda: api.CancelTask(controlplane_pb2.CancelTaskRequest(task_id=task_id), metadata=as_b),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                attempt()
            # exactly what a task that does not exist gives: B cannot even learn that it exists
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        listed = api.ListTasks(controlplane_pb2.ListTasksRequest(limit=1000), metadata=as_b)
        assert task_id not in [t.id for t in listed.tasks]
        with pytest.raises(grpc.RpcError) as caught:
            api.ListTasks(controlplane_pb2.ListTasksRequest(), metadata=(("authorization", "Bearer nonsense"),))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    # and over REST
    import httpx

    r = httpx.get(
        f"http://127.0.0.1:{shared_up.http_port}/api/v1/tasks/{task_id}",
        headers={"authorization": f"Bearer {intruder}"},
        timeout=10,
    )
    assert r.status_code == 404


def test_output_of_a_call_reaches_levers9_logs(shared_up: Up) -> None:
    done = shared_up.python(
        """
        import sys, levers9

        @levers9.function()
        def chatty(n):
            for i in range(n):
                print(f"line {i} of {n}", flush=True)
            print("to stderr", file=sys.stderr, flush=True)
            return n

        call = chatty.spawn(3)
        assert call.get(timeout=120) == 3
        print("TASK", call.task_id)
        """
    )
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.split("TASK", 1)[1].strip()
    logs = shared_up.levers9("logs", task_id)
    assert logs.returncode == 0, logs.stderr
    assert "line 0 of 3\nline 1 of 3\nline 2 of 3\n" in logs.stdout
    assert "to stderr" in logs.stdout


def test_a_worker_told_to_stop_finishes_its_call_first(levers9_up: Up) -> None:
    levers9_up.start()
    marker = levers9_up.exchange / "started"
    release = levers9_up.exchange / "release"
    program = levers9_up.root / "long_app.py"
    program.write_text(
        f"""
import os, time, levers9

@levers9.function()
def long():
    open({str(marker)!r}, "w").close()
    while not os.path.exists({str(release)!r}):  # runs until its worker is draining
        time.sleep(0.05)
    return "done"

print("RESULT", long.remote(), flush=True)
"""
    )
    app = subprocess.Popen(
        [sys.executable, str(program)],
        env=levers9_up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=levers9_up.root,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the call never started"
        worker = _worker_running_a_call(levers9_up)
        os.kill(worker, signal.SIGTERM)  # drain: take nothing new, finish what runs, leave
        wait_for(
            lambda: _worker_logs_say(levers9_up, "draining: finishing 1 running calls"),
            "the worker draining",
            60,
            levers9_up.log,
        )
        release.touch()
        out, err = app.communicate(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err
    assert "RESULT done" in out
    deadline = time.monotonic() + 30
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{worker}").exists(), "the drained worker did not exit"
    tasks = json.loads(levers9_up.levers9("tasks", "--json").stdout)
    [task] = [t for t in tasks if t.get("function") == "long"]
    assert (task["status"], task["attempts"]) == ("complete", 0)  # finished where it ran, not run again


def test_a_second_up_on_the_same_home_or_port_refuses_and_leaves_the_first_alone(levers9_up: Up) -> None:
    levers9_up.start()
    ports = [
        "--grpc-port",
        str(levers9_up.grpc_port),
        "--http-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    ]
    same_home = levers9_up.levers9("up", *ports, timeout=60)
    assert same_home.returncode == 1
    assert "another levers9 controlplane is running on" in same_home.stderr
    other_home = subprocess.run(
        [sys.executable, "-m", "levers9", "up", *ports],
        env={**levers9_up.env, "LEVERS9_HOME": str(levers9_up.root / "other-home")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=levers9_up.root,
    )
    assert other_home.returncode == 1
    assert f"cannot listen for gRPC on 127.0.0.1:{levers9_up.grpc_port}" in other_home.stderr
    http_taken = subprocess.run(
        [
            sys.executable,
            "-m",
            "levers9",
            "up",
            "--grpc-port",
            str(free_port()),
            "--http-port",
            str(levers9_up.http_port),
            "--metrics-port",
            str(free_port()),
        ],
        env={**levers9_up.env, "LEVERS9_HOME": str(levers9_up.root / "third-home")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=levers9_up.root,
    )
    assert http_taken.returncode == 1, http_taken.stderr
    assert f"cannot listen for HTTP on 127.0.0.1:{levers9_up.http_port}" in http_taken.stderr
    done = levers9_up.levers9("run", str(EXAMPLES / "hello.py"))  # the first one still serves
    assert done.returncode == 0, done.stderr
    assert "7 squared on a levers9 worker: 49" in done.stdout


def test_ctrl_c_stops_up_in_order_without_restarting_its_redis_or_registry(levers9_up: Up) -> None:
    """A terminal's Ctrl-C signals its whole foreground process group. The embedded Redis and registry run in
    sessions of their own, so the signal reaches the controlplane alone, which stops them after its workers;
    before, they died first and were restarted in the middle of the shutdown."""
    home = levers9_up.root / "ctrl-c-home"
    ports = ["--grpc-port", str(free_port()), "--http-port", str(free_port()), "--metrics-port", str(free_port())]
    log = levers9_up.root / "ctrl-c.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "levers9", "up", *ports],
            env={**levers9_up.env, "LEVERS9_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=levers9_up.root,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "levers9 is up" not in log.read_text(errors="replace"):
            assert up.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        children = _processes_mentioning(str(home))
        assert any("redis-server" in cmd for _, cmd in children), children
        assert any("registry" in cmd and "serve" in cmd for _, cmd in children), children
        os.killpg(up.pid, signal.SIGINT)  # as the terminal does
        up.wait(60)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    said = log.read_text(errors="replace")
    assert "starting it again" not in said, said
    assert "restarted the embedded" not in said, said
    assert _processes_mentioning(str(home)) == []


def test_up_says_what_it_starts_and_levers9_down_stops_it(levers9_up: Up) -> None:
    """A newcomer sees `up` at work before its banner, and stops a background `up` with `levers9 down`."""
    up = levers9_up
    up.start(wait_workers=0)
    said = up.log()
    banner = said.index("levers9 is up")
    steps = ["loading the config and the plugins", "opening the database and Redis", "serving HTTP"]
    assert all(0 <= said.find(step) < banner for step in steps), said[:2000]
    state = json.loads((up.home / "up.json").read_text())
    assert up.process is not None
    assert state["pid"] == up.process.pid
    done = up.levers9("down")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"stopping levers9 up (pid {up.process.pid}, {state['http']}) ...",
        "levers9 up stopped",
    ]
    assert up.process.wait(10) == 0
    assert not (up.home / "up.json").exists()
    again = up.levers9("down")
    assert again.returncode == 0
    assert again.stdout.strip() == f"no levers9 up is running for {up.home}"
    # a file naming a process that is gone (an up that was killed) is not trusted, and is removed
    (up.home / "up.json").write_text(json.dumps({**state, "started": 1}))
    assert up.levers9("down").stdout.strip() == f"no levers9 up is running for {up.home}"
    assert not (up.home / "up.json").exists()
