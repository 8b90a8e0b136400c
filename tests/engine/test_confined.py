"""A confined container's rules (host_guard's ``confine``) against the real kernel: namespaces on a bridge, no runtime.

Two namespaces on a test bridge stand for containers (``confined`` and ``peer``), and a namespace routed
through the host for the internet (tests/fixtures/outside_net.py). Each check first shows the place is
reached without the rules, so a probe that fails for another reason cannot pass for a rule that holds.
Every test removes the rules it made, and checks ``iptables -S`` and ``ip6tables -S`` name none of its veths.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from levers9.engine import host_guard
from levers9.engine.network import Attachment, Bridge, veth_name
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.worker.leftovers import remove_leftovers
from tests.engine.test_network import bridge, ip, link_local, new_id, subnet  # noqa: F401 (fixtures)
from tests.fixtures.outside_net import PROBE, SERVER, UNREACHED, Outside, outside_network, parse_probe
from tests.fixtures.wait import wait_for

PEER_PORT, CONFINED_PORT = 8001, 8003


def rules_naming(veth: str) -> list[str]:
    """Lines of ``iptables -S`` and ``ip6tables -S`` that name the veth (its jump or its chain)."""
    found = []
    for command in ("iptables", "ip6tables"):
        listing = subprocess.run([command, "-w", "-S"], capture_output=True, text=True, check=True).stdout
        found += [f"{command}: {line}" for line in listing.splitlines() if veth in line]
    return found


@pytest.fixture
def veths() -> Iterator[list[str]]:
    """The veths a test confines: whatever it left is taken back, and then none may be named by a rule."""
    made: list[str] = []
    yield made
    left = [line for veth in made for line in rules_naming(veth)]
    for veth in made:
        host_guard.unconfine(veth)
    assert not left, f"rules left behind: {left}"


@pytest.fixture
def outside() -> Iterator[Outside]:
    with outside_network() as place:
        yield place


@contextlib.contextmanager
def serving(attachment: Attachment, port: int, word: str) -> Iterator[None]:
    """:data:`SERVER` in the namespace (IPv4 and IPv6), answering ``word``."""
    cmd = ["ip", "netns", "exec", attachment.netns_name, sys.executable, "-c", SERVER, str(port), word, "dual"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if probe(attachment, [("self", attachment.ip, port, "tcp")])["self"] == word:
                break
        else:
            pytest.fail(f"the server in {attachment.netns_name} never answered")
        yield
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def probe(attachment: Attachment, targets: list[tuple[str, str, int, str]]) -> dict[str, str]:
    done = subprocess.run(
        ["ip", "netns", "exec", attachment.netns_name, sys.executable, "-c", PROBE, json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return parse_probe(done.stdout)


def peer_link_local(peer: Attachment, confined: Attachment) -> str:
    """The peer's IPv6 link-local address, once both namespaces' are usable (duplicate detection done)."""

    def settled(attachment: Attachment) -> bool:
        shown = ip("-n", attachment.netns_name, "-6", "addr", "show", "dev", "eth0").stdout
        return "fe80::" in shown and "tentative" not in shown

    wait_for(lambda: settled(peer) and settled(confined), "IPv6 link-local addresses on both namespaces")
    links = json.loads(ip("-n", peer.netns_name, "-j", "link", "show", "dev", "eth0").stdout)
    return f"{link_local(links[0]['address'])}%eth0"


def test_a_confined_namespace_reaches_only_replies_and_its_allowed_networks(
    bridge: Bridge,  # noqa: F811
    new_id: Callable[[str], str],  # noqa: F811
    outside: Outside,
    veths: list[str],
    tmp_path: Path,
) -> None:
    confined, peer = bridge.attach(new_id("confined")), bridge.attach(new_id("peer"))
    veth = confined.veth_host
    veths.append(veth)
    targets = [
        ("peer", peer.ip, PEER_PORT, "tcp"),
        ("peer6", peer_link_local(peer, confined), PEER_PORT, "tcp"),
        ("outside", outside.ip, outside.port, "tcp"),
        ("outside-udp", outside.ip, outside.port, "udp"),
    ]
    reached = {"peer": "peer", "peer6": "peer", "outside": "outside", "outside-udp": "outside-udp"}
    with serving(peer, PEER_PORT, "peer"), serving(confined, CONFINED_PORT, "confined"):
        assert probe(confined, targets) == reached  # without rules: everything answers

        host_guard.confine(veth, [], label="sb-blocked", owner=tmp_path)
        assert [c.label for c in host_guard.confined() if c.veth == veth] == ["sb-blocked"]
        host_guard.check_confined(veth)
        cut = probe(confined, targets)
        assert all(cut[name] in UNREACHED for name in reached), cut
        assert cut["peer"] == cut["outside"] == "refused"  # TCP is reset: no wait for a timeout
        # what others open to it still gets its replies: the peer, and the host (the worker's way in)
        assert probe(peer, [("confined", confined.ip, CONFINED_PORT, "tcp")]) == {"confined": "confined"}
        with socket_to(confined.ip, CONFINED_PORT) as answer:
            assert answer == "confined"

        only = [ipaddress.ip_network(outside.ip), ipaddress.ip_network("2001:db8::/32")]
        host_guard.confine(veth, only, label="sb-allowed", owner=tmp_path)  # made again, with the allow_list
        assert [c.label for c in host_guard.confined() if c.veth == veth] == ["sb-allowed"]
        allowed = probe(confined, targets)
        assert (allowed["outside"], allowed["outside-udp"]) == ("outside", "outside-udp")
        assert allowed["peer"] in UNREACHED, allowed
        assert allowed["peer6"] in UNREACHED, allowed

        host_guard.unconfine(veth)
        assert rules_naming(veth) == []
        with pytest.raises(host_guard.HostGuardError, match=f"no jump to L9SB-{veth}"):
            host_guard.check_confined(veth)
        assert probe(confined, targets) == reached
    host_guard.unconfine(veth)  # nothing left to take back is fine


@contextlib.contextmanager
def socket_to(host: str, port: int) -> Iterator[str]:
    with socket.create_connection((host, port), timeout=10) as conn:
        yield conn.recv(64).decode().strip()


def test_a_container_that_cannot_be_held_is_refused(
    bridge: Bridge,  # noqa: F811
    new_id: Callable[[str], str],  # noqa: F811
    veths: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(host_guard.HostGuardError, match="interface l9hnosuch0 is not on this host"):
        host_guard.check_confined("l9hnosuch0")
    with pytest.raises(host_guard.HostGuardError, match="is not a port of a bridge"):
        host_guard.check_confined("lo")
    for bad in ({"label": "sb 1"}, {"owner": tmp_path / 'a"b'}):
        with pytest.raises(ValueError, match=r"label|owner"):
            host_guard.confine("l9hbad00000", [], **{"label": "sb-1", "owner": tmp_path, **bad})  # type: ignore[arg-type]
    assert rules_naming("l9hbad00000") == []

    # a tool missing: each is named, nothing is made (the rest of the iptables package is there)
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("iptables", "ip6tables", "iptables-restore"):
        found = shutil.which(tool)
        assert found is not None, f"{tool} is not installed (apt-get install -y iptables)"
        (tools / tool).symlink_to(found)
    with monkeypatch.context() as patched:
        patched.setenv("PATH", str(tools))
        patched.setattr(host_guard, "FALLBACK_PATHS", ())
        with pytest.raises(host_guard.HostGuardError, match=r"^ip6tables-restore is not installed .*block_network"):
            host_guard.confine("l9hbad00000", [], label="sb-1", owner=tmp_path)
        (tools / "iptables").unlink()
        with pytest.raises(
            host_guard.HostGuardError, match=r"^iptables is not installed .*apt-get install -y iptables"
        ):
            host_guard.confine("l9hbad00000", [], label="sb-1", owner=tmp_path)
    assert rules_naming("l9hbad00000") == []

    attached = bridge.attach(new_id("held"))
    veths.append(attached.veth_host)
    switches = tmp_path / "bridge-nf"
    with monkeypatch.context() as patched:
        patched.setattr(host_guard, "BRIDGE_NF", tmp_path / "no-br-netfilter")
        with pytest.raises(host_guard.HostGuardError, match=r"br_netfilter is not loaded.*modprobe br_netfilter"):
            host_guard.confine(attached.veth_host, [], label="sb-1", owner=tmp_path)
        assert rules_naming(attached.veth_host) == []

        # the module loaded, but bridged packets passed by iptables: host-wide off, and the bridge's own off
        switches.mkdir()
        for family in ("iptables", "ip6tables"):
            (switches / f"bridge-nf-call-{family}").write_text("0\n")
        patched.setattr(host_guard, "BRIDGE_NF", switches)
        host_guard.confine(attached.veth_host, [], label="sb-1", owner=tmp_path)
        own = Path("/sys/class/net") / bridge.name / "bridge"
        assert (own / "nf_call_iptables").read_text().strip() == "0"
        with pytest.raises(host_guard.HostGuardError, match=rf"bridge {bridge.name} do not meet iptables"):
            host_guard.check_confined(attached.veth_host)
        (switches / "bridge-nf-call-iptables").write_text("1\n")
        with pytest.raises(host_guard.HostGuardError, match=rf"bridge {bridge.name} do not meet ip6tables"):
            host_guard.check_confined(attached.veth_host)
        (own / "nf_call_ip6tables").write_text("1\n")  # the bridge's own switch is as good
        host_guard.check_confined(attached.veth_host)
    host_guard.unconfine(attached.veth_host)


async def test_a_killed_workers_rules_are_removed_at_its_next_start(tmp_path: Path, veths: list[str]) -> None:
    mine, other = tmp_path / "worker", tmp_path / "other"
    (mine / "containers").mkdir(parents=True)
    other.mkdir()
    gone, kept = veth_name(f"l9-gone-{tmp_path.name}"), veth_name(f"l9-kept-{tmp_path.name}")
    veths += [gone, kept]
    host_guard.confine(gone, [], label="sb-gone", owner=mine / "containers")
    host_guard.confine(kept, [ipaddress.ip_network("192.0.2.0/24")], label="sb-kept", owner=other)
    assert rules_naming(gone)
    assert rules_naming(kept)

    hooks = Hooks(load_plugins(PluginPolicy()))
    try:
        await remove_leftovers(hooks, mine)  # a worker starting on the killed one's state directory
    finally:
        hooks.close()
    assert rules_naming(gone) == []
    assert [c.label for c in host_guard.confined() if c.veth == kept] == ["sb-kept"]  # another worker's stay
    assert [c.label for c in host_guard.sweep_confined(other)] == ["sb-kept"]
    assert rules_naming(kept) == []
