"""The load generator of ``bench/agents.py``: N simulated agents, joined for real, heartbeating on real streams.

Run by ``bench/agents.py`` as its own process (so its CPU is never counted as
the controlplane's): ``python bench/agents_load.py --count N --pool P``, with
the controlplane's context in ``$LEVERS9_HOME`` and an operator token in
``$LEVERS9_TOKEN``. It

1. creates N joined machines (``CreateJoinedMachine``, as ``levers9 machine
   create`` does), each with its single-use join token;
2. spends each token with ``Join`` (as ``levers9 agent join`` does) for the
   agent's own credential;
3. opens one ``Connect`` stream per agent, each on its own channel (its own TCP
   and TLS connection and keepalive pings, as N separate machines would have),
   sends Hello, awaits Welcome, sends one Inventory (a CPU box: 16 cores,
   64 GiB, no containers, the ``details_json`` a real agent sends), then a
   Heartbeat every ``Welcome.heartbeat_s``, the first at a random point of the
   first period; a Ping is answered with a Heartbeat, an order with a refusing
   Ack. SIGUSR1 switches on an Inventory every ``--inventory-every`` seconds
   besides (what the real agent sends regardless of change); SIGTERM ends it.

Progress goes to stdout as one JSON object per line: ``{"phase": "created" |
"joined" | "connected", "seconds": ...}`` and, after SIGTERM, ``{"phase":
"done", ...counts...}``. A failure to create, join or connect ends the process
with its error on stderr and exit status 1. A stream that ends is counted
(``stream_ends``, with the reasons) and dialled again after 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio

from levers9.__about__ import __version__
from levers9.agent.connection import CHANNEL_OPTIONS as AGENT_CHANNEL_OPTIONS
from levers9.proto.target import parse_target
from levers9.proto.v1 import agent_pb2, agent_pb2_grpc
from levers9.proto.v1 import controlplane_pb2 as pb
from levers9.sdk.channel import call_metadata, control_plane, credentials, open_channel
from levers9.sdk.context import Context, current_context

T = TypeVar("T")

#: the real agent's channel options (levers9.agent.connection), plus a subchannel pool of its own per channel, so
#: that every simulated agent has its own TCP connection as a separate machine would (gRPC shares them otherwise)
CHANNEL_OPTIONS: list[tuple[str, Any]] = [*AGENT_CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]

DETAILS = json.dumps(
    {
        "docker": {"version": "20.10.24", "runtimes": ["runc"], "nvidia": False},
        "arch": "x86_64",
        "disk_free_gib": 100.0,
        "containers": [],
    }
)


def inventory() -> agent_pb2.Inventory:
    return agent_pb2.Inventory(
        cpu_millicores=16_000,
        memory_mib=65_536,
        free_cpu_millicores=16_000,
        free_memory_mib=65_536,
        details_json=DETAILS,
    )


@dataclass
class Counts:
    heartbeats: int = 0
    inventories: int = 0
    pings: int = 0
    orders: int = 0
    welcomed: int = 0
    stream_ends: Counter[str] = field(default_factory=Counter)


@dataclass
class Fleet:
    ctx: Context
    target: str
    tls: bool
    inventory_every: float
    counts: Counts = field(default_factory=Counts)
    inventories_on: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    all_welcomed: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 0

    def channel(self) -> grpc.aio.Channel:
        if self.tls:
            return grpc.aio.secure_channel(self.target, credentials(self.ctx), CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(self.target, CHANNEL_OPTIONS)


async def bounded(items: list[T], limit: int, work: Callable[[T], Awaitable[Any]]) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> Any:
        async with gate:
            return await work(item)

    return await asyncio.gather(*(one(item) for item in items))


async def create_machines(ctx: Context, pool: str, count: int, prefix: str, limit: int) -> list[str]:
    async with open_channel(ctx) as channel:
        stub = control_plane(channel)
        metadata = call_metadata(ctx)

        async def create(i: int) -> str:
            made = await stub.CreateJoinedMachine(
                pb.CreateJoinedMachineRequest(pool=pool, name=f"{prefix}-{i:04d}", ttl_s=3600),
                metadata=metadata,
                timeout=120,
            )
            return str(made.join_token)

        return await bounded(list(range(count)), limit, create)


async def join_agents(fleet: Fleet, tokens: list[str], limit: int) -> list[str]:
    async with fleet.channel() as channel:
        stub: Any = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]

        async def join(pair: tuple[int, str]) -> str:
            i, token = pair
            joined = await stub.Join(
                agent_pb2.JoinRequest(join_token=token, version=__version__, hostname=f"sim-{i:04d}"), timeout=120
            )
            return str(joined.agent_token)

        return await bounded(list(enumerate(tokens)), limit, join)


async def one_stream(fleet: Fleet, index: int, token: str, first: asyncio.Event) -> None:
    """One agent's stream, held until ``fleet.stop``; dialled again after 1 s whenever it ends."""
    while not fleet.stop.is_set():
        outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        async with fleet.channel() as channel:
            stub: Any = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Connect(metadata=(("authorization", f"Bearer {token}"),))
            writer = asyncio.create_task(write(call, outbox))
            beats: asyncio.Task[None] | None = None
            try:
                outbox.put_nowait(
                    agent_pb2.AgentMessage(
                        hello=agent_pb2.Hello(
                            version=__version__, provider="agent_machine", hostname=f"sim-{index:04d}"
                        )
                    )
                )
                welcome = await call.read()
                if welcome is grpc.aio.EOF or welcome.WhichOneof("body") != "welcome":
                    raise RuntimeError(f"agent {index}: no Welcome after Hello: {welcome}")
                outbox.put_nowait(agent_pb2.AgentMessage(inventory=inventory()))
                fleet.counts.inventories += 1
                if not first.is_set():
                    first.set()
                    fleet.counts.welcomed += 1
                    if fleet.counts.welcomed == fleet.expected:
                        fleet.all_welcomed.set()
                beats = asyncio.create_task(heartbeats(fleet, outbox, welcome.welcome.heartbeat_s or 10.0))
                stopping = asyncio.create_task(fleet.stop.wait())
                reading = asyncio.create_task(read(fleet, call, outbox))
                done, _ = await asyncio.wait({stopping, reading, writer}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if stopping in done:
                    reading.cancel()
                    return
                for task in done:
                    task.result()
                fleet.counts.stream_ends["ended by the controlplane"] += 1
            except grpc.aio.AioRpcError as exc:
                fleet.counts.stream_ends[f"{exc.code().name}: {exc.details()}"] += 1
            finally:
                if beats is not None:
                    beats.cancel()
                writer.cancel()
                call.cancel()
        if not fleet.stop.is_set():
            await asyncio.sleep(1.0)


async def write(call: Any, outbox: asyncio.Queue[agent_pb2.AgentMessage | None]) -> None:
    while (message := await outbox.get()) is not None:
        await call.write(message)
    await call.done_writing()


async def read(fleet: Fleet, call: Any, outbox: asyncio.Queue[agent_pb2.AgentMessage | None]) -> None:
    while (command := await call.read()) is not grpc.aio.EOF:
        which = command.WhichOneof("body")
        if which == "ping":
            fleet.counts.pings += 1
            outbox.put_nowait(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
        elif which == "order":
            fleet.counts.orders += 1
            ack = agent_pb2.Ack(order_id=command.order.order_id, ok=False, error="a simulated agent runs nothing")
            outbox.put_nowait(agent_pb2.AgentMessage(ack=ack))


async def heartbeats(fleet: Fleet, outbox: asyncio.Queue[agent_pb2.AgentMessage | None], period: float) -> None:
    await asyncio.sleep(random.uniform(0, period))
    next_inventory: float | None = None  # the first at a random point of the first period after SIGUSR1
    while True:
        outbox.put_nowait(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
        fleet.counts.heartbeats += 1
        if fleet.inventories_on.is_set() and next_inventory is None:
            next_inventory = time.monotonic() + random.uniform(0, fleet.inventory_every)
        if next_inventory is not None and time.monotonic() >= next_inventory:
            outbox.put_nowait(agent_pb2.AgentMessage(inventory=inventory()))
            fleet.counts.inventories += 1
            next_inventory = time.monotonic() + fleet.inventory_every
        await asyncio.sleep(period)


def report(phase: str, **fields: Any) -> None:
    print(json.dumps({"phase": phase, **fields}), flush=True)


async def main(args: argparse.Namespace) -> None:
    ctx = current_context()
    target, tls = parse_target(ctx.addresses[0])
    fleet = Fleet(ctx, target, tls, args.inventory_every, expected=args.count)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, fleet.stop.set)
    loop.add_signal_handler(signal.SIGINT, fleet.stop.set)
    loop.add_signal_handler(signal.SIGUSR1, fleet.inventories_on.set)

    began = time.monotonic()
    tokens = await create_machines(ctx, args.pool, args.count, args.prefix, args.concurrency)
    report("created", seconds=time.monotonic() - began)
    began = time.monotonic()
    agent_tokens = await join_agents(fleet, tokens, args.concurrency)
    report("joined", seconds=time.monotonic() - began)

    began = time.monotonic()
    gate = asyncio.Semaphore(args.connect_concurrency)
    streams = []

    async def start(index: int, token: str) -> None:
        first = asyncio.Event()
        async with gate:  # at most this many Hellos outstanding: the ramp of a fleet coming online
            streams.append(asyncio.create_task(one_stream(fleet, index, token, first)))
            waiters = {asyncio.create_task(first.wait()), asyncio.create_task(fleet.stop.wait())}
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()

    await asyncio.gather(*(start(i, t) for i, t in enumerate(agent_tokens)))
    if fleet.stop.is_set():
        return
    report("connected", seconds=time.monotonic() - began, streams=fleet.counts.welcomed)
    await fleet.stop.wait()
    await asyncio.wait(streams, timeout=30)
    c = fleet.counts
    report(
        "done",
        heartbeats=c.heartbeats,
        inventories=c.inventories,
        pings=c.pings,
        orders=c.orders,
        stream_ends=dict(c.stream_ends),
        cpu_s=sum(os.times()[:2]),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--pool", default="box")
    parser.add_argument("--prefix", default="sim", help="machine names are PREFIX-0000, PREFIX-0001...")
    parser.add_argument("--concurrency", type=int, default=16, help="CreateJoinedMachine/Join calls in flight")
    parser.add_argument("--connect-concurrency", type=int, default=50, help="streams waiting for Welcome at once")
    parser.add_argument("--inventory-every", type=float, default=300.0)  # as the agent: on change, and every 5 min
    try:
        asyncio.run(main(parser.parse_args()))
    except grpc.aio.AioRpcError as exc:
        print(f"agents_load: {exc.code().name}: {exc.details()}", file=sys.stderr)
        sys.exit(1)
