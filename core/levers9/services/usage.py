"""Usage: how many GPU-hours and CPU-hours a workspace's tasks held, by environment and pool, over a period.

Counted from the tasks table alone (no separate meter): a task holds what its placement request asked for
(``cpu_millicores``; its GPU count when it was placed on a GPU, none when it fell back to CPU) from
``started_at`` until ``finished_at`` (a task still running: until now; one that finished without a
``finished_at``: until its last update). Only the part of that time inside ``[since, until)`` counts, so
periods add up: two adjacent periods' hours sum to the hours of both together. A task never started (queued,
cancelled while waiting) holds nothing.

Invariants:

* the caller sees its own workspace only: every environment of the workspace its token acts in (environments
  are workspace rows of their own, so they are listed by name), never another workspace's;
* ``since`` must be before ``until`` and the period at most :data:`MAX_PERIOD_DAYS` days; a naive datetime is
  UTC. Anything else is a ValueError naming the field;
* hours are rounded to :data:`DIGITS` decimals only when shown; sums are of exact seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select

from levers9.services.access import own_workspace
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.models import Task
from levers9.state.sql.records import TaskStatus

__all__ = ["DIGITS", "MAX_PERIOD_DAYS", "Usage", "UsageRow", "usage"]

#: the longest period one question may cover
MAX_PERIOD_DAYS = 366
#: decimals of hours shown
DIGITS = 3
#: the pool named for a task that started without one recorded (it ran before its placement was written)
UNKNOWN_POOL = "(unknown)"


@dataclass(frozen=True)
class UsageRow:
    environment: str
    pool: str
    #: the GPU type the pool's tasks ran on (None: CPU only)
    gpu: str | None
    #: tasks that held resources inside the period
    tasks: int
    gpu_hours: float
    cpu_hours: float


@dataclass(frozen=True)
class Usage:
    workspace_id: str
    since: datetime
    until: datetime
    #: by environment, then pool
    rows: list[UsageRow]

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rows)

    @property
    def cpu_hours(self) -> float:
        return sum(r.cpu_hours for r in self.rows)


def _utc(value: datetime, field: str) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(f"{field}: a date and time is needed, got {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _held(task: Task, now: datetime) -> tuple[datetime, datetime] | None:
    """When ``task`` held its resources, or None when it never started."""
    if task.started_at is None:
        return None
    if task.finished_at is not None:
        end = task.finished_at
    elif TaskStatus(task.status).terminal:
        end = task.updated_at
    else:
        end = now
    return task.started_at, max(end, task.started_at)


def _shape(task: Task) -> tuple[float, int]:
    """(CPU cores, GPUs) the task held, from its placement request."""
    request = task.request or {}
    try:
        cores = max(float(request.get("cpu_millicores", 1000)), 0.0) / 1000
    except (TypeError, ValueError):
        cores = 1.0
    gpus = 0
    if task.gpu:
        gpu = request.get("gpu") or {}
        try:
            gpus = max(int(gpu.get("count", 0)), 0) if isinstance(gpu, dict) else 0
        except (TypeError, ValueError):
            gpus = 0
    return cores, gpus


async def usage(
    services: Services, principal: Principal, since: datetime, until: datetime, *, now: datetime | None = None
) -> Usage:
    """GPU-hours and CPU-hours of the caller's workspace in ``[since, until)``, by environment and pool."""
    own_workspace(principal, "see usage")
    start, end = _utc(since, "since"), _utc(until, "until")
    if end <= start:
        raise ValueError(f"until: must be after since ({start.isoformat()}), got {end.isoformat()}")
    if end - start > timedelta(days=MAX_PERIOD_DAYS):
        raise ValueError(f"until: a period of at most {MAX_PERIOD_DAYS} days is accepted, got {(end - start).days}")
    now = _utc(now, "now") if now is not None else datetime.now(UTC)
    root = principal.workspace_root or ""
    environments = {env.id: env.environment for env in await services.workspaces.environments(root)}
    query = select(Task).where(
        Task.workspace_id.in_(list(environments)),
        Task.started_at.is_not(None),
        Task.started_at < end,
        or_(Task.finished_at.is_(None), Task.finished_at > start),
    )
    seconds: dict[tuple[str, str, str | None], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    async with services.db.transaction() as session:
        for task in await session.scalars(query):
            held = _held(task, now)
            if held is None:
                continue
            overlap = (min(held[1], end) - max(held[0], start)).total_seconds()
            if overlap <= 0 and not (held[0] == held[1] and start <= held[0] < end):
                continue
            cores, gpus = _shape(task)
            key = (environments[task.workspace_id], task.pool or UNKNOWN_POOL, task.gpu if gpus else None)
            totals = seconds[key]
            totals[0] += 1
            totals[1] += max(overlap, 0.0) * gpus
            totals[2] += max(overlap, 0.0) * cores
    rows = [
        UsageRow(environment, pool, gpu, int(t[0]), t[1] / 3600, t[2] / 3600)
        for (environment, pool, gpu), t in sorted(seconds.items(), key=lambda item: (item[0][0], item[0][1]))
    ]
    return Usage(root, start, end, rows)
