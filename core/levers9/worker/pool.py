"""Warm containers for function calls, shared by the calls of each stub.

Starting a container costs far more than a small call, so a container is
kept after its call and takes the next call of the same stub. Each stub has
a queue of waiting calls and each of its containers loops: take the next
call, hand it to the runner inside (:mod:`levers9.runner.main`), report the
outcome. A new container is started only while the stub has fewer containers
than calls in flight, and only a few at a time: containers that are already
up usually drain a burst of small calls before a new one has started, and
those that come up late simply wait idle for the next burst.

The container runs untrusted code, so nothing it sends is unpickled here:
results and exceptions are passed on as the bytes the runner produced (see
:mod:`levers9.runner.frames`). A container only ever serves one stub, and so
one workspace; its secrets reach it as environment variables and are never
logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from levers9.checkpoint.snapshot import SIGNAL_SOCKET, Checkpointing
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, GpuDevice, Mount, RuntimeContext
from levers9.payloads import DEFAULT_MAX_PAYLOAD_BYTES
from levers9.runner import frames
from levers9.runner import main as runner
from levers9.worker.calls import Call, Outcome, RemoteErrorInfo, Serving, StubSpec

__all__ = ["ContainerPool", "OnLog", "OnServing", "OnStarted"]

log = logging.getLogger(__name__)

OnStarted = Callable[[str], Awaitable[None] | None]
OnLog = Callable[[str, bytes], None]
OnServing = Callable[[Serving], Awaitable[None] | None]

#: seconds between SIGTERM and SIGKILL when a call's container is stopped under it
STOP_GRACE_S = 3.0
#: seconds a runner is given to end by itself once the worker has hung up, before it is signalled
HANG_UP_WAIT_S = 1.0
#: seconds a container whose connection broke is given to be seen as exited, before it is killed
EXIT_WAIT_S = 10.0
#: how much of a container's output an error quotes
LOG_TAIL_BYTES = 4000
#: how many StubSpec objects' keys are remembered
KEY_CACHE_SIZE = 256
#: the longest wait between two start failures of one stub
MAX_RETRY_DELAY_S = 30.0

#: where, inside a container, the runner's own packages and the stub's handler are mounted
PYTHON_DIR = "/opt/levers9/python"
HANDLER_DIR = "/opt/levers9/handler"
HANDLER_FILE = "handler.pkl"
#: what ``python -m levers9.runner`` imports beyond the standard library
RUNNER_PACKAGES = ("levers9", "cloudpickle", "pluggy")


class _State(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"


class _StartFailed(Exception):
    """A container did not come up to serve calls; the message says why, with its output."""


@dataclass(eq=False)
class _Pending:
    call: Call
    future: asyncio.Future[Outcome]
    on_started: OnStarted | None
    on_log: OnLog | None
    on_serving: OnServing | None = None
    #: set to stop the call where it runs (cancel, the caller gone, the pool closing)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    #: the container running it, once handed over
    container: _Container | None = None
    #: loop time it was queued, for the scale-up rule
    queued_at: float = 0.0


@dataclass(eq=False)
class _Container:
    cid: str
    port: int
    token: str
    gpus: list[GpuDevice]
    state: _State = _State.STARTING
    idle_since: float = 0.0
    prepared: bool = False
    started: bool = False
    stop_requested: bool = False
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    pending: _Pending | None = None
    task: asyncio.Task[None] | None = None
    #: a checkpointed container's signal directory (ready and go files, the runner's socket)
    signal_dir: Path | None = None
    #: an endpoint's container: the port its HTTP server listens on
    http_port: int = 0


@dataclass(eq=False)
class _Stub:
    key: str
    spec: StubSpec
    handler_dir: Path
    queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    containers: dict[str, _Container] = field(default_factory=dict)
    #: calls queued or running, not yet settled
    in_flight: int = 0
    #: calls in the order they were queued; the head is dropped once taken or settled (see _oldest_waiting)
    waiting: collections.deque[_Pending] = field(default_factory=collections.deque)
    failures: int = 0
    retry_at: float = 0.0

    def count(self, state: _State) -> int:
        return sum(1 for c in self.containers.values() if c.state is state)


class ContainerPool:
    """The containers of one worker's runtime, started on demand, kept warm, and removed without a trace."""

    def __init__(
        self,
        hooks: Hooks,
        runtime: RuntimeContext,
        *,
        state_dir: Path,
        gpus: list[GpuDevice] = [],  # noqa: B006 (only read, never mutated)
        start_timeout_s: float = 120.0,
        python: str = sys.executable,
        max_containers: int = 64,
        max_starting_per_stub: int = 2,
        max_result_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        scale_after_s: float = 0.05,
        checkpointing: Checkpointing | None = None,
    ) -> None:
        self.hooks = hooks
        #: checkpoints of stubs that ask for them; None: every container starts cold
        self.checkpointing = checkpointing
        self.runtime = runtime
        self.state_dir = Path(state_dir)
        self.gpus = list(gpus)
        self.start_timeout_s = start_timeout_s
        self.python = python
        self.max_containers = max_containers
        self.max_starting_per_stub = max_starting_per_stub
        #: a stub that has a container gets another only once a call has waited this long for one
        self.scale_after_s = scale_after_s
        self.max_result_bytes = max_result_bytes
        #: containers started since the pool was made, for tests and metrics
        self.started_total = 0
        self._stubs: dict[str, _Stub] = {}
        self._keys: dict[int, tuple[StubSpec, str]] = {}
        self._calls: dict[str, tuple[_Stub, _Pending]] = {}
        self._stopping: set[_Container] = set()
        self._free_gpus = list(self.gpus)
        self._ports: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._retry_handle: asyncio.TimerHandle | None = None
        #: a stub is waiting for room (GPUs, the container limit) that an idle container could give
        self._room_wanted = False
        # the process runtime has no filesystem of its own: host paths, host network, no mounts
        self._on_host = runtime.name == "process"

    # ----------------------------------------------------------------- public

    async def run(
        self,
        stub: StubSpec,
        call: Call,
        *,
        on_started: OnStarted | None = None,
        on_log: OnLog | None = None,
        on_serving: OnServing | None = None,
    ) -> Outcome:
        """Run ``call`` in a warm container of ``stub`` (starting one if needed) and return how it ended.

        A call of a serving stub (an endpoint or a box) is a container of its own that serves until the
        call is cancelled or the container ends; ``on_serving`` says where, once it is ready.
        """
        if self._closed:
            raise RuntimeError("the container pool is closed")
        if call.task_id in self._calls:
            raise ValueError(f"task {call.task_id} is already running in this pool")
        if stub.gpu_count > len(self.gpus):
            return _error(
                call, "InsufficientGpus", f"the function needs {stub.gpu_count} GPUs; this worker has {len(self.gpus)}"
            )
        group = self._group(stub)
        pending = _Pending(call, asyncio.get_running_loop().create_future(), on_started, on_log, on_serving)
        pending.queued_at = asyncio.get_running_loop().time()
        self._calls[call.task_id] = (group, pending)
        group.in_flight += 1
        group.waiting.append(pending)
        group.queue.put_nowait(pending)
        self._rebalance()
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            self._abandon(group, pending, "the caller stopped waiting for the call")
            raise

    async def cancel(self, task_id: str) -> bool:
        """Stop a call, killing the container running it; True once its ``run`` has returned ``cancelled``."""
        entry = self._calls.get(task_id)
        if entry is None:
            return False
        group, pending = entry
        self._abandon(group, pending, "the call was cancelled")
        outcome = await asyncio.shield(pending.future)
        return outcome.status == "cancelled"

    async def reap_idle(self) -> int:
        """Stop the containers that have been idle longer than their stub's ``keep_warm_s``; how many."""
        now = asyncio.get_running_loop().time()
        victims = [
            box
            for group in self._stubs.values()
            for box in group.containers.values()
            if box.state is _State.IDLE and now - box.idle_since >= group.spec.keep_warm_s
        ]
        for box in victims:
            self._request_stop(box, "idle")
        await asyncio.gather(*(box.task for box in victims if box.task is not None), return_exceptions=True)
        return len(victims)

    async def close(self) -> None:
        """Stop every call and container, remove the containers and the handler files; nothing is left."""
        self._closed = True
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        for group, pending in list(self._calls.values()):
            self._abandon(group, pending, "the worker's container pool was closed")
        for group in self._stubs.values():
            for box in list(group.containers.values()):
                self._request_stop(box, "the pool is closing")
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for group in list(self._stubs.values()):
            self._drop_group(group)
        if self.checkpointing is not None:
            await self.checkpointing.close()
        for leftover in ("handlers", "signals", "images"):
            with contextlib.suppress(OSError):
                (self.state_dir / leftover).rmdir()

    def stats(self) -> dict[str, int]:
        """Containers by state, and calls waiting for one: what the worker logs and exports as metrics."""
        counts = {state.value: 0 for state in _State}
        for group in self._stubs.values():
            for box in group.containers.values():
                counts[box.state.value] += 1
        counts[_State.STOPPING.value] += len(self._stopping)
        counts["queued"] = sum(g.in_flight - g.count(_State.BUSY) for g in self._stubs.values())
        return counts

    # ----------------------------------------------------------------- stubs and calls

    def _group(self, stub: StubSpec) -> _Stub:
        key = self._key(stub)
        group = self._stubs.get(key)
        if group is None:
            handler_dir = self.state_dir / "handlers" / key
            _write_private(handler_dir / HANDLER_FILE, stub.handler)
            group = self._stubs[key] = _Stub(key=key, spec=stub, handler_dir=handler_dir)
        else:
            group.spec = stub  # the same function; keep_warm_s may have changed
        return group

    def _key(self, stub: StubSpec) -> str:
        """The stub's key, hashed once per StubSpec object: a handler can be megabytes and calls many."""
        cached = self._keys.get(id(stub))
        if cached is not None and cached[0] is stub:
            return cached[1]
        key = _stub_key(stub)
        if len(self._keys) >= KEY_CACHE_SIZE:
            del self._keys[next(iter(self._keys))]
        self._keys[id(stub)] = (stub, key)  # holding the stub keeps its id from being reused
        return key

    def _drop_group(self, group: _Stub) -> None:
        self._stubs.pop(group.key, None)
        shutil.rmtree(group.handler_dir, ignore_errors=True)

    def _settle(self, group: _Stub, pending: _Pending, outcome: Outcome) -> None:
        if pending.future.done():
            return
        pending.future.set_result(outcome)
        group.in_flight -= 1
        self._calls.pop(pending.call.task_id, None)

    def _abandon(self, group: _Stub, pending: _Pending, reason: str) -> None:
        """Cancel a call: at once while it waits in the queue, else by stopping its container."""
        if pending.future.done():
            return
        if pending.container is None:
            self._settle(group, pending, _cancelled(pending.call, reason))
            return
        pending.stop_reason = reason
        pending.stop.set()

    # ----------------------------------------------------------------- how many containers

    def _rebalance(self) -> None:
        """Start containers where stubs have more calls in flight than containers, as room allows."""
        if self._closed:
            return
        self._room_wanted = False
        now = asyncio.get_running_loop().time()
        for group in list(self._stubs.values()):
            while len(group.containers) < group.in_flight and group.count(_State.STARTING) < self.max_starting_per_stub:
                if group.containers:
                    # Short calls are served faster by the containers already there than by a new one
                    # (which takes a few hundred ms to start): scale up only when calls actually wait.
                    oldest = self._oldest_waiting(group)
                    if oldest is None:
                        break
                    if now < oldest + self.scale_after_s:
                        self._rebalance_at(oldest + self.scale_after_s)
                        break
                if now < group.retry_at:
                    self._rebalance_at(group.retry_at)
                    break
                if not self._has_room(group.spec):
                    self._room_wanted = True
                    self._make_room(group)
                    break
                self._launch(group)

    def _oldest_waiting(self, group: _Stub) -> float | None:
        """When the longest-waiting queued call of ``group`` was queued; None when none waits.

        Called on every new call, so it must not scan them all: calls are taken in the order they were
        queued, so the oldest still waiting is the head of ``group.waiting`` once taken ones are dropped.
        """
        while group.waiting and (group.waiting[0].container is not None or group.waiting[0].future.done()):
            group.waiting.popleft()
        return group.waiting[0].queued_at if group.waiting else None

    def _rebalance_at(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        if self._retry_handle is not None and self._retry_handle.when() <= when:
            return
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        self._retry_handle = loop.call_at(when, self._retry)

    def _retry(self) -> None:
        self._retry_handle = None
        self._rebalance()

    def _has_room(self, stub: StubSpec) -> bool:
        total = sum(len(g.containers) for g in self._stubs.values()) + len(self._stopping)
        return total < self.max_containers and len(self._free_gpus) >= stub.gpu_count

    def _make_room(self, group: _Stub) -> None:
        """Stop the longest-idle container of another stub; what it frees is used when it is gone."""
        if self._stopping:
            return  # room is on its way; decide again when it has come
        needs_gpus = len(self._free_gpus) < group.spec.gpu_count
        idle = [
            box
            for other in self._stubs.values()
            if other is not group
            for box in other.containers.values()
            if box.state is _State.IDLE and (box.gpus or not needs_gpus)
        ]
        if idle:
            self._request_stop(min(idle, key=lambda box: box.idle_since), "making room for another function")

    def _launch(self, group: _Stub) -> None:
        gpus, self._free_gpus = self._free_gpus[: group.spec.gpu_count], self._free_gpus[group.spec.gpu_count :]
        box = _Container(cid=_container_id(group.spec), port=self._free_port(), token=secrets.token_urlsafe(32),
                         gpus=gpus)  # fmt: skip
        if group.spec.serves:
            box.http_port = self._free_port()
        group.containers[box.cid] = box
        self.started_total += 1
        box.task = self._spawn(self._life(group, box), f"levers9-container-{box.cid}")

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _request_stop(self, box: _Container, reason: str) -> None:
        """Stop a container: an idle one at once; a starting one when it is up; a busy one by ending its call."""
        box.stop_requested = True
        if box.state is _State.IDLE and box.task is not None:
            box.state = _State.STOPPING
            box.task.cancel()  # it waits on its stub's queue, where cancelling loses no call
        elif box.state is _State.BUSY and box.pending is not None:
            box.pending.stop_reason = box.pending.stop_reason or reason
            box.pending.stop.set()

    def _free_port(self) -> int:
        """A port no other container of this pool uses, below the kernel's ephemeral range.

        Outgoing connections take their local ports from that range, so a port picked below it cannot be
        taken between the pick and the runner binding it (on the host network of the process runtime).
        """
        low = _ephemeral_low()
        for _ in range(200):
            port = random.randrange(max(1024, low - 20000), low)
            if port not in self._ports and _bindable(port):
                self._ports.add(port)
                return port
        raise Levers9Error("no free TCP port found for a container's runner")

    # ----------------------------------------------------------------- one container's life

    async def _life(self, group: _Stub, box: _Container) -> None:
        try:
            try:
                await self._boot(group, box)
            except _StartFailed as exc:
                if not box.stop_requested:
                    self._start_failed(group, box, str(exc))
                return
            group.failures = 0
            await self._serve(group, box)
        except asyncio.CancelledError:
            pass  # stopped while idle
        except Exception as exc:
            log.exception("container %s of %s failed", box.cid, group.spec.name)
            if box.pending is not None:
                self._settle(group, box.pending, _error(box.pending.call, "WorkerError", f"the worker failed: {exc}"))
        finally:
            group.containers.pop(box.cid, None)
            box.state = _State.STOPPING
            self._stopping.add(box)
            await self._dispose(group, box)

    async def _serve(self, group: _Stub, box: _Container) -> None:
        while not box.stop_requested:
            box.state = _State.IDLE
            box.idle_since = asyncio.get_running_loop().time()
            pending = await group.queue.get()
            if pending.future.done():
                continue  # cancelled while it waited
            box.state = _State.BUSY
            box.pending = pending
            pending.container = box
            if group.spec.serves:
                outcome, alive = await self._execute_serving(group, box, pending), False
            else:
                outcome, alive = await self._execute(group, box, pending)
            self._settle(group, pending, outcome)
            box.pending = None
            if not alive:
                return
            if self._room_wanted:
                # decided once this container waits on its queue, where it can be stopped to make room
                asyncio.get_running_loop().call_soon(self._rebalance)

    async def _dispose(self, group: _Stub, box: _Container) -> None:
        try:
            hung_up = False
            if box.writer is not None:
                box.writer.close()  # the runner ends when its worker hangs up
                with contextlib.suppress(OSError):
                    await box.writer.wait_closed()
                hung_up = True
            if box.prepared:
                try:
                    # stopped before removal, also because a runtime may not be able to kill what it just started
                    if box.started:
                        ended = hung_up and await self._wait_exited(box.cid, HANG_UP_WAIT_S) is not None
                        if not ended:
                            await self._kill(box)
                    await self.hooks.container_remove(self.runtime, box.cid)
                except Levers9Error as exc:
                    log.error("removing container %s failed: %s", box.cid, exc)
        finally:
            if box.signal_dir is not None:
                shutil.rmtree(box.signal_dir, ignore_errors=True)
            self._stopping.discard(box)
            self._free_gpus = sorted([*self._free_gpus, *box.gpus], key=lambda g: g.index)
            self._ports.discard(box.port)
            self._ports.discard(box.http_port)
            if not group.containers and group.in_flight == 0 and self._stubs.get(group.key) is group:
                self._drop_group(group)
            self._rebalance()

    def _start_failed(self, group: _Stub, box: _Container, reason: str) -> None:
        """A start failed: the calls waiting fail with the reason, unless a running container will serve them."""
        log.warning("container %s of %s did not start: %s", box.cid, group.spec.name, reason)
        group.failures += 1
        delay = min(MAX_RETRY_DELAY_S, 0.5 * 2 ** (group.failures - 1))
        group.retry_at = asyncio.get_running_loop().time() + delay
        running = [c for c in group.containers.values() if c is not box and c.state in (_State.IDLE, _State.BUSY)]
        if running:
            return
        while not group.queue.empty():
            pending = group.queue.get_nowait()
            self._settle(group, pending, _error(pending.call, "ContainerStartFailed", reason))

    # ----------------------------------------------------------------- starting

    def _spec(self, group: _Stub, box: _Container) -> ContainerSpec:
        stub = group.spec
        image_python = self.python if stub.image == "host" else "python3"
        return ContainerSpec(
            container_id=box.cid,
            image=stub.image,
            command=[image_python, "-m", "levers9.runner"],
            env=self._environment(group, box),
            cpu_millicores=stub.cpu_millicores,
            memory_mib=stub.memory_mib,
            gpus=box.gpus,
            mounts=[] if self._on_host else self._mounts(group),
            network="host" if self._on_host else "bridge",
            # only the runner's port is forwarded to the worker's loopback: the gateway reaches a serving
            # container's HTTP server and a box's ports at the container's own address on the bridge
            ports=[box.port],
        )

    def _environment(self, group: _Stub, box: _Container) -> dict[str, str]:
        stub = group.spec
        env = {**stub.env, **stub.secret_env}
        if self._on_host:
            paths = list(dict.fromkeys(str(Path(d).parent) for d in _package_dirs().values()))
            handler = str(group.handler_dir / HANDLER_FILE)
            env[runner.ENV_HOST] = "127.0.0.1"  # the host's network: listen where only this machine can reach
            if self.gpus:  # nothing isolates a process from the host's GPUs but CUDA's own filter
                env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in box.gpus)
        else:
            paths = [PYTHON_DIR]
            handler = f"{HANDLER_DIR}/{HANDLER_FILE}"
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [stub.env.get("PYTHONPATH")])])
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the code is mounted read-only
        env[runner.ENV_PORT] = str(box.port)
        env[runner.ENV_TOKEN] = box.token
        env[runner.ENV_HANDLER] = handler
        env[runner.ENV_PYTHON] = stub.python_version
        return env

    def _mounts(self, group: _Stub) -> list[Mount]:
        """The runner's packages, at a path of their own so any image can import them, and the handler."""
        mounts = [Mount(source=d, target=f"{PYTHON_DIR}/{name}") for name, d in _package_dirs().items()]
        return [*mounts, Mount(source=str(group.handler_dir), target=HANDLER_DIR)]

    async def _boot(self, group: _Stub, box: _Container) -> None:
        spec = self._spec(group, box)
        checkpointing = self.checkpointing
        if (
            checkpointing is not None
            and group.spec.checkpoint_enabled
            and not self._on_host
            and await checkpointing.available(self.hooks, self.runtime)
        ):
            await self._boot_checkpointed(group, box, spec, checkpointing)
            return
        box.prepared = True  # a prepare that fails half way still leaves something to remove
        try:
            prepared = await self.hooks.container_prepare(self.runtime, spec, timeout=self.start_timeout_s)
            await self.hooks.container_start(self.runtime, prepared, timeout=self.start_timeout_s)
            box.started = True
            box.reader, box.writer = await self._connect(box)
        except Levers9Error as exc:
            raise _StartFailed(f"the runtime could not start the container: {exc}") from exc

    async def _boot_checkpointed(
        self, group: _Stub, box: _Container, spec: ContainerSpec, checkpointing: Checkpointing
    ) -> None:
        """Start from the stub's checkpoint, or cold and then checkpoint it once loaded (see checkpointing)."""
        stub = group.spec
        box.signal_dir = self.state_dir / "signals" / box.cid
        spec = checkpointing.prepare_spec(spec, box.signal_dir)
        box.prepared = True
        try:
            started = await checkpointing.start(
                self.hooks, self.runtime, spec, stub_id=stub.stub_id, timeout=self.start_timeout_s
            )
            box.started = True
            if started.restored_from is None and stub.stub_id not in checkpointing.taken:
                checkpointing.taken.add(stub.stub_id)
                await checkpointing.snapshot(
                    self.hooks, self.runtime, spec, signal_dir=box.signal_dir, images=self.state_dir / "images",
                    workspace_id=stub.workspace_id, stub_id=stub.stub_id,
                )  # fmt: skip
            # the go file carries this container's token: a restored runner remembers its original's
            _write_private(box.signal_dir / "go", box.token.encode())
            box.reader, box.writer = await self._connect(box)
        except (Levers9Error, TimeoutError) as exc:
            raise _StartFailed(f"the runtime could not start the container: {exc}") from exc

    async def _connect(self, box: _Container) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the runner and authenticate, retrying while it starts, until it answers or the container ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        delay = 0.005
        while True:
            if box.stop_requested:
                raise _StartFailed("the container was stopped while it started")
            state = await self.hooks.container_state(self.runtime, box.cid)
            if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
                code = "" if state.exit_code is None else f" with code {state.exit_code}"
                raise _StartFailed(
                    f"container {box.cid} exited{code} before its runner answered; "
                    f"its output:\n{await self._log_tail(box.cid)}"
                )
            address = state.address
            if box.signal_dir is not None:
                sock = box.signal_dir / SIGNAL_SOCKET
                address = f"unix:{sock}" if sock.exists() else None
            if address is not None:
                with contextlib.suppress(OSError, asyncio.IncompleteReadError, frames.ProtocolError, TimeoutError):
                    remaining = max(0.1, deadline - loop.time())
                    return await asyncio.wait_for(_handshake(address, box.token), min(remaining, 10.0))
            if loop.time() > deadline:
                raise _StartFailed(
                    f"the runner in container {box.cid} did not answer within {self.start_timeout_s:g} s; "
                    f"its output:\n{await self._log_tail(box.cid)}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    # ----------------------------------------------------------------- one call

    async def _execute(self, group: _Stub, box: _Container, pending: _Pending) -> tuple[Outcome, bool]:
        """Run the call in ``box``: its outcome, and whether the container can take another call."""
        call = pending.call
        assert box.reader is not None
        assert box.writer is not None
        try:
            await frames.write_frame(
                box.writer, "call", call.args, task_id=call.task_id, max_result=self.max_result_bytes
            )
        except (OSError, ConnectionError):
            return await self._exit_outcome(group, box, call), False
        await _notify_started(pending, box.cid)
        reading = asyncio.ensure_future(self._read_result(box.reader, pending))
        stopping = asyncio.ensure_future(pending.stop.wait())
        try:
            done, _ = await asyncio.wait(
                {reading, stopping}, timeout=call.timeout_s or None, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            reading.cancel()  # the worker is stopping this call: nothing is left pending behind it
            raise
        finally:
            stopping.cancel()
        if reading in done:
            try:
                return reading.result(), True
            except (OSError, asyncio.IncompleteReadError):
                return await self._exit_outcome(group, box, call), False
            except frames.ProtocolError as exc:
                await self._kill(box)
                return _error(call, "ProtocolError", f"the container's runner broke the protocol: {exc}"), False
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await self._kill(box)
        if pending.stop.is_set():
            return _cancelled(call, pending.stop_reason), False
        return _error(call, "TimeoutError", f"the call exceeded its timeout of {call.timeout_s:g} s", "timeout"), False

    async def _execute_serving(self, group: _Stub, box: _Container, pending: _Pending) -> Outcome:
        """Have ``box`` serve (see the runner's ``serve``) until the call is stopped or the container ends."""
        call, stub = pending.call, group.spec
        assert box.reader is not None
        assert box.writer is not None
        interface = "box" if stub.kind == "box" else stub.interface
        try:
            await frames.write_frame(box.writer, "serve", task_id=call.task_id, interface=interface,
                                     port=box.http_port, concurrency=stub.tasks_per_container,
                                     ports=list(stub.ports))  # fmt: skip
        except (OSError, ConnectionError):
            return await self._exit_outcome(group, box, call)
        ready = asyncio.Event()
        reading = asyncio.ensure_future(self._follow_serving(group, box, pending, ready))
        stopping = asyncio.ensure_future(pending.stop.wait())
        readying = asyncio.ensure_future(ready.wait())
        try:
            done, _ = await asyncio.wait({reading, stopping, readying}, timeout=self.start_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if readying in done and reading not in done and stopping not in done:
                done, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            reading.cancel()
            raise
        finally:
            stopping.cancel()
            readying.cancel()
        if reading in done:
            try:
                return reading.result()
            except (OSError, asyncio.IncompleteReadError):
                return await self._exit_outcome(group, box, call)
            except frames.ProtocolError as exc:
                await self._kill(box)
                return _error(call, "ProtocolError", f"the container's runner broke the protocol: {exc}")
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await self._kill(box)
        if pending.stop.is_set():
            return _cancelled(call, pending.stop_reason)
        what = "its ports did not accept connections" if stub.kind == "box" else "its HTTP server did not start"
        return _error(call, "StartTimeout", f"{what} within {self.start_timeout_s:g} s", "timeout")

    async def _follow_serving(self, group: _Stub, box: _Container, pending: _Pending, ready: asyncio.Event) -> Outcome:
        """Pass on the serving container's output; say where it serves once it does; its result, if it ends."""
        assert box.reader is not None
        task_id = pending.call.task_id
        while True:
            frame = await frames.read_frame(box.reader, max_payload=self.max_result_bytes)
            if frame.kind == "log":
                _deliver_log(pending, frame.payload)
            elif frame.kind == "serving" and not ready.is_set():
                state = await self.hooks.container_state(self.runtime, box.cid)
                if not self._on_host and not state.ip:
                    await self._kill(box)
                    return _error(pending.call, "NoAddress", f"the {self.runtime.name} runtime reports no address "
                                  "for the container, so the gateway could not reach it")  # fmt: skip
                host = "127.0.0.1" if self._on_host else str(state.ip)
                serving = Serving(
                    container_id=box.cid,
                    address=f"{host}:{box.http_port}" if group.spec.kind != "box" else "",
                    ports={p: f"{host}:{p}" for p in group.spec.ports},
                )
                ready.set()
                await _notify_started(pending, box.cid)
                if pending.on_serving is not None:
                    try:
                        result = pending.on_serving(serving)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        log.exception("on_serving of task %s failed", task_id)
            elif frame.kind == "result" and frame.text("task_id") == task_id:
                return self._result_outcome(task_id, frame)
            else:
                raise frames.ProtocolError(f"unexpected {frame.kind!r} frame from a serving container")

    async def _read_result(self, reader: asyncio.StreamReader, pending: _Pending) -> Outcome:
        task_id = pending.call.task_id
        while True:
            frame = await frames.read_frame(reader, max_payload=self.max_result_bytes)
            if frame.kind == "log":
                _deliver_log(pending, frame.payload)
                continue
            if frame.kind != "result" or frame.text("task_id") != task_id:
                raise frames.ProtocolError(f"expected the result of {task_id}, got a {frame.kind!r} frame")
            return self._result_outcome(task_id, frame)

    @staticmethod
    def _result_outcome(task_id: str, frame: frames.Frame) -> Outcome:
        status = frame.text("status")
        if status == "complete":
            return Outcome(task_id=task_id, status="complete", result=frame.payload)
        if status != "error":
            raise frames.ProtocolError(f"unknown result status {status!r}")
        error = frames.Frame("error", frame.object("error"))
        info = RemoteErrorInfo(
            type=error.text("type"), message=error.text("message", ""), traceback=error.text("traceback", "")
        )
        return Outcome(task_id=task_id, status="error", result=frame.payload, error=info)

    async def _exit_outcome(self, group: _Stub, box: _Container, call: Call) -> Outcome:
        """The outcome of a call whose container went away under it: how it ended, and its last output."""
        state = await self._wait_exited(box.cid, EXIT_WAIT_S)
        if state is None:  # the connection broke but the container lives on: no use to anyone
            await self._kill(box)
            state = await self.hooks.container_state(self.runtime, box.cid)
        code = "unknown" if state.exit_code is None else str(state.exit_code)
        tail = await self._log_tail(box.cid)
        if state.oom_killed:
            kind = "OutOfMemory"
            message = f"the container ran out of memory ({group.spec.memory_mib} MiB) and was killed (exit code {code})"
        else:
            kind = "ContainerExited"
            message = f"the container exited with code {code} while running the call"
        return _error(call, kind, f"{message}; its last output:\n{tail}" if tail else message)

    async def _kill(self, box: _Container) -> None:
        """SIGTERM, then SIGKILL if the container is still there after the grace period."""
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, EXIT_WAIT_S)):
            try:
                await self.hooks.container_kill(self.runtime, box.cid, sig)
            except Levers9Error as exc:
                log.warning("signalling container %s failed: %s", box.cid, exc)
            if await self._wait_exited(box.cid, wait) is not None:
                return

    async def _wait_exited(self, cid: str, timeout: float) -> ContainerState | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = await self.hooks.container_state(self.runtime, cid)
            if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
                return state
            if loop.time() > deadline:
                return None
            await asyncio.sleep(0.02)

    async def _log_tail(self, cid: str) -> str:
        tail, offset = b"", 0
        with contextlib.suppress(Levers9Error):
            for _ in range(256):  # a runaway log is read 1 MiB a time; stop somewhere
                chunk = await self.hooks.container_logs(self.runtime, cid, offset)
                tail = (tail + chunk.data)[-LOG_TAIL_BYTES:]
                if chunk.eof or not chunk.data:
                    break
                offset = chunk.next_offset
        return tail.decode(errors="replace").strip()


# --------------------------------------------------------------------------- helpers


async def _handshake(address: str, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a runner at ``host:port`` or ``unix:PATH`` and prove the container's token."""
    if address.startswith("unix:"):
        path = Path(address.removeprefix("unix:"))
        # a socket path may hold at most 107 bytes, and a worker's state directory can be deep: the
        # directory is reached through a descriptor of it instead
        directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            reader, writer = await asyncio.open_unix_connection(f"/proc/self/fd/{directory}/{path.name}")
        finally:
            os.close(directory)
    else:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await frames.write_frame(writer, "hello", token=token)
        answer = await frames.read_frame(reader, max_payload=0)
        if answer.kind != "ready":
            raise frames.ProtocolError(f"the runner answered hello with {answer.kind!r}")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _notify_started(pending: _Pending, cid: str) -> None:
    if pending.on_started is None:
        return
    try:
        result = pending.on_started(cid)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("on_started of task %s failed", pending.call.task_id)


def _deliver_log(pending: _Pending, data: bytes) -> None:
    if pending.on_log is None:
        return
    try:
        pending.on_log(pending.call.task_id, data)
    except Exception:
        log.exception("on_log of task %s failed", pending.call.task_id)


def _error(call: Call, kind: str, message: str, status: str = "error") -> Outcome:
    return Outcome(task_id=call.task_id, status=status, error=RemoteErrorInfo(type=kind, message=message))


def _cancelled(call: Call, reason: str) -> Outcome:
    return _error(call, "Cancelled", reason, "cancelled")


def _stub_key(stub: StubSpec) -> str:
    """Containers are shared by calls whose stub would build the very same container."""
    digest = hashlib.sha256(stub.handler)
    fields = [stub.stub_id, stub.workspace_id, stub.image, stub.python_version, stub.cpu_millicores,
              stub.memory_mib, stub.gpu_count, sorted(stub.env.items()), sorted(stub.secret_env.items())]  # fmt: skip
    digest.update(json.dumps(fields).encode())
    return digest.hexdigest()[:32]


def _container_id(stub: StubSpec) -> str:
    short = re.sub(r"[^A-Za-z0-9]", "", stub.stub_id)[:12] or "stub"
    return f"l9-{short}-{secrets.token_hex(4)}"


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _package_dirs() -> dict[str, str]:
    """Where the runner's packages live on this host."""
    found = {}
    for name in RUNNER_PACKAGES:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if not locations:
            raise Levers9Error(f"package {name!r}, which the container runner needs, is not importable here")
        found[name] = locations[0]
    return found


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
