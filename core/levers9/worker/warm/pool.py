"""The worker's warm pool: containers for function calls, kept after a call for the next call of the same stub.

Starting a container costs far more than a small call, so a container is
kept after its call and takes the next call of the same stub. Each stub has
a queue of waiting calls and each of its containers loops: take the next
call, hand it to the runner inside (:mod:`levers9.runner.main`), report the
outcome. When a stub gets another container, and which idle one is stopped to
make room, is :mod:`levers9.worker.warm.scaling`'s policy; building and
starting a container is :mod:`~levers9.worker.warm.launch`'s; talking to the
runner inside is :mod:`~levers9.worker.warm.runner_client`'s.

The container runs untrusted code, so nothing it sends is unpickled here:
results and exceptions are passed on as the bytes the runner produced (see
:mod:`levers9.runner.frames`). A container only ever serves one stub, and so
one workspace; its secrets reach it as environment variables and are never
logged. Closing the pool leaves nothing behind: no container, handler file or
signal directory.

GPUs come from the worker's :class:`~levers9.worker.gpu_ledger.GpuLedger`, which
the pool shares with the worker's sandboxes: a container holds its devices
from its start until it is removed, a call waiting for GPUs starts when any
come back (from a container of the pool or a sandbox), and a sandbox's claim
stops idle GPU containers of the pool, never a busy one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import shutil
import sys
from collections.abc import Awaitable
from pathlib import Path

from levers9.checkpoint.snapshot import Checkpointing
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import GpuDevice, RuntimeCapabilities, RuntimeContext
from levers9.payloads import DEFAULT_MAX_PAYLOAD_BYTES
from levers9.worker.calls import Call, Outcome, StubSpec, cancelled_outcome, error_outcome
from levers9.worker.gpu_ledger import GpuLedger
from levers9.worker.volumes import WorkerVolumes
from levers9.worker.warm.launch import Launcher, PortPicker, StartFailed, container_id, write_handler
from levers9.worker.warm.runner_client import RunnerClient
from levers9.worker.warm.scaling import (
    OnLog,
    OnServing,
    OnStarted,
    Phase,
    QueuedCall,
    ScalingLimits,
    Step,
    WarmContainer,
    WarmStub,
    idle_to_stop,
    next_step,
)

__all__ = ["OnLog", "OnServing", "OnStarted", "WarmPool"]

log = logging.getLogger(__name__)

#: how many StubSpec objects' keys are remembered
KEY_CACHE_SIZE = 256


class WarmPool:
    """The containers of one worker's runtime, started on demand, kept warm, and removed without a trace.

    ``capabilities`` are the runtime's own report (``levers9_runtime_capabilities``): every difference
    between runtimes is decided from them, never from the runtime's name.
    """

    def __init__(
        self,
        hooks: Hooks,
        runtime: RuntimeContext,
        capabilities: RuntimeCapabilities,
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
        volumes: WorkerVolumes | None = None,
    ) -> None:
        self.hooks = hooks
        #: checkpoints of stubs that ask for them; None: every container starts cold
        self.checkpointing = checkpointing
        self.runtime = runtime
        self.capabilities = capabilities
        self.state_dir = Path(state_dir)
        self.gpus = list(gpus)
        self.start_timeout_s = start_timeout_s
        self.limits = ScalingLimits(
            max_containers=max_containers, max_starting_per_stub=max_starting_per_stub, scale_after_s=scale_after_s
        )
        self.max_result_bytes = max_result_bytes
        self.launcher = Launcher(
            hooks,
            runtime,
            capabilities,
            state_dir=self.state_dir,
            python=python,
            gpus_present=bool(self.gpus),
            start_timeout_s=start_timeout_s,
            checkpointing=checkpointing,
            volumes=volumes,
        )
        self.client = RunnerClient(self.launcher, max_result_bytes=max_result_bytes, start_timeout_s=start_timeout_s)
        #: containers started since the pool was made, for tests and metrics
        self.started_total = 0
        #: idle containers stopped to make room for another stub's call (or a sandbox's GPUs), for tests and metrics
        self.stopped_for_room_total = 0
        self._stubs: dict[str, WarmStub] = {}
        self._keys: dict[int, tuple[StubSpec, str]] = {}
        self._calls: dict[str, tuple[WarmStub, QueuedCall]] = {}
        self._stopping: set[WarmContainer] = set()
        #: the worker's one account of its GPUs, which the worker shares with its sandboxes
        self.gpu_ledger = GpuLedger(self.gpus)
        self.gpu_ledger.on_freed(self._gpus_freed)
        self.gpu_ledger.reclaim_with(self._reclaim_gpus)
        self._ports = PortPicker()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._retry_handle: asyncio.TimerHandle | None = None
        #: a stub is waiting for room (GPUs, the container limit) that an idle container could give
        self._room_wanted = False

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
            message = f"the function needs {stub.gpu_count} GPUs; this worker has {len(self.gpus)}"
            return error_outcome(call, "InsufficientGpus", message)
        group = self._group(stub)
        pending = QueuedCall(call, asyncio.get_running_loop().create_future(), on_started, on_log, on_serving)
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
            if box.phase is Phase.IDLE and now - box.idle_since >= group.spec.keep_warm_s
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
        if self.launcher.volumes is not None:
            await self.launcher.volumes.close()
        for leftover in ("handlers", "signals", "images"):
            with contextlib.suppress(OSError):
                (self.state_dir / leftover).rmdir()

    def stats(self) -> dict[str, int]:
        """Containers by phase, and calls waiting for one: what the worker logs and exports as metrics."""
        counts = {phase.value: 0 for phase in Phase}
        for group in self._stubs.values():
            for box in group.containers.values():
                counts[box.phase.value] += 1
        counts[Phase.STOPPING.value] += len(self._stopping)
        counts["queued"] = sum(g.in_flight - g.count(Phase.BUSY) for g in self._stubs.values())
        return counts

    # ----------------------------------------------------------------- stubs and calls

    def _group(self, stub: StubSpec) -> WarmStub:
        key = self._key(stub)
        group = self._stubs.get(key)
        if group is None:
            handler_dir = self.state_dir / "handlers" / key
            write_handler(handler_dir, stub.handler)
            group = self._stubs[key] = WarmStub(key=key, spec=stub, handler_dir=handler_dir)
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

    def _drop_group(self, group: WarmStub) -> None:
        self._stubs.pop(group.key, None)
        shutil.rmtree(group.handler_dir, ignore_errors=True)

    def _settle(self, group: WarmStub, pending: QueuedCall, outcome: Outcome) -> None:
        if pending.future.done():
            return
        pending.future.set_result(outcome)
        group.in_flight -= 1
        self._calls.pop(pending.call.task_id, None)

    def _abandon(self, group: WarmStub, pending: QueuedCall, reason: str) -> None:
        """Cancel a call: at once while it waits in the queue, else by stopping its container."""
        if pending.future.done():
            return
        if pending.container is None:
            self._settle(group, pending, cancelled_outcome(pending.call, reason))
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
            while True:
                step, when = next_step(group, now=now, limits=self.limits, has_room=self._has_room(group.spec))
                if step is Step.START:
                    self._launch(group)
                    continue
                if step is Step.LATER:
                    self._rebalance_at(when)
                elif step is Step.NO_ROOM:
                    self._room_wanted = True
                    self._make_room(group)
                break

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
        return total < self.limits.max_containers and self.gpu_ledger.can_take(stub.gpu_count)

    def _make_room(self, group: WarmStub) -> None:
        """Stop the longest-idle container of another stub; what it frees is used when it is gone."""
        if self._stopping:
            return  # room is on its way; decide again when it has come
        needs_gpus = self.gpu_ledger.free < group.spec.gpu_count
        victim = idle_to_stop(self._stubs.values(), group, needs_gpus=needs_gpus)
        if victim is not None:
            self.stopped_for_room_total += 1
            self._request_stop(victim, "making room for another function")

    def _launch(self, group: WarmStub) -> None:
        gpus = self.gpu_ledger.take(group.spec.gpu_count)
        if gpus is None:  # _has_room said yes a moment ago, on this loop: a bug, never a shared device
            raise RuntimeError(f"no {group.spec.gpu_count} GPUs free for {group.spec.name}, though room was found")
        box = WarmContainer(
            cid=container_id(group.spec), port=self._ports.pick(), token=secrets.token_urlsafe(32), gpus=gpus
        )
        if group.spec.serves:
            box.http_port = self._ports.pick()
        group.containers[box.cid] = box
        self.started_total += 1
        box.task = self._spawn(self._life(group, box), f"levers9-container-{box.cid}")

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _gpus_freed(self) -> None:
        """Devices came back to the ledger (a sandbox ended, say): a call waiting for GPUs may start now."""
        if self._room_wanted and not self._closed:
            asyncio.get_running_loop().call_soon(self._rebalance)

    def _reclaim_gpus(self, needed: int) -> int:
        """For a claim on the ledger (a sandbox's): stop idle containers holding GPUs, longest idle first, when
        that brings ``needed`` more devices back; how many are on their way back (see GpuLedger.reclaim_with)."""
        boxes = [box for group in self._stubs.values() for box in group.containers.values() if box.gpus]
        coming = sum(len(box.gpus) for box in [*self._stopping, *boxes] if box.phase is Phase.STOPPING)
        idle = sorted((box for box in boxes if box.phase is Phase.IDLE), key=lambda box: box.idle_since)
        if coming + sum(len(box.gpus) for box in idle) < needed:
            return coming  # busy containers hold the rest: stopping idle ones would free too few
        for box in idle:
            if coming >= needed:
                break
            coming += len(box.gpus)
            self.stopped_for_room_total += 1
            self._request_stop(box, "making room for a sandbox")
        return coming

    def _request_stop(self, box: WarmContainer, reason: str) -> None:
        """Stop a container: an idle one at once; a starting one when it is up; a busy one by ending its call."""
        box.stop_requested = True
        if box.phase is Phase.IDLE and box.task is not None:
            box.phase = Phase.STOPPING
            box.task.cancel()  # it waits on its stub's queue, where cancelling loses no call
        elif box.phase is Phase.BUSY and box.pending is not None:
            box.pending.stop_reason = box.pending.stop_reason or reason
            box.pending.stop.set()

    # ----------------------------------------------------------------- one container's life

    async def _life(self, group: WarmStub, box: WarmContainer) -> None:
        try:
            try:
                await self.launcher.boot(group, box)
                box.reader, box.writer = await self.client.connect(box)
            except StartFailed as exc:
                if not box.stop_requested:
                    self._start_failed(group, box, str(exc))
                return
            group.start_succeeded()
            await self._serve(group, box)
        except asyncio.CancelledError:
            pass  # stopped while idle
        except Exception as exc:
            log.exception("container %s of %s failed", box.cid, group.spec.name)
            if box.pending is not None:
                outcome = error_outcome(box.pending.call, "WorkerError", f"the worker failed: {exc}")
                self._settle(group, box.pending, outcome)
        finally:
            group.containers.pop(box.cid, None)
            box.phase = Phase.STOPPING
            self._stopping.add(box)
            await self._dispose(group, box)

    async def _serve(self, group: WarmStub, box: WarmContainer) -> None:
        while not box.stop_requested:
            box.phase = Phase.IDLE
            box.idle_since = asyncio.get_running_loop().time()
            pending = await group.queue.get()
            if pending.future.done():
                continue  # cancelled while it waited
            box.phase = Phase.BUSY
            box.pending = pending
            pending.container = box
            if group.spec.serves:
                outcome, alive = await self.client.execute_serving(group, box, pending), False
            else:
                outcome, alive = await self.client.execute(group, box, pending)
                if group.spec.volumes and self.launcher.volumes is not None:
                    await self.launcher.volumes.settle(box.cid)  # what the call closed is uploaded first
            self._settle(group, pending, outcome)
            box.pending = None
            if not alive:
                return
            if self._room_wanted:
                # decided once this container waits on its queue, where it can be stopped to make room
                asyncio.get_running_loop().call_soon(self._rebalance)

    async def _dispose(self, group: WarmStub, box: WarmContainer) -> None:
        try:
            hung_up = False
            if box.writer is not None:
                box.writer.close()  # the runner ends when its worker hangs up
                with contextlib.suppress(OSError):
                    await box.writer.wait_closed()
                hung_up = True
            try:
                await self.launcher.stop(box, hung_up=hung_up)
            except Levers9Error as exc:
                log.error("removing container %s failed: %s", box.cid, exc)
        finally:
            if box.signal_dir is not None:
                shutil.rmtree(box.signal_dir, ignore_errors=True)
            self._stopping.discard(box)
            gpus, box.gpus = box.gpus, []
            self.gpu_ledger.give(gpus)
            self._ports.release(box.port, box.http_port)
            if not group.containers and group.in_flight == 0 and self._stubs.get(group.key) is group:
                self._drop_group(group)
            self._rebalance()

    def _start_failed(self, group: WarmStub, box: WarmContainer, reason: str) -> None:
        """A start failed: the calls waiting fail with the reason, unless a running container will serve them."""
        log.warning("container %s of %s did not start: %s", box.cid, group.spec.name, reason)
        group.start_failed(asyncio.get_running_loop().time())
        running = [c for c in group.containers.values() if c is not box and c.phase in (Phase.IDLE, Phase.BUSY)]
        if running:
            return
        while not group.queue.empty():
            pending = group.queue.get_nowait()
            self._settle(group, pending, error_outcome(pending.call, "ContainerStartFailed", reason))


def _stub_key(stub: StubSpec) -> str:
    """Containers are shared by calls whose stub would build the very same container."""
    digest = hashlib.sha256(stub.handler)
    fields = [
        stub.stub_id,
        stub.workspace_id,
        stub.image,
        stub.python_version,
        stub.cpu_millicores,
        stub.memory_mib,
        stub.gpu_count,
        sorted(stub.env.items()),
        sorted(stub.secret_env.items()),
        [dataclasses.astuple(v) for v in stub.volumes],
    ]
    digest.update(json.dumps(fields).encode())
    return digest.hexdigest()[:32]
