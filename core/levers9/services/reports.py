"""What a worker reports about the calls it runs, and who hears of serving containers.

:class:`WorkerReport` is one batch from a worker's session: calls started,
serving containers ready (with where they answer), outcomes and output. The
data plane stores them; a :class:`ServingListener` (the gateway's autoscaler)
is told of serving containers as they come and go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ServingListener", "ServingReport", "TaskOutcome", "WorkerReport"]


@dataclass(frozen=True)
class TaskOutcome:
    task_id: str
    status: str
    result: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    container_id: str | None = None


@dataclass(frozen=True)
class ServingReport:
    """A serving container ready for requests: where the worker says it answers."""

    task_id: str
    address: str
    ports: dict[int, str] = field(default_factory=dict)


class ServingListener(Protocol):
    """The gateway, told of serving containers as their workers report them."""

    def serving(self, stub_id: str, worker_id: str, report: ServingReport) -> None: ...

    def ended(self, outcomes: Sequence[TaskOutcome]) -> None: ...


@dataclass
class WorkerReport:
    started: list[tuple[str, str]] = field(default_factory=list)
    serving: list[ServingReport] = field(default_factory=list)
    outcomes: list[TaskOutcome] = field(default_factory=list)
    logs: list[tuple[str, bytes]] = field(default_factory=list)
