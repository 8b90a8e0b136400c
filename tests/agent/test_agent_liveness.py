"""A controlplane that vanishes without a word is found by the agent within a ping period, and dialled again.

The agent pings every ``KEEPALIVE_S`` (12 s) and gives a ping
``KEEPALIVE_TIMEOUT_S`` (4 s) to be answered; gRPC also sets TCP_USER_TIMEOUT
to that timeout on the agent's socket, so a heartbeat that goes unacknowledged
closes the connection too, whichever comes first. Here the real agent
connection code holds a real TLS stream to the Agent service on loopback;
iptables then drops every packet of that port both ways (a host that lost
power, a NAT that forgot the connection: no RST, no FIN). The agent must give
the stream up within a ping period and its timeout (and slack), and join again
once the packets flow. The deadlines are that bound, not a measurement. (A
replica frozen by SIGSTOP, whose kernel still acknowledges, is
tests/e2e/test_agent_frozen_replica.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.agent.connection import KEEPALIVE_S, KEEPALIVE_TIMEOUT_S, Send, connect_forever
from levers9.proto.v1 import agent_pb2
from tests.agent.agent_wire import eventually, opened_server

#: a ping period and its timeout (16 s), and slack for a loaded machine
FOUND_WITHIN_S = 30.0


class _Heartbeats:
    """The least an agent does on its stream: heartbeat at the pace Welcome gives."""

    async def session(self, send: Send, heartbeat_s: float) -> None:
        while True:
            send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            await asyncio.sleep(heartbeat_s)

    def order(self, order: agent_pb2.Order, send: Send) -> None:
        send(agent_pb2.AgentMessage(ack=agent_pb2.Ack(order_id=order.order_id, ok=False, error="not here")))


def _iptables(*args: str) -> None:
    done = subprocess.run(["iptables", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"iptables {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


@contextlib.contextmanager
def _blackholed(port: int) -> Iterator[None]:
    """Every TCP packet to or from ``127.0.0.1:port`` dropped, until the block ends (the rules go, whatever)."""
    rules = [
        ("INPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(port), "-j", "DROP"),
        ("INPUT", "-p", "tcp", "-s", "127.0.0.1", "--sport", str(port), "-j", "DROP"),
    ]
    added = []
    try:
        for chain, *rule in rules:
            _iptables("-I", chain, *rule)
            added.append((chain, *rule))
        yield
    finally:
        for chain, *rule in added:
            subprocess.run(["iptables", "-D", chain, *rule], capture_output=True, timeout=30)


async def test_a_vanished_controlplane_is_found_by_the_next_heartbeat_and_dialled_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if shutil.which("iptables") is None:
        pytest.fail("this test drops packets with iptables: apt-get install iptables (and run it as root)")
    assert KEEPALIVE_S + KEEPALIVE_TIMEOUT_S < FOUND_WITHIN_S
    async with opened_server(tmp_path, tls=True) as server:
        credential = await server.credential()
        stop = asyncio.Event()
        with caplog.at_level(logging.WARNING, logger="levers9.agent.connection"):
            agent = asyncio.create_task(connect_forever(credential, _Heartbeats(), stop, hostname="box"))
            try:
                await eventually(lambda: server.said.hellos(credential.agent_id) == 1, "the agent's first Hello")
                with _blackholed(server.port):
                    dropped_at = time.monotonic()
                    await eventually(
                        lambda: any("lost or not opened" in r.getMessage() for r in caplog.records),
                        "the agent giving up the silent stream",
                        timeout=FOUND_WITHIN_S,
                    )
                    found_after = time.monotonic() - dropped_at
                assert not agent.done()
                # the packets flow again: it joins again on its own (its back-off is 30 s at most)
                await eventually(lambda: server.said.hellos(credential.agent_id) == 2, "the Hello after", timeout=60)
            finally:
                stop.set()
                await asyncio.wait_for(agent, 30)
    lost = next(r.getMessage() for r in caplog.records if "lost or not opened" in r.getMessage())
    print(f"found the vanished controlplane after {found_after:.1f} s: {lost}")
