"""Container networking against the real kernel: namespaces, veths and a bridge made with ``ip``.

Each test gets a bridge and a /24 of its own (claimed in a shared directory, so parallel workers
and parallel runs never pick the same one) and container ids that no other run uses, and its
fixture destroys the bridge and checks that no namespace or interface of the test is left,
whether the test passed or not. Traffic only ever goes to addresses these tests created.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from levers9.engine import host_guard
from levers9.engine.network import (
    Attachment,
    Bridge,
    NetworkError,
    PortForward,
    bridge_mac,
    forwarder_command,
    netns_name,
    veth_name,
)

# Serves on an ephemeral port of the namespace it runs in, prints the port, and echoes every
# connection until the client's EOF, then half-closes its side: the test for half-close handling.
ECHO_SERVER = """
import socket, sys, threading
def serve(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# Sends its payload, half-closes, and prints everything it reads until EOF.
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
    s.sendall(sys.argv[3].encode())
    s.shutdown(socket.SHUT_WR)
    chunks = []
    while data := s.recv(65536):
        chunks.append(data)
sys.stdout.write(b"".join(chunks).decode())
"""

# Tries one TCP connection and says how it went: connected, refused, timed out, or failed with an errno.
PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
s = socket.socket(family, kind, proto)
s.settimeout(5)
try:
    s.connect(address)
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timed out")
except OSError as exc:
    print("failed", exc.errno)
else:
    print("connected")
"""

SUBNET_POOL = ipaddress.IPv4Network("10.210.0.0/16")
CLAIMS = Path(tempfile.gettempdir()) / "levers9-test-subnets"


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=60)


def netns_list() -> set[str]:
    return {line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name).returncode == 0


def addresses_in(ns: str) -> set[str]:
    links = json.loads(ip("-n", ns, "-j", "-4", "addr", "show", "dev", "eth0").stdout or "[]")
    return {f"{a['local']}/{a['prefixlen']}" for link in links for a in link["addr_info"]}


def in_use_networks() -> list[ipaddress.IPv4Network]:
    links = json.loads(ip("-j", "-4", "addr", "show").stdout or "[]")
    return [
        ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
        for link in links
        for a in link["addr_info"]
    ]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture
def subnet() -> Iterator[str]:
    """A /24 of 10.210.0.0/16 that no other live test process holds and no interface uses."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    candidates = list(SUBNET_POOL.subnets(new_prefix=24))
    secrets.SystemRandom().shuffle(candidates)
    used = in_use_networks()
    for candidate in candidates:
        if any(candidate.overlaps(net) for net in used):
            continue
        claim = CLAIMS / str(candidate.network_address)
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with contextlib.suppress(OSError, ValueError):
                if not pid_alive(int(claim.read_text())):
                    claim.unlink()  # left by a run that died; the next test may take it
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        try:
            yield str(candidate)
        finally:
            claim.unlink(missing_ok=True)
        return
    pytest.fail(f"no free /24 left in {SUBNET_POOL}; see {CLAIMS}")


@pytest.fixture
def new_id() -> Iterator[Callable[[str], str]]:
    """Container ids unique to this test run, remembered so teardown can check what they left behind."""
    made: list[str] = []
    run = secrets.token_hex(6)

    def make(name: str) -> str:
        made.append(f"l9test-{run}-{name}")
        return made[-1]

    yield make
    # Runs after the bridge fixture's teardown (it depends on this one), so this sees the final state.
    leftovers = [netns_name(cid) for cid in made if netns_name(cid) in netns_list()]
    leftovers += [veth_name(cid) for cid in made if link_exists(veth_name(cid))]
    assert not leftovers, f"left behind: {leftovers}"


@pytest.fixture
def bridge(tmp_path: Path, subnet: str, new_id: Callable[[str], str]) -> Iterator[Bridge]:
    br = Bridge(name=f"l9t{secrets.token_hex(5)}", subnet=subnet, state_dir=tmp_path / "net")
    try:
        br.ensure()
        yield br
    finally:
        br.destroy()
        assert not link_exists(br.name), f"bridge {br.name} left behind"
        assert not chain_exists(host_guard.chain_name(br.name)), f"iptables chain of {br.name} left behind"


def chain_exists(chain: str) -> bool:
    return subprocess.run(["iptables", "-w", "-S", chain], capture_output=True, check=False).returncode == 0


def input_jumps(bridge: str) -> int:
    listing = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
    return listing.splitlines().count(f"-A INPUT -i {bridge} -j {host_guard.chain_name(bridge)}")


def probe_from(ns: str, host: str, port: int) -> str:
    done = ip("netns", "exec", ns, sys.executable, "-c", PROBE, host, str(port))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def host_addresses(exclude: str) -> list[str]:
    """Every address of the host but loopback and the bridge's own (those the container might aim at)."""
    found = []
    for family in ("-4", "-6"):
        for link in json.loads(ip("-j", family, "addr", "show").stdout or "[]"):
            if link.get("ifname") in ("lo", exclude):
                continue
            for a in link.get("addr_info", []):
                if not a["local"].startswith("fe80:"):
                    found.append(a["local"])
    return found


