"""A worker rides out a controlplane outage shorter than its limit, however long it has been running.

The limit (``disconnect_exit_s``) counts from the worker's last contact with
its controlplane. It used to count from the end of the last session that
returned normally, which a healthy session never does, so every worker older
than the limit stopped on the first break: a controlplane restart took the
whole fleet down.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.fixtures.levers9_up import Up, end_session

pytestmark = pytest.mark.timeout(300)

#: the worker's limit here; the production default is 120 s, the logic is the same
LIMIT_S = 20


def test_a_worker_older_than_its_limit_keeps_serving_across_a_controlplane_restart(levers9_up: Up) -> None:
    levers9_up.min_workers = 0
    levers9_up.max_workers = 0  # no provider workers: the one worker is started here, by hand
    levers9_up.start(wait_workers=0)
    issued = levers9_up.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert issued.returncode == 0, issued.stderr
    env = {
        **levers9_up.env,
        "LEVERS9_TOKEN": issued.stdout.strip(),
        "LEVERS9_DISCONNECT_EXIT_S": str(LIMIT_S),
    }
    log = (levers9_up.root / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "levers9",
            "worker",
            "--controlplane",
            f"grpc://127.0.0.1:{levers9_up.grpc_port}",
            "--pool",
            "local",
            "--state-dir",
            str(levers9_up.root / "worker-state"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        levers9_up.wait_workers(1)
        time.sleep(LIMIT_S + 2)  # older than its limit
        levers9_up.kill()
        levers9_up.start(wait_workers=0)
        levers9_up.wait_workers(1, timeout=60)  # it registered again
        assert worker.poll() is None, (levers9_up.root / "worker.log").read_text()
        done = levers9_up.python(
            """
            import levers9

            @levers9.function(cpu=0.25)
            def where():
                import os
                return os.getpid()

            print("ran", where.remote())
            """,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr + (levers9_up.root / "worker.log").read_text()[-3000:]
        assert "ran " in done.stdout
        assert worker.poll() is None
        assert "stopping" not in (levers9_up.root / "worker.log").read_text()
    finally:
        end_session(worker)
        log.close()
