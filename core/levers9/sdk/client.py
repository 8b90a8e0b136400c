"""The SDK's connection to a controlplane, usable from plain synchronous code and from async code.

User programs are mostly synchronous, yet a ``map`` must keep hundreds of
calls in flight and read results as they stream in. The client therefore runs
its own event loop in a daemon thread, owns the gRPC channel there, and hands
synchronous callers the results of coroutines run on that loop. Async callers
await the same coroutines through :meth:`Client.run_async` without blocking
their own loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from levers9.proto.v1 import controlplane_pb2_grpc
from levers9.sdk.channel import call_metadata, control_plane, explain, open_channel
from levers9.sdk.context import Context, current_context
from levers9.sdk.errors import ControlPlaneError, InvalidFunction, Unschedulable

__all__ = ["Client", "client_for", "translate"]

T = TypeVar("T")

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def translate(exc: grpc.aio.AioRpcError, ctx: Context) -> Exception:
    """A gRPC failure as the SDK error a user would catch."""
    code = exc.code()
    message = explain(exc, ctx)
    if code == grpc.StatusCode.FAILED_PRECONDITION and "no pool can run" in message:
        return Unschedulable(message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidFunction(message)
    return ControlPlaneError(message)


class Client:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.metadata = call_metadata(ctx)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"levers9 {ctx.name}", daemon=True)
        self._thread.start()
        self._channel: grpc.aio.Channel | None = None
        self._stub: controlplane_pb2_grpc.ControlPlaneStub | None = None
        #: stub ids by (function identity, config digest), so a function is registered once per client
        self.stub_ids: dict[tuple[int, str], str] = {}
        #: the controlplane's cap on one payload, asked once before the first big one is sent
        self.max_payload_bytes: int | None = None

    @property
    def stub(self) -> controlplane_pb2_grpc.ControlPlaneStub:
        """The ControlPlane stub; only use it from coroutines running on this client's loop."""
        if self._stub is None:
            self._channel = open_channel(self.ctx)
            self._stub = control_plane(self._channel)
        return self._stub

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the client's loop and wait for it here (from synchronous code)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("levers9: a blocking SDK call was made from inside the SDK's own loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            raise
        except KeyboardInterrupt:
            future.cancel()
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the client's loop from another event loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            if self._channel is not None:
                await self._channel.close()
            # gRPC leaves bookkeeping tasks behind for finished calls; end them here, or Python prints
            # "Task was destroyed but it is pending!" when the program exits
            current = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not current]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._loop.close()


_resolved: dict[tuple[str | None, ...], Context] = {}


def client_for(context: str | None = None) -> Client:
    """The shared client of the named (or current) context.

    The context file is read once per combination of the variables that choose
    a context, so calling in a loop does not read and parse it every time.
    """
    import os

    names = ("LEVERS9_CONTEXT", "LEVERS9_HOME", "LEVERS9_GRPC", "LEVERS9_TOKEN")
    selector = (context, *(os.environ.get(v) for v in names))
    ctx = _resolved.get(selector)
    if ctx is None:
        ctx = _resolved[selector] = current_context(context)
    key = f"{ctx.name}|{ctx.grpc}|{ctx.token}"
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(ctx)
        return client


@atexit.register
def _close_all() -> None:
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
