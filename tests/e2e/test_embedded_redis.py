"""`levers9 up`'s embedded Redis is supervised: killed, it is started again and the controlplane recovers.

The embedded ``redis-server`` keeps nothing on disk, so a new one starts
empty; the controlplane then rebuilds what Redis held as it does at start (the
backlog from SQL, workers registering again, the planner lease taken again).
A Redis that cannot be started again ends ``levers9 up`` with an error and a
non-zero exit, so a service manager can restart the whole thing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)


def _redis_child(up: Up) -> int | None:
    """The pid of the `redis-server` child of the `levers9 up` process (None when it has none)."""
    assert up.process is not None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing parenthesis
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == up.process.pid and comm == "redis-server" and state != "Z":
            return int(entry.name)
    return None


def _wait_for(what: str, check: object, up: Up, timeout: float = 60) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s:\n{up.log()[-5000:]}")
        time.sleep(0.1)


def _health(up: Up) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{up.http_port}/api/v1/health", timeout=10)


def _restarts(up: Up) -> float:
    text = httpx.get(f"http://127.0.0.1:{up.metrics_port}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("levers9_embedded_redis_restarts_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_the_embedded_redis_killed_mid_map_is_restarted_and_the_map_completes(levers9_up: Up) -> None:
    levers9_up.start()
    old = _redis_child(levers9_up)
    assert old is not None, "levers9 up runs no redis-server child (is redis-server installed? scripts/setup)"
    gate = levers9_up.exchange
    program = levers9_up.root / "mapper.py"
    # Every call waits for the test's "go" file: when Redis is killed, some calls are running on the
    # worker and the rest wait in the backlog that dies with Redis; none has finished.
    program.write_text(
        f"""
import json, os, time, levers9

@levers9.function(cpu=0.25, memory=64)
def square(i):
    open(os.path.join({str(gate)!r}, f"started-{{i}}"), "w").close()
    deadline = time.time() + 240
    while not os.path.exists(os.path.join({str(gate)!r}, "go")) and time.time() < deadline:
        time.sleep(0.05)
    return i * i

print("RESULTS", json.dumps(list(square.map(range(200), progress=False))), flush=True)
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
        _wait_for("no call started", lambda: any(gate.glob("started-*")), levers9_up, timeout=120)
        os.kill(old, signal.SIGKILL)
        (gate / "go").touch()
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, err + levers9_up.log()[-5000:]
    assert "RESULTS" in out, out
    results = [int(x) for x in out.split("RESULTS", 1)[1].strip().strip("[]").split(",")]
    assert results == [i * i for i in range(200)]
    new = _redis_child(levers9_up)
    assert new is not None, "no redis-server runs after the kill"
    assert new != old
    # reaped: no zombie is left of the old one (the pid is not reused this soon)
    _wait_for(
        f"/proc/{old} (the killed redis-server) is still there",
        lambda: not Path(f"/proc/{old}").exists(),
        levers9_up,
        timeout=10,
    )
    _wait_for("health is not ok again", lambda: _health(levers9_up).status_code == 200, levers9_up)
    assert _health(levers9_up).json()["redis"] == "ok"
    assert _restarts(levers9_up) == 1
    assert levers9_up.log().count("restarted the embedded redis-server") == 1
    # and it goes on serving: a new call after the recovery
    done = levers9_up.python(
        """
        import levers9

        @levers9.function(cpu=0.25, memory=64)
        def plus_one(x):
            return x + 1

        print("RESULT", plus_one.remote(41))
        """
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT 42" in done.stdout


def test_an_embedded_redis_that_cannot_start_again_ends_levers9_up_with_an_error(
    levers9_up: Up, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-server as `up` finds it on PATH: the real one until the test breaks it
    real = subprocess.run(["sh", "-c", "command -v redis-server"], capture_output=True, text=True).stdout.strip()
    assert real, "redis-server is not installed: run scripts/setup (apt-get install redis-server)"
    bin_dir = levers9_up.root / "bin"
    bin_dir.mkdir()
    broken = levers9_up.root / "broken"
    wrapper = bin_dir / "redis-server"
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e {broken} ]; then echo "redis-server: broken by the test" >&2; exit 1; fi\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    levers9_up.start()
    old = _redis_child(levers9_up)
    assert old is not None
    broken.touch()
    os.kill(old, signal.SIGKILL)
    assert levers9_up.process is not None
    try:
        code = levers9_up.process.wait(120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"levers9 up still runs 120 s after its Redis could not start again:\n{levers9_up.log()[-5000:]}")
    assert code != 0
    log = levers9_up.log()
    assert "levers9 up: the embedded redis-server died and could not be started again" in log, log[-5000:]
    assert "broken by the test" in log
