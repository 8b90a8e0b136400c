"""Prometheus metrics: the series a scrape of the metrics app shows, and where their values come from."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, cast

import httpx
from prometheus_client.parser import text_string_to_metric_families

from levers9.config.model import SchedulerConfig
from levers9.hooks.errors import (
    AuthenticationFailed,
    BillingRefused,
    InsufficientCapacity,
    PluginTimeout,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.facade import Hooks
from levers9.hooks.types import Machine, ProvisionRequest
from levers9.scheduler import events
from levers9.scheduler.service import Scheduler
from levers9.services.core import Services
from levers9.services.metrics import Metrics
from levers9.state.redis.workers import WorkerInfo
from tests.controlplane.conftest import Api

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(metrics: Metrics) -> Samples:
    """Every sample the metrics app serves, by name and labels, as Prometheus would read it."""
    transport = httpx.ASGITransport(app=metrics.asgi_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics.test") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def test_counters_and_histograms_show_with_their_labels() -> None:
    metrics = Metrics()
    metrics.placed("cpu", None, 3)
    metrics.placed("gpu-l4", "L4")
    metrics.placed("gpu-l4", "L4", n=2)
    metrics.provisioned("local", 1.5, "ok")
    metrics.provisioned("ec2", 30.0, "capacity")
    metrics.provisioned("ec2", 40.0, "capacity")
    metrics.task_finished("complete", 2.0)
    metrics.task_finished("error", 700.0)

    samples = await scrape(metrics)
    assert value(samples, "levers9_placements_total", replica="local", pool="cpu", gpu="cpu") == 3
    assert value(samples, "levers9_placements_total", replica="local", pool="gpu-l4", gpu="L4") == 3

    assert value(samples, "levers9_provisioning_seconds_count", replica="local", provider="local", outcome="ok") == 1
    assert value(samples, "levers9_provisioning_seconds_sum", replica="local", provider="local", outcome="ok") == 1.5
    assert (
        value(samples, "levers9_provisioning_seconds_bucket", replica="local", provider="local", outcome="ok", le="1.0")
        == 0
    )
    assert (
        value(samples, "levers9_provisioning_seconds_bucket", replica="local", provider="local", outcome="ok", le="2.5")
        == 1
    )
    assert (
        value(samples, "levers9_provisioning_seconds_count", replica="local", provider="ec2", outcome="capacity") == 2
    )
    assert value(samples, "levers9_provisioning_seconds_sum", replica="local", provider="ec2", outcome="capacity") == 70
    assert value(samples, "levers9_provisioning_seconds_count", replica="local", provider="ec2", outcome="ok") is None

    assert value(samples, "levers9_tasks_finished_total", replica="local", status="complete") == 1
    assert value(samples, "levers9_tasks_finished_total", replica="local", status="error") == 1
    assert value(samples, "levers9_task_duration_seconds_count", replica="local", status="error") == 1
    assert value(samples, "levers9_task_duration_seconds_sum", replica="local", status="error") == 700
    assert value(samples, "levers9_task_duration_seconds_bucket", replica="local", status="error", le="300.0") == 0
    assert value(samples, "levers9_task_duration_seconds_bucket", replica="local", status="error", le="900.0") == 1
    assert value(samples, "levers9_task_duration_seconds_bucket", replica="local", status="complete", le="+Inf") == 1


async def test_counters_with_known_labels_are_exported_at_0_from_the_start(services: Services) -> None:
    """Issue 36: a counter born at its first increment makes increase() miss the first burst after a start."""
    metrics = Metrics()
    metrics.replica = "r1"
    metrics.seed(services.pools.values())
    metrics.connection_counter("http", ("per_client", "evicted"))
    samples = await scrape(metrics)
    for reason in (
        "worker_lost",
        "machine_vanished",
        "preempted",
        "machine_failed",
        "attempt_failed",
        "restart",
        "never_delivered",
    ):
        assert value(samples, "levers9_requeues_total", replica="r1", reason=reason) == 0, reason
    for pool, gpu in (("cpu", "cpu"), ("gpu-l4", "L4")):
        for reason in ("keepalive_lapsed", "removed", "machine_vanished", "preempted", "machine_failed"):
            assert value(samples, "levers9_workers_lost_total", replica="r1", pool=pool, reason=reason) == 0
        for reason in ("never_registered", "worker_gone", "idle", "orphan", "vanished", "preempted", "failed"):
            assert value(samples, "levers9_machines_terminated_total", replica="r1", pool=pool, reason=reason) == 0
        assert value(samples, "levers9_placements_total", replica="r1", pool=pool, gpu=gpu) == 0
        assert value(samples, "levers9_placements_queued_total", replica="r1", pool=pool) == 0
        for hook in ("provision", "terminate", "list_machines"):
            assert value(samples, "levers9_provider_calls_total", replica="r1", provider="local", hook=hook) == 0
    for status in ("complete", "error", "cancelled", "timeout"):
        assert value(samples, "levers9_tasks_finished_total", replica="r1", status=status) == 0
    assert value(samples, "levers9_embedded_redis_restarts_total", replica="r1") == 0
    assert value(samples, "levers9_connections_refused_total", replica="r1", listener="http", reason="per_client") == 0
    assert value(samples, "levers9_connections_closed_total", replica="r1", listener="http", reason="evicted") == 0
    # nothing under the name the replica had before it was known
    assert not [k for k in samples if ("replica", "local") in k[1]]
    # and the seeded series count on from 0
    metrics.scheduler_event(events.Requeued(events.REQUEUE_WORKER_LOST, 92))
    metrics.scheduler_event(events.WorkerLost("cpu", events.LOST_KEEPALIVE))
    samples = await scrape(metrics)
    assert value(samples, "levers9_requeues_total", replica="r1", reason="worker_lost") == 92
    assert value(samples, "levers9_workers_lost_total", replica="r1", pool="cpu", reason="keepalive_lapsed") == 1


async def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.placed("cpu", None)
    assert (
        first.registry.get_sample_value("levers9_placements_total", {"replica": "local", "pool": "cpu", "gpu": "cpu"})
        == 1
    )
    assert (
        second.registry.get_sample_value("levers9_placements_total", {"replica": "local", "pool": "cpu", "gpu": "cpu"})
        is None
    )


async def test_refresh_reads_the_backlog_and_the_workers_from_redis(api: Api) -> None:
    services = api.services
    scheduler = services.scheduler
    a, _ = await api.user("team-a")
    metrics = Metrics()
    assert await scheduler.lease.acquire()  # only the lease holder exports the cluster-wide series

    await metrics.refresh(services)
    samples = await scrape(metrics)
    assert value(samples, "levers9_backlog_depth") == 0
    # Configured pools show as 0 rather than missing.
    assert value(samples, "levers9_workers", pool="cpu", gpu="cpu", status="running") == 0
    assert value(samples, "levers9_workers", pool="gpu-l4", gpu="L4", status="draining") == 0

    await api.worker("w-1", "cpu")
    await api.worker("w-2", "cpu")
    await api.worker("w-3", "gpu-l4")
    # A worker of a pool since removed from the config (it still counts until it goes).
    await scheduler.register_worker(WorkerInfo(id="w-old", pool="retired", cpu_millicores=1000, memory_mib=1024))
    assert await scheduler.workers.drain_if_idle("w-2", now_ms=scheduler.ctx.now_ms() + 1, idle_ms=0)
    await services.redis.delete("l9:alive:w-3")  # keepalive lapsed, not reaped yet
    await api.submit(a, "task-1", cpu_millicores=1000, memory_mib=1024)
    await api.submit(a, "task-2", gpu="L4")
    await api.submit(a, "task-3", gpu="L4")

    await metrics.refresh(services)
    samples = await scrape(metrics)
    assert value(samples, "levers9_backlog_depth") == 3
    assert value(samples, "levers9_workers", pool="cpu", gpu="cpu", status="running") == 1
    assert value(samples, "levers9_workers", pool="cpu", gpu="cpu", status="draining") == 1
    assert value(samples, "levers9_workers", pool="gpu-l4", gpu="L4", status="silent") == 1
    assert value(samples, "levers9_workers", pool="gpu-l4", gpu="L4", status="running") == 0
    assert value(samples, "levers9_workers", pool="retired", gpu="cpu", status="running") == 1

    await scheduler.place_once()  # task-1 goes to w-1; the GPU tasks wait for w-3's pool
    await scheduler.cancel("task-2")
    for worker in ("w-old", "w-3"):
        await scheduler.workers.remove(worker, now_ms=scheduler.ctx.now_ms(), force=True)

    await metrics.refresh(services)
    samples = await scrape(metrics)
    assert value(samples, "levers9_backlog_depth") == 1
    assert value(samples, "levers9_workers", pool="gpu-l4", gpu="L4", status="silent") is None
    assert value(samples, "levers9_workers", pool="retired", gpu="cpu", status="running") is None
    assert value(samples, "levers9_workers", pool="cpu", gpu="cpu", status="running") == 1


def _retryable(message: str) -> ProviderError:
    """A provider error that is neither capacity nor throttling, but that the provider says may pass."""
    error = ProviderError(message)
    error.retryable = True
    return error


class FakeProvider:
    """Stands in for the hooks facade: each provision answers with the next outcome (None: a machine)."""

    def __init__(self, outcomes: list[BaseException | None]) -> None:
        self.outcomes = outcomes
        self.hang = asyncio.Event()

    async def provision(self, request: ProvisionRequest, *, timeout: float | None = None) -> Machine:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, asyncio.CancelledError):
            await self.hang.wait()
        if outcome is None:
            return Machine(provider_id=f"p-{request.machine_id}", machine_id=request.machine_id, pool=request.pool.name)
        raise outcome


async def test_provider_calls_are_timed_by_outcome(services: Services) -> None:
    provider = FakeProvider(
        [
            None,
            InsufficientCapacity("none left"),
            QuotaExceeded("limit reached"),
            BillingRefused("insufficient balance"),
            Throttled("slow down", retry_after=1),
            _retryable("try later"),
            AuthenticationFailed("bad key"),
            PluginTimeout("local", "levers9_provision", 1),
            RuntimeError("plugin bug"),
            asyncio.CancelledError(),
        ]
    )
    scheduler = Scheduler(
        db=services.db,
        redis=services.redis,
        hooks=cast(Hooks, provider),
        pools=services.pools,
        settings=SchedulerConfig(retry_initial_s=0.01, retry_max_s=0.05),
    )
    metrics = Metrics()
    scheduler.ctx.on_provisioned = metrics.provisioned
    spec = services.pools["gpu-l4"]
    started = []
    try:
        for _ in range(9):
            started.append(await scheduler.provisioner.start(spec, "test"))
            await asyncio.gather(*scheduler.provisioner._tasks.values())
        started.append(await scheduler.provisioner.start(spec, "test"))
        while provider.outcomes:  # until the last provider call is waiting
            await asyncio.sleep(0.01)
    finally:
        await scheduler.stop()  # cancels the call in flight

    samples = await scrape(metrics)
    counts = {
        outcome: value(
            samples, "levers9_provisioning_seconds_count", replica="local", provider="local", outcome=outcome
        )
        for outcome in ("ok", "capacity", "quota", "billing", "throttled", "timeout", "error", "cancelled")
    }
    assert counts == {
        "ok": 1,
        "capacity": 1,
        "quota": 1,
        "billing": 1,
        "throttled": 2,
        "timeout": 1,
        "error": 2,
        "cancelled": 1,
    }
    # What the scheduler does with each answer is unchanged by the observer.
    machines = [await services.machines.get(machine_id) for machine_id in started]
    assert [m.state.value if m else None for m in machines] == ["starting"] + ["failed"] * 9


async def test_a_failing_observer_does_not_fail_the_machine(services: Services) -> None:
    scheduler = Scheduler(
        db=services.db, redis=services.redis, hooks=cast(Hooks, FakeProvider([None])), pools=services.pools
    )

    def broken(provider: str, seconds: float, outcome: str) -> None:
        raise RuntimeError("metrics are down")

    scheduler.ctx.on_provisioned = broken
    try:
        machine_id = await scheduler.provisioner.start(services.pools["cpu"], "test")
        await asyncio.gather(*scheduler.provisioner._tasks.values())
    finally:
        await scheduler.stop()
    machine = await services.machines.get(machine_id)
    assert machine is not None
    assert (machine.state.value, machine.provider_id) == ("starting", f"p-{machine_id}")


async def test_the_metrics_app_answers_lifespan_events() -> None:
    app = Metrics().asgi_app()
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
