"""The SDK client's channels: moving to another replica never cancels the calls still open on the old one.

A cancelled gRPC call raises ``asyncio.CancelledError`` in the coroutine awaiting it, which looks exactly like
that coroutine's own task being cancelled, so a ``map``'s watch on a closed channel would end silently and
the map would wait forever for its results. The client therefore closes a channel it moved away from only
later (``RETIRE_AFTER_S``), and every call on it finishes or fails on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from levers9.proto.v1 import common_pb2, controlplane_pb2, controlplane_pb2_grpc
from levers9.sdk.calls import watch
from levers9.sdk.client import Client
from levers9.sdk.context import Context


class _SlowWatch(controlplane_pb2_grpc.ControlPlaneServicer):
    """WhoAmI answers; WatchMany sends its one result once told to."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.release = asyncio.Event()

    async def WhoAmI(self, request: controlplane_pb2.WhoAmIRequest, context: Any) -> controlplane_pb2.WhoAmIResponse:
        return controlplane_pb2.WhoAmIResponse(workspace_name="w")

    async def WatchMany(
        self, request: controlplane_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[controlplane_pb2.TaskEvents]:
        self.opened.set()
        await self.release.wait()
        [task_id] = request.task_ids
        result = common_pb2.TaskResult(task_id=task_id, status="complete", result=b"done")
        yield controlplane_pb2.TaskEvents(
            events=[controlplane_pb2.TaskEvent(task_id=task_id, status="complete", result=result)]
        )


@pytest.fixture
async def server() -> AsyncIterator[tuple[_SlowWatch, int]]:
    servicer = _SlowWatch()
    srv = grpc.aio.server()
    add: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server
    add(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield servicer, port
    finally:
        await srv.stop(0)


async def test_a_watch_open_when_the_client_moves_on_still_gets_its_result(server: tuple[_SlowWatch, int]) -> None:
    servicer, port = server
    # two addresses of the same live server: moving on from the first must leave its open watch alone
    address = f"127.0.0.1:{port}"
    client = Client(Context(name="t", grpc=f"{address},localhost:{port}", token="x"))
    try:

        async def follow() -> list[str]:
            return [event.task_id async for event in watch(client, ["task_1"])]

        following = asyncio.run_coroutine_threadsafe(follow(), client._loop)
        await asyncio.wait_for(servicer.opened.wait(), 10)
        # another call failed and the client moved to the next replica (done on the client's loop)
        moved = asyncio.run_coroutine_threadsafe(_move_on(client), client._loop)
        await asyncio.wrap_future(moved)
        servicer.release.set()
        assert await asyncio.wait_for(asyncio.wrap_future(following), 10) == ["task_1"]
    finally:
        await asyncio.get_running_loop().run_in_executor(None, client.close)


async def _move_on(client: Client) -> None:
    client.current()
    client._retire(failed=True)
