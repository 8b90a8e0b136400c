"""The warm pool's bookkeeping and its scaling policy: when a stub gets another container, and which one goes.

A stub's calls wait in its queue (:class:`WarmStub`); its containers
(:class:`WarmContainer`) take them one at a time. The policy, decided by
:func:`next_step` each time something changes:

- a stub gets a new container only while it has fewer containers than calls in
  flight, and only :attr:`ScalingLimits.max_starting_per_stub` starting at once;
- a stub that already has a container gets another only once a call has
  waited :attr:`ScalingLimits.scale_after_s` for one: the containers already up
  usually drain a burst of short calls before a new one could have started;
- after a failed start the stub waits before the next try, longer after each
  failure in a row (:mod:`levers9.backoff`), back to nothing after a success;
- when the worker is full (the container limit or its GPUs), the longest-idle
  container of another stub is stopped to make room (:func:`idle_to_stop`).

The pool (:mod:`levers9.worker.warm.pool`) acts on these decisions; nothing
here starts or stops anything.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from levers9.backoff import Backoff
from levers9.hooks.types import GpuDevice
from levers9.worker.calls import Call, Outcome, Serving, StubSpec

__all__ = [
    "FIRST_RETRY_S",
    "MAX_RETRY_DELAY_S",
    "OnLog",
    "OnServing",
    "OnStarted",
    "Phase",
    "QueuedCall",
    "ScalingLimits",
    "Step",
    "WarmContainer",
    "WarmStub",
    "idle_to_stop",
    "next_step",
]

OnStarted = Callable[[str], Awaitable[None] | None]
OnLog = Callable[[str, bytes], None]
OnServing = Callable[[Serving], Awaitable[None] | None]

#: the wait after a stub's first failed start; it doubles with each failure in a row
FIRST_RETRY_S = 0.5
#: the longest wait between two start failures of one stub
MAX_RETRY_DELAY_S = 30.0


class Phase(StrEnum):
    """Where a warm container is in its life."""

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"


@dataclass(eq=False)
class QueuedCall:
    """A call waiting for, or running in, a warm container."""

    call: Call
    future: asyncio.Future[Outcome]
    on_started: OnStarted | None
    on_log: OnLog | None
    on_serving: OnServing | None = None
    #: set to stop the call where it runs (cancel, the caller gone, the pool closing)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    #: the container running it, once handed over
    container: WarmContainer | None = None
    #: loop time it was queued, for the scale-up rule
    queued_at: float = 0.0


@dataclass(eq=False)
class WarmContainer:
    """One container of a stub and the connection to its runner."""

    cid: str
    port: int
    token: str
    gpus: list[GpuDevice]
    phase: Phase = Phase.STARTING
    idle_since: float = 0.0
    #: the runtime was asked to prepare it (it must be removed)
    prepared: bool = False
    #: it was started (it must be stopped before it is removed)
    started: bool = False
    stop_requested: bool = False
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    pending: QueuedCall | None = None
    task: asyncio.Task[None] | None = None
    #: a checkpointed container's signal directory (ready and go files, the runner's socket)
    signal_dir: Path | None = None
    #: an endpoint's container: the port its HTTP server listens on
    http_port: int = 0


@dataclass(eq=False)
class WarmStub:
    """A stub's queue of calls and its containers, which serve only it."""

    key: str
    spec: StubSpec
    handler_dir: Path
    queue: asyncio.Queue[QueuedCall] = field(default_factory=asyncio.Queue)
    containers: dict[str, WarmContainer] = field(default_factory=dict)
    #: calls queued or running, not yet settled
    in_flight: int = 0
    #: calls in the order they were queued; the head is dropped once taken or settled (see oldest_waiting)
    waiting: collections.deque[QueuedCall] = field(default_factory=collections.deque)
    #: failed starts in a row, and the wait they call for
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=FIRST_RETRY_S, cap_s=MAX_RETRY_DELAY_S))
    #: loop time before which no container of this stub is started (after a failed start)
    retry_at: float = 0.0

    def count(self, phase: Phase) -> int:
        return sum(1 for c in self.containers.values() if c.phase is phase)

    def oldest_waiting(self) -> float | None:
        """When the longest-waiting queued call was queued; None when none waits.

        Called on every new call, so it must not scan them all: calls are taken in the order they were
        queued, so the oldest still waiting is the head of ``waiting`` once taken ones are dropped.
        """
        while self.waiting and (self.waiting[0].container is not None or self.waiting[0].future.done()):
            self.waiting.popleft()
        return self.waiting[0].queued_at if self.waiting else None

    def start_failed(self, now: float) -> None:
        """Count a failed start: no new container before the back-off has passed."""
        self.retry_at = now + self.backoff.next_s()

    def start_succeeded(self) -> None:
        self.backoff.reset()


@dataclass(frozen=True)
class ScalingLimits:
    #: containers at once on this worker, of all stubs, stopping ones included
    max_containers: int
    #: containers of one stub starting at once
    max_starting_per_stub: int
    #: a stub that has a container gets another only once a call has waited this long for one
    scale_after_s: float


class Step(StrEnum):
    """What :func:`next_step` says to do for a stub."""

    #: start one more container now
    START = "start"
    #: enough containers, or as many starting as allowed
    ENOUGH = "enough"
    #: decide again at the time returned with it
    LATER = "later"
    #: the worker is full: make room
    NO_ROOM = "no_room"


def next_step(stub: WarmStub, *, now: float, limits: ScalingLimits, has_room: bool) -> tuple[Step, float]:
    """Whether ``stub`` should get another container now; with ``Step.LATER``, the loop time to ask again."""
    if len(stub.containers) >= stub.in_flight or stub.count(Phase.STARTING) >= limits.max_starting_per_stub:
        return Step.ENOUGH, 0.0
    if stub.containers:
        # Short calls are served faster by the containers already there than by a new one
        # (which takes a few hundred ms to start): scale up only when calls actually wait.
        oldest = stub.oldest_waiting()
        if oldest is None:
            return Step.ENOUGH, 0.0
        if now < oldest + limits.scale_after_s:
            return Step.LATER, oldest + limits.scale_after_s
    if now < stub.retry_at:
        return Step.LATER, stub.retry_at
    if not has_room:
        return Step.NO_ROOM, 0.0
    return Step.START, 0.0


def idle_to_stop(stubs: Iterable[WarmStub], wanting: WarmStub, *, needs_gpus: bool) -> WarmContainer | None:
    """The container to stop so that ``wanting`` gets room: the longest-idle one of another stub.

    When the room wanted is GPUs, only a container holding GPUs frees any.
    """
    idle = [
        box
        for other in stubs
        if other is not wanting
        for box in other.containers.values()
        if box.phase is Phase.IDLE and (box.gpus or not needs_gpus)
    ]
    return min(idle, key=lambda box: box.idle_since) if idle else None
