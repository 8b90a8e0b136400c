"""A `levers9 up` under 20,000 slow HTTP connections still answers: health, a function call, its metrics.

The probe that found the controlplane could be taken down (issue 32, item 4) opened about 20,000 slowloris
connections to the HTTP port of a fresh `levers9 up`, whose process may open 20,000 descriptors: they took
them all, and REST, the gateway and gRPC stopped answering, while asyncio's accept loop logged "Too many
open files" hundreds of thousands of times. Here the same flood comes from helper processes
(tests/fixtures/slow_clients.py), from 20 source addresses with 1,000 connections each: a little over the
per-address cap the controlplane derives from its descriptor limit (so some are refused per address), and
far over its cap in all (so the ones that never sent a whole head are evicted for newer ones). While they
are held, a health request and a real function call must each finish within the deadline the test gives
them, and the log must not have flooded.

The controlplane runs under a descriptor limit of 20,000, soft and hard, as the probe's did (a higher one
would make its caps hold all 20,000). The config raises ``listen.header_timeout_s`` to 120 s so that the slow connections the controlplane holds
are still held while the test checks (at the default 10 s they would be answered 408 and closed first,
which tests/controlplane/test_slow_clients.py checks); every other limit is the default.
"""

from __future__ import annotations

import math
import re
import resource
import time

import httpx
import pytest

from tests.fixtures.levers9_up import Up
from tests.fixtures.slow_clients import slow_clients

pytestmark = pytest.mark.timeout(600)

#: slow connections in all: as many as the controlplane may open descriptors
FLOOD = 20_000
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 22)]
#: the deadline of each check while the flood is held
DEADLINE_S = 60.0


def test_health_and_a_call_answer_while_20000_slow_connections_are_held(levers9_up: Up) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < FLOOD:
        pytest.fail(
            f"this test runs levers9 up under {FLOOD} file descriptors, above this process's hard limit "
            f"({hard}): run it after `ulimit -Hn {FLOOD}` (as root)"
        )
    levers9_up.nofile = FLOOD
    levers9_up.write_config()
    with (levers9_up.home / "levers9.yaml").open("a") as config:
        config.write("listen:\n  header_timeout_s: 120\n")
    levers9_up.start()
    began = time.monotonic()
    # each helper holds what its descriptor limit (raised to this process's hard one) allows, and no more than 10,000
    helpers = max(2, math.ceil(FLOOD / max(1, min(10_000, hard - 1_000))))
    with slow_clients(
        levers9_up.http_port,
        addresses=ADDRESSES,
        per_address=FLOOD // len(ADDRESSES),
        helpers=min(helpers, len(ADDRESSES)),
    ) as clients:
        status = clients.wait_settled(FLOOD, timeout=180)
        assert status["connected"] == FLOOD, status

        health = httpx.get(f"http://127.0.0.1:{levers9_up.http_port}/api/v1/health", timeout=DEADLINE_S)
        assert health.status_code == 200, health.text

        done = levers9_up.python(
            """
            import levers9

            @levers9.function(cpu=0.5, memory=128)
            def add(a, b):
                return a + b

            print("RESULT", add.remote(20, 22))
            """,
            timeout=DEADLINE_S,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "RESULT 42" in done.stdout

        metrics = httpx.get(f"http://127.0.0.1:{levers9_up.metrics_port}/metrics", timeout=DEADLINE_S).text
        held = clients.status()

    # the controlplane held thousands of the slow connections (not refused them all), the helpers saw the rest
    # evicted or refused, and both caps took part
    open_now = _series(metrics, "levers9_connections_open", listener="http")
    assert open_now > 1000, metrics
    assert held["open"] > 1000, held
    assert _series(metrics, "levers9_connections_refused_total", listener="http", reason="per_client") > 0
    assert _series(metrics, "levers9_connections_closed_total", listener="http", reason="evicted") > 0

    levers9_up.wait_for("HTTP listener :", 2 * 10)  # the burst's line comes once its 10 s are over
    elapsed = time.monotonic() - began
    log = levers9_up.log()
    assert log.count("Too many open files") == 0, log[-3000:]
    assert "out of system resource" not in log
    bursts = [line for line in log.splitlines() if "HTTP listener :" in line]
    assert 1 <= len(bursts) <= elapsed / 10 + 2, bursts


def _series(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, in a Prometheus text page."""
    total = 0.0
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total
