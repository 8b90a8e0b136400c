"""An agent leaves a frozen replica within seconds and holds its stream on the next one (issue 36, item 2).

Two real ``levers9 server`` replicas (tests/fixtures/replicas.py: one
PostgreSQL, one redis-server, one config) serve an ``agent_machine`` pool. A
machine is created through replica 0's REST API (an operator's token), and the
real agent connection code (:func:`levers9.agent.connection.join` and
:func:`~levers9.agent.connection.connect_forever`, in this process) joins with
its token and holds its stream on the first address, replica 0, sending
heartbeats as the agent does. Replica 0 then gets SIGSTOP: its sockets stay
open and its kernel acknowledges everything, so only an answer its process must
give (a gRPC ping's) shows it gone. While it is still stopped, the agent must
be connected to replica 1 and replica 1 must list the machine as connected,
last heard from after the stop. Replica 0 is then resumed and replica 1 frozen
in turn: the agent must go back to replica 0, the next address, and not dial
the replica it just lost again. The deadlines are hang bounds: well over the
~16 s the agent's pings take (12 s apart, 4 s to answer); the first well under
the minutes the old options took (a ping every 5 min, and grpcio waits 60 s for
its answer), the second under the ~46 s that dialling the frozen replica again
and awaiting its Welcome (30 s) took. A frozen replica gets SIGCONT in a
``finally``, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

import httpx
import pytest

from levers9.agent.connection import Send, connect_forever, join
from levers9.proto.v1 import agent_pb2
from tests.fixtures.replicas import Replica, Replicas

#: the hang bound for leaving the frozen replica (expected: within KEEPALIVE_S + KEEPALIVE_TIMEOUT_S, 16 s)
LEFT_WITHIN_S = 45.0
#: the same when replica 1 is frozen in turn, under the ~46 s that dialling the frozen replica again would take (its
#: Welcome awaited for 30 s, then the next address)
NEXT_WITHIN_S = 35.0

POOL = """\
  box:
    provider: agent_machine
    runtime: runc
    workspace: default
    cpu: 1
    memory: 1024
    min_workers: 0
    max_workers: 1
    settings:
      worker_image: levers9-worker:test
      docker_network_mode: host
"""


class _Heartbeats:
    """What an idle agent does on its stream: a heartbeat every period Welcome gives."""

    async def session(self, send: Send, heartbeat_s: float) -> None:
        while True:
            send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            await asyncio.sleep(heartbeat_s)

    def order(self, order: agent_pb2.Order, send: Send) -> None:
        send(agent_pb2.AgentMessage(ack=agent_pb2.Ack(order_id=order.order_id, ok=False, error="not here")))


def _rest(replicas: Replicas, replica: Replica, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(
        method,
        f"http://127.0.0.1:{replica.http_port}/api/v1{path}",
        headers={"authorization": f"Bearer {replicas.token}"},
        timeout=10,
        **kwargs,
    )
    assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def _connects(caplog: pytest.LogCaptureFixture, replica: Replica) -> int:
    """How many times the agent's stream was welcomed by ``replica``."""
    return sum(f"connected to {replica.address} " in r.getMessage() for r in caplog.records)


def _losses(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The agent's log lines for streams lost or not opened, in order."""
    return [r.getMessage() for r in caplog.records if "lost or not opened" in r.getMessage()]


async def _until(check: Any, what: str, timeout: float, replicas: Replicas) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s\n{replicas.logs()}")
        await asyncio.sleep(0.1)


async def test_an_agent_leaves_a_frozen_replica_for_the_next(
    replicas: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    replicas.min_workers = 0
    replicas.pools = POOL
    replicas.start_all()
    operator = replicas.levers9("token", "create", "--operator")  # the pool is the operator's
    assert operator.returncode == 0, operator.stderr
    replicas.token = operator.stdout.strip()
    first, second = replicas.replicas
    made = _rest(replicas, first, "POST", "/joined-machines", json={"pool": "box", "name": "box1"})
    stop = asyncio.Event()
    controlplane = ",".join(replicas.addresses)
    credential = await join(controlplane, made["join_token"], ca_pem=None, insecure=True, stop=stop, hostname="box1")
    assert credential is not None
    agent: asyncio.Task[None] | None = None
    frozen: Replica | None = None
    moved_after: list[float] = []

    def heard_since(replica: Replica, since: float) -> bool:
        """``replica`` lists the machine connected, last heard from after ``since`` (epoch seconds)."""
        [machine] = _rest(replicas, replica, "GET", "/joined-machines")
        return bool(machine["connected"]) and float(machine["last_seen"]) > since

    async def freeze_and_move(stopped: Replica, to: Replica, within: float) -> None:
        nonlocal frozen
        assert stopped.process is not None
        before, lost_before = _connects(caplog, to), _losses(caplog)
        stopped.process.send_signal(signal.SIGSTOP)
        frozen, stopped_at, stopped_wall = stopped, time.monotonic(), time.time()
        await _until(
            lambda: _connects(caplog, to) > before, f"the agent's stream on replica {to.index}", within, replicas
        )
        moved_after.append(time.monotonic() - stopped_at)
        assert agent is not None
        assert not agent.done()
        # straight to the other replica: the frozen one was not dialled again (that is a second loss, its Welcome
        # awaited in vain)
        since = _losses(caplog)[len(lost_before) :]
        assert len(since) == 1, f"replica {stopped.index} was dialled again before replica {to.index}: {since}"
        await _until(lambda: heard_since(to, stopped_wall), f"replica {to.index} hearing from the agent", 10, replicas)
        assert stopped.running  # still there, still stopped: nothing but the agent's own pings found it
        stopped.process.send_signal(signal.SIGCONT)
        frozen = None

    try:
        with caplog.at_level(logging.INFO, logger="levers9.agent.connection"):
            agent = asyncio.create_task(connect_forever(credential, _Heartbeats(), stop, hostname="box1"))
            await _until(lambda: _connects(caplog, first) == 1, "the agent's stream on replica 0", 30, replicas)
            await freeze_and_move(first, second, LEFT_WITHIN_S)
            # the stream on the second address is lost: the agent dials the first again, not the frozen one it left
            await freeze_and_move(second, first, NEXT_WITHIN_S)
    finally:
        if frozen is not None and frozen.process is not None:
            frozen.process.send_signal(signal.SIGCONT)
        stop.set()
        if agent is not None:
            await asyncio.wait_for(agent, 30)
    lost = _losses(caplog)
    print(f"the agent was on the other replica {moved_after[0]:.1f} s and {moved_after[1]:.1f} s after a stop: {lost}")
