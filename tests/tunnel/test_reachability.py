"""Deciding whether a worker needs a tunnel: the worker's probe port, tried for real, and the provider's word."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from levers9.proto.v1 import common_pb2, worker_pb2_grpc
from levers9.services.tunnels import decide_tunnel, peer_host, probe
from levers9.worker.tunnel import ProbeListener
from tests.fixtures.ports import free_port
from tests.tunnel.netns import namespace


async def test_a_listening_worker_is_reachable_and_anything_else_is_not() -> None:
    listener = ProbeListener()
    await listener.start()
    try:
        assert listener.port > 0
        assert await probe("127.0.0.1", listener.port, listener.nonce)
        assert not await probe("127.0.0.1", listener.port, "another worker's nonce!!!!!!!!!!")
        assert not await probe("127.0.0.1", free_port(), listener.nonce)  # nothing listens there
        assert not await probe("", listener.port, listener.nonce)
        assert not await decide_tunnel(
            declared_reachable=None,
            peer_host="127.0.0.1",
            probe_port=listener.port,
            probe_nonce=listener.nonce,
            worker="w",
        )
    finally:
        await listener.close()


async def test_something_else_on_the_port_is_not_the_worker() -> None:
    async def stranger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6 hello there, who are you")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(stranger, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        assert not await probe("127.0.0.1", port, "0123456789abcdef0123456789abcdef")
    finally:
        server.close()


async def test_the_providers_word_decides_without_trying() -> None:
    connections = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await decide_tunnel(
            declared_reachable=False, peer_host="127.0.0.1", probe_port=port, probe_nonce="n", worker="w"
        )
        assert not await decide_tunnel(
            declared_reachable=True, peer_host="127.0.0.1", probe_port=port, probe_nonce="n", worker="w"
        )
        # a worker that offers no port is taken as reachable, as every worker was before tunnels
        assert not await decide_tunnel(
            declared_reachable=None, peer_host="127.0.0.1", probe_port=0, probe_nonce="", worker="w"
        )
        assert connections == 0
    finally:
        server.close()


async def test_a_worker_behind_a_firewall_is_not_reachable() -> None:
    script = (
        "import asyncio, sys\n"
        "from levers9.worker.tunnel import ProbeListener\n"
        "async def main():\n"
        "    p = ProbeListener(); await p.start()\n"
        "    print(p.port, p.nonce, flush=True)\n"
        "    await asyncio.sleep(120)\n"
        "asyncio.run(main())\n"
    )
    for drop, expected in ((False, True), (True, False)):
        with namespace(drop_inbound=drop) as ns:
            worker = subprocess.Popen(
                [*ns.exec_prefix(), sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
            )
            try:
                assert worker.stdout is not None
                line = await asyncio.to_thread(worker.stdout.readline)
                port, nonce = line.split()
                assert await probe(ns.ns_ip, int(port), nonce) is expected, f"drop_inbound={drop}"
            finally:
                worker.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.wait(10)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.1.2.3:5555", "10.1.2.3"),
        ("ipv6:[::1]:5555", "::1"),
        ("ipv6:%5B::1%5D:5555", "::1"),  # what gRPC reports for a worker that dialed localhost
        ("ipv6:[fe80::1%25eth0]:5555", "fe80::1%eth0"),  # a zone, its % encoded
        ("ipv6:%5Bfe80::1%25eth0%5D:5555", "fe80::1%eth0"),
        ("ipv6:[2001:db8::7]:1", "2001:db8::7"),
        ("ipv6:%5B::ffff:10.1.2.3%5D:5555", "10.1.2.3"),  # an IPv4 peer of a dual-stack listener
        ("unix:/tmp/sock", ""),
        ("unix-abstract:levers9", ""),
        ("", ""),
    ],
)
def test_peer_addresses(peer: str, host: str) -> None:
    assert peer_host(peer) == host


async def test_a_worker_that_dialed_localhost_over_ipv6_is_probed_and_reached() -> None:
    """The peer string gRPC itself reports for a connection over ::1 decodes to a host the probe reaches."""
    seen: list[str] = []

    class Peer(worker_pb2_grpc.WorkerServicer):
        async def GetBlob(self, request: Any, context: Any) -> AsyncIterator[Any]:
            seen.append(context.peer())
            return
            yield

    server = grpc.aio.server()
    add: Any = worker_pb2_grpc.add_WorkerServicer_to_server
    add(Peer(), server)
    port = server.add_insecure_port("[::1]:0")  # only ::1: a client dialing localhost comes over IPv6
    await server.start()
    listener = ProbeListener()
    await listener.start()
    try:
        async with grpc.aio.insecure_channel(f"localhost:{port}") as channel:
            factory: Any = worker_pb2_grpc.WorkerStub
            async for _ in factory(channel).GetBlob(common_pb2.GetBlobRequest(), timeout=10):
                pass
        assert len(seen) == 1, seen
        assert seen[0].startswith("ipv6:"), seen
        assert peer_host(seen[0]) == "::1", seen
        assert not await decide_tunnel(
            declared_reachable=None,
            peer_host=peer_host(seen[0]),
            probe_port=listener.port,
            probe_nonce=listener.nonce,
            worker="w",
        )
    finally:
        await listener.close()
        await server.stop(0)
