"""The podmarket example's fixtures, and its fake marketplace: the HTTP API on 127.0.0.1, at the wire, pods run
with real Docker.

Fixtures: ``docker_host`` (a private dockerd for the session,
:func:`levers9.testing.dockerd.private_dockerd`), ``market`` (a fake whose
pods are records, for the contract kit to boot), ``docker_market`` (a fake
that runs its pods), and the API key in ``$PODMARKET_API_KEY`` for every test.

The plugin calls it over HTTP exactly as it would call the real marketplace
(``api_url``); nothing in the plugin is patched. What it keeps, under one
lock: offers (with stock), secrets (name → value, never shown by the API),
pods (labels, status, the secret names their variables come from) and the
account's balance.

Pods run two ways. With ``docker_host`` each pod is a real container of its
image, command and environment (the secrets resolved), on the host's network
with no port published; a container that exits is listed ``exited``. Without
it a pod is only a record, and the contract kit boots what the record says
(:meth:`FakeMarket.spec`), as it boots the user data a VM was given.

Faults a test can cause: :meth:`outbid` (a spot pod stopped, listed
``outbid``), :meth:`fail` (listed ``failed``), :attr:`fail_after_create`
(the next pod is created, then the call answers 500), a balance of 0 (402,
``insufficient_balance``), an offer's stock of 0 (409, ``no_stock``), a key
other than :data:`API_KEY` (401).

:meth:`close` stops the server and removes every container it started.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from levers9.bootstrap import BootstrapContainer
from levers9.testing import nvidia_smi
from levers9.testing.dockerd import private_dockerd

#: the key the fake accepts
API_KEY = "pm-test-key"

OFFERS: list[dict[str, Any]] = [
    {
        "id": "h100-sxm-secure-eu-ro-1",
        "gpu": "H100 SXM",
        "form_factor": "sxm",
        "cloud": "secure",
        "datacenter": "eu-ro-1",
    },
    {
        "id": "h100-pcie-community-eu-se-1",
        "gpu": "H100 PCIe",
        "form_factor": "pcie",
        "cloud": "community",
        "datacenter": "eu-se-1",
    },
    {
        "id": "h100-sxm-secure-us-tx-3",
        "gpu": "H100 SXM",
        "form_factor": "sxm",
        "cloud": "secure",
        "datacenter": "us-tx-3",
    },
    {
        "id": "rtx4090-community-eu-ro-1",
        "gpu": "RTX 4090",
        "form_factor": "pcie",
        "cloud": "community",
        "datacenter": "eu-ro-1",
    },
    {
        "id": "h100-nvl-secure-us-tx-3",
        "gpu": "H100 NVL",
        "form_factor": "pcie",
        "cloud": "secure",
        "datacenter": "us-tx-3",
    },
    {
        "id": "rtx3090-community-eu-se-1",
        "gpu": "RTX 3090",
        "form_factor": "pcie",
        "cloud": "community",
        "datacenter": "eu-se-1",
    },
    {
        "id": "rtx6000ada-secure-eu-ro-1",
        "gpu": "RTX 6000 Ada",
        "form_factor": "pcie",
        "cloud": "secure",
        "datacenter": "eu-ro-1",
    },
]
#: one GPU's memory as nvidia-smi reports it, in MiB
MEMORY_MIB = {
    "H100 SXM": 81559,
    "H100 PCIe": 81559,
    "H100 NVL": 95830,
    "RTX 4090": 24564,
    "RTX 3090": 24576,
    "RTX 6000 Ada": 49140,
}
#: each card as levers9's catalog names it: what the pod's nvidia-smi shows (levers9.testing's recordings)
CARDS = {
    "H100 SXM": "H100",
    "H100 PCIe": "H100",
    "H100 NVL": "H100-NVL",
    "RTX 4090": "RTX4090",
    "RTX 3090": "RTX3090",
    "RTX 6000 Ada": "RTX6000-Ada",
}
PRICES = {
    "H100 SXM": (2.99, 1.75),
    "H100 PCIe": (2.39, 1.25),
    "H100 NVL": (2.59, 1.49),
    "RTX 4090": (0.69, 0.35),
    "RTX 3090": (0.43, 0.22),
    "RTX 6000 Ada": (0.77, 0.41),
}


class FakeMarket:
    def __init__(self, docker_host: str | None = None, stock: int = 2) -> None:
        self.docker_host = docker_host
        #: the pods' nvidia-smi stand-ins (a pod's container sees its GPUs through one), removed by close()
        self.scratch = tempfile.mkdtemp(prefix="podmarket-")
        self.api_key = API_KEY
        self.lock = threading.Lock()
        self.offers = [
            {
                **o,
                "gpu_count": 1,
                "memory_mib": MEMORY_MIB[o["gpu"]],
                "price": PRICES[o["gpu"]][0],
                "spot_price": PRICES[o["gpu"]][1],
                "stock": stock,
            }
            for o in OFFERS
        ]
        self.secrets: dict[str, str] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.balance = 100.0
        self.fail_after_create = False
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-podmarket", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    # ------------------------------------------------------------------ what a test reads or causes

    def spec(self, pod_id: str) -> BootstrapContainer:
        """The container a pod runs, as the marketplace holds it: image, command, env, its secrets resolved."""
        with self.lock:
            pod = self.pods[pod_id]
            return BootstrapContainer(
                image=pod["image"],
                command=pod["command"],
                env=pod["env"],
                secret_env={name: self.secrets[secret] for name, secret in pod["secret_env"].items()},
            )

    def instances(self) -> list[dict[str, Any]]:
        """Every pod the marketplace holds, as its API lists it (bypassing any plugin)."""
        self._refresh()
        with self.lock:
            return [_public(p) for p in self.pods.values()]

    def set_stock(self, stock: int) -> None:
        """Every offer's stock (0: every pod request answers 409, no stock)."""
        with self.lock:
            for offer in self.offers:
                offer["stock"] = stock

    def outbid(self, pod_id: str) -> None:
        self._end(pod_id, "outbid", "outbid: a higher bid took the GPU")

    def fail(self, pod_id: str) -> None:
        self._end(pod_id, "failed", "the host went offline")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            containers = [p["container"] for p in self.pods.values() if p.get("container")]
        for container in containers:
            self._remove(container)
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ------------------------------------------------------------------ the API

    def handle(self, method: str, path: str, query: dict[str, list[str]], key: str, body: Any) -> tuple[int, Any]:
        self.requests.append(f"{method} {path}")
        if key != self.api_key:
            return 401, {"error": "invalid_api_key", "message": "the API key is not valid"}
        parts = path.strip("/").split("/")
        if parts == ["v1", "offers"] and method == "GET":
            with self.lock:
                return 200, list(self.offers)
        if parts[:2] == ["v1", "secrets"] and len(parts) == 3:
            with self.lock:
                if method == "PUT":
                    self.secrets[parts[2]] = str(body["value"])
                    return 200, {"name": parts[2]}
                if method == "DELETE":
                    return (200, {}) if self.secrets.pop(parts[2], None) is not None else (404, {"error": "not_found"})
        if parts == ["v1", "pods"] and method == "GET":
            self._refresh()
            wanted = [tuple(v.split("=", 1)) for v in query.get("label", []) if "=" in v]
            with self.lock:
                return 200, [_public(p) for p in self.pods.values() if all(p["labels"].get(k) == v for k, v in wanted)]
        if parts == ["v1", "pods"] and method == "POST":
            return self._create(body)
        if parts[:2] == ["v1", "pods"] and len(parts) == 3 and method == "DELETE":
            return self._delete(parts[2])
        return 404, {"error": "not_found", "message": f"no {method} {path}"}

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self.lock:
            offer = next((o for o in self.offers if o["id"] == body.get("offer_id")), None)
            if offer is None or offer["datacenter"] != body.get("datacenter"):
                return 400, {"error": "bad_offer", "message": f"no offer {body.get('offer_id')} in that datacenter"}
            missing = sorted(set(body["secret_env"].values()) - set(self.secrets))
            if missing:
                return 400, {"error": "no_secret", "message": f"no secret named {', '.join(missing)}"}
            if self.balance <= 0:
                return 402, {"error": "insufficient_balance", "message": "the account's balance is $0.00"}
            if offer["stock"] <= 0:
                return 409, {"error": "no_stock", "message": f"{offer['id']} is out of stock"}
            offer["stock"] -= 1
            pod = {
                "id": f"pod-{uuid.uuid4().hex[:10]}",
                "offer_id": offer["id"],
                "gpu": offer["gpu"],
                "gpu_count": offer["gpu_count"],
                "datacenter": offer["datacenter"],
                "image": body["image"],
                "command": list(body["command"]),
                "env": dict(body["env"]),
                "secret_env": dict(body["secret_env"]),
                "ports": list(body.get("ports") or []),
                "labels": dict(body["labels"]),
                "spot": bool(body.get("spot")),
                "status": "running" if self.docker_host is None else "starting",
                "reason": None,
                "created": time.time(),
                "container": None,
            }
            self.pods[pod["id"]] = pod
            environment = {**pod["env"], **{n: self.secrets[s] for n, s in pod["secret_env"].items()}}
            failing, self.fail_after_create = self.fail_after_create, False
        if self.docker_host is not None:
            pod["container"] = self._run(pod, environment)
            pod["status"] = "running"
        if failing:
            return 500, {"error": "internal", "message": "the pod was scheduled, then the API failed"}
        return 200, _public(pod)

    def _delete(self, pod_id: str) -> tuple[int, Any]:
        with self.lock:
            pod = self.pods.get(pod_id)
            if pod is None:
                return 404, {"error": "not_found", "message": f"no pod {pod_id}"}
            container, pod["container"] = pod["container"], None
            if pod["status"] != "terminated":
                pod["status"] = "terminated"
                next(o for o in self.offers if o["id"] == pod["offer_id"])["stock"] += 1
        if container:
            self._remove(container)
        return 200, {}

    def _end(self, pod_id: str, status: str, reason: str) -> None:
        with self.lock:
            pod = self.pods[pod_id]
            pod.update(status=status, reason=reason)
            container, pod["container"] = pod["container"], None
        if container:
            self._remove(container)

    # ------------------------------------------------------------------ Docker

    def _docker(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.docker_host, timeout=60)

    def _nvidia_smi(self, pod: dict[str, Any]) -> str:
        """An ``nvidia-smi`` that prints the pod's GPUs as the real one does for the worker's query (no driver here)."""
        lines = nvidia_smi(CARDS[pod["gpu"]], pod["gpu_count"], machine=pod["id"])
        tool = f"{self.scratch}/{pod['id']}-nvidia-smi"
        with open(tool, "w") as out:
            out.write(
                f"#!/bin/sh\ncase \"$*\" in *--query-gpu=*) cat <<'EOF'\n{lines.rstrip()}\nEOF\nexit 0 ;; esac\nexit 2\n"
            )
        Path(tool).chmod(0o755)
        return tool

    def _run(self, pod: dict[str, Any], environment: dict[str, str]) -> str:
        client = self._docker()
        try:
            container = client.containers.run(
                pod["image"],
                pod["command"],
                name=f"podmarket-{pod['id']}",
                environment=environment,
                network_mode="host",
                volumes={self._nvidia_smi(pod): {"bind": "/usr/local/bin/nvidia-smi", "mode": "ro"}},
                labels={"podmarket.pod": pod["id"]},
                detach=True,
            )
            return str(container.id)
        finally:
            client.close()

    def _remove(self, container: str) -> None:
        client = self._docker()
        try:
            with contextlib.suppress(Exception):
                client.containers.get(container).remove(force=True)
        finally:
            client.close()

    def _refresh(self) -> None:
        """A pod whose container ended is ``exited``, as the marketplace would list it."""
        if self.docker_host is None:
            return
        with self.lock:
            running = [(p, p["container"]) for p in self.pods.values() if p["status"] == "running" and p["container"]]
        if not running:
            return
        client = self._docker()
        try:
            for pod, container in running:
                try:
                    state = client.containers.get(container).attrs["State"]
                except Exception:
                    continue
                if not state.get("Running"):
                    with self.lock:
                        pod.update(status="exited", reason=f"the container exited with code {state.get('ExitCode')}")
        finally:
            client.close()


def _public(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pod.items() if k != "container"}


def _handler(market: FakeMarket) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            status, answer = market.handle(method, url.path, parse_qs(url.query), key, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """A private dockerd for the session: pods' containers and the contract kit's boot run there."""
    with private_dockerd() as daemon:
        yield daemon.host


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODMARKET_API_KEY", API_KEY)


@pytest.fixture
def market() -> Iterator[FakeMarket]:
    """A fake marketplace whose pods are records only (the contract kit boots what they say)."""
    fake = FakeMarket()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def docker_market(docker_host: str) -> Iterator[FakeMarket]:
    """A fake marketplace that runs each pod as a container in ``docker_host``."""
    fake = FakeMarket(docker_host)
    try:
        yield fake
    finally:
        fake.close()
