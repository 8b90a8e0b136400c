"""`levers9 up` with the operator's limits, its private data directory, and clean worker teardowns.

Real processes throughout: the controlplane, its local workers, user programs
using the SDK, and `levers9 logs` reading back what was stored.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import Up, _processes_mentioning
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(600)

LINE = b"y" * 1023 + b"\n"  # 1 KiB
MARKER = re.compile(
    rb"\[levers9: ([0-9,]+) bytes of output dropped; the limit is 256 KiB \(limits\.max_task_log_bytes\)\]\n"
)


def _task_id(stdout: str, name: str) -> str:
    match = re.search(rf"^{name} (\S+)$", stdout, re.MULTILINE)
    assert match is not None, stdout
    return match.group(1)


def test_output_past_max_task_log_bytes_is_dropped_with_a_marker(levers9_up: Up) -> None:
    levers9_up.write_config()
    with (levers9_up.home / "levers9.yaml").open("a") as config:
        config.write("limits:\n  max_task_log_bytes: 256KiB\n")
    levers9_up.start()
    done = levers9_up.python(
        """
        import sys, levers9

        @levers9.function(memory="256Mi", cpu="500m")  # sizes as Kubernetes spells them reach the controlplane
        def loud():
            block = (b"y" * 1023 + b"\\n") * 1024  # 1 MiB
            for _ in range(20):
                sys.stdout.buffer.write(block)
                sys.stdout.flush()
            return "loud done"

        @levers9.function(memory="1Gi")
        def quiet():
            print("hello", flush=True)
            return "quiet done"

        first, second = loud.spawn(), quiet.spawn()
        print(first.get(timeout=240), second.get(timeout=240))
        print("LOUD", first.task_id)
        print("QUIET", second.task_id)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "loud done quiet done" in done.stdout
    logs = levers9_up.levers9("logs", _task_id(done.stdout, "LOUD"))
    assert logs.returncode == 0, logs.stderr
    output = logs.stdout.encode()
    match = MARKER.search(output)
    assert match is not None, output[-500:]
    assert match.end() == len(output), output[-500:]
    assert output[: match.start()] == LINE * 256  # the first 256 KiB, whole
    assert int(match[1].replace(b",", b"")) == 20 * 1024 * 1024 - 256 * 1024
    assert len(output) <= 256 * 1024 + 120
    quiet = levers9_up.levers9("logs", _task_id(done.stdout, "QUIET"))
    assert quiet.stdout == "hello\n"  # other calls are unaffected


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_data_directory_and_database_files_are_private(levers9_up: Up) -> None:
    data = levers9_up.home / "data"
    data.mkdir(parents=True)
    data.chmod(0o755)  # left loose by an older version, or made by hand
    from cryptography.fernet import Fernet

    key = data / "secret.key"
    key.write_bytes(Fernet.generate_key() + b"\n")
    key.chmod(0o644)
    levers9_up.start()
    done = levers9_up.python(
        """
        import levers9

        @levers9.function()
        def one():
            return 1

        print("RESULT", one.remote())
        """
    )
    assert done.returncode == 0, done.stderr
    assert _mode(data) == 0o700
    assert _mode(key) == 0o600
    database = data / "levers9.db"
    for path in (database, database.with_name("levers9.db-wal"), database.with_name("levers9.db-shm")):
        assert path.exists(), path
        assert _mode(path) == 0o600, (path, oct(_mode(path)))
    if (data / "redis").exists():  # the embedded Redis child, when redis-server is installed
        assert _mode(data / "redis") == 0o700
    assert not [p for p in data.iterdir() if p.is_file() and _mode(p) & 0o077], [
        (p.name, oct(_mode(p))) for p in data.iterdir()
    ]


def test_a_worker_going_away_leaves_no_pending_task_destroyed(levers9_up: Up, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's session ends mid-wait when the worker dies; nothing it started may be left pending.

    A task left pending is reported only when the garbage collector frees it, which
    an idle controlplane may not do for minutes; ``sitecustomize`` here makes the
    controlplane collect every 0.2 s so a leak shows within the test.
    """
    site = levers9_up.root / "site"
    site.mkdir()
    collections = levers9_up.root / "collections"  # a file a process: how many collections it has made
    collections.mkdir()
    (site / "sitecustomize.py").write_text(
        "import gc, os, threading, time\n"
        "def _collect():\n"
        "    done = 0\n"
        "    while True:\n"
        "        time.sleep(0.2)\n"
        "        gc.collect()\n"
        "        done += 1\n"
        f"        with open(os.path.join({str(collections)!r}, str(os.getpid())), 'w') as f:\n"
        "            f.write(str(done))\n"
        "threading.Thread(target=_collect, daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))  # read by Up.env, so by the controlplane it starts
    levers9_up.start()
    done = levers9_up.python(
        """
        import levers9

        @levers9.function()
        def inc(x):
            return x + 1

        print("RESULT", sum(inc.map(range(50))))
        """
    )
    assert "RESULT 1275" in done.stdout, done.stderr
    workers = [pid for pid, cmd in _processes_mentioning(str(levers9_up.root)) if cmd.endswith("-m levers9 worker")]
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    # the controlplane notices one of three ways: the worker's keepalive lapses, the provider no longer
    # lists it, or the provider lists it as failed (the local provider does once it reaps the process)
    noticed = ("stopped reporting", "is gone from the provider", "failed: the worker exited")
    deadline = time.monotonic() + 60
    while not any(n in levers9_up.log() for n in noticed) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(n in levers9_up.log() for n in noticed), levers9_up.log()[-3000:]
    assert levers9_up.process is not None
    counted = collections / str(levers9_up.process.pid)

    def made() -> int:
        return int(counted.read_text() or 0) if counted.exists() else 0

    ended = made()
    wait_for(lambda: made() >= ended + 3, "the controlplane's three collections after the sessions ended", 60)
    levers9_up.stop()
    assert "Task was destroyed but it is pending" not in levers9_up.log(), levers9_up.log()[-5000:]
