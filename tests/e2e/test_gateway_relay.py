"""Any replica serves any gateway request: two real replicas, a worker behind NAT whose tunnel only one holds.

Two ``levers9 server`` replicas share PostgreSQL and Redis; the one worker
runs in a network namespace that drops every connection opened towards it
and dials replica 0 only, so replica 0 holds its tunnel. The same endpoint is
then called through each replica: replica 1 has no tunnel and relays to
replica 0 (``Replica.Relay``). Every request answers 200 on both (before the
relay, replica 1 answered 502 "no tunnel"), including a big body and a
streamed response whose first item arrives before the second is made (the
gateway passes no WebSocket upgrade, so the relay's byte pipe is checked with
a long-lived streamed response instead).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.levers9_up import end_session
from tests.fixtures.replicas import Replicas
from tests.tunnel.netns import Namespace, namespace

pytestmark = pytest.mark.timeout(240)

#: requests sent to each replica
REQUESTS = 10

APP = """
import os
import time

import levers9

@levers9.endpoint(keep_warm=60)
def greet(name: str = "you") -> dict:
    return {"greeting": "hello, " + name, "big": "x" * 1_000_000}

@levers9.endpoint(keep_warm=60)
def ticks(go: str):
    yield {"tick": 0}
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
    yield {"tick": 1 if os.path.exists(go) else "the test never said go"}
"""


def _eventually(check: Callable[[], bool], timeout: float, what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s:\n{log()[-6000:]}")
        time.sleep(0.1)


def _start_worker(replicas: Replicas, ns: Namespace) -> subprocess.Popen[bytes]:
    """The worker behind NAT, dialing replica 0 only (so only replica 0 holds its tunnel)."""
    issued = replicas.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert issued.returncode == 0, issued.stderr
    env = {**replicas.env, "LEVERS9_TOKEN": issued.stdout.strip(), "LEVERS9_STOP_GRACE_S": "5"}
    env.pop("LEVERS9_ADVERTISE_URL", None)
    log = (replicas.root / "worker.log").open("wb")
    try:
        return subprocess.Popen(
            [
                *ns.exec_prefix(),
                sys.executable,
                "-m",
                "levers9",
                "worker",
                "--log-level",
                "info",
                "--controlplane",
                f"grpc://{ns.host_ip}:{replicas.replicas[0].grpc_port}",
                "--pool",
                "local",
                "--state-dir",
                str(replicas.root / "worker-state"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def test_gateway_requests_to_either_replica_reach_a_worker_behind_nat(replicas: Replicas) -> None:
    replicas.min_workers = 0
    replicas.max_workers = 0  # no provider workers: the one worker is the one behind NAT
    replicas.host = "0.0.0.0"  # so the namespace can dial in; plain text on a test-only link
    replicas.listen = "  plaintext: true\n"
    replicas.start_all()
    holder, other = replicas.replicas

    def logs() -> str:
        worker_log = replicas.root / "worker.log"
        return replicas.logs() + "\n--- worker:\n" + (worker_log.read_text() if worker_log.exists() else "")[-4000:]

    # where the test says "go" to the streaming endpoint, which runs as nobody
    exchange = Path(tempfile.mkdtemp(prefix="levers9-relay-"))
    exchange.chmod(0o1777)
    with namespace(drop_inbound=True) as ns:
        worker = _start_worker(replicas, ns)
        try:
            replicas.wait_workers(1)
            _eventually(lambda: "opened its tunnel" in holder.log(), 30, "the worker's tunnel", logs)
            assert "opened its tunnel" not in other.log()
            app = replicas.root / "relayapp.py"
            app.write_text(textwrap.dedent(APP))
            deployed = subprocess.run(
                [sys.executable, "-m", "levers9", "deploy", str(app)],
                env=replicas.sdk_env(None, None),
                capture_output=True,
                text=True,
                timeout=120,
                cwd=replicas.root,
            )
            assert deployed.returncode == 0, deployed.stderr + logs()

            headers = {"authorization": f"Bearer {replicas.token}"}
            for replica in (holder, other):
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{replica.http_port}", headers=headers, timeout=60
                ) as client:
                    codes: list[int] = []
                    for i in range(REQUESTS):
                        answer = client.post("/endpoint/greet", json={"name": f"r{replica.index}-{i}"})
                        assert answer.status_code == 200, f"replica {replica.index}: {answer.text[:500]}\n{logs()}"
                        body: dict[str, Any] = answer.json()
                        assert body["greeting"] == f"hello, r{replica.index}-{i}"
                        assert body["big"] == "x" * 1_000_000
                        codes.append(answer.status_code)
                    assert codes == [200] * REQUESTS

                    # a streamed response through the relay: the first item comes through alone
                    go = exchange / f"go-{replica.index}"
                    items: list[Any] = []
                    with client.stream("POST", "/endpoint/ticks", json={"go": str(go)}) as response:
                        assert response.status_code == 200, response.read().decode() + logs()
                        for line in response.iter_lines():
                            if line:
                                items.append(json.loads(line))
                                if len(items) == 1:
                                    go.touch()
                    assert items == [{"tick": 0}, {"tick": 1}], logs()
            assert "opened its tunnel" not in other.log()  # replica 1 served every request through replica 0
            assert worker.poll() is None, logs()
        finally:
            end_session(worker)
            shutil.rmtree(exchange, ignore_errors=True)
