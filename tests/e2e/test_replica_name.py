"""A replica's name on real `levers9 server` processes: its metrics' label from the start, one live replica per name.

Takes about 20 s: one replica, then a second process under its name, refused once it sees the first renew
its hold (within a third of the 10 s TTL).
"""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.fixtures.levers9_up import free_port
from tests.fixtures.replicas import Replicas


def test_a_replica_exports_under_its_name_and_a_second_one_with_that_name_is_refused(replicas: Replicas) -> None:
    replicas.count = 1
    replicas.min_workers = 0
    replicas.start_all()
    first = replicas.replicas[0]
    scrape = httpx.get(f"http://127.0.0.1:{first.metrics_port}/metrics", timeout=10).text
    # the name given (--replica-name), and the counters at 0 before anything happened (issue 36 item 3)
    for series in (
        'levers9_requeues_total{reason="worker_lost",replica="replica0"} 0.0',
        'levers9_workers_lost_total{pool="local",reason="keepalive_lapsed",replica="replica0"} 0.0',
    ):
        assert series in scrape, f"{series} not exported:\n{scrape}"
    assert "replica replica0 (this process: replica0-" in first.log(), first.log()[-3000:]

    # the same config with listen.replica_name naming the live replica's name, no flag
    config = (replicas.home / "levers9.yaml").read_text().replace("listen:\n", "listen:\n  replica_name: replica0\n", 1)
    clash = replicas.root / "clash.yaml"
    clash.write_text(config)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "levers9",
            "--config",
            str(clash),
            "server",
            "--grpc-port",
            str(free_port()),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
        ],
        env=replicas.env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=replicas.root,
    )
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "the replica name 'replica0' is in use by another live replica (process replica0-" in refused.stderr
    assert "listen.replica_name or levers9 server --replica-name" in refused.stderr
    # the first goes on, still under its name
    assert first.running
    scrape = httpx.get(f"http://127.0.0.1:{first.metrics_port}/metrics", timeout=10).text
    assert 'levers9_planner_lease_held{replica="replica0"} 1.0' in scrape, scrape
