"""TLS on every listener of a real ``levers9 server`` process, certificate renewal, and the plain-text rule.

The certificates come from a CA each test makes (tests/fixtures/tls.py). The
server runs as a subprocess with its own levers9 home (SQLite, the embedded
Redis); every process a test starts is stopped, and checked gone, at its end.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509

from levers9.config.model import TlsConfig
from levers9.controlplane.server import Listeners
from levers9.controlplane.tls import ListenerTls, TlsError, check_plaintext, is_loopback
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from tests.fixtures.levers9_up import free_port
from tests.fixtures.tls import TestCA

BASE_CONFIG = """\
version: 1
scheduler:
  worker_keepalive_s: 3
  reconcile_interval_s: 5
listen:
{listen}
"""


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in seen:
            found.append(int(entry.name))
    return found


@dataclass
class ServerProcess:
    """A ``levers9 server`` with its own home under ``root``; ``listen`` is the config's listen block."""

    root: Path
    listen: str = ""
    pools: str = ""
    #: ``server``, or ``up`` (which also stops the local workers it started when it stops)
    command: str = "server"
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_file: Path | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
        env.update(LEVERS9_HOME=str(self.home), XDG_STATE_HOME=str(self.root / "state"), PYTHONUNBUFFERED="1")
        return env

    def write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        ports = f"  grpc_port: {self.grpc_port}\n  http_port: {self.http_port}\n  metrics_port: {self.metrics_port}\n"
        text = BASE_CONFIG.format(listen=ports + self.listen) + self.pools
        (self.home / "levers9.yaml").write_text(text)

    def token(self) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "levers9", "token", "create"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def launch(self, *args: str) -> None:
        self.write_config()
        self.log_file = self.root / f"server-{time.monotonic_ns()}.log"
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "levers9", self.command, "--log-level", "info", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file else ""

    def start(self, *args: str) -> None:
        """Launch and wait until every listener is open."""
        self.launch(*args)
        deadline = time.monotonic() + 90
        while "levers9 controlplane listening" not in self.log():
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"levers9 server exited with {self.process.returncode}:\n{self.log()[-5000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"levers9 server did not open its listeners:\n{self.log()[-5000:]}")
            time.sleep(0.1)

    def fails_to_start(self, *args: str) -> str:
        """Launch, expecting the server to exit 1 by itself; its output."""
        self.launch(*args)
        assert self.process is not None
        try:
            code = self.process.wait(90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"levers9 server kept running:\n{self.log()[-5000:]}")
        assert code == 1, self.log()
        return self.log()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            pytest.fail(f"levers9 server did not stop within 60 s of SIGTERM:\n{self.log()[-5000:]}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path)
    try:
        yield proc
    finally:
        proc.stop()
        deadline = time.monotonic() + 15
        while _processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = _processes_mentioning(str(tmp_path))
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left running after levers9 server stopped: {left}"


@dataclass
class Pki:
    """A CA, the server's certificate files it signed, and the listen block that serves them."""

    ca: TestCA
    ca_file: Path
    cert_file: Path
    key_file: Path
    serial: int

    def listen(self, *, ca: bool = True) -> str:
        lines = f"  tls:\n    cert_file: {self.cert_file}\n    key_file: {self.key_file}\n"
        return lines + (f"    ca_file: {self.ca_file}\n" if ca else "")

    def trust(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "tls"
    directory.mkdir()
    ca = TestCA()
    issued = ca.issue()
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    issued.write(cert_file, key_file)
    return Pki(ca, ca.write(directory / "ca.pem"), cert_file, key_file, issued.serial)


def served_serial(port: int, ca_file: Path, alpn: str) -> int:
    """The serial of the certificate a new TLS connection to ``port`` is shown (verified against the CA)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def who_am_i(channel: grpc.aio.Channel, token: str) -> controlplane_pb2.WhoAmIResponse:
    stub = controlplane_pb2_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
    response: controlplane_pb2.WhoAmIResponse = await stub.WhoAmI(
        controlplane_pb2.WhoAmIRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=20
    )
    return response


# every listener over TLS


async def test_grpc_serves_tls_to_clients_trusting_the_ca_only(server: ServerProcess, pki: Pki) -> None:
    server.listen = pki.listen()
    token = server.token()
    server.start()
    target = f"localhost:{server.grpc_port}"

    async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(pki.ca.pem)) as channel:
        assert (await who_am_i(channel, token)).workspace_name == "default"

    other = TestCA("another CA")
    async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(other.pem)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as untrusted:
            await who_am_i(channel, token)
    assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "certificate" in (untrusted.value.details() or "").lower(), untrusted.value.details()

    async with grpc.aio.insecure_channel(target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await who_am_i(channel, token)
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    assert served_serial(server.grpc_port, pki.ca_file, "h2") == pki.serial
    assert "over TLS" in server.log()


async def test_http_gateway_and_metrics_serve_tls_only(server: ServerProcess, pki: Pki) -> None:
    server.listen = pki.listen()
    server.start()
    base = f"https://localhost:{server.http_port}"
    async with httpx.AsyncClient(verify=pki.trust(), timeout=20) as client:
        health = await client.get(f"{base}/api/v1/health")
        assert health.status_code == 200, health.text
        assert health.json()["database"] == "ok"
        gateway = await client.get(f"{base}/endpoint/@default/no-such-endpoint")
        assert gateway.status_code == 404, gateway.text  # answered by the gateway, over TLS
        metrics = await client.get(f"https://localhost:{server.metrics_port}/metrics")
        assert metrics.status_code == 200
        assert "levers9_" in metrics.text

    other = ssl.create_default_context(cadata=TestCA("another CA").pem.decode())
    async with httpx.AsyncClient(verify=other, timeout=20) as c:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await c.get(f"{base}/api/v1/health")
    async with httpx.AsyncClient(timeout=20) as plain:
        for port in (server.http_port, server.metrics_port):
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{port}/api/v1/health")
    for port in (server.http_port, server.metrics_port):
        assert served_serial(port, pki.ca_file, "http/1.1") == pki.serial


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(server: ServerProcess, pki: Pki) -> None:
    server.listen = pki.listen()
    server.start()
    ports = {
        "gRPC": (server.grpc_port, "h2"),
        "HTTP": (server.http_port, "http/1.1"),
        "metrics": (server.metrics_port, "http/1.1"),
    }
    for port, alpn in ports.values():
        assert served_serial(port, pki.ca_file, alpn) == pki.serial

    renewed = pki.ca.issue()
    renewed.write(pki.cert_file, pki.key_file)
    for name, (port, alpn) in ports.items():
        deadline = time.monotonic() + 60
        while (seen := served_serial(port, pki.ca_file, alpn)) != renewed.serial:
            assert seen == pki.serial  # the old one until the new one: never anything else
            if time.monotonic() > deadline:
                pytest.fail(f"the {name} listener still serves serial {seen:x}:\n{server.log()[-3000:]}")
            time.sleep(0.2)
    assert server.process is not None
    assert server.process.poll() is None
    assert "TLS certificate reloaded" in server.log()


# start-up checks


def test_plain_text_on_every_interface_is_refused_without_tls_or_plaintext(server: ServerProcess) -> None:
    server.listen = "  host: 0.0.0.0\n"
    out = server.fails_to_start()
    assert "listen.host is 0.0.0.0" in out
    assert "listen.tls is not set" in out
    assert "listen.plaintext: true" in out
    assert "in clear" in out


def test_the_host_option_counts_for_the_plain_text_rule(server: ServerProcess) -> None:
    out = server.fails_to_start("--host", "::")
    assert "listen.host is ::" in out
    assert "listen.plaintext" in out


def test_plaintext_true_allows_plain_text_on_every_interface(server: ServerProcess) -> None:
    server.listen = "  host: 0.0.0.0\n  plaintext: true\n"
    server.start()
    health = httpx.get(f"http://127.0.0.1:{server.http_port}/api/v1/health", timeout=20)
    assert health.status_code == 200


def test_tls_on_every_interface_needs_no_plaintext(server: ServerProcess, pki: Pki) -> None:
    server.listen = "  host: 0.0.0.0\n" + pki.listen()
    server.start()
    assert served_serial(server.http_port, pki.ca_file, "http/1.1") == pki.serial


def test_a_missing_certificate_fails_start_naming_the_key(server: ServerProcess, pki: Pki) -> None:
    pki.cert_file.unlink()
    server.listen = pki.listen()
    out = server.fails_to_start()
    assert f"listen.tls.cert_file: {pki.cert_file} does not exist" in out


def test_a_key_of_another_certificate_fails_start_naming_the_key(server: ServerProcess, pki: Pki) -> None:
    other = pki.ca.issue()
    pki.key_file.write_bytes(other.key_pem)
    server.listen = pki.listen()
    out = server.fails_to_start()
    assert f"listen.tls.key_file: {pki.key_file} does not match the certificate in listen.tls.cert_file" in out


def test_a_file_that_is_not_pem_fails_start_naming_the_key(server: ServerProcess, pki: Pki) -> None:
    pki.cert_file.write_text("not a certificate\n")
    server.listen = pki.listen()
    out = server.fails_to_start()
    assert f"listen.tls.cert_file: {pki.cert_file} is not a PEM certificate chain" in out


# the reload logic, in process


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _config(pki: Pki) -> TlsConfig:
    return TlsConfig(cert_file=str(pki.cert_file), key_file=str(pki.key_file), ca_file=str(pki.ca_file))


def test_refresh_rereads_only_changed_files_and_keeps_the_old_pair_when_the_new_one_does_not_load(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    tls = ListenerTls(_config(pki), clock=clock)
    assert tls.ca_pem == pki.ca.pem.decode()
    first = tls.pair
    clock.now += 5
    assert tls.refresh() is first  # unchanged files: not read again

    renewed, stranger = pki.ca.issue(), pki.ca.issue()
    pki.cert_file.write_bytes(renewed.cert_pem)
    pki.key_file.write_bytes(stranger.key_pem)  # half a renewal: the key is another certificate's
    clock.now += 5
    with caplog.at_level(logging.WARNING, logger="levers9.controlplane.tls"):
        assert tls.refresh() is first
    assert f"listen.tls.key_file: {pki.key_file} does not match" in caplog.text
    assert f"still serving serial {first.serial:x}" in caplog.text

    pki.key_file.write_bytes(renewed.key_pem + b"\n")  # the rest of the renewal (a different size)
    assert tls.refresh() is first  # looked at most once a second
    clock.now += 5
    assert tls.refresh().serial == renewed.serial


def test_the_grpc_fetcher_hands_over_each_new_pair_once(pki: Pki) -> None:
    clock = Clock()
    tls = ListenerTls(_config(pki), clock=clock)
    tls.grpc_credentials()
    assert tls._fetch() is None  # gRPC already has the first pair
    pki.ca.issue().write(pki.cert_file, pki.key_file)
    clock.now += 5
    assert isinstance(tls._fetch(), grpc.ServerCertificateConfiguration)
    clock.now += 5
    assert tls._fetch() is None


def test_a_key_readable_by_others_is_served_with_a_warning(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    pki.key_file.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="levers9.controlplane.tls"):
        ListenerTls(_config(pki))
    assert f"listen.tls.key_file: {pki.key_file} can be read by group or others (mode 0644)" in caplog.text


def test_an_encrypted_key_is_refused_naming_the_key(pki: Pki) -> None:
    pki.key_file.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(TlsError, match=r"listen\.tls\.key_file: .* is encrypted"):
        ListenerTls(_config(pki))


def test_a_ca_file_that_is_not_pem_is_refused_naming_the_key(pki: Pki) -> None:
    pki.ca_file.write_text("nope")
    with pytest.raises(TlsError, match=r"listen\.tls\.ca_file: .* is not a PEM CA bundle"):
        ListenerTls(_config(pki))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts_stay_plain_text(host: str) -> None:
    assert is_loopback(host)
    check_plaintext(host, None, False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "cp.example.com"])
def test_other_hosts_need_tls_or_plaintext(host: str, pki: Pki) -> None:
    assert not is_loopback(host)
    with pytest.raises(TlsError, match=r"listen\.tls is not set.*listen\.plaintext: true"):
        check_plaintext(host, None, False)
    check_plaintext(host, None, True)
    check_plaintext(host, _config(pki), False)


def test_the_advertised_address_follows_advertise_then_the_environment_then_tls(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEVERS9_ADVERTISE_URL", raising=False)
    plain = Listeners("127.0.0.1", 1993, 1994, 9090)
    secure = Listeners("127.0.0.1", 1993, 1994, 9090, tls=_config(pki))
    assert plain.advertised_grpc() == "grpc://127.0.0.1:1993"
    assert secure.advertised_grpc() == "grpcs://127.0.0.1:1993"
    assert Listeners("::1", 1993, 1994, 9090, tls=_config(pki)).advertised_grpc() == "grpcs://[::1]:1993"
    monkeypatch.setenv("LEVERS9_ADVERTISE_URL", "grpcs://lb.example.com:443")
    assert secure.advertised_grpc() == "grpcs://lb.example.com:443"
    both = Listeners("0.0.0.0", 1993, 1994, 9090, tls=_config(pki), advertise=("grpcs://a:1993", "grpcs://b:1993"))
    assert both.advertised_grpc() == "grpcs://a:1993,grpcs://b:1993"


def test_the_http_address_follows_advertise_http_then_the_first_grpc_address(pki: Pki) -> None:
    """Built images are named by the HTTP address: behind an ingress it is not the gRPC host's with http_port."""
    from levers9.config.model import ListenConfig

    both = Listeners("0.0.0.0", 1993, 1994, 9090, tls=_config(pki), advertise=("grpcs://a:1993", "grpcs://b:1993"))
    assert both.advertised_http() == "https://a:1994"
    assert Listeners("127.0.0.1", 1993, 1994, 9090).advertised_http() == "http://127.0.0.1:1994"
    listen = ListenConfig(advertise_http="https://levers9.example.com/")
    assert listen.advertise_http == "https://levers9.example.com"
    behind = Listeners(
        "0.0.0.0",
        1993,
        1994,
        9090,
        tls=_config(pki),
        advertise=("grpcs://a:1993",),
        advertise_http=listen.advertise_http,
    )
    assert behind.advertised_http() == "https://levers9.example.com"
    for bad in ("levers9.example.com", "ftp://x", "https://x/v2", "https://x:99999", "https://"):
        with pytest.raises(ValueError, match=r"advertise_http[\s\S]*accepted: http\(s\)://host\[:port\]"):
            ListenConfig(advertise_http=bad)


# end to end: a local worker and the SDK over TLS

LOCAL_POOL = """\
pools:
  local:
    provider: local
    runtime: process
    workspace: default
    cpu: 2
    memory: 4096
    min_workers: 1
    max_workers: 1
    settings:
      stop_grace_s: 5
"""


def _worker_environments(root: Path) -> list[dict[str, str]]:
    found = []
    for pid in _processes_mentioning(str(root)):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("LEVERS9_MACHINE_ID"):
            found.append(env)
    return found


@pytest.mark.timeout(600)
def test_a_local_worker_and_the_sdk_verify_the_controlplane_with_the_configured_ca(
    server: ServerProcess, pki: Pki
) -> None:
    server.command = "up"  # stops its local workers when it stops, as `levers9 server` leaves them running
    server.listen = pki.listen(ca=True)
    server.pools = LOCAL_POOL
    token = server.token()
    server.start()
    headers = {"authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 120
    while True:  # the worker registers over gRPC with TLS, trusting only the CA it was handed
        workers = httpx.get(
            f"https://127.0.0.1:{server.http_port}/api/v1/workers", headers=headers, verify=pki.trust(), timeout=20
        ).json()
        items = workers["workers"] if isinstance(workers, dict) else workers
        if items:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"no worker registered over TLS:\n{server.log()[-5000:]}")
        time.sleep(0.5)
    context = (server.home / "config").read_text()  # what `up` wrote for the SDK and the CLI
    assert f"grpcs://127.0.0.1:{server.grpc_port}" in context
    assert f"ca_file: {pki.ca_file}" in context
    [env] = _worker_environments(server.root)
    assert env["LEVERS9_CONTROLPLANE_CA"].strip() == pki.ca.pem.decode().strip()
    assert env["LEVERS9_CONTROLPLANE_URL"] == f"grpcs://127.0.0.1:{server.grpc_port}"

    program = server.root / "app.py"
    program.write_text(
        "import os, levers9\n"
        "@levers9.function(cpu=0.25, memory=128)\n"
        "def square(x):\n"
        "    return x * x, os.getpid()\n"
        "value, pid = square.remote(7)\n"
        "print('RESULT', value, pid != os.getpid())\n"
    )
    env = dict(
        server.env,
        LEVERS9_GRPC=f"grpcs://127.0.0.1:{server.grpc_port}",
        LEVERS9_TOKEN=token,
        LEVERS9_CA_FILE=str(pki.ca_file),
    )
    done = subprocess.run(
        [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=300, cwd=server.root
    )
    assert done.returncode == 0, done.stderr + server.log()[-3000:]
    assert "RESULT 49 True" in done.stdout
