"""A replica's worker sessions share one timer: keepalives reach Redis in batches, unannounced work is found.

Through the real Worker gRPC service on real Services (SQLite and PostgreSQL, embedded Redis), with a worker
that registers with its machine's join token and holds its ``Session`` stream as a worker does. No test
asserts how long anything took: each waits, up to a generous deadline, for the state it expects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import worker_pb2
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.state.sql.records import TokenKind
from tests.controlplane.conftest import Cp

DEADLINE_S = 20.0


async def _until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"gave up waiting for {what} within {DEADLINE_S:g} s")
        await asyncio.sleep(0.05)


@dataclass
class Worker:
    """A registered worker holding its session: what it sends goes into ``up``, what comes down is read off
    ``call``."""

    worker_id: str
    up: asyncio.Queue[worker_pb2.WorkerMessage | None]
    call: Any

    def keepalive(self) -> None:
        self.up.put_nowait(worker_pb2.WorkerMessage(keepalive=True))


@contextlib.asynccontextmanager
async def session(cp: Cp) -> AsyncIterator[Worker]:
    machine_id, join = await cp.machine()
    registered = await cp.register(join, machine_id)
    up: asyncio.Queue[worker_pb2.WorkerMessage | None] = asyncio.Queue()

    async def messages() -> AsyncIterator[worker_pb2.WorkerMessage]:
        while (message := await up.get()) is not None:
            yield message

    metadata = (("authorization", f"Bearer {registered.session_token}"), (WORKER_ID_METADATA, registered.worker_id))
    call = cp.stub.Session(messages(), metadata=metadata)
    try:
        yield Worker(registered.worker_id, up, call)
    finally:
        up.put_nowait(None)
        call.cancel()


async def _alive(cp: Cp, worker_id: str) -> bool:
    return bool(await cp.services.redis.exists(f"l9:alive:{worker_id}"))


async def attached(cp: Cp, worker: Worker) -> None:
    """Until the worker's session is held: a keepalive sent on it has reached Redis."""
    await cp.services.redis.delete(f"l9:alive:{worker.worker_id}")
    worker.keepalive()
    await _until("the session to be attached", lambda: _alive(cp, worker.worker_id))


async def test_a_keepalive_reaches_redis_in_the_next_batch(cp: Cp) -> None:
    async with session(cp) as worker:
        await cp.services.redis.delete(f"l9:alive:{worker.worker_id}")  # as if its keepalive had lapsed
        worker.keepalive()
        await _until("the keepalive to set the worker alive again", lambda: _alive(cp, worker.worker_id))
        assert await cp.services.scheduler.workers.silent() == []


async def test_a_worker_reaped_meanwhile_is_told_to_register_again(cp: Cp) -> None:
    async with session(cp) as worker:
        await attached(cp, worker)
        await cp.services.scheduler.remove_worker(worker.worker_id, "was silent", force=True)
        worker.keepalive()
        # the controlplane ends the session; the worker's next step is to register again
        code: grpc.StatusCode | None = None
        try:
            received = await asyncio.wait_for(_drain(worker.call), DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            code, received = exc.code(), []
        assert code is None, f"the session should end cleanly, not with {code}"
        assert received == []
        assert await cp.services.scheduler.workers.get(worker.worker_id) is None


async def _drain(call: Any) -> list[worker_pb2.ControllerMessage]:
    return [message async for message in call]


async def test_work_placed_without_a_wake_up_is_sent_down_all_the_same(cp: Cp) -> None:
    """Another replica placed the call and its notice never arrived: the replica's timer finds the work."""
    services = cp.services
    elsewhere = DataPlane(services, Hub(services.redis, name="elsewhere"))
    services.scheduler.on_placed = None  # no replica is told: every wake-up is lost
    workspace = await services.workspaces.get_or_create("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    try:
        async with session(cp) as worker:
            await attached(cp, worker)
            stub_id, _ = await elsewhere.get_or_create_stub(me, {"name": "f", "cpu_millicores": 500}, b"handler")
            [task_id] = await elsewhere.submit(me, stub_id, [b"args"])  # a lone call: placed by its submit
            state = await services.scheduler.backlog.get(task_id)
            assert state is not None
            assert (state.state, state.worker) == ("placed", worker.worker_id)

            async def requests() -> list[str]:
                async for message in worker.call:
                    if message.WhichOneof("kind") == "requests":
                        return [r.task_id for r in message.requests.requests]
                return []

            assert await asyncio.wait_for(requests(), DEADLINE_S) == [task_id]
    finally:
        await elsewhere.close()
