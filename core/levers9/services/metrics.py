"""Prometheus metrics of one controlplane process, served on the metrics port.

Each :class:`Metrics` owns its registry instead of using prometheus_client's
global one: a process (or a test) may build several, and the global registry
refuses a second metric with the same name.

Counters and histograms are fed by the code paths where things happen
(placements, provider calls, finished tasks); the gauges describe shared state
that other replicas change too (the backlog, the workers), so they are read
from Redis by :meth:`Metrics.refresh` rather than tracked incrementally, which
would drift as soon as another replica placed work or the reaper removed a worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = ["CPU_LABEL", "Metrics"]

#: the ``gpu`` label of CPU pools and workers: a real value rather than an empty
#: label, so ``{gpu="cpu"}`` can be selected like any GPU type
CPU_LABEL = "cpu"

#: a provider call takes from under a second (a local process) to many minutes (bare metal)
_PROVISIONING_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
#: tasks range from sub-second calls to day-long training runs
_TASK_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
#: a gateway request takes from well under a millisecond (a warm endpoint) to minutes (a cold GPU start)
_GATEWAY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: worker statuses every configured pool reports, at 0 when it has none, so a
#: dashboard sees an empty pool as 0 instead of a gap
_SEEDED_STATUSES = ("running", "draining")


def _gpu(gpu: str | None) -> str:
    return gpu or CPU_LABEL


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.backlog_depth = Gauge(
            "levers9_backlog_depth",
            "Requests waiting in the backlog for a worker (queued, not yet placed), across all replicas.",
            registry=self.registry,
        )
        self.placements = Counter(
            "levers9_placements_total",
            "Requests this replica placed on a worker, by pool and GPU type.",
            ["pool", "gpu"],
            registry=self.registry,
        )
        self.provisioning = Histogram(
            "levers9_provisioning_seconds",
            "Duration of provider calls that start a machine (not the machine's boot), by provider and outcome.",
            ["provider", "outcome"],
            buckets=_PROVISIONING_BUCKETS,
            registry=self.registry,
        )
        self.workers = Gauge(
            "levers9_workers",
            "Registered workers by pool, GPU type and status (running, draining; silent: keepalive lapsed).",
            ["pool", "gpu", "status"],
            registry=self.registry,
        )
        self.task_duration = Histogram(
            "levers9_task_duration_seconds",
            "How long finished tasks ran, from their dispatch to a worker to their end (0 if they never ran), by final status.",
            ["status"],
            buckets=_TASK_BUCKETS,
            registry=self.registry,
        )
        self.tasks_finished = Counter(
            "levers9_tasks_finished_total",
            "Tasks that reached a final status (complete, error, cancelled, timeout) through this replica.",
            ["status"],
            registry=self.registry,
        )

        self.gateway_requests = Counter(
            "levers9_gateway_requests_total",
            "Requests the gateway answered on this replica, by route (endpoint, queue, job, box) and HTTP status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.gateway_seconds = Histogram(
            "levers9_gateway_request_seconds",
            "Time from a gateway request's arrival to the end of its response, waiting for a container included.",
            ["route"],
            buckets=_GATEWAY_BUCKETS,
            registry=self.registry,
        )
        self.gateway_wait = Histogram(
            "levers9_gateway_wait_seconds",
            "Time requests that found no free container slot waited for one (a cold start, or a full endpoint).",
            buckets=_GATEWAY_BUCKETS,
            registry=self.registry,
        )
        self.serving_containers = Gauge(
            "levers9_serving_containers",
            "Endpoint and box containers this replica runs, by state (starting, ready, draining).",
            ["state"],
            registry=self.registry,
        )
        self._gateway_series: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self.gateway_waiting = Gauge(
            "levers9_gateway_waiting_requests",
            "Requests on this replica waiting for a container slot right now.",
            registry=self.registry,
        )

    def placed(self, pool: str, gpu: str | None, n: int = 1) -> None:
        self.placements.labels(pool=pool, gpu=_gpu(gpu)).inc(n)

    def provisioned(self, provider: str, seconds: float, outcome: str) -> None:
        """Fits :attr:`levers9.scheduler.context.Context.on_provisioned`, so it can be handed to the scheduler as is."""
        self.provisioning.labels(provider=provider, outcome=outcome).observe(max(0.0, seconds))

    def task_finished(self, status: str, seconds: float) -> None:
        """``seconds`` is how long the task ran (0 when it never started), so queueing does not blur run times."""
        self.tasks_finished.labels(status=status).inc()
        self.task_duration.labels(status=status).observe(max(0.0, seconds))

    def gateway_answered(self, route: str, status: int, seconds: float) -> None:
        """Counted on every gateway request: the labelled series are looked up once, then kept."""
        series = self._gateway_series.get((route, status))
        if series is None:
            series = self._gateway_series[(route, status)] = (
                self.gateway_requests.labels(route=route, status=str(status)),
                self.gateway_seconds.labels(route=route),
            )
        series[0].inc()
        series[1].observe(max(0.0, seconds))

    def serving(self, starting: int, ready: int, draining: int, waiting: int) -> None:
        """The gateway's containers and waiting requests, set by its scaler once a second."""
        self.serving_containers.labels(state="starting").set(starting)
        self.serving_containers.labels(state="ready").set(ready)
        self.serving_containers.labels(state="draining").set(draining)
        self.gateway_waiting.set(waiting)

    async def refresh(self, services: Services) -> None:
        """Set the gauges from Redis; Redis errors propagate (the caller logs them) and the gauges keep their values.

        Everything is read before any gauge changes, and the changes happen
        without yielding to the event loop, so a scrape served by the same loop
        never sees a half-updated set of series. Series of pools that are gone
        from both the config and Redis are dropped rather than left at their
        last value.
        """
        workers = services.scheduler.workers
        depth = await services.scheduler.backlog.size()
        ids = sorted(await workers.ids())
        silent = set(await workers.silent())
        states = await workers.get_many(ids)
        counts = {
            (spec.name, _gpu(spec.gpu), status): 0 for spec in services.pools.values() for status in _SEEDED_STATUSES
        }
        for wid, state in zip(ids, states, strict=True):
            if state is not None:
                key = (state.info.pool, _gpu(state.info.gpu), "silent" if wid in silent else state.status)
                counts[key] = counts.get(key, 0) + 1
        self.backlog_depth.set(depth)
        self.workers.clear()
        for (pool, gpu, status), count in counts.items():
            self.workers.labels(pool=pool, gpu=gpu, status=status).set(count)

    def asgi_app(self) -> ASGIApp:
        """The app for the metrics port; it also answers ASGI lifespan events, which prometheus_client's app refuses."""
        scrape = make_asgi_app(registry=self.registry)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            else:
                await scrape(scope, receive, send)

        return app
