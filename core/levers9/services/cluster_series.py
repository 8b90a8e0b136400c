"""The cluster-wide series: what one refresh read of the state every replica shares, exported by one replica.

:class:`ClusterSnapshot` is what :meth:`levers9.services.metrics.Metrics.refresh` read from Redis and SQL;
:class:`ClusterSeries` exports the last one, or nothing at all when its ``snapshot`` is None, which it is
on every replica but the planner lease's holder (checked at each scrape against the lease's fencing
token: a replica that lost the lease drops it before answering). Nothing here reads the state itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ClusterSeries", "ClusterSnapshot"]


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster-wide state one refresh read; ages are computed when scraped, so they never lag."""

    backlog_depth: int = 0
    #: (pool, gpu, status) -> workers
    workers: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: pool -> (queued tasks that prefer it, the oldest one's enqueue time in epoch ms; 0 when none)
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: (pool, state) -> machines in an active state
    machines: dict[tuple[str, str], int] = field(default_factory=dict)


class ClusterSeries(Collector):
    """Exports the last :class:`ClusterSnapshot`, or nothing at all when this replica does not hold the lease."""

    def __init__(self) -> None:
        self.snapshot: ClusterSnapshot | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # the series come and go with the lease; nothing to check for name clashes up front

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        depth = GaugeMetricFamily(
            "levers9_backlog_depth",
            "Requests waiting in the backlog for a worker (queued, not yet placed), across all replicas.",
        )
        depth.add_metric([], snap.backlog_depth)
        workers = GaugeMetricFamily(
            "levers9_workers",
            "Registered workers by pool, GPU type and status (running, draining; silent: keepalive lapsed).",
            labels=["pool", "gpu", "status"],
        )
        for (pool, gpu, status), n in sorted(snap.workers.items()):
            workers.add_metric([pool, gpu, status], n)
        pending = GaugeMetricFamily(
            "levers9_pending_tasks",
            "Tasks queued for a worker, by the pool they prefer (the first of their candidates).",
            labels=["pool"],
        )
        oldest = GaugeMetricFamily(
            "levers9_oldest_pending_seconds",
            "Age of the oldest task queued for a worker, by the pool it prefers (0 when none waits).",
            labels=["pool"],
        )
        now_ms = time.time() * 1000
        for pool, (count, first_ms) in sorted(snap.pending.items()):
            pending.add_metric([pool], count)
            oldest.add_metric([pool], max(0.0, (now_ms - first_ms) / 1000) if count and first_ms else 0.0)
        machines = GaugeMetricFamily(
            "levers9_machines",
            "Machines levers9 started that are not yet terminated, by pool and state.",
            labels=["pool", "state"],
        )
        for (pool, state), n in sorted(snap.machines.items()):
            machines.add_metric([pool, state], n)
        yield from (depth, workers, pending, oldest, machines)
