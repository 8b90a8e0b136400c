"""A sandbox's network, cut (``block_network``) or limited (``allow_list``), in real runc and gVisor containers.

Each test serves sandboxes over the worker's loopback API on a bridge of its own (tests/worker/test_sandboxes.py)
and places to reach (tests/fixtures/outside_net.py): another sandbox's server on the bridge, a namespace routed
through the host standing in for the internet (TCP and UDP), and a server of the test process on the host. A
sandbox on default settings reaches the first two (and not the host: host_guard), so a probe that fails for
another reason cannot pass for a cut that holds. The probe runs inside the sandbox with a 3 s timeout per place
and says what answered, or ``refused`` / ``timed out``. gVisor is tested apart from runc: its netstack sends
through the same veth, but is another TCP/IP stack. Rules are checked in ``iptables -S`` and ``ip6tables -S``:
there while the sandbox runs, gone once it ends.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from levers9.engine import host_guard
from levers9.engine.network import veth_name
from levers9.engine.node import NodeSettings
from levers9.worker.sandboxes import SandboxRefused, SandboxSpec
from tests.fixtures.outside_net import (
    PROBE,
    SERVER,
    UNREACHED,
    Outside,
    host_server,
    outside_network,
    parse_probe,
    wait_listening,
)
from tests.worker.test_pool import PYTHON
from tests.worker.test_sandboxes import Served, _error, runtime, served  # noqa: F401 (runtime: a fixture)

PEER_PORT, OWN_PORT = 8080, 8081


def rules_naming(veth: str) -> list[str]:
    found = []
    for command in ("iptables", "ip6tables"):
        listing = subprocess.run([command, "-w", "-S"], capture_output=True, text=True, check=True).stdout
        found += [f"{command}: {line}" for line in listing.splitlines() if veth in line]
    return found


def python(code: str, *args: str) -> str:
    """``code`` run with ``args`` as its ``sys.argv[1:]`` (exec's ``code`` takes no arguments)."""
    return f"import sys\nsys.argv = ['-c', *{list(args)!r}]\n{code}"


async def probe(s: Served, sid: str, targets: list[tuple[str, str, int, str]]) -> dict[str, str]:
    number = await s.exec(sid, code=python(PROBE, json.dumps(targets)))
    output = await s.output(sid, number)
    assert output[-1] == {"exit": 0}, output
    return parse_probe("".join(o["data"] for o in output if o.get("stream") == "stdout"))


async def word_at(address: str) -> str:
    """What the server at ``host:port`` answers this process (the worker's side)."""
    host, port = address.rsplit(":", 1)
    await asyncio.to_thread(wait_listening, host, int(port), "a sandbox's server")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        return conn.recv(64).decode().strip()


def gateway(s: Served) -> str:
    settings = s.world.ctx.settings
    assert isinstance(settings, NodeSettings)
    return str(ipaddress.ip_network(settings.subnet).network_address + 1)


async def test_a_sandbox_whose_network_is_cut_or_limited_reaches_only_what_it_may(
    runtime: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    with outside_network() as outside, host_server() as host_port:
        async with served(runtime, tmp_path) as s:
            peer = await s.create(ports=[PEER_PORT])
            await s.exec(peer["id"], code=python(SERVER, str(PEER_PORT), "peer"))
            assert await word_at(peer["ports"][str(PEER_PORT)]) == "peer"
            targets = places(outside, peer["ports"][str(PEER_PORT)], gateway(s), host_port)

            # on default settings: the bridge and the routed network answer, the host does not (host_guard)
            open_ = await s.create()
            assert open_["block_network"] is False
            reached = await probe(s, open_["id"], targets)
            assert {k: v for k, v in reached.items() if k != "host"} == {
                "peer": "peer",
                "outside": "outside",
                "outside-udp": "outside-udp",
            }
            assert reached["host"] in UNREACHED

            # block_network: nothing answers; it is still exec'd into and its exposed port still reached
            blocked = await s.create(block_network=True, ports=[OWN_PORT])
            assert (blocked["block_network"], blocked["allow_list"]) == (True, [])
            blocked_veth = veth_name(blocked["container_id"])
            assert [c.label for c in host_guard.confined() if c.veth == blocked_veth] == [blocked["id"]]
            cut = await probe(s, blocked["id"], targets)
            assert all(cut[name] in UNREACHED for name in targets_named(targets)), cut
            await s.exec(blocked["id"], code=python(SERVER, str(OWN_PORT), "blocked"))
            assert await word_at(blocked["ports"][str(OWN_PORT)]) == "blocked"

            # allow_list: the routed network it names answers, TCP and UDP; the bridge and the host do not
            allowed = await s.create(allow_list=[outside.ip])
            assert (allowed["block_network"], allowed["allow_list"]) == (True, [outside.ip])
            allowed_veth = veth_name(allowed["container_id"])
            limited = await probe(s, allowed["id"], targets)
            assert (limited["outside"], limited["outside-udp"]) == ("outside", "outside-udp"), limited
            assert limited["peer"] in UNREACHED, limited
            assert limited["host"] in UNREACHED, limited

            # the default sandbox still reaches the peer: the cuts are the confined sandboxes' alone
            assert (await probe(s, open_["id"], targets))["peer"] == "peer"

            for sandbox, veth in ((blocked, blocked_veth), (allowed, allowed_veth)):
                assert rules_naming(veth), veth
                ended = await s.http.delete(f"/sandboxes/{sandbox['id']}")
                assert ended.status_code == 200, ended.text
                assert rules_naming(veth) == []
            assert [c for c in host_guard.confined() if c.veth in (blocked_veth, allowed_veth)] == []


def places(outside: Outside, peer: str, gw: str, host_port: int) -> list[tuple[str, str, int, str]]:
    peer_ip, peer_port = peer.rsplit(":", 1)
    return [
        ("peer", peer_ip, int(peer_port), "tcp"),
        ("outside", outside.ip, outside.port, "tcp"),
        ("outside-udp", outside.ip, outside.port, "udp"),
        ("host", gw, host_port, "tcp"),
    ]


def targets_named(targets: list[tuple[str, str, int, str]]) -> list[str]:
    return [name for name, *_ in targets]


async def test_a_worker_that_cannot_cut_the_network_refuses_the_sandbox(
    runtime: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with served(runtime, tmp_path) as s:
        before = {c.veth for c in host_guard.confined()}
        # br_netfilter not loaded: refused before any container starts
        monkeypatch.setattr(host_guard, "BRIDGE_NF", tmp_path / "no-br-netfilter")
        refused = await s.http.post("/sandboxes", json=body(block_network=True))
        status, code, message = _error(refused)
        assert (status, code) == (400, "BadRequest")
        assert "block_network cannot be enforced on this worker" in message
        assert "modprobe br_netfilter" in message

        # loaded, but bridged packets pass by iptables: found once the container is up, before it is used
        switches = tmp_path / "bridge-nf"
        switches.mkdir()
        for family in ("iptables", "ip6tables"):
            (switches / f"bridge-nf-call-{family}").write_text("0\n")
        monkeypatch.setattr(host_guard, "BRIDGE_NF", switches)
        refused = await s.http.post("/sandboxes", json=body(allow_list=["192.0.2.0/24"]))
        status, code, message = _error(refused)
        assert (status, code) == (400, "BadRequest")
        assert "allow_list cannot be enforced on this worker" in message
        assert "do not meet iptables" in message
        assert (await s.http.get("/sandboxes")).json()["sandboxes"] == []
        assert {c.veth for c in host_guard.confined()} <= before  # its rules went with it

        # a host name is refused by name, not resolved
        named = await s.http.post("/sandboxes", json=body(allow_list=["pypi.org"]))
        status, code, message = _error(named)
        assert (status, code) == (400, "BadRequest")
        assert "allow_list holds 'pypi.org'" in message
        assert "host names are not resolved" in message


def body(**fields: Any) -> dict[str, Any]:
    return {"workspace_id": "ws1", "python_version": PYTHON, **fields}


def test_an_allow_list_holds_networks_and_refuses_anything_else_by_name() -> None:
    spec = SandboxSpec(workspace_id="ws1", allow_list=("198.51.100.7", "203.0.113.0/24", "2001:db8::1", " 10.0.0.5/8 "))
    spec.check()
    assert [str(n) for n in spec.networks()] == ["198.51.100.7/32", "203.0.113.0/24", "2001:db8::1/128", "10.0.0.0/8"]
    assert spec.confined  # an allow_list implies block_network
    assert SandboxSpec(workspace_id="ws1", block_network=True).confined
    assert not SandboxSpec(workspace_id="ws1").confined
    for bad in ("pypi.org", "10.0.0.0/33", "", "fe80::1%eth0"):
        with pytest.raises(SandboxRefused, match=rf"allow_list holds {re.escape(repr(bad))}, which is not an IP"):
            SandboxSpec(workspace_id="ws1", allow_list=(bad,)).check()
    with pytest.raises(SandboxRefused, match=r"allow_list holds 65 networks; at most 64"):
        SandboxSpec(workspace_id="ws1", allow_list=tuple(f"10.0.{i}.0/24" for i in range(65))).check()
