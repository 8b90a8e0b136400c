"""The containers behind each endpoint and box: which are ready, who waits for one, how many to run.

A request takes a slot on a ready container (one of ``tasks_per_container``)
or waits in the stub's buffer, in arrival order, until a slot frees or a new
container reports it is ready. Only a container its worker reported ready
ever gets a request. The buffer is bounded (``max_pending``: then 429) and a
wait is bounded (``start_timeout_s``: then 504, saying why containers did not
come up when a start failed).

Scaling is decided per stub, whenever demand changes and once a second:
enough containers for the requests in flight and waiting, at
``tasks_per_container`` each, between the stub's floor (``min_containers``)
and ``max_containers``. A container is a serving task that the scheduler
places like any call; it is stopped by cancelling that task once it has been
idle ``keep_warm_s`` seconds and is not needed for the floor, so an idle
endpoint scales to zero. A stopped deployment version's containers are
stopped as soon as their requests finish. Starts that fail back off, doubling
up to 30 s (:func:`levers9.backoff.delay_s`), so a broken image does not spin.
Which replica owns which container is kept by
:class:`~levers9.services.serving.ServingOwners`, so one left behind by a gone
replica is stopped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field

from levers9.backoff import delay_s
from levers9.cancelling import raise_if_cancelling
from levers9.services import deployments
from levers9.services.dataplane import DataPlane
from levers9.services.metrics import Metrics
from levers9.services.reports import ServingReport, TaskOutcome
from levers9.services.serving import ServingOwners
from levers9.services.stubs import StubSettings

__all__ = ["Container", "NoContainer", "Overloaded", "ServedStub", "ServingAutoscaler"]

log = logging.getLogger(__name__)

#: seconds between two scaling passes over every stub, on top of those that demand triggers
SCALE_EVERY_S = 1.0
#: seconds between two reads of which deployed stubs must keep containers however idle
FLOORS_EVERY_S = 5.0
#: seconds between two looks for serving containers no live replica owns (left by a restart or a crash)
ORPHANS_EVERY_S = 10.0
#: a replica counts as alive this long after it last said so (it says so every FLOORS_EVERY_S)
ALIVE_TTL_S = 30.0
#: a serving task is judged an orphan only once this old: its owner records it just after creating it
ORPHAN_AFTER_S = 30.0
MAX_BACKOFF_S = 30.0
#: a box serves any number of requests at once
_UNLIMITED = 1 << 30


class Overloaded(Exception):
    """The stub's wait buffer is full: 429."""


class NoContainer(Exception):
    """No container was ready within the stub's start timeout: 504."""


@dataclass(frozen=True)
class ServedStub:
    stub_id: str
    workspace_id: str
    settings: StubSettings


@dataclass(eq=False)
class Container:
    task_id: str
    stub_id: str
    worker_id: str
    address: str
    ports: dict[int, str]
    in_flight: int = 0
    last_used: float = 0.0
    #: no new requests: it is being stopped once those in flight end
    draining: bool = False


@dataclass(eq=False)
class _StubContainers:
    """One served stub's containers (ready and starting), its waiting requests and its failed starts."""

    stub: ServedStub
    ready: dict[str, Container] = field(default_factory=dict)
    #: serving tasks queued or starting: task id -> when
    starting: dict[str, float] = field(default_factory=dict)
    waiters: collections.deque[asyncio.Future[Container]] = field(default_factory=collections.deque)
    #: the stub's deployment version was stopped: no new containers, the running ones go
    retired: bool = False
    #: the floor from the deployment (0 when not deployed)
    deployed_floor: int = 0
    failures: int = 0
    retry_at: float = 0.0
    last_failure: str = ""

    @property
    def capacity(self) -> int:
        s = self.stub.settings
        return _UNLIMITED if s.kind == "box" else s.tasks_per_container


