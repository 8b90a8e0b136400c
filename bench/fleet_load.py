"""The worker load of ``bench/fleet.py``: N simulated idle workers, registered for real, holding real sessions.

Run by ``bench/fleet.py`` as its own process (so its CPU is never counted as
the controlplane's): ``python bench/fleet_load.py --count N --pool P``, with
the controlplane's context in ``$LEVERS9_HOME`` (its address and CA) and a
pool worker token (``levers9 token create --kind worker --pool P``) in
``$LEVERS9_WORKER_TOKEN``. Each simulated worker does on the wire what an idle
``levers9 worker`` does (:mod:`levers9.worker.session`,
:mod:`levers9.worker.outbox`), on a channel of its own (its own TCP and TLS
connection, with the worker's channel options: gRPC keepalive pings every
:data:`levers9.worker.session.SESSION_PING_S`, unless ``--ping-s`` asks for a
what-if):

1. ``Register`` with the token and the fields a worker sends (its pool, CPU
   and memory, no GPU, its hostname, this levers9 version, the port and nonce
   of a :class:`levers9.worker.tunnel.ProbeListener`, which the controlplane
   connects to, so it is told no tunnel is needed);
2. one ``Session`` stream with its token and worker id as metadata: a
   ``WorkerMessage(keepalive=True)`` at once and then every
   ``RegisterResponse.keepalive_s`` (unless ``--keepalive-s`` asks for a
   what-if), the first repeat at a random point of the first period (a fleet's
   workers started at different times). Anything the
   controlplane sends down is counted; a container request is answered with
   an error result (nothing runs here), a ``drain`` is counted.

A session that ends is counted (``session_ends``, with the reasons) and the
worker registers again with its id after 1 s, as a worker does. It never runs a
container, starts no warm pool, holds no tunnel and stores no blob.

One :class:`~levers9.worker.tunnel.ProbeListener` serves every simulated
worker (a real worker has its own): the controlplane's probe at registration
costs it the same either way.

Progress goes to stdout as one JSON object per line, as ``bench/agents_load.py``
does: ``{"phase": "registered", "seconds": ...}`` once every worker registered
and opened its session, and after SIGTERM ``{"phase": "done", ...counts...}``.
A failure to register ends the process with its error on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents_load import bounded, report
from levers9.__about__ import __version__
from levers9.payloads import MESSAGE_MAX_BYTES
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.target import parse_target
from levers9.proto.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from levers9.sdk.channel import credentials
from levers9.sdk.context import current_context
from levers9.worker.session import SESSION_PING_S
from levers9.worker.tunnel import ProbeListener

TOKEN_ENV = "LEVERS9_WORKER_TOKEN"


def channel_options(ping_s: float = SESSION_PING_S) -> list[tuple[str, Any]]:
    """The channel options of ``levers9.worker.session.WorkerProcess._sessions`` (gRPC pings every ``ping_s``,
    the worker's :data:`~levers9.worker.session.SESSION_PING_S` unless a what-if run says otherwise), plus a
    subchannel pool of its own per channel, so that every simulated worker has its own TCP connection as a
    separate machine would."""
    return [
        ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
        ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
        ("grpc.keepalive_time_ms", int(ping_s * 1000)),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.use_local_subchannel_pool", 1),
    ]


@dataclass
class Counts:
    keepalives: int = 0
    registrations: int = 0
    requests: int = 0
    stubs: int = 0
    cancels: int = 0
    drains: int = 0
    session_ends: Counter[str] = field(default_factory=Counter)


@dataclass
class Workers:
    """What every simulated worker shares: where the controlplane is, the token, the probe port, the counts."""

    target: str
    creds: grpc.ChannelCredentials | None
    token: str
    pool: str
    probe: ProbeListener
    cpu_millicores: int
    memory_mib: int
    ping_s: float = SESSION_PING_S
    #: seconds between keepalives; 0: ``RegisterResponse.keepalive_s``, as a worker does (another is a what-if)
    keepalive_s: float = 0.0
    counts: Counts = field(default_factory=Counts)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def channel(self) -> grpc.aio.Channel:
        options = channel_options(self.ping_s)
        if self.creds is not None:
            return grpc.aio.secure_channel(self.target, self.creds, options)
        return grpc.aio.insecure_channel(self.target, options)

    def metadata(self, worker_id: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"), (WORKER_ID_METADATA, worker_id))


async def register(workers: Workers, stub: Any, index: int, worker_id: str) -> worker_pb2.RegisterResponse:
    request = worker_pb2.RegisterRequest(
        pool=workers.pool,
        cpu_millicores=workers.cpu_millicores,
        memory_mib=workers.memory_mib,
        hostname=f"sim-worker-{index:04d}",
        version=__version__,
        worker_id=worker_id,
        probe_port=workers.probe.port,
        probe_nonce=workers.probe.nonce,
    )
    response: worker_pb2.RegisterResponse = await stub.Register(
        request, metadata=workers.metadata(worker_id), timeout=60
    )
    workers.counts.registrations += 1
    return response


async def upstream(
    workers: Workers, period: float, outbox: asyncio.Queue[worker_pb2.WorkerMessage], ended: asyncio.Event
) -> AsyncIterator[worker_pb2.WorkerMessage]:
    """What the worker's outbox yields at rest: a keepalive at once, then one every ``period``; replies between."""
    next_keepalive = time.monotonic()
    first = True
    while not ended.is_set():
        wait = max(0.0, next_keepalive - time.monotonic())
        try:
            yield await asyncio.wait_for(outbox.get(), wait)
            continue
        except TimeoutError:
            pass
        workers.counts.keepalives += 1
        yield worker_pb2.WorkerMessage(keepalive=True)
        # the first repeat at a random point of the first period, then every period
        next_keepalive = time.monotonic() + (random.uniform(0, period) if first else period)
        first = False


def answer(workers: Workers, message: worker_pb2.ControllerMessage) -> list[worker_pb2.WorkerMessage]:
    """What a simulated worker says back to a message from the controlplane (nothing runs here)."""
    kind = message.WhichOneof("kind")
    requests: list[worker_pb2.ContainerRequest] = []
    if kind == "stub":
        workers.counts.stubs += 1
    elif kind == "cancel":
        workers.counts.cancels += 1
    elif kind == "drain":
        workers.counts.drains += 1
    elif kind == "request":
        requests = [message.request]
    elif kind == "requests":
        requests = list(message.requests.requests)
    workers.counts.requests += len(requests)
    error = common_pb2.RemoteError(type="WorkerError", message="a simulated worker runs nothing")
    return [
        worker_pb2.WorkerMessage(results=[common_pb2.TaskResult(task_id=r.task_id, status="error", error=error)])
        for r in requests
    ]


async def session(workers: Workers, stub: Any, worker_id: str, period: float, ready: asyncio.Event) -> None:
    """One session, until it ends or ``workers.stop``; ``ready`` is set once the first keepalive went up."""
    outbox: asyncio.Queue[worker_pb2.WorkerMessage] = asyncio.Queue()
    ended = asyncio.Event()
    call = stub.Session(upstream(workers, period, outbox, ended), metadata=workers.metadata(worker_id))
    stopping = asyncio.create_task(workers.stop.wait())
    try:
        reading = asyncio.create_task(read(workers, call, outbox))
        ready.set()
        done, _ = await asyncio.wait({stopping, reading}, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            reading.result()
            workers.counts.session_ends["ended by the controlplane"] += 1
        else:
            reading.cancel()
    finally:
        ended.set()
        stopping.cancel()
        call.cancel()


async def read(workers: Workers, call: Any, outbox: asyncio.Queue[worker_pb2.WorkerMessage]) -> None:
    async for message in call:
        for reply in answer(workers, message):
            outbox.put_nowait(reply)


async def one_worker(workers: Workers, index: int, registered: asyncio.Event) -> None:
    """A worker: register, hold the session; register again (same id) 1 s after it ends, until ``workers.stop``."""
    worker_id = ""
    while not workers.stop.is_set():
        async with workers.channel() as channel:
            stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            try:
                response = await register(workers, stub, index, worker_id)
                worker_id = response.worker_id
                period = workers.keepalive_s or response.keepalive_s or 10.0
                await session(workers, stub, worker_id, period, registered)
            except grpc.aio.AioRpcError as exc:
                if not registered.is_set():
                    raise
                workers.counts.session_ends[f"{exc.code().name}: {exc.details()}"] += 1
        if not workers.stop.is_set():
            await asyncio.sleep(1.0)


async def main(args: argparse.Namespace) -> None:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"fleet_load: ${TOKEN_ENV} must hold a pool worker token")
    ctx = current_context()
    target, tls = parse_target(ctx.addresses[0])
    probe = ProbeListener()
    await probe.start()
    creds = credentials(ctx) if tls else None
    workers = Workers(target, creds, token, args.pool, probe, args.cpu, args.memory, args.ping_s, args.keepalive_s)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, workers.stop.set)
    loop.add_signal_handler(signal.SIGINT, workers.stop.set)

    began = time.monotonic()
    tasks: list[asyncio.Task[None]] = []

    async def start(index: int) -> None:
        registered = asyncio.Event()
        tasks.append(asyncio.create_task(one_worker(workers, index, registered)))
        got = asyncio.create_task(registered.wait())
        await asyncio.wait({got, tasks[-1]}, return_when=asyncio.FIRST_COMPLETED)
        got.cancel()
        if tasks[-1].done():
            tasks[-1].result()  # raises what ended it before it registered

    try:
        await bounded(list(range(args.count)), args.concurrency, start)
        report("registered", seconds=time.monotonic() - began, workers=args.count)
        await workers.stop.wait()
        await asyncio.wait(tasks, timeout=30)
    finally:
        await probe.close()
    c = workers.counts
    report(
        "done",
        keepalives=c.keepalives,
        registrations=c.registrations,
        requests=c.requests,
        stubs=c.stubs,
        cancels=c.cancels,
        drains=c.drains,
        session_ends=dict(c.session_ends),
        cpu_s=sum(os.times()[:2]),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--pool", default="fleet")
    parser.add_argument("--cpu", type=int, default=2000, help="millicores each worker offers")
    parser.add_argument("--memory", type=int, default=4096, help="MiB each worker offers")
    parser.add_argument("--concurrency", type=int, default=32, help="registrations in flight")
    parser.add_argument(
        "--ping-s",
        type=float,
        default=SESSION_PING_S,
        help="seconds between gRPC pings (default: the worker's; another value is a what-if)",
    )
    parser.add_argument(
        "--keepalive-s",
        type=float,
        default=0.0,
        help="seconds between keepalives (default 0: what Register answers; another is a what-if)",
    )
    try:
        asyncio.run(main(parser.parse_args()))
    except grpc.aio.AioRpcError as exc:
        print(f"fleet_load: {exc.code().name}: {exc.details()}", file=sys.stderr)
        sys.exit(1)
