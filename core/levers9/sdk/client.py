"""The SDK's connection to a controlplane, usable from plain synchronous code and from async code.

User programs are mostly synchronous, yet a ``map`` must keep hundreds of
calls in flight and read results as they stream in. The client therefore runs
its own event loop in a daemon thread, owns the gRPC channel there, and hands
synchronous callers the results of coroutines run on that loop. Async callers
await the same coroutines through :meth:`Client.run_async` without blocking
their own loop.

**Replicas.** A context may list several controlplane replicas. The client
talks to one at a time; when it has none that answers (at the start, or once
its replica failed a call with UNAVAILABLE: refused, reset, gone mid-stream)
it dials every replica at once and keeps the first that answers
(:mod:`levers9.sdk.dial`; the one it had is preferred by a head start of a
quarter second). A round in which none answered is followed by a wait (0.2 s
doubling to 5 s, with jitter), and the client keeps going until the context's
``reconnect_s`` has passed without reaching any replica; then the call fails
with :class:`ControlPlaneError` naming every address tried. That one deadline
governs every call of the SDK: it counts from the first failure after the last
successful contact with any replica (an answer, a message on a stream, or a
probe that connected), so a client idle for an hour does not fail on its first
hiccup. Two cases fail sooner, because waiting cannot help: a client that has
never reached any replica and finds every address refusing connections for
:data:`START_REFUSED_S` (there is no controlplane: the message says to start
one), and a TLS handshake that cannot succeed (below).

**Exactly once.** Reads and idempotent writes (registering a function,
cancelling, blobs, watches) are simply retried on the next replica. Calls
(``Submit``, ``SubmitAndWatch``, ``Invoke``) carry a submission id, so the
same request sent again to another replica is stored once (see
:mod:`levers9.sdk.calls`); once the ids came, results are followed by task id
on any replica (tasks live in the shared SQL/Redis). ``Deploy`` is sent once,
after the client has made sure it is connected; if the connection breaks
before the answer, the deploy may or may not have happened, so it is not sent
again and the caller gets a :class:`ControlPlaneError` that says so.

A TLS certificate that does not verify is not a reason to move on: the call
fails at once with a message naming ``ca_file`` and ``$LEVERS9_CA_FILE``; so
does a plain-text context dialling a TLS port, or the reverse (the message
says which scheme to use).

With :data:`ANNOUNCE` set (``levers9 run`` sets it), a client whose first
dial has not reached a replica within :data:`ANNOUNCE_AFTER_S` (or failed
sooner) says on stderr which addresses it is connecting to, so a person is not left looking
at a silent terminal.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc

from levers9.backoff import Backoff
from levers9.proto.target import parse_target
from levers9.proto.tls import certificate_untrusted
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from levers9.sdk.channel import call_metadata, control_plane, explain, open_channel, untrusted_message
from levers9.sdk.context import Context, current_context
from levers9.sdk.dial import Failure, Reached, dial, unreached_message
from levers9.sdk.errors import ControlPlaneError, InvalidFunction, Unschedulable

__all__ = ["ANNOUNCE_AFTER_S", "CONNECT_S", "GONE", "START_REFUSED_S", "Client", "client_for", "translate"]

T = TypeVar("T")

#: how long one replica may take to answer a probe (a black-holed address) before it counts as failed
CONNECT_S = 10.0
#: a client that never reached a replica gives up after every address refused connections this long
START_REFUSED_S = 3.0
#: whether a client says on stderr what it is connecting to when that takes a while (``levers9 run``)
ANNOUNCE = False
#: how long the first connection may take before ANNOUNCE says so
ANNOUNCE_AFTER_S = 0.5
#: the codes of a call whose replica went away, or is stopping (it cancels what is still open when its grace
#: ends): the call may go to another replica
GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
#: how long the channel to a replica the client moved away from stays open for the calls still on it
RETIRE_AFTER_S = 60.0
#: unary methods that store something new each time: sent once, never again on another replica
_SEND_ONCE = frozenset({"Deploy"})
#: the first wait after a full round of replicas failed, and the longest
_ROUND_INITIAL_S = 0.2
_ROUND_CAP_S = 5.0

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def translate(exc: grpc.aio.AioRpcError, ctx: Context, tried: list[str] | None = None) -> Exception:
    """A gRPC failure as the SDK error a user would catch."""
    code = exc.code()
    message = explain(exc, ctx, tried)
    if code == grpc.StatusCode.FAILED_PRECONDITION and "no pool can run" in message:
        return Unschedulable(message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidFunction(message)
    return ControlPlaneError(message)


class Client:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.metadata = call_metadata(ctx)
        #: every replica's address as written, and its host:port
        self.addresses = ctx.addresses
        self.targets = [parse_target(a)[0] for a in self.addresses]
        self.reconnect_s = ctx.reconnect_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"levers9 {ctx.name}", daemon=True)
        self._thread.start()
        self._channel: grpc.aio.Channel | None = None
        #: channels of replicas the client moved away from, closed RETIRE_AFTER_S later (see _retire)
        self._retired: list[grpc.aio.Channel] = []
        self._raw: controlplane_pb2_grpc.ControlPlaneStub | None = None
        self._index = 0
        #: bumped each time the client moves to another replica, so one failure moves it once
        self._generation = 0
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = Backoff(initial_s=_ROUND_INITIAL_S, cap_s=_ROUND_CAP_S, jitter=True)
        #: the replica index each recent generation talked to, for the failures of calls still on old channels
        self._index_of: dict[int, int] = {0: 0}
        #: the dial in progress, shared by every call that needs a replica meanwhile
        self._dialing: asyncio.Task[Reached | list[Failure]] | None = None
        #: the last dial whose outcome was acted on, and the error it left for every call that shared it
        self._judged: asyncio.Task[Reached | list[Failure]] | None = None
        self._verdict: ControlPlaneError | None = None
        #: whether any replica ever answered this client (refusals at the start end sooner, see the module's doc)
        self._ever_reached = False
        self._announced = False
        #: when every address started refusing connections, while none was ever reached
        self._refused_since: float | None = None
        #: the replicas tried since the last contact, in order, for the error a person reads
        self.tried: list[str] = []
        #: stub ids by (function identity, config digest), so a function is registered once per client
        self.stub_ids: dict[tuple[int, str], str] = {}
        #: the refs of images built through this client, by blueprint key (:mod:`levers9.sdk.builds`)
        self.image_refs: dict[str, str] = {}
        #: the controlplane's cap on one payload, asked once before the first big one is sent
        self.max_payload_bytes: int | None = None

    @property
    def stub(self) -> controlplane_pb2_grpc.ControlPlaneStub:
        """The ControlPlane stub; only use it from coroutines running on this client's loop.

        Unary methods move between replicas by themselves (see the module's doc); streaming ones
        go to the current replica, and their callers follow them with :meth:`connect` and :meth:`lost`.
        """
        proxy: Any = _FailoverStub(self)
        stub: controlplane_pb2_grpc.ControlPlaneStub = proxy
        return stub

    @property
    def target(self) -> str:
        """The host:port of the replica the client talks to now."""
        return self.targets[self._index]

    def current(self) -> tuple[controlplane_pb2_grpc.ControlPlaneStub, int]:
        """The stub of the current replica (its channel opened if need be) and the client's generation."""
        if self._raw is None:
            self._channel = open_channel(self.ctx, self.addresses[self._index])
            self._raw = control_plane(self._channel)
        return self._raw, self._generation

    async def connect(self) -> tuple[controlplane_pb2_grpc.ControlPlaneStub, int]:
        """A stub on a replica that answers, dialling every replica until one does; ControlPlaneError past
        ``reconnect_s``, or at once for a handshake that cannot succeed."""
        loop = asyncio.get_running_loop()
        while True:
            wait = self._retry_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            channel, raw = self._channel, self._raw
            if channel is not None and raw is not None and channel.get_state(True) == grpc.ChannelConnectivity.READY:
                return raw, self._generation
            task = self._dial()
            outcome = await asyncio.shield(task)
            # every call waiting meanwhile shares one dial; the first of them to wake acts on its outcome
            if self._judged is not task:
                self._judged = task
                self._verdict = None
                if isinstance(outcome, Reached):
                    self._adopt(outcome)
                    self.reached()
                else:
                    self._verdict = self._failed(outcome, loop.time())
            if self._verdict is not None:
                raise ControlPlaneError(str(self._verdict))

    def _dial(self) -> asyncio.Task[Reached | list[Failure]]:
        """The dial in progress, or a new one preferring the current replica."""
        if self._dialing is None or self._dialing.done():
            self._dialing = asyncio.get_running_loop().create_task(self._dial_all())
        return self._dialing

    async def _dial_all(self) -> Reached | list[Failure]:
        dialing = asyncio.ensure_future(
            dial(
                self.ctx,
                self.addresses,
                prefer=self._index,
                probe_s=min(CONNECT_S, self.reconnect_s),
                metadata=self.metadata,
            )
        )
        if ANNOUNCE and not self._announced and not self._ever_reached:
            done, _ = await asyncio.wait({dialing}, timeout=ANNOUNCE_AFTER_S)
            if not done or _waits_on(dialing.result() if dialing.exception() is None else None):
                self._announced = True
                import sys

                print(f"levers9: connecting to {', '.join(self.targets)}...", file=sys.stderr, flush=True)
        return await dialing

    def _adopt(self, reached: Reached) -> None:
        """Talk to the replica that answered from now on, through the channel the dial opened."""
        self._retire()
        self._channel, self._index = reached.channel, reached.index
        self._raw = control_plane(reached.channel)
        self._index_of[self._generation] = self._index

    def _failed(self, failures: list[Failure], now: float) -> ControlPlaneError | None:
        """No replica answered a dial: wait before the next, or the error to raise when waiting cannot help."""
        for failure in failures:
            if failure.fatal:
                return ControlPlaneError(failure.message)
            if failure.target not in self.tried:
                self.tried.append(failure.target)
        if self._down_since is None:
            self._down_since = now
        if not self._ever_reached and all(f.kind == "refused" for f in failures):
            if self._refused_since is None:
                self._refused_since = now
            if now - self._refused_since >= START_REFUSED_S:
                return ControlPlaneError(unreached_message(self.ctx, failures))
        else:
            self._refused_since = None
        if now - self._down_since >= self.reconnect_s:
            return self.unreachable(failures[-1].error)
        self._retry_at = now + self._backoff.next_s()
        if self._refused_since is not None:  # the last try comes when START_REFUSED_S is up, not a backoff later
            self._retry_at = min(self._retry_at, self._refused_since + START_REFUSED_S)
        return None

    def reached(self) -> None:
        """A replica answered: the time without contact starts again from zero."""
        self._ever_reached = True
        self._refused_since = None
        self._down_since = None
        self._retry_at = 0.0
        self._backoff.reset()
        self.tried.clear()

    async def lost(self, exc: grpc.aio.AioRpcError, generation: int) -> None:
        """The replica of ``generation`` failed with ``exc``: drop it, so the next call dials (once per failure).

        Raises ControlPlaneError when no replica was reached for ``reconnect_s``, or at once when the
        server's certificate was not trusted (another try cannot help).
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        target = self.targets[self._index_of.get(generation, self._index)]
        if certificate_untrusted(exc.details() or ""):
            raise ControlPlaneError(untrusted_message(self.ctx, target)) from None
        if target not in self.tried:
            self.tried.append(target)
        if self._down_since is None:
            self._down_since = now
        if generation == self._generation:
            self._retire(failed=True)
        if now - self._down_since >= self.reconnect_s:
            raise self.unreachable(exc) from None

    def unreachable(self, exc: grpc.aio.AioRpcError) -> ControlPlaneError:
        """The error of a call that reached no replica for ``reconnect_s``."""
        tried = [t for t in self.targets if t in self.tried] or self.targets
        message = explain(exc, self.ctx, tried) if exc.code() == grpc.StatusCode.UNAVAILABLE else ""
        if not message:
            where = tried[0] if len(tried) == 1 else f"any of {', '.join(tried)}"
            message = f"cannot reach the controlplane at {where}: {exc.code().name} {exc.details() or ''}".rstrip()
        return ControlPlaneError(
            f"{message}\n  (no replica answered for {self.reconnect_s:g} s: reconnect_s of context {self.ctx.name!r})"
        )

    def broke(self, exc: grpc.aio.AioRpcError, generation: int, what: str) -> ControlPlaneError:
        """The error of a submission whose connection broke before it was acknowledged; never sent again."""
        target = self.target
        if generation == self._generation:
            self._retire(failed=True)
        return ControlPlaneError(
            f"the connection to the controlplane at {target} broke while {what} was being submitted "
            f"({exc.code().name}: {exc.details() or 'no details'}); it may or may not have been stored, "
            "so it was not sent again"
        )

    def _retire(self, *, failed: bool = False) -> None:
        """Stop using the current channel (the next call dials every replica); it is closed only later.

        After a failure (``failed``) the next dial prefers the replica after this one.

        Other calls may still be on the old channel. Closing it now would cancel them, and a cancelled
        gRPC call raises ``asyncio.CancelledError`` in its caller, which cannot be told from the caller's
        own task being cancelled: a watch would end silently, without its results. Left open, each of them
        fails (or finishes) on its own and follows the client to the next replica.
        """
        channel, self._channel, self._raw = self._channel, None, None
        if failed:
            self._index = (self._index + 1) % len(self.targets)
        self._generation += 1
        self._index_of[self._generation] = self._index
        self._index_of.pop(self._generation - 256, None)
        if channel is not None:
            self._retired.append(channel)
            asyncio.get_running_loop().call_later(RETIRE_AFTER_S, self._close_retired, channel)

    def _close_retired(self, channel: grpc.aio.Channel) -> None:
        if channel in self._retired:
            self._retired.remove(channel)
            task = asyncio.get_running_loop().create_task(channel.close())
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def retrying(self, op: Callable[[controlplane_pb2_grpc.ControlPlaneStub], Awaitable[T]]) -> T:
        """``op`` on a replica, again on the next one while UNAVAILABLE; for reads and idempotent writes only."""
        return await self.on_channel(lambda _channel: op(self.current()[0]))

    async def on_channel(self, op: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
        """``op`` with the channel of a replica that answers, again on the next one while UNAVAILABLE; for
        reads and idempotent writes of other services than ControlPlane (volumes)."""
        while True:
            _, generation = await self.connect()
            assert self._channel is not None
            try:
                result = await op(self._channel)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in GONE:
                    raise
                await self.lost(exc, generation)
                continue
            self.reached()
            return result

    async def once(self, op: Callable[[controlplane_pb2_grpc.ControlPlaneStub], Awaitable[T]], what: str) -> T:
        """``op`` sent once, on a replica known to be reachable; a break before its answer is not retried."""
        stub, generation = await self.connect()
        try:
            result = await op(stub)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in GONE:
                raise
            raise self.broke(exc, generation, what) from None
        self.reached()
        return result

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
            for channel in [*self._retired, self._channel]:
                if channel is not None:
                    await channel.close()
            self._retired.clear()
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


def _waits_on(outcome: Reached | list[Failure] | None) -> bool:
    """Whether a dial that ended with ``outcome`` leaves the client waiting for a replica (no answer, none fatal)."""
    return isinstance(outcome, list) and not any(f.fatal for f in outcome)


class _FailoverStub:
    """The ControlPlane stub as callers use it: unary calls move between replicas, streams stay put."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        client = self._client
        method_of = controlplane_pb2.DESCRIPTOR.services_by_name["ControlPlane"].methods_by_name.get(name)
        if method_of is None or method_of.client_streaming or method_of.server_streaming:
            return getattr(client.current()[0], name)  # asking the descriptor opens no channel for a unary call

        def call(request: Any, **kwargs: Any) -> Awaitable[Any]:
            def op(stub: controlplane_pb2_grpc.ControlPlaneStub) -> Awaitable[Any]:
                method: Any = getattr(stub, name)
                result: Awaitable[Any] = method(request, **kwargs)
                return result

            if name in _SEND_ONCE:
                return client.once(op, f"the {name} request")
            return client.retrying(op)

        return call


_resolved: dict[tuple[str | None, ...], Context] = {}


def client_for(context: str | None = None) -> Client:
    """The shared client of the named (or current) context.

    The context file is read once per combination of the variables that choose
    a context, so calling in a loop does not read and parse it every time.
    """
    import os

    names = (
        "LEVERS9_CONTEXT",
        "LEVERS9_HOME",
        "LEVERS9_GRPC",
        "LEVERS9_TOKEN",
        "LEVERS9_CA_FILE",
        "LEVERS9_RECONNECT_S",
    )
    selector = (context, *(os.environ.get(v) for v in names))
    ctx = _resolved.get(selector)
    if ctx is None:
        ctx = _resolved[selector] = current_context(context)
    key = f"{ctx.name}|{ctx.grpc}|{ctx.token}|{ctx.environment}|{ctx.ca_file}|{ctx.reconnect_s}"
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
