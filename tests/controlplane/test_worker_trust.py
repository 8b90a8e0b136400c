"""What a forged worker can do with a real pool worker token: nothing to calls and containers not placed on it.

A probe registered a worker of its own with a pool's worker token (anyone running workers by hand on that pool
holds one), then finished another workspace's pending call with a pickled result that the caller's SDK would
unpickle, and reported a serving container at the controlplane's own listener, which the gateway then relayed
requests to. Through the real Worker gRPC service on real Services (SQLite and PostgreSQL, embedded Redis),
with the worker's own client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from levers9.__about__ import __version__
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import common_pb2, worker_pb2
from levers9.services.auth import Principal
from levers9.services.reports import ServingReport, TaskOutcome
from levers9.state.sql.records import TokenKind
from tests.controlplane.conftest import Cp

DEADLINE_S = 20.0
#: a result whose unpickling runs a shell command
EVIL = b"cos\nsystem\n(S'touch /tmp/levers9-pwned'\ntR."


async def _until(what: str, check: Callable[[], Awaitable[bool] | bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        answer = check()
        if await answer if isinstance(answer, Awaitable) else answer:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"gave up waiting for {what} within {DEADLINE_S:g} s")
        await asyncio.sleep(0.05)


@dataclass
class Forged:
    """A worker of the ``cpu`` pool registered with a real pool worker token, holding its session."""

    worker_id: str
    up: asyncio.Queue[worker_pb2.WorkerMessage | None]
    #: what came down its session, as it came
    down: asyncio.Queue[worker_pb2.ControllerMessage]

    def send(self, **fields: Any) -> None:
        self.up.put_nowait(worker_pb2.WorkerMessage(**fields))

    async def placed(self) -> list[str]:
        """The task ids of the next batch of requests sent down to it."""
        while True:
            message = await self.down.get()
            if message.WhichOneof("kind") == "requests":
                return [r.task_id for r in message.requests.requests]


@contextlib.asynccontextmanager
async def forged_worker(cp: Cp) -> AsyncIterator[Forged]:
    _, token = await cp.services.tokens.issue("worker", subject="cpu")
    registered = await cp.stub.Register(
        worker_pb2.RegisterRequest(pool="cpu", hostname="evil", version=__version__),
        metadata=(("authorization", f"Bearer {token}"),),
        timeout=30,
    )
    up: asyncio.Queue[worker_pb2.WorkerMessage | None] = asyncio.Queue()

    async def messages() -> AsyncIterator[worker_pb2.WorkerMessage]:
        while (message := await up.get()) is not None:
            yield message

    # a worker of a pool token speaks with that token (a machine's worker gets a session token instead)
    speaks = registered.session_token or token
    metadata = (("authorization", f"Bearer {speaks}"), (WORKER_ID_METADATA, registered.worker_id))
    call = cp.stub.Session(messages(), metadata=metadata)
    down: asyncio.Queue[worker_pb2.ControllerMessage] = asyncio.Queue()

    async def read() -> None:
        async for message in call:
            down.put_nowait(message)

    reader = asyncio.create_task(read())
    try:
        yield Forged(registered.worker_id, up, down)
    finally:
        up.put_nowait(None)
        call.cancel()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


def _refused(cp: Cp, what: str) -> float:
    value: float = cp.metrics.worker_refusals.labels(replica="local", what=what)._value.get()
    return value


async def test_a_forged_worker_cannot_finish_another_workspaces_pending_call(cp: Cp) -> None:
    services, dp = cp.services, cp.dataplane
    victim = await services.workspaces.get_or_create("team-b")
    them = Principal(token_id="t", kind=TokenKind.USER, workspace_id=victim.id, subject="someone")
    # an L4 call: no worker of the CPU pool may ever be given it
    stub_id, _ = await dp.get_or_create_stub(them, {"name": "f", "gpu": ["L4"]}, b"pickled handler")
    [task_id] = await dp.submit(them, stub_id, [b"args"])
    async with forged_worker(cp) as forged:
        forged.send(
            started=[worker_pb2.TaskStarted(task_id=task_id, container_id="c1")],
            results=[common_pb2.TaskResult(task_id=task_id, status="complete", result=EVIL)],
            logs=[worker_pb2.TaskLog(task_id=task_id, data=b"owned\n")],
        )
        await _until("the report to be refused", lambda: _refused(cp, "report") >= 1)
        await _until("the flusher to be idle", lambda: dp.reports.idle)
        await asyncio.sleep(0.2)
    task = await services.tasks.get(task_id)
    assert task is not None
    assert (task.status.value, task.worker_id, task.container_id) == ("pending", None, None)
    assert await dp.calls.results([task_id]) == []
    assert await dp.calls.logs(task_id) == []


@dataclass
class Listener:
    """The gateway's side: what it would be told of serving containers."""

    ready: list[tuple[str, ServingReport]] = field(default_factory=list)

    def serving(self, stub_id: str, worker_id: str, report: ServingReport) -> None:
        self.ready.append((worker_id, report))

    def ended(self, outcomes: Sequence[TaskOutcome]) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_the_gateway_is_told_only_of_addresses_a_container_of_that_worker_can_have(cp: Cp) -> None:
    """Loopback is this host's: the worker's session comes from here, so its containers may answer there, but
    never at one of the controlplane's own listeners; link-local and other hosts' addresses are nobody's."""
    services, dp = cp.services, cp.dataplane
    listener = Listener()
    dp.serving_listener = listener
    victim = await services.workspaces.get_or_create("team-b")
    them = Principal(token_id="t", kind=TokenKind.USER, workspace_id=victim.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(
        them, {"name": "web", "kind": "endpoint", "cpu_millicores": 100}, b"pickled handler"
    )
    free = _free_port()
    addresses = {
        f"127.0.0.1:{cp.port}": False,  # the controlplane's gRPC listener (the probe used its metrics port)
        "169.254.169.254:80": False,  # a cloud's metadata service
        "10.9.8.7:8080": False,  # another host: not where the worker's session comes from
        "localhost:8080": False,  # a name, not an address
        f"127.0.0.1:{free}": True,  # a port of this host that the controlplane does not listen on
    }
    async with forged_worker(cp) as forged:
        tasks = [dp.new_serving_id() for _ in addresses]
        for task_id in tasks:
            await dp.start_serving(victim.id, stub_id, task_id)
        placed: list[str] = []
        while len(placed) < len(tasks):
            placed += await asyncio.wait_for(forged.placed(), DEADLINE_S)
        assert sorted(placed) == sorted(tasks)
        forged.send(
            started=[
                worker_pb2.TaskStarted(task_id=task_id, container_id=f"c{i}", address=address)
                for i, (task_id, address) in enumerate(zip(tasks, addresses, strict=True))
            ]
        )
        await _until("the refusals", lambda: _refused(cp, "address") >= 4)
        await _until("the allowed address to reach the gateway", lambda: bool(listener.ready))
    assert _refused(cp, "address") == 4
    assert [(w, r.address) for w, r in listener.ready] == [(forged.worker_id, f"127.0.0.1:{free}")]


async def test_a_worker_resending_a_finished_calls_outcome_is_not_a_security_event(
    cp: Cp, caplog: pytest.LogCaptureFixture
) -> None:
    """After a failover a worker registers with another replica and re-sends what it reported in the last minute:
    outcomes of calls it ran that are finished already. Dropped quietly, not refused as a forged report; a report on
    a call never placed on it is still refused and logged as one."""
    services, dp = cp.services, cp.dataplane
    mine = await services.workspaces.get_or_create("team-a")
    us = Principal(token_id="t", kind=TokenKind.USER, workspace_id=mine.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(us, {"name": "f", "cpu_millicores": 100}, b"pickled handler")
    victim = await services.workspaces.get_or_create("team-b")
    them = Principal(token_id="t2", kind=TokenKind.USER, workspace_id=victim.id, subject="someone else")
    other_stub, _ = await dp.get_or_create_stub(them, {"name": "g", "gpu": ["L4"]}, b"pickled handler")
    [not_ours] = await dp.submit(them, other_stub, [b"args"])
    async with forged_worker(cp) as forged:
        [task_id] = await dp.submit(us, stub_id, [b"args"])
        assert await asyncio.wait_for(forged.placed(), DEADLINE_S) == [task_id]
        started = worker_pb2.TaskStarted(task_id=task_id, container_id="c1")
        result = common_pb2.TaskResult(task_id=task_id, status="complete", result=b"first")
        forged.send(started=[started], results=[result], logs=[worker_pb2.TaskLog(task_id=task_id, data=b"ran\n")])

        async def finished() -> bool:
            task = await services.tasks.get(task_id)
            return task is not None and task.status.value == "complete"

        await _until("the outcome to be stored", finished)
        caplog.set_level(logging.DEBUG, logger="levers9.services.worker_reports")
        caplog.clear()
        # re-sent as after a failover: the same start, outcome and output again
        forged.send(started=[started], results=[result], logs=[worker_pb2.TaskLog(task_id=task_id, data=b"ran\n")])
        # then a report on a call that was never placed on it
        forged.send(results=[common_pb2.TaskResult(task_id=not_ours, status="complete", result=EVIL)])
        # output trailing its own finished call is accepted: once stored, everything before it has been read
        forged.send(logs=[worker_pb2.TaskLog(task_id=task_id, data=b"trailing\n")])

        async def trailing_stored() -> bool:
            return [d for _, d in await dp.calls.logs(task_id)] == [b"ran\n", b"trailing\n"]

        await _until("the trailing output to be stored", trailing_stored)
    assert _refused(cp, "report") == 1, "the re-sent outcome was counted as a refusal"
    security = [r.getMessage() for r in caplog.records if r.getMessage().startswith("security:")]
    assert len(security) == 1, security
    assert not_ours in security[0]
    assert task_id not in security[0]
    assert any(r.levelno == logging.DEBUG and task_id in r.getMessage() for r in caplog.records)
    assert await dp.calls.results([not_ours]) == []
    [stored] = await dp.calls.results([task_id])
    assert (stored.status, stored.result) == ("complete", b"first")
