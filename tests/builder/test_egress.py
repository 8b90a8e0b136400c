"""The build's egress proxy against the real kernel: a bridge, network namespaces, iptables, the real index.

Each test gets a bridge and /24 of its own, with network namespaces attached to it standing in for
build containers (the client runs in them with ``ip netns exec``); the fixture destroys the bridge
and checks that no host-guard rule, chain or namespace is left.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from levers9.builder.egress import EgressProxy
from levers9.builder.sources import DEFAULT_INDEX_HOSTS
from levers9.engine import host_guard
from levers9.engine.network import Attachment, Bridge

# Sends one raw request through the proxy and prints the first line it gets back (or how it failed).
CLIENT = r"""
import socket, sys
host, port, request = sys.argv[1], int(sys.argv[2]), sys.argv[3].replace("\\r\\n", "\r\n")
try:
    s = socket.create_connection((host, port), timeout=20)
    s.sendall(request.encode())
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    print(data.split(b"\r\n")[0].decode() or "closed")
except OSError as e:
    print(type(e).__name__)
"""

# Fetches a URL through the proxies the environment names, with this host's CA bundle.
FETCH = r"""
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=60).status)
"""


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[Bridge]:
    br = Bridge(
        name=f"l9e{secrets.token_hex(5)}",
        subnet=f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24",
        state_dir=tmp_path / "net",
    )
    try:
        yield br
    finally:
        br.destroy()
    listing = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
    assert br.name not in listing, f"iptables rules of {br.name} left behind"


@pytest.fixture
def attach(bridge: Bridge) -> Callable[[], Attachment]:
    def make() -> Attachment:
        return bridge.attach(f"egress-{secrets.token_hex(6)}")

    return make


async def ask(att: Attachment, host: str, port: int, request: str) -> str:
    """Send ``request`` from inside ``att``'s namespace to ``host:port``; the first line answered."""
    proc = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        att.netns_name,
        sys.executable,
        "-c",
        CLIENT,
        host,
        str(port),
        request,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode().strip()


async def fetch(att: Attachment, proxy: EgressProxy, url: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "http_proxy": proxy.url, "https_proxy": proxy.url}
    proc = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        att.netns_name,
        sys.executable,
        "-c",
        FETCH,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return out.decode().strip().splitlines()[-1]


def connect(host: str, port: int) -> str:
    return f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n"


async def test_it_refuses_loopback_and_the_host_and_lets_the_index_through(
    bridge: Bridge, attach: Callable[[], Attachment]
) -> None:
    with socket.create_server(("0.0.0.0", 0)) as listener:
        port = listener.getsockname()[1]
        allowed = {*DEFAULT_INDEX_HOSTS, ("deb.debian.org", 80)}  # what this machine's pip and apt name
        async with EgressProxy(bridge, allowed=allowed) as proxy:
            container = attach()
            await proxy.admit(container.ip)
            gw = bridge.gateway
            assert await ask(container, gw, proxy.port, connect("127.0.0.1", port)) == "HTTP/1.1 403 Forbidden"
            assert await ask(container, gw, proxy.port, connect("localhost", port)) == "HTTP/1.1 403 Forbidden"
            assert await ask(container, gw, proxy.port, connect(gw, port)) == "HTTP/1.1 403 Forbidden"
            link_local = "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\\r\\n\\r\\n"
            assert await ask(container, gw, proxy.port, link_local) == "HTTP/1.1 403 Forbidden"
            # the host's port itself, straight from the container, is refused by the host guard
            assert await ask(container, gw, port, "hello\\r\\n") == "ConnectionRefusedError"
            # the index (pip's default, resolving to a private address here) and the Debian mirror, over http
            assert (
                await ask(container, gw, proxy.port, connect("pypi.org", 443)) == "HTTP/1.1 200 Connection established"
            )
            assert await fetch(container, proxy, "https://pypi.org/simple/six/") == "200"
            release = (
                "GET http://deb.debian.org/debian/dists/bookworm/Release HTTP/1.1\\r\\nHost: deb.debian.org\\r\\n\\r\\n"
            )
            assert await ask(container, gw, proxy.port, release) == "HTTP/1.1 200 OK"
    reasons = [r.reason for r in proxy.refusals]
    assert "a loopback address" in reasons[0]
    assert "a loopback address" in reasons[1]
    assert "an address of the build machine itself" in reasons[2]
    assert "a link-local address" in reasons[3]
    assert all(r.client == container.ip for r in proxy.refusals)
    assert len(proxy.refusals) == 4


async def test_only_admitted_containers_get_through(bridge: Bridge, attach: Callable[[], Attachment]) -> None:
    async with EgressProxy(bridge, allowed=DEFAULT_INDEX_HOSTS) as proxy:
        admitted, stranger = attach(), attach()
        await proxy.admit(admitted.ip)
        gw, pypi = bridge.gateway, connect("pypi.org", 443)
        assert await ask(admitted, gw, proxy.port, pypi) == "HTTP/1.1 200 Connection established"
        assert await ask(stranger, gw, proxy.port, pypi) == "ConnectionRefusedError"  # the host guard
        # a stray rule letting it through the host guard does not make it a container of the build
        host_guard.allow(bridge.name, stranger.ip, gw, proxy.port)
        try:
            assert await ask(stranger, gw, proxy.port, pypi) in ("closed", "ConnectionResetError")
        finally:
            host_guard.disallow(bridge.name, stranger.ip, gw, proxy.port)
        assert proxy.refusals[-1].client == stranger.ip
        assert "not a container of this build" in proxy.refusals[-1].reason
        await proxy.forget(admitted.ip)
        assert await ask(admitted, gw, proxy.port, pypi) == "ConnectionRefusedError"
        assert host_guard.allowances(bridge.name) == []