def link_local(mac: str) -> str:
    """The IPv6 link-local address the kernel derives from a MAC (EUI-64)."""
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    return "fe80::" + ":".join(f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2))


@contextlib.contextmanager
def echo_server(attachment: Attachment) -> Iterator[int]:
    """An echo server inside the container's namespace, listening on its address; yields the port."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", attachment.netns_name, sys.executable, "-c", ECHO_SERVER, attachment.ip],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip():
            proc.kill()
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"echo server in {attachment.netns_name} did not start: {err}")
        yield int(line)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def client_in(ns: str, host: str, port: int, payload: str) -> str:
    """Run the client inside a namespace and return what it read back."""
    done = ip("netns", "exec", ns, sys.executable, "-c", CLIENT, host, str(port), payload)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_containers_reach_each_other_and_the_host_reaches_them(
    bridge: Bridge, new_id: Callable[[str], str]
) -> None:
    a = bridge.attach(new_id("a"))
    b = bridge.attach(new_id("b"))

    assert a.ip != b.ip
    assert a.gateway == b.gateway == str(bridge.network.network_address + 1)
    for att in (a, b):
        assert ipaddress.IPv4Address(att.ip) in bridge.network
        assert att.prefix_len == 24
        assert att.netns_path == f"/var/run/netns/{att.netns_name}"
        assert Path(att.netns_path).exists()
        assert att.netns_name in netns_list()
        assert addresses_in(att.netns_name) == {f"{att.ip}/24"}
        routes = json.loads(ip("-n", att.netns_name, "-j", "route", "show", "default").stdout)
        assert [r["gateway"] for r in routes] == [att.gateway]
        veth = json.loads(ip("-j", "link", "show", "dev", att.veth_host).stdout)[0]
        assert veth["master"] == bridge.name
        assert len(att.veth_host) <= 15

    with echo_server(a) as port:
        assert client_in(b.netns_name, a.ip, port, "from b to a") == "from b to a"
        # The host reaches a container directly through the bridge's route.
        with socket.create_connection((a.ip, port), timeout=30) as s:
            s.sendall(b"from host")
            s.shutdown(socket.SHUT_WR)
            assert s.makefile("rb").read() == b"from host"


def test_a_container_cannot_open_a_connection_to_the_host(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    """Services the host listens on at 0.0.0.0 and :: are closed to containers: at the gateway, at any other
    address of the host, and over IPv6 (the bridge has none); the host still reaches the container."""
    att = bridge.attach(new_id("a"))
    v4 = socket.create_server(("0.0.0.0", 0))
    v6 = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) if socket.has_ipv6 else None
    try:
        mac = json.loads(ip("-j", "link", "show", "dev", bridge.name).stdout)[0]["address"]
        targets = [(bridge.gateway, v4), *[(a, v4 if ":" not in a else v6) for a in host_addresses(bridge.name)]]
        if v6 is not None:
            targets.append((f"{link_local(mac)}%eth0", v6))
        outcomes = {}
        for host, server in targets:
            assert server is not None
            outcomes[host] = probe_from(att.netns_name, host, server.getsockname()[1])
        assert all(result != "connected" for result in outcomes.values()), outcomes
        assert outcomes[bridge.gateway] == "refused"  # answered with a reset, not left to time out
        for server in (v4, v6):
            if server is not None:
                server.setblocking(False)
                with pytest.raises(BlockingIOError):
                    server.accept()  # nothing ever reached the listener
        assert Path(f"/proc/sys/net/ipv6/conf/{bridge.name}/disable_ipv6").read_text().strip() == "1"
    finally:
        v4.close()
        if v6 is not None:
            v6.close()
    with echo_server(att) as port, socket.create_connection((att.ip, port), timeout=30) as s:
        s.sendall(b"the host still gets in")
        s.shutdown(socket.SHUT_WR)
        assert s.makefile("rb").read() == b"the host still gets in"


def test_the_host_guard_is_repaired_by_ensure_and_removed_with_the_bridge(
    bridge: Bridge, new_id: Callable[[str], str]
) -> None:
    chain = host_guard.chain_name(bridge.name)
    assert host_guard.is_guarded(bridge.name)
    assert input_jumps(bridge.name) == 1
    subprocess.run(["iptables", "-w", "-D", "INPUT", "-i", bridge.name, "-j", chain], check=True)
    subprocess.run(["iptables", "-w", "-F", chain], check=True)
    assert not host_guard.is_guarded(bridge.name)
    bridge.ensure()
    assert host_guard.is_guarded(bridge.name)
    assert input_jumps(bridge.name) == 1
    bridge.ensure()
    assert input_jumps(bridge.name) == 1  # checked, not added twice
    att = bridge.attach(new_id("a"))
    with socket.create_server(("0.0.0.0", 0)) as server:
        assert probe_from(att.netns_name, bridge.gateway, server.getsockname()[1]) == "refused"
    bridge.destroy()
    assert not chain_exists(chain)
    assert input_jumps(bridge.name) == 0


def test_without_iptables_no_container_is_attached(
    tmp_path: Path, subnet: str, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    ip_binary = subprocess.run(["sh", "-c", "command -v ip"], capture_output=True, text=True, check=True).stdout
    (empty / "ip").symlink_to(ip_binary.strip())
    br = Bridge(name=f"l9t{secrets.token_hex(5)}", subnet=subnet, state_dir=tmp_path / "net")
    cid = new_id("a")
    try:
        with monkeypatch.context() as patched:
            patched.setenv("PATH", str(empty))
            patched.setattr(host_guard, "FALLBACK_PATHS", ())
            with pytest.raises(NetworkError, match=r"iptables is not installed.*apt-get install -y iptables"):
                br.attach(cid)
        assert netns_name(cid) not in netns_list()
        assert not link_exists(veth_name(cid))
    finally:
        br.destroy()


def test_attach_is_idempotent_and_detach_releases_everything(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    cid = new_id("x")
    first = bridge.attach(cid)
    assert bridge.attach(cid) == first
    assert bridge.attachments() == [first]

    bridge.detach(cid)
    assert first.netns_name not in netns_list()
    assert not Path(first.netns_path).exists()
    assert not link_exists(first.veth_host)
    assert bridge.attachments() == []
    bridge.detach(cid)  # nothing left to do is not an error
    bridge.detach(new_id("never-attached"))

    again = bridge.attach(cid)
    assert again.netns_name in netns_list()
    assert addresses_in(again.netns_name) == {f"{again.ip}/24"}


def test_the_bridge_keeps_its_own_mac_when_ports_come_and_go(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    """A bridge left to itself takes the lowest MAC of its ports; losing that port changed it under the other
    containers, whose packets to the gateway went nowhere until their neighbour entry went stale."""
    first, second = bridge.attach(new_id("m1")), bridge.attach(new_id("m2"))
    sysfs = Path("/sys/class/net") / bridge.name
    assert (sysfs / "address").read_text().strip() == bridge_mac(bridge.name)
    assert (sysfs / "addr_assign_type").read_text().strip() == "3"  # NET_ADDR_SET: ports do not change it
    bridge.detach(first.container_id)
    bridge.detach(second.container_id)
    assert (sysfs / "address").read_text().strip() == bridge_mac(bridge.name)
    bridge.ensure()
    assert (sysfs / "address").read_text().strip() == bridge_mac(bridge.name)


def test_an_address_given_again_has_no_neighbour_entry_of_the_container_before(
    bridge: Bridge, new_id: Callable[[str], str]
) -> None:
    """The host's entry for a removed container's address names its MAC: a new container given that address
    was unreachable from the host until the entry timed out (tens of seconds)."""
    bridge.attach(new_id("n0"))  # the bridge keeps a port, so it keeps its carrier (losing it flushes the table)
    old = bridge.attach(new_id("n1"))
    old_mac = "02:00:00:00:00:01"
    subprocess.run(
        ["ip", "neigh", "replace", old.ip, "lladdr", old_mac, "dev", bridge.name, "nud", "reachable"], check=True
    )
    bridge.detach(old.container_id)
    new = bridge.attach(new_id("n2"))
    assert new.ip == old.ip
    entry = subprocess.run(
        ["ip", "neigh", "show", "to", new.ip, "dev", bridge.name], capture_output=True, text=True, check=True
    ).stdout
    assert old_mac not in entry


def test_detached_addresses_are_reused_and_never_shared(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    a = bridge.attach(new_id("a"))
    b = bridge.attach(new_id("b"))
    bridge.detach(a.container_id)
    c = bridge.attach(new_id("c"))
    assert c.ip == a.ip
    assert c.ip != b.ip
    assert {x.container_id for x in bridge.attachments()} == {b.container_id, c.container_id}


def test_attach_repairs_what_a_crash_left_half_done(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    """A record whose veth vanished (a crash mid-attach) is wired again with the address it had."""
    att = bridge.attach(new_id("a"))
    assert ip("link", "del", "dev", att.veth_host).returncode == 0

    repaired = bridge.attach(att.container_id)
    assert repaired == att
    assert link_exists(att.veth_host)
    assert addresses_in(att.netns_name) == {f"{att.ip}/24"}


def test_concurrent_attaches_get_distinct_addresses(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    ids = [new_id(f"c{i}") for i in range(20)]
    start = threading.Barrier(len(ids))

    def attach(cid: str) -> Attachment:
        # A Bridge object per thread, like separate worker processes sharing one state directory.
        mine = Bridge(bridge.name, str(bridge.network), bridge.state_dir)
        start.wait()
        return mine.attach(cid)

    with ThreadPoolExecutor(len(ids)) as pool:
        attached = list(pool.map(attach, ids))

    ips = [a.ip for a in attached]
    assert len(set(ips)) == len(ids)
    assert bridge.gateway not in ips
    assert sorted(bridge.attachments(), key=lambda a: a.container_id) == sorted(attached, key=lambda a: a.container_id)
    for att in attached:
        assert addresses_in(att.netns_name) == {f"{att.ip}/24"}

    def detach(cid: str) -> None:
        Bridge(bridge.name, str(bridge.network), bridge.state_dir).detach(cid)

    with ThreadPoolExecutor(len(ids)) as pool:
        list(pool.map(detach, ids))
    assert bridge.attachments() == []
    assert not {netns_name(cid) for cid in ids} & netns_list()


def test_ensure_is_idempotent_and_refuses_what_it_does_not_own(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    bridge.ensure()
    bridge.ensure()
    info = json.loads(ip("-j", "-4", "addr", "show", "dev", bridge.name).stdout)[0]
    assert [f"{a['local']}/{a['prefixlen']}" for a in info["addr_info"]] == [f"{bridge.gateway}/24"]
    assert "UP" in info["flags"]

    with pytest.raises(NetworkError, match="not a bridge"):
        Bridge(name="lo", subnet="10.211.0.0/24", state_dir=bridge.state_dir.parent / "lo").ensure()

    other = Bridge(
        name=f"l9t{secrets.token_hex(5)}", subnet=str(bridge.network), state_dir=bridge.state_dir.parent / "o"
    )
    with pytest.raises(NetworkError, match="overlaps"):
        other.ensure()
    assert not link_exists(other.name)

    with pytest.raises(NetworkError, match="interface name"):
        Bridge(name="a-name-far-too-long")
    with pytest.raises(NetworkError, match="IPv4"):
        Bridge(name="l9tx", subnet="10.210.0.1/24")


def test_destroy_leaves_no_bridge_veth_or_netns(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    attached = [bridge.attach(new_id(name)) for name in ("a", "b", "c")]

    bridge.destroy()

    assert not link_exists(bridge.name)
    for att in attached:
        assert not link_exists(att.veth_host)
        assert att.netns_name not in netns_list()
    assert bridge.attachments() == []
    bridge.destroy()  # already gone is fine


async def test_port_forward_echoes_two_connections_and_half_closes(
    bridge: Bridge, new_id: Callable[[str], str]
) -> None:
    att = bridge.attach(new_id("fwd"))
    with echo_server(att) as port:
        forward = PortForward(att.ip, port)
        host_port = await forward.start()
        assert forward.port == host_port
        try:
            async with asyncio.timeout(60):
                r1, w1 = await asyncio.open_connection("127.0.0.1", host_port)
                r2, w2 = await asyncio.open_connection("127.0.0.1", host_port)
                w1.write(b"one")
                w2.write(b"two")
                assert await r1.readexactly(3) == b"one"
                assert await r2.readexactly(3) == b"two"

                # EOF from the client reaches the server, which answers the rest and then closes.
                w2.write(b" and more")
                w2.write_eof()
                assert await r2.read() == b" and more"
                # The other connection is unaffected.
                w1.write(b"still here")
                assert await r1.readexactly(10) == b"still here"
                w1.write_eof()
                assert await r1.read() == b""
                for w in (w1, w2):
                    w.close()
                    await w.wait_closed()
        finally:
            await forward.close()


async def test_port_forward_close_drops_open_connections(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    att = bridge.attach(new_id("fwd"))
    with echo_server(att) as port:
        tasks_before = asyncio.all_tasks()
        forward = PortForward(att.ip, port)
        host_port = await forward.start()
        try:
            async with asyncio.timeout(60):
                reader, writer = await asyncio.open_connection("127.0.0.1", host_port)
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"

                await forward.close()

                try:
                    rest = await reader.read()
                except ConnectionResetError:
                    rest = b""
                assert rest == b""
                writer.close()
                with contextlib.suppress(ConnectionResetError):
                    await writer.wait_closed()
                assert asyncio.all_tasks() <= tasks_before
                with pytest.raises(ConnectionRefusedError):
                    await asyncio.open_connection("127.0.0.1", host_port)
        finally:
            await forward.close()


async def test_port_forward_to_a_closed_port_drops_the_client(bridge: Bridge, new_id: Callable[[str], str]) -> None:
    att = bridge.attach(new_id("fwd"))
    # Nothing listens in a fresh namespace: the container's kernel refuses, and the client sees its connection end.
    forward = PortForward(att.ip, 7)
    host_port = await forward.start()
    try:
        async with asyncio.timeout(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", host_port)
            try:
                rest = await reader.read()
            except ConnectionResetError:
                rest = b""
            assert rest == b""
            writer.close()
            with contextlib.suppress(ConnectionResetError):
                await writer.wait_closed()
    finally:
        await forward.close()


def test_forwarder_process_forwards_and_exits_on_sigterm(
    bridge: Bridge, new_id: Callable[[str], str], tmp_path: Path
) -> None:
    att = bridge.attach(new_id("fwd"))
    ready = tmp_path / "forward.port"
    with echo_server(att) as port:
        proc = subprocess.Popen(
            forwarder_command(att.ip, port, "127.0.0.1", 0, ready),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    out, err = proc.communicate()
                    pytest.fail(f"forwarder never became ready (exit {proc.returncode}): {out}{err}")
                time.sleep(0.05)
            host_port = int(ready.read_text())

            with socket.create_connection(("127.0.0.1", host_port), timeout=30) as s:
                s.sendall(b"through a process")
                s.shutdown(socket.SHUT_WR)
                assert s.makefile("rb").read() == b"through a process"

            with socket.create_connection(("127.0.0.1", host_port), timeout=30) as held:
                held.sendall(b"open")
                assert held.recv(4) == b"open"
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                try:
                    rest = held.recv(100)
                except ConnectionResetError:
                    rest = b""
                assert rest == b""
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", host_port), timeout=30).close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_sweep_detaches_the_containers_whose_owner_is_gone(
    bridge: Bridge, new_id: Callable[[str], str], tmp_path: Path
) -> None:
    """A worker killed with its state removed leaves its containers attached; sweep takes exactly those away."""
    alive_dir, dead_dir = tmp_path / "alive", tmp_path / "dead"
    alive_dir.mkdir()
    dead_dir.mkdir()
    alive = bridge.attach(new_id("owned"), owner=alive_dir)
    dead = bridge.attach(new_id("orphan"), owner=dead_dir)
    unowned = bridge.attach(new_id("unowned"))  # attached by something that names no owner: never swept
    dead_dir.rmdir()

    assert bridge.sweep() == [dead.container_id]
    assert dead.netns_name not in netns_list()
    assert not link_exists(dead.veth_host)
    assert {a.container_id for a in bridge.attachments()} == {alive.container_id, unowned.container_id}
    assert alive.netns_name in netns_list()
    assert bridge.sweep() == []
    # a record whose namespace someone deleted by hand (or a crash mid-attach left) goes too, owner or not
    subprocess.run(["ip", "netns", "del", unowned.netns_name], check=True)
    assert bridge.sweep() == [unowned.container_id]
    assert not link_exists(unowned.veth_host)
    assert [a.container_id for a in bridge.attachments()] == [alive.container_id]
    bridge.detach(alive.container_id)


def test_destroy_leaves_no_state_directory(tmp_path: Path, subnet: str, new_id: Callable[[str], str]) -> None:
    """A bridge's records and lock live in a directory of its own (one per bridge name): it goes with it."""
    br = Bridge(name=f"l9t{secrets.token_hex(5)}", subnet=subnet, state_dir=tmp_path / "net" / "br")
    br.attach(new_id("one"))
    assert (tmp_path / "net" / "br").is_dir()
    br.destroy()
    assert not (tmp_path / "net" / "br").exists()
    br.destroy()  # again: nothing to do, nothing made
    assert not (tmp_path / "net" / "br").exists()


def test_the_engine_sweep_removes_the_cgroups_of_the_containers_it_detaches(
    bridge: Bridge, new_id: Callable[[str], str], tmp_path: Path
) -> None:
    """A killed worker's container leaves its memory cgroup too (made before the runtime starts it)."""
    from levers9.engine import cgroups, oci
    from levers9.engine.spec import cgroups_path

    owner = tmp_path / "gone"
    owner.mkdir()
    orphan = bridge.attach(new_id("cg"), owner=owner)
    relative = cgroups_path(orphan.container_id).lstrip("/")
    if Path("/sys/fs/cgroup/memory").is_dir():  # cgroup v1: the engine makes the memory cgroup itself
        cgroups.own_memory_cgroup(cgroups_path(orphan.container_id), 64 * 1024 * 1024)
        made = [Path("/sys/fs/cgroup/memory") / relative]
    else:  # cgroup v2: what the runtime makes, in the unified hierarchy
        made = [Path("/sys/fs/cgroup") / relative]
        made[0].mkdir(parents=True)
    assert all(p.is_dir() for p in made)
    owner.rmdir()
    oci._swept.pop(bridge.name, None)
    oci._sweep(bridge)
    assert bridge.attachments() == []
    assert [p for p in made if p.exists()] == []
