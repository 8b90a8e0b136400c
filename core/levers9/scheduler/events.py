"""What the scheduler tells an observer (the controlplane's metrics) as things happen.

The scheduler sits below the services layer and cannot import the metrics; it
calls :meth:`levers9.scheduler.context.Context.emit` with one of the small,
immutable events here, and whoever composed the process sets
``Context.on_event`` to count them. Each event is emitted once, by the replica
where the thing happened, so counters fed from them sum correctly across
replicas.

Every label value an event carries comes from a small fixed set (the ``*_``
constants below, a pool or provider name from the config, a hook name, an
exception class name), so the series they feed stay few. An observer that
raises is logged and ignored: counting must never change what the scheduler
does.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LOST_KEEPALIVE",
    "LOST_LEFT",
    "LOST_MACHINE_FAILED",
    "LOST_MACHINE_VANISHED",
    "LOST_PREEMPTED",
    "REQUEUE_ATTEMPT_FAILED",
    "REQUEUE_MACHINE_FAILED",
    "REQUEUE_MACHINE_VANISHED",
    "REQUEUE_NEVER_DELIVERED",
    "REQUEUE_PREEMPTED",
    "REQUEUE_RESTART",
    "REQUEUE_WORKER_LOST",
    "TERMINATED_FAILED",
    "TERMINATED_IDLE",
    "TERMINATED_NEVER_REGISTERED",
    "TERMINATED_ORPHAN",
    "TERMINATED_OTHER",
    "TERMINATED_PREEMPTED",
    "TERMINATED_VANISHED",
    "TERMINATED_WORKER_GONE",
    "MachineTerminated",
    "ProviderCalled",
    "Requeued",
    "SchedulerEvent",
    "WorkerLost",
]

#: why tasks went back to the backlog
REQUEUE_WORKER_LOST = "worker_lost"
REQUEUE_MACHINE_VANISHED = "machine_vanished"
#: the provider reported the machine preempted (a spot interruption) or failed: requeued at once
REQUEUE_PREEMPTED = "preempted"
REQUEUE_MACHINE_FAILED = "machine_failed"
REQUEUE_ATTEMPT_FAILED = "attempt_failed"
REQUEUE_RESTART = "restart"
#: sent to a worker by a replica that went away before the worker got it (found when the worker came back)
REQUEUE_NEVER_DELIVERED = "never_delivered"

#: why a worker was taken out while it still held work or a slot
LOST_KEEPALIVE = "keepalive_lapsed"
LOST_LEFT = "removed"
LOST_MACHINE_VANISHED = "machine_vanished"
LOST_PREEMPTED = "preempted"
LOST_MACHINE_FAILED = "machine_failed"

#: why a machine was stopped (or found stopped)
TERMINATED_NEVER_REGISTERED = "never_registered"
TERMINATED_WORKER_GONE = "worker_gone"
TERMINATED_IDLE = "idle"
TERMINATED_ORPHAN = "orphan"
TERMINATED_VANISHED = "vanished"
TERMINATED_PREEMPTED = "preempted"
TERMINATED_FAILED = "failed"
TERMINATED_OTHER = "other"


@dataclass(frozen=True)
class Requeued:
    """``count`` tasks went back to the backlog for ``reason`` (a ``REQUEUE_*`` value)."""

    reason: str
    count: int = 1


@dataclass(frozen=True)
class WorkerLost:
    """A worker of ``pool`` was removed for ``reason`` (a ``LOST_*`` value)."""

    pool: str
    reason: str


@dataclass(frozen=True)
class MachineTerminated:
    """A machine of ``pool`` was terminated (or found gone) for ``reason`` (a ``TERMINATED_*`` value)."""

    pool: str
    reason: str


@dataclass(frozen=True)
class ProviderCalled:
    """A provider hook returned: ``error`` is empty on success, else the exception's class name."""

    provider: str
    hook: str
    error: str = ""


SchedulerEvent = Requeued | WorkerLost | MachineTerminated | ProviderCalled
