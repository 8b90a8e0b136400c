"""Prometheus metrics of one controlplane replica, served on the metrics port.

Each :class:`Metrics` owns its registry instead of using prometheus_client's
global one: a process (or a test) may build several, and the global registry
refuses a second metric with the same name.

Two kinds of series, so that ``sum()`` over every replica is always right:

- **per-replica** series carry a ``replica`` label (:attr:`Metrics.replica`:
  its stable name, levers9.services.replica_name). They count what this
  replica did (requests it answered, tasks it placed, machines it terminated,
  tasks its reaper requeued) or what it holds (its gateway's containers).
  Counters and histograms are fed by the code paths where things happen,
  the scheduler's through :meth:`Metrics.scheduler_event`.
- **cluster-wide** series (workers, the backlog, pending tasks and the oldest
  one's age per pool, machines) describe state in Redis and SQL that every
  replica shares. Only the replica holding the planner lease exports them,
  without a ``replica`` label; every other replica exports none (not stale
  values), so exactly one copy exists. :meth:`Metrics.refresh` reads them and
  ``levers9_planner_lease_held{replica}`` (1 or 0 on every replica). Both
  are checked again at each scrape against the lease's fencing token in
  Redis (:meth:`levers9.scheduler.lease.Lease.current`), never taken from
  what the replica last believed: a replica that resumes from a freeze
  (SIGSTOP) after another took the lease reads 0 and exports none of them at
  its first scrape, so exactly one replica reads 1 at any scrape. A scrape
  whose check fails (Redis unreachable) reads 0 too.

Counters are exported at 0 from the start for the label sets known then
(:meth:`Metrics.seed`: the scheduler's reasons, the config's pools, hooks,
final statuses, listener events), or ``increase()`` would miss the first burst
after a start. Provider errors, request counters by status, worker refusals
and later-attached pools appear at their first increment (labels not known).

Process metrics (``process_*``, ``python_*``) and ``levers9_build_info`` come
from prometheus_client's collectors; the Prometheus ``instance`` label tells
replicas apart there. The full list is in docs/architecture.md ("Metrics").
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    make_asgi_app,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from levers9.scheduler import events
from levers9.scheduler.planner import ACTIVE
from levers9.services.cluster_series import ClusterSeries, ClusterSnapshot

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from levers9.scheduler.pools import PoolSpec
    from levers9.services.core import Services

__all__ = ["CPU_LABEL", "ClusterSnapshot", "Metrics"]


#: the ``gpu`` label of CPU pools and workers: a real value rather than an empty
#: label, so ``{gpu="cpu"}`` can be selected like any GPU type
CPU_LABEL = "cpu"

#: a provider call takes from under a second (a local process) to many minutes (bare metal)
_PROVISIONING_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
#: tasks range from sub-second calls to day-long training runs
_TASK_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
#: a gateway request takes from well under a millisecond (a warm endpoint) to minutes (a cold GPU start)
_GATEWAY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: an API request (gRPC or REST) takes under a millisecond (a lookup) to seconds (a large submit)
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: worker statuses every configured pool reports, at 0 when it has none, so a
#: dashboard sees an empty pool as 0 instead of a gap
_SEEDED_STATUSES = ("running", "draining")
#: the final statuses of a task (``levers9_tasks_finished_total``'s ``status``)
_FINAL_STATUSES = ("complete", "error", "cancelled", "timeout")
#: the provider hooks whose calls are counted (``levers9_provider_calls_total``'s ``hook``)
_PROVIDER_HOOKS = ("provision", "terminate", "list_machines")
#: backlog entries read per Redis round trip while counting pending tasks
_CHUNK = 1000
#: the HTTP listeners' events that close a connection (the others refuse one)
_CLOSED = frozenset({"evicted", "header_timeout", "body_timeout"})
#: every reason the scheduler gives (levers9.scheduler.events), by the counter it feeds
_REQUEUE_REASONS = tuple(getattr(events, n) for n in events.__all__ if n.startswith("REQUEUE_"))
_LOST_REASONS = tuple(getattr(events, n) for n in events.__all__ if n.startswith("LOST_"))
_TERMINATED_REASONS = tuple(getattr(events, n) for n in events.__all__ if n.startswith("TERMINATED_"))


def _gpu(gpu: str | None) -> str:
    return gpu or CPU_LABEL


def _version() -> str:
    try:
        return package_version("levers9")
    except PackageNotFoundError:
        return "unknown"


class Metrics:
    def __init__(self, replica: str = "local") -> None:
        self.registry = CollectorRegistry()
        self._replica = replica
        r = ["replica"]
        self.placements = Counter(
            "levers9_placements_total",
            "Requests this replica placed on a worker, by pool and GPU type.",
            [*r, "pool", "gpu"],
            registry=self.registry,
        )
        self.placements_queued = Counter(
            "levers9_placements_queued_total",
            "Of those, the calls placed in a worker's own queue (to start there when its room frees), by pool.",
            [*r, "pool"],
            registry=self.registry,
        )
        self.provisioning = Histogram(
            "levers9_provisioning_seconds",
            "Duration of provider calls that start a machine (not the machine's boot), by provider and outcome.",
            [*r, "provider", "outcome"],
            buckets=_PROVISIONING_BUCKETS,
            registry=self.registry,
        )
        self.task_duration = Histogram(
            "levers9_task_duration_seconds",
            "How long finished tasks ran, from their dispatch to a worker to their end (0 if they never ran), by final status.",
            [*r, "status"],
            buckets=_TASK_BUCKETS,
            registry=self.registry,
        )
        self.tasks_finished = Counter(
            "levers9_tasks_finished_total",
            "Tasks that reached a final status (complete, error, cancelled, timeout) through this replica.",
            [*r, "status"],
            registry=self.registry,
        )
        self.gateway_requests = Counter(
            "levers9_gateway_requests_total",
            "Requests the gateway answered on this replica, by route (endpoint, queue, job, box) and HTTP status.",
            [*r, "route", "status"],
            registry=self.registry,
        )
        self.gateway_seconds = Histogram(
            "levers9_gateway_request_seconds",
            "Time from a gateway request's arrival to the end of its response, waiting for a container included.",
            [*r, "route"],
            buckets=_GATEWAY_BUCKETS,
            registry=self.registry,
        )
        self.gateway_waits = Histogram(
            "levers9_gateway_wait_seconds",
            "Time requests that found no free container slot waited for one (a cold start, or a full endpoint).",
            r,
            buckets=_GATEWAY_BUCKETS,
            registry=self.registry,
        )
        self.serving_containers = Gauge(
            "levers9_serving_containers",
            "Endpoint and box containers this replica runs, by state (starting, ready, draining).",
            [*r, "state"],
            registry=self.registry,
        )
        self.gateway_waiting = Gauge(
            "levers9_gateway_waiting_requests",
            "Requests on this replica waiting for a container slot right now.",
            r,
            registry=self.registry,
        )
        self.grpc_requests = Counter(
            "levers9_grpc_requests_total",
            "gRPC calls this replica answered, by full method name and final status code (streams counted once).",
            [*r, "method", "code"],
            registry=self.registry,
        )
        self.grpc_seconds = Histogram(
            "levers9_grpc_request_seconds",
            "Time to answer gRPC calls with a single response (streaming responses are not timed), by method.",
            [*r, "method"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "levers9_http_requests_total",
            "HTTP requests this replica answered (REST and gateway), by route template, method and status.",
            [*r, "route", "method", "status"],
            registry=self.registry,
        )
        self.http_seconds = Histogram(
            "levers9_http_request_seconds",
            "Time from an HTTP request's arrival to its response headers, by route template.",
            [*r, "route"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "levers9_connections_refused_total",
            "Connections an HTTP listener (http, metrics) refused, by reason: per_client (over "
            "listen.max_connections_per_client), cap (at its cap, none to evict), descriptors (accept found no "
            "file descriptor free; counted once per pause of the listener).",
            [*r, "listener", "reason"],
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "levers9_connections_closed_total",
            "Connections an HTTP listener closed while the client owed bytes, by reason: evicted (at the cap, one "
            "that had sent no request head, to make room), header_timeout, body_timeout.",
            [*r, "listener", "reason"],
            registry=self.registry,
        )
        self.connections_open = Gauge(
            "levers9_connections_open",
            "Connections an HTTP listener holds now.",
            [*r, "listener"],
            registry=self.registry,
        )
        self.requeues = Counter(
            "levers9_requeues_total",
            "Tasks this replica put back in the backlog, by reason "
            "(worker_lost, machine_vanished, attempt_failed, restart).",
            [*r, "reason"],
            registry=self.registry,
        )
        self.worker_refusals = Counter(
            "levers9_worker_refusals_total",
            "Tasks a worker reported on, or asked the payloads of, that were not placed on it: refused, by what "
            "it tried (a security event: a forged worker, or a late one whose call was placed again elsewhere).",
            [*r, "what"],
            registry=self.registry,
        )
        self.workers_lost = Counter(
            "levers9_workers_lost_total",
            "Workers this replica took out, by pool and reason (keepalive_lapsed, removed, machine_vanished).",
            [*r, "pool", "reason"],
            registry=self.registry,
        )
        self.machines_terminated = Counter(
            "levers9_machines_terminated_total",
            "Machines this replica terminated or found gone, by pool and reason "
            "(never_registered, worker_gone, idle, orphan, vanished, other).",
            [*r, "pool", "reason"],
            registry=self.registry,
        )
        self.provider_calls = Counter(
            "levers9_provider_calls_total",
            "Provider hook calls this replica made (provision, terminate, list_machines), by provider and hook.",
            [*r, "provider", "hook"],
            registry=self.registry,
        )
        self.provider_errors = Counter(
            "levers9_provider_errors_total",
            "Provider hook calls that failed, by provider, hook and error (the exception's class name).",
            [*r, "provider", "hook", "error"],
            registry=self.registry,
        )
        self.redis_restarts = Counter(
            "levers9_embedded_redis_restarts_total",
            "Times this replica started its embedded redis-server again after it died (what it held is rebuilt "
            "from SQL); a configured Redis is not counted here.",
            r,
            registry=self.registry,
        )
        self.lease_held = Gauge(
            "levers9_planner_lease_held",
            "1 on the replica holding the planner lease (it plans capacity and exports the cluster-wide series), "
            "else 0.",
            r,
            registry=self.registry,
        )
        self.build_info = Gauge(
            "levers9_build_info",
            "Always 1: the levers9 version and Python version this replica runs.",
            ["version", "python"],
            registry=self.registry,
        )
        self.build_info.labels(version=_version(), python=platform.python_version()).set(1)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._cluster = ClusterSeries()
        self.registry.register(self._cluster)
        #: whether this replica's lease is current, asked at each scrape (None until the first refresh)
        self._lease_current: Callable[[], Awaitable[bool]] | None = None
        self._gateway_series: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._grpc_series: dict[tuple[str, str], Counter] = {}
        self._grpc_timers: dict[str, Histogram] = {}
        self._http_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    @property
    def replica(self) -> str:
        """The ``replica`` label of the per-replica series."""
        return self._replica

    @replica.setter
    def replica(self, name: str) -> None:
        """Set once, when the replica's name is known and before anything is counted (series already made keep
        the old name)."""
        self._replica = name
        self._gateway_series.clear()
        self._grpc_series.clear()
        self._grpc_timers.clear()
        self._http_series.clear()

    def seed(self, pools: Iterable[PoolSpec]) -> None:
        """Export at 0 every counter series whose labels are known now (see the module's docstring).

        Called once, after :attr:`replica` is set; ``pools`` are the pools the replica starts with.
        """
        r = self._replica
        for reason in _REQUEUE_REASONS:
            self.requeues.labels(replica=r, reason=reason)
        for status in _FINAL_STATUSES:
            self.tasks_finished.labels(replica=r, status=status)
        self.redis_restarts.labels(replica=r)
        for spec in pools:
            pool = spec.name
            self.placements.labels(replica=r, pool=pool, gpu=_gpu(spec.gpu))
            self.placements_queued.labels(replica=r, pool=pool)
            for reason in _LOST_REASONS:
                self.workers_lost.labels(replica=r, pool=pool, reason=reason)
            for reason in _TERMINATED_REASONS:
                self.machines_terminated.labels(replica=r, pool=pool, reason=reason)
            for hook in _PROVIDER_HOOKS:
                self.provider_calls.labels(replica=r, provider=spec.pool.provider, hook=hook)

    # ------------------------------------------------------------------ fed by code paths

    def placed(self, pool: str, gpu: str | None, n: int = 1, *, queued: int = 0) -> None:
        self.placements.labels(replica=self._replica, pool=pool, gpu=_gpu(gpu)).inc(n)
        if queued:
            self.placements_queued.labels(replica=self._replica, pool=pool).inc(queued)

    def provisioned(self, provider: str, seconds: float, outcome: str) -> None:
        """Fits :attr:`levers9.scheduler.context.Context.on_provisioned`, so it can be handed to the scheduler as is."""
        self.provisioning.labels(replica=self._replica, provider=provider, outcome=outcome).observe(max(0.0, seconds))

    def scheduler_event(self, event: events.SchedulerEvent) -> None:
        """Fits :attr:`levers9.scheduler.context.Context.on_event`: counts what the scheduler reports."""
        r = self._replica
        if isinstance(event, events.Requeued):
            self.requeues.labels(replica=r, reason=event.reason).inc(event.count)
        elif isinstance(event, events.WorkerLost):
            self.workers_lost.labels(replica=r, pool=event.pool, reason=event.reason).inc()
        elif isinstance(event, events.MachineTerminated):
            self.machines_terminated.labels(replica=r, pool=event.pool, reason=event.reason).inc()
        elif isinstance(event, events.ProviderCalled):
            self.provider_calls.labels(replica=r, provider=event.provider, hook=event.hook).inc()
            if event.error:
                self.provider_errors.labels(
                    replica=r, provider=event.provider, hook=event.hook, error=event.error
                ).inc()

    def worker_refused(self, what: str, n: int = 1) -> None:
        self.worker_refusals.labels(replica=self._replica, what=what).inc(n)

    def embedded_redis_restarted(self) -> None:
        self.redis_restarts.labels(replica=self._replica).inc()

    def task_finished(self, status: str, seconds: float) -> None:
        """``seconds`` is how long the task ran (0 when it never started), so queueing does not blur run times."""
        self.tasks_finished.labels(replica=self._replica, status=status).inc()
        self.task_duration.labels(replica=self._replica, status=status).observe(max(0.0, seconds))

    def gateway_answered(self, route: str, status: int, seconds: float) -> None:
        """Counted on every gateway request: the labelled series are looked up once, then kept."""
        series = self._gateway_series.get((route, status))
        if series is None:
            series = self._gateway_series[(route, status)] = (
                self.gateway_requests.labels(replica=self._replica, route=route, status=str(status)),
                self.gateway_seconds.labels(replica=self._replica, route=route),
            )
        series[0].inc()
        series[1].observe(max(0.0, seconds))

    @property
    def gateway_wait(self) -> Histogram:
        """This replica's series of ``levers9_gateway_wait_seconds`` (the gateway's scaler observes it)."""
        return self.gateway_waits.labels(replica=self._replica)

    def serving(self, starting: int, ready: int, draining: int, waiting: int) -> None:
        """The gateway's containers and waiting requests, set by its scaler once a second."""
        r = self._replica
        self.serving_containers.labels(replica=r, state="starting").set(starting)
        self.serving_containers.labels(replica=r, state="ready").set(ready)
        self.serving_containers.labels(replica=r, state="draining").set(draining)
        self.gateway_waiting.labels(replica=r).set(waiting)

    def grpc_answered(self, method: str, code: str, seconds: float | None) -> None:
        """One gRPC call ended with status ``code``; ``seconds`` is None for calls that are not timed (streams).

        A method that is never timed has no ``levers9_grpc_request_seconds`` series at all (not one stuck at 0).
        """
        counter = self._grpc_series.get((method, code))
        if counter is None:
            counter = self._grpc_series[(method, code)] = self.grpc_requests.labels(
                replica=self._replica, method=method, code=code
            )
        counter.inc()
        if seconds is not None:
            timer = self._grpc_timers.get(method)
            if timer is None:
                timer = self._grpc_timers[method] = self.grpc_seconds.labels(replica=self._replica, method=method)
            timer.observe(max(0.0, seconds))

    def http_answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """One HTTP request answered; ``route`` is a template (bounded), never a raw path."""
        series = self._http_series.get((route, method, status))
        if series is None:
            series = self._http_series[(route, method, status)] = (
                self.http_requests.labels(replica=self._replica, route=route, method=method, status=str(status)),
                self.http_seconds.labels(replica=self._replica, route=route),
            )
        series[0].inc()
        series[1].observe(max(0.0, seconds))

    def connection_counter(self, listener: str, known: Iterable[str] = ()) -> Callable[[str], None]:
        """What counts an HTTP listener's events (refusals, evictions, timeouts: levers9.controlplane.listener).

        The ``known`` events (the listener's full list) are exported at 0 from now on.
        """
        children: dict[str, Counter] = {}
        for what in known:
            family = self.connections_closed if what in _CLOSED else self.connections_refused
            children[what] = family.labels(replica=self._replica, listener=listener, reason=what)

        def count(what: str) -> None:
            child = children.get(what)
            if child is None:
                family = self.connections_closed if what in _CLOSED else self.connections_refused
                child = children[what] = family.labels(replica=self._replica, listener=listener, reason=what)
            child.inc()

        return count

    def watch_connections(self, listener: str, read: Callable[[], float]) -> None:
        """``levers9_connections_open`` of ``listener`` is what ``read`` returns at each scrape."""
        self.connections_open.labels(replica=self._replica, listener=listener).set_function(read)

    # ------------------------------------------------------------------ read from shared state

    @property
    def cluster(self) -> ClusterSnapshot | None:
        """What this replica exports of the cluster-wide series; None while it does not hold the lease."""
        return self._cluster.snapshot

    async def refresh(self, services: Services) -> None:
        """Check the planner lease; on its holder, read the cluster-wide series from Redis and SQL.

        A replica that does not hold the lease exports none of them (they are dropped at once, not left
        at their last value). Everything is read before anything changes, and the change is one
        assignment, so a scrape never sees a half-updated set. On an error (Redis or SQL unreachable)
        the cluster-wide series are dropped, the lease gauge reads 0, and the error propagates (the
        caller logs it): a replica that cannot read the state cannot vouch for it.
        """
        held = self.lease_held.labels(replica=self._replica)
        self._lease_current = services.scheduler.lease.current
        try:
            if not await services.scheduler.lease.current():
                held.set(0)
                self._cluster.snapshot = None
                return
            snapshot = await self._read_cluster(services)
        except BaseException:
            held.set(0)
            self._cluster.snapshot = None
            raise
        held.set(1)
        self._cluster.snapshot = snapshot

    async def _check_lease(self) -> None:
        """At a scrape: the lease gauge as Redis says now; the cluster-wide series dropped if it is not held."""
        current = self._lease_current
        held = self.lease_held.labels(replica=self._replica)
        try:
            holds = current is not None and await current()
        except Exception:
            holds = False
        if not holds:
            held.set(0)
            self._cluster.snapshot = None
        else:
            held.set(1)

    async def _read_cluster(self, services: Services) -> ClusterSnapshot:
        scheduler = services.scheduler
        workers = scheduler.workers
        backlog = scheduler.backlog
        depth = await backlog.size()
        counts = {
            (spec.name, _gpu(spec.gpu), status): 0 for spec in services.pools.values() for status in _SEEDED_STATUSES
        }
        for (pool, gpu, status), count in (await workers.census()).items():  # counted in Redis, in one step
            key = (pool, _gpu(gpu or None), status)
            counts[key] = counts.get(key, 0) + count

        pending: dict[str, tuple[int, int]] = dict.fromkeys(services.pools, (0, 0))
        queued = [str(r) for r in await services.redis.zrange(f"{backlog.prefix}backlog", 0, -1)]
        for start in range(0, len(queued), _CHUNK):
            for request in await backlog.get_many(queued[start : start + _CHUNK]):
                if request is None or request.state != "queued" or not request.request.groups:
                    continue
                pools = request.request.groups[0].pools
                if not pools:
                    continue
                count, first_ms = pending.get(pools[0], (0, 0))
                enq = request.request.enqueued_ms
                pending[pools[0]] = (count + 1, enq if not first_ms or 0 < enq < first_ms else first_ms)

        machines = {(name, state): 0 for name in services.pools for state in ("starting", "running")}
        for m in await services.machines.list(states=list(ACTIVE)):
            where = (m.pool, str(getattr(m.state, "value", m.state)))
            machines[where] = machines.get(where, 0) + 1
        return ClusterSnapshot(backlog_depth=depth, workers=counts, pending=pending, machines=machines)

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
                if scope["type"] == "http":
                    await self._check_lease()
                await scrape(scope, receive, send)

        return app