async def test_hosts_the_configuration_names_may_be_private(bridge: Bridge, attach: Callable[[], Attachment]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        async with EgressProxy(bridge, allowed={("localhost", port)}) as proxy:
            container = attach()
            await proxy.admit(container.ip)
            gw = bridge.gateway
            assert (
                await ask(container, gw, proxy.port, connect("localhost", port))
                == "HTTP/1.1 200 Connection established"
            )
            # only that host and port: the same address under another name, or another port, is refused
            assert await ask(container, gw, proxy.port, connect("127.0.0.1", port)) == "HTTP/1.1 403 Forbidden"
            assert await ask(container, gw, proxy.port, connect("localhost", port + 1)) == "HTTP/1.1 403 Forbidden"


# Fetches one URL through the proxy over plain http, on a connection it would keep alive, reading slowly (as
# apt does, writing to disk) so the proxy still holds some of the answer when the server has sent it all.
WHOLE = r"""
import hashlib, http.client, sys, time
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=60)
conn.request("GET", sys.argv[3])
response = conn.getresponse()
body = b""
while chunk := response.read(65536):
    body += chunk
    time.sleep(0.005)
print(response.status, len(body), hashlib.sha256(body).hexdigest(), response.getheader("Connection"))
"""


async def test_a_plain_http_answer_arrives_whole_and_closes_its_connection(
    bridge: Bridge, attach: Callable[[], Attachment], tmp_path: Path
) -> None:
    payload = secrets.token_bytes(8 << 20)
    (tmp_path / "big").write_bytes(payload)
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 30)).decode()
        port = int(line.split(" port ")[1].split()[0])
        async with EgressProxy(bridge, allowed={("localhost", port)}) as proxy:
            container = attach()
            await proxy.admit(container.ip)
            for _ in range(3):
                proc = await asyncio.create_subprocess_exec(
                    "ip",
                    "netns",
                    "exec",
                    container.netns_name,
                    sys.executable,
                    "-c",
                    WHOLE,
                    bridge.gateway,
                    str(proxy.port),
                    f"http://localhost:{port}/big",
                    stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await asyncio.wait_for(proc.communicate(), 120)
                expected = f"200 {len(payload)} {hashlib.sha256(payload).hexdigest()} close"
                assert out.decode().strip() == expected
    finally:
        server.terminate()
        await server.wait()


async def test_closing_it_leaves_nothing(bridge: Bridge, attach: Callable[[], Attachment]) -> None:
    proxy = EgressProxy(bridge, allowed=DEFAULT_INDEX_HOSTS)
    await proxy.start()
    container = attach()
    await proxy.admit(container.ip)
    gw, port = bridge.gateway, proxy.port
    # a tunnel left open by its client is ended by close()
    reader, writer = await asyncio.open_connection(gw, port)  # from the host: not admitted, closed at once
    assert await reader.read() == b""
    writer.close()
    hold = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        container.netns_name,
        sys.executable,
        "-c",
        "import socket, sys, time; s = socket.create_connection(sys.argv[1:3] and (sys.argv[1], int(sys.argv[2])));"
        "s.sendall(b'CONNECT pypi.org:443 HTTP/1.1\\r\\n\\r\\n'); print(s.recv(100).split(b'\\r\\n')[0].decode(), flush=True);"
        "print(repr(s.recv(100)), flush=True)",
        gw,
        str(port),
        stdout=asyncio.subprocess.PIPE,
    )
    assert hold.stdout is not None
    assert (await asyncio.wait_for(hold.stdout.readline(), 60)).strip() == b"HTTP/1.1 200 Connection established"
    assert proxy.connections == 1
    await proxy.close()
    assert (await asyncio.wait_for(hold.stdout.readline(), 60)).strip() == b"b''", "the tunnel was ended"
    await hold.wait()
    assert proxy.connections == 0
    assert host_guard.allowances(bridge.name) == []
    with pytest.raises(ConnectionRefusedError):  # nothing listens there any more (the host guard lets the host in)
        socket.create_connection((gw, port), timeout=10).close()


async def test_a_proxy_sweeps_the_rules_a_killed_workers_proxy_left(
    bridge: Bridge, attach: Callable[[], Attachment]
) -> None:
    """A worker SIGKILLed during a build leaves its allowance; the next proxy on the bridge removes it, and
    leaves alone the rules of a proxy that still listens (another worker's build running meanwhile)."""
    running = EgressProxy(bridge, allowed=DEFAULT_INDEX_HOSTS)
    await running.start()
    live, dead = attach(), attach()
    await running.admit(live.ip)
    # what a killed worker's proxy leaves: a rule for a port nothing listens on any more
    gone = socket.socket()
    gone.bind((bridge.gateway, 0))
    dead_port = gone.getsockname()[1]
    gone.close()
    host_guard.allow(bridge.name, dead.ip, bridge.gateway, dead_port)
    assert len(host_guard.allowances(bridge.name)) == 2

    proxy = EgressProxy(bridge, allowed=DEFAULT_INDEX_HOSTS)
    await proxy.start()
    try:
        left = host_guard.allowances(bridge.name)
        assert len(left) == 1
        assert f"{live.ip}/32" in left[0]
        assert f"--dport {running.port} " in left[0]
    finally:
        await proxy.close()
        await running.close()
    assert host_guard.allowances(bridge.name) == []
