"""A worker behind NAT serves endpoints and a box through its tunnel: a real `levers9 up`, a real namespace.

The worker runs in a network namespace that can connect to the controlplane
but drops every connection opened towards it. At registration the
controlplane's connection to the worker's probe port is dropped, so it tells
the worker to open its tunnel; the gateway's requests then reach the worker's
containers (which listen on the namespace's loopback) through it: a plain
response (megabytes, through the per-stream flow control), a streaming one
whose first item arrives before the second is made, and a box port.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest

from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import worker_pb2_grpc
from tests.fixtures.levers9_up import Up, end_session
from tests.tunnel.netns import Namespace, namespace

pytestmark = pytest.mark.timeout(300)

BOX_PORT = 18080

APP = f"""
import http.server
import os
import time

import levers9

@levers9.endpoint(keep_warm=60)
def greet(name: str = "you") -> dict:
    return {{"greeting": "hello, " + name, "big": "x" * 3_000_000}}

@levers9.endpoint(keep_warm=60)
def ticks(go: str):
    yield {{"tick": 0}}
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
    yield {{"tick": 1 if os.path.exists(go) else "the test never said go"}}

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("box says " + self.path).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

@levers9.box(ports=[{BOX_PORT}])
def web():
    http.server.ThreadingHTTPServer(("127.0.0.1", {BOX_PORT}), Hello).serve_forever()
"""


def _eventually(check: Callable[[], bool], timeout: float, what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s:\n{log()[-4000:]}")
        time.sleep(0.2)


def _deploy(up: Up) -> dict[str, dict[str, Any]]:
    app = up.root / "natapp.py"
    app.write_text(textwrap.dedent(APP))
    done = up.levers9("deploy", str(app), "--json")
    assert done.returncode == 0, done.stderr + up.log()[-3000:]
    return {d["name"]: d for d in json.loads(done.stdout)}


def _start_worker(up: Up, ns: Namespace) -> subprocess.Popen[bytes]:
    issued = up.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert issued.returncode == 0, issued.stderr
    # a short grace: at the end the worker stops its serving containers within seconds
    env = {**up.env, "LEVERS9_TOKEN": issued.stdout.strip(), "LEVERS9_STOP_GRACE_S": "5"}
    log = (up.root / "worker.log").open("wb")
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
                f"grpc://{ns.host_ip}:{up.grpc_port}",
                "--pool",
                "local",
                "--state-dir",
                str(up.root / "worker-state"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def _tunnel_refused_without_the_workers_token(up: Up, worker_id: str) -> None:
    """Only the worker's own credential opens its tunnel: a user's token or none is refused."""
    with grpc.insecure_channel(f"127.0.0.1:{up.grpc_port}") as channel:
        factory: Any = worker_pb2_grpc.WorkerStub
        stub = factory(channel)
        for token in ("", up.token()):
            metadata = [(WORKER_ID_METADATA, worker_id)] + ([("authorization", f"Bearer {token}")] if token else [])
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Tunnel(iter([]), metadata=metadata, timeout=30))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value


def test_endpoints_streams_and_box_ports_of_a_worker_behind_nat(levers9_up: Up) -> None:
    up = levers9_up
    up.min_workers = 0
    up.max_workers = 0  # no provider workers: the one worker is the one behind NAT
    up.home.mkdir(parents=True, exist_ok=True)
    config = up.config_text(min_workers=0, max_workers=0)
    # every interface, so the namespace can dial in; plain text on a test-only link
    (up.home / "levers9.yaml").write_text(config + "listen:\n  host: 0.0.0.0\n  plaintext: true\n")
    up.start(wait_workers=0)

    def logs() -> str:
        worker_log = up.root / "worker.log"
        return up.log()[-6000:] + "\n--- worker:\n" + (worker_log.read_text() if worker_log.exists() else "")[-6000:]

    with namespace(drop_inbound=True) as ns:
        worker = _start_worker(up, ns)
        try:
            up.wait_workers(1)
            _eventually(lambda: "opened its tunnel" in up.log(), 30, "the worker's tunnel", logs)
            assert "serves through a tunnel" in up.log()
            _deploy(up)
            with httpx.Client(
                base_url=f"http://127.0.0.1:{up.http_port}",
                headers={"authorization": f"Bearer {up.token()}"},
                timeout=60,
            ) as client:
                plain = client.post("/endpoint/greet", json={"name": "nat"})
                assert plain.status_code == 200, plain.text + logs()
                body = plain.json()
                assert body["greeting"] == "hello, nat"
                assert body["big"] == "x" * 3_000_000
                assert "is ready at tunnel://" in up.log()  # reached through the tunnel, not directly

                go = up.exchange / "go"
                items: list[Any] = []
                with client.stream("POST", "/endpoint/ticks", json={"go": str(go)}) as response:
                    assert response.status_code == 200, response.read().decode() + logs()
                    for line in response.iter_lines():
                        if not line:
                            continue
                        items.append(json.loads(line))
                        if len(items) == 1:
                            go.touch()  # only now may the second item be made: the first came through alone
                assert items == [{"tick": 0}, {"tick": 1}]

                box = client.get(f"/box/web/v1/{BOX_PORT}/some/path?q=1")
                assert box.status_code == 200, box.text + logs()
                assert box.text == "box says /some/path?q=1"
            assert worker.poll() is None, logs()
            _tunnel_refused_without_the_workers_token(up, str(up.workers()[0]["id"]))
        finally:
            end_session(worker)