class ServingAutoscaler:
    """Every served stub's containers and waiting requests, on this controlplane replica."""

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        prefix: str = "l9:",
        name: str | None = None,
        orphan_after_s: float = ORPHAN_AFTER_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.metrics = metrics
        #: which replica started which serving task (and stops it)
        self.owners = ServingOwners(dataplane, prefix=prefix, name=name)
        #: this replica's name, as the owner of the containers it starts
        self.name = self.owners.name
        self.orphan_after_s = orphan_after_s
        self._stubs: dict[str, _StubContainers] = {}
        #: serving task id -> its stub, for reports of tasks that end
        self._tasks: dict[str, str] = {}
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        #: called with the address of a container that ended (the proxy drops its connections to it)
        self.on_gone: list[Callable[[str], None]] = []
        dataplane.serving_listener = self
        dataplane.hub.on_serving = self._from_another_replica

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._scale_loop(), name="gateway scaler")

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop every container this replica started, and fail the requests still waiting."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        for state in self._stubs.values():
            _fail_waiters(state, NoContainer("the gateway is shutting down"))
        stops = [
            self._stop_task(task_id, c.worker_id if c else None)
            for state in self._stubs.values()
            for task_id, c in [*((t, None) for t in state.starting), *((t, c) for t, c in state.ready.items())]
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*stops, *self._jobs, return_exceptions=True), grace_s)

    # ------------------------------------------------------------------ requests

    async def acquire(self, stub: ServedStub, *, timeout_s: float | None = None) -> Container:
        """A slot on a ready container of ``stub``; waits for one as the stub's settings allow.

        ``timeout_s`` bounds the wait instead of the stub's ``start_timeout_s`` (a request that already
        waited for a container that then refused it waits only for what is left).
        """
        state = self._state(stub)
        container = self._take_slot(state)
        if container is not None:
            return container
        settings = stub.settings
        if len(state.waiters) >= settings.max_pending:
            raise Overloaded(
                f"{len(state.waiters)} requests already wait for a container of this {settings.kind} "
                f"(max_pending={settings.max_pending}); try again shortly"
            )
        future: asyncio.Future[Container] = asyncio.get_running_loop().create_future()
        state.waiters.append(future)
        self._kick.set()
        since = time.monotonic()
        wait_s = settings.start_timeout_s if timeout_s is None else timeout_s
        try:
            granted = await asyncio.wait_for(asyncio.shield(future), wait_s)
            if self.metrics is not None:
                self.metrics.gateway_wait.observe(time.monotonic() - since)
            return granted
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()  # handed a slot in the very moment the wait ran out
            why = f"; the last start failed: {state.last_failure}" if state.last_failure else ""
            raise NoContainer(
                f"no container of this {settings.kind} was ready within {settings.start_timeout_s:g} s{why}"
            ) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())  # the caller went away after it was handed a slot
            raise
        finally:
            if not future.done():
                future.cancel()
            with contextlib.suppress(ValueError):
                state.waiters.remove(future)

    def try_acquire(self, stub_id: str) -> Container | None:
        """A slot on a ready container of a stub served here already, when one is free now; None otherwise
        (then :meth:`acquire` decides: it waits, or refuses)."""
        state = self._stubs.get(stub_id)
        return None if state is None else self._take_slot(state)

    def _take_slot(self, state: _StubContainers) -> Container | None:
        container = _pick(state)
        if container is not None:
            container.in_flight += 1
            if container.in_flight >= state.capacity:
                self._kick.set()  # this was its last slot: maybe time for another container
        return container

    def release(self, container: Container, *, broken: bool = False) -> None:
        """A request ended; ``broken``: the container failed it (refused, or broke off) and is unusable now.

        An unusable container is handed no more requests; it is stopped once those in flight end, and as it
        no longer counts among the live ones, the scaler starts another in its place.
        """
        container.in_flight -= 1
        container.last_used = time.monotonic()
        state = self._stubs.get(container.stub_id)
        if state is None:
            return
        if broken and not container.draining:
            log.warning("container %s at %s could not be reached; stopping it", container.task_id, container.address)
            self._drain(state, container)
        if container.draining:
            if container.in_flight == 0:
                self._spawn(self._stop_task(container.task_id, container.worker_id))
            return
        self._hand_over(state, container)

    def retire(self, stub_id: str) -> None:
        """The stub's deployment version was stopped: stop its containers once their requests end."""
        state = self._stubs.get(stub_id)
        if state is None:
            return
        state.retired = True
        _fail_waiters(state, NoContainer("the deployment version was stopped"))
        self._kick.set()

    def stats(self, stub_id: str) -> dict[str, int]:
        """Ready, draining, starting and waiting counts of a stub: for tests and metrics."""
        state = self._stubs.get(stub_id)
        if state is None:
            return {"ready": 0, "draining": 0, "starting": 0, "waiting": 0, "in_flight": 0}
        return {
            "ready": sum(1 for c in state.ready.values() if not c.draining),
            "draining": sum(1 for c in state.ready.values() if c.draining),
            "starting": len(state.starting),
            "waiting": len(state.waiters),
            "in_flight": sum(c.in_flight for c in state.ready.values()),
        }

    # ------------------------------------------------------------------ reports (ServingListener)

    def serving(self, stub_id: str, worker_id: str, report: ServingReport) -> None:
        state = self._stubs.get(stub_id)
        if state is None or report.task_id not in state.starting:
            if report.task_id not in self._tasks:  # another replica asked for it: tell them all
                event = {"ready": [stub_id, worker_id, report.task_id, report.address, report.ports]}
                self._spawn(self.dataplane.hub.serving(json.dumps(event)))
            return
        del state.starting[report.task_id]
        state.failures = 0
        state.last_failure = ""
        container = Container(
            report.task_id, stub_id, worker_id, report.address, dict(report.ports), last_used=time.monotonic()
        )
        state.ready[report.task_id] = container
        if state.retired:
            self._drain(state, container)
            return
        log.info("container %s of %s is ready at %s", report.task_id, stub_id, report.address or report.ports)
        self._hand_over(state, container)

    def ended(self, outcomes: Sequence[TaskOutcome]) -> None:
        elsewhere = [[o.task_id, o.status, o.error] for o in outcomes if o.task_id not in self._tasks]
        if elsewhere:  # serving containers another replica asked for: tell them all
            self._spawn(self.dataplane.hub.serving(json.dumps({"ended": elsewhere})))
        for outcome in outcomes:
            stub_id = self._tasks.pop(outcome.task_id, None)
            if stub_id is None:
                continue
            self._spawn(self._disown(outcome.task_id))
            state = self._stubs.get(stub_id)
            if state is None:
                continue
            container = state.ready.pop(outcome.task_id, None)
            never_served = state.starting.pop(outcome.task_id, None) is not None
            if container is not None and container.address:
                self._forget_address(container.address)
            if outcome.status != "cancelled" and (never_served or not (container and container.draining)):
                reason = outcome.error or outcome.status
                if never_served:
                    _back_off(state, reason)
                log.warning("serving container %s of %s ended: %s", outcome.task_id, stub_id, reason)
            self._kick.set()

    def _from_another_replica(self, payload: str) -> None:
        """A report that reached another replica (its worker's session is there) about a container of ours."""
        event = json.loads(payload)
        if "ready" in event:
            stub_id, worker_id, task_id, address, ports = event["ready"]
            if task_id in self._tasks:
                report = ServingReport(str(task_id), str(address), {int(p): str(a) for p, a in ports.items()})
                self.serving(str(stub_id), str(worker_id), report)
        for task_id, status, error in event.get("ended", []):
            if task_id in self._tasks:
                self.ended([TaskOutcome(str(task_id), str(status), error=error)])

    # ------------------------------------------------------------------ scaling

    def _state(self, stub: ServedStub) -> _StubContainers:
        state = self._stubs.get(stub.stub_id)
        if state is None:
            state = self._stubs[stub.stub_id] = _StubContainers(stub)
        return state

    def _hand_over(self, state: _StubContainers, container: Container) -> None:
        while state.waiters and container.in_flight < state.capacity and not container.draining:
            future = state.waiters.popleft()
            if future.done():
                continue
            container.in_flight += 1
            future.set_result(container)

    def _drain(self, state: _StubContainers, container: Container) -> None:
        container.draining = True
        if container.in_flight == 0:
            self._spawn(self._stop_task(container.task_id, container.worker_id))

    async def _scale_loop(self) -> None:
        floors_at = 0.0
        orphans_at = time.monotonic() + 1.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), SCALE_EVERY_S)
            self._kick.clear()
            try:
                if time.monotonic() >= floors_at:
                    await self.owners.alive(ALIVE_TTL_S)
                    await self._read_floors()
                    floors_at = time.monotonic() + FLOORS_EVERY_S
                if time.monotonic() >= orphans_at:
                    await self._stop_orphans()
                    orphans_at = time.monotonic() + ORPHANS_EVERY_S
                for state in list(self._stubs.values()):
                    await self._scale(state)
                if self.metrics is not None:
                    self._export(self.metrics)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelling(exc)
                log.exception("scaling serving containers failed; trying again")
                await asyncio.sleep(1.0)

    def _export(self, metrics: Metrics) -> None:
        states = list(self._stubs.values())
        ready = [c for state in states for c in state.ready.values()]
        metrics.serving(
            starting=sum(len(state.starting) for state in states),
            ready=sum(1 for c in ready if not c.draining),
            draining=sum(1 for c in ready if c.draining),
            waiting=sum(len(state.waiters) for state in states),
        )

    async def _stop_orphans(self) -> None:
        """Stop serving containers no live replica owns: a restarted controlplane forgets what it ran."""
        for orphan in await self.owners.orphans(older_than_s=self.orphan_after_s, skip=set(self._tasks)):
            if orphan.task_id in self._tasks:  # started while the list was read
                continue
            log.info("stopping serving container %s: the replica that started it is gone", orphan.task_id)
            await self._stop_task(orphan.task_id, orphan.worker_id)
            await self.owners.disown(orphan.task_id)

    async def _read_floors(self) -> None:
        """Which deployed stubs keep containers however idle (a box, an endpoint with min_containers)."""
        serving = await deployments.serving_stubs(self.dataplane)
        live = set()
        for workspace_id, stub_id in serving:
            record, settings = await self.dataplane.stub(stub_id)
            if record.kind not in ("endpoint", "box"):
                continue
            live.add(stub_id)
            state = self._state(ServedStub(stub_id, workspace_id, settings))
            state.deployed_floor = settings.floor
            state.retired = False
        for stub_id, state in self._stubs.items():
            if stub_id not in live:
                state.deployed_floor = 0

    async def _scale(self, state: _StubContainers) -> None:
        settings = state.stub.settings
        now = time.monotonic()
        live = [c for c in state.ready.values() if not c.draining]
        if state.retired:
            for container in live:
                self._drain(state, container)
            for task_id in list(state.starting):
                del state.starting[task_id]
                self._spawn(self._stop_task(task_id, None))
            if not state.ready and not state.starting:
                self._stubs.pop(state.stub.stub_id, None)
            return
        demand = sum(c.in_flight for c in live) + len(state.waiters)
        wanted = math.ceil(demand / state.capacity) if demand else 0
        wanted = min(settings.max_containers, max(wanted, state.deployed_floor))
        have = len(live) + len(state.starting)
        if wanted > have and now >= state.retry_at:
            for _ in range(wanted - have):
                # known before it is queued: a worker may report it ready before start_serving returns
                task_id = self.dataplane.new_serving_id()
                state.starting[task_id] = now
                self._tasks[task_id] = state.stub.stub_id
                try:
                    await self.owners.own(task_id)  # before it exists: no other replica takes it for an orphan
                    await self.dataplane.start_serving(state.stub.workspace_id, state.stub.stub_id, task_id)
                except Exception as exc:
                    state.starting.pop(task_id, None)
                    self._tasks.pop(task_id, None)
                    self._spawn(self._disown(task_id))
                    _back_off(state, f"{type(exc).__name__}: {exc}")
                    log.warning("starting a container of %s failed: %s", state.stub.stub_id, exc)
                    break
            return
        # idle ones beyond what is wanted go once keep_warm has passed, longest idle first
        surplus = have - wanted
        idle = sorted((c for c in live if c.in_flight == 0), key=lambda c: c.last_used)
        for container in idle:
            if surplus <= 0:
                break
            if now - container.last_used >= settings.keep_warm_s:
                log.info("stopping container %s of %s: idle", container.task_id, state.stub.stub_id)
                self._drain(state, container)
                surplus -= 1
        if not state.ready and not state.starting and not state.waiters and not state.deployed_floor:
            self._stubs.pop(state.stub.stub_id, None)

    async def _disown(self, task_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.owners.disown(task_id)

    async def _stop_task(self, task_id: str, worker_id: str | None) -> None:
        """Cancel a serving task, and forget its container now: no report of its end will come.

        The dataplane stops tracking a task it cancels, so the worker's outcome for it is dropped
        before it reaches :meth:`ended`; without this the container would stay counted (as draining)
        for the life of the process.
        """
        try:
            await self.dataplane.stop_task(task_id, worker_id)
        except Exception as exc:
            log.warning("stopping serving container %s failed: %s", task_id, exc)
            return
        if task_id in self._tasks:
            self.ended([TaskOutcome(task_id, "cancelled")])

    def _forget_address(self, address: str) -> None:
        for hook in self.on_gone:
            hook(address)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)


def _back_off(state: _StubContainers, reason: str) -> None:
    """A start failed: remember why (a 504 says it) and wait before the next, 0.5 s doubling to MAX_BACKOFF_S."""
    state.failures += 1
    state.last_failure = reason
    state.retry_at = time.monotonic() + delay_s(state.failures, initial_s=0.5, cap_s=MAX_BACKOFF_S)


def _pick(state: _StubContainers) -> Container | None:
    """The ready container with the fewest requests in flight that has room; None when none has."""
    best: Container | None = None
    capacity = state.capacity
    for container in state.ready.values():
        if container.draining or container.in_flight >= capacity:
            continue
        if best is None or container.in_flight < best.in_flight:
            best = container
            if best.in_flight == 0:
                break
    return best


def _fail_waiters(state: _StubContainers, error: Exception) -> None:
    while state.waiters:
        future = state.waiters.popleft()
        if not future.done():
            future.set_exception(error)
