"""Cluster-wide series come from the planner lease's holder only; every replica says whether it holds it."""

from __future__ import annotations

import dataclasses
import time

from levers9.gpu.preference import parse_gpu
from levers9.scheduler.lease import Lease
from levers9.scheduler.request import PlacementRequest
from levers9.scheduler.service import Scheduler
from levers9.services.metrics import Metrics
from tests.controlplane.conftest import Api
from tests.controlplane.test_metrics import scrape, value

CLUSTER = (
    "levers9_backlog_depth",
    "levers9_workers",
    "levers9_pending_tasks",
    "levers9_oldest_pending_seconds",
    "levers9_machines",
)


def _request(workspace: str, task_id: str, submitted_ms: int) -> PlacementRequest:
    return PlacementRequest(id=task_id, workspace=workspace, gpu=parse_gpu(None), submitted_ms=submitted_ms)


def _names(metrics: Metrics) -> set[str]:
    return {s.name for family in metrics.registry.collect() for s in family.samples}


async def test_only_the_lease_holder_exports_cluster_wide_series_and_the_old_holder_drops_them(api: Api) -> None:
    services = api.services
    # a second replica: its own scheduler (own name, own lease handle) on the same SQL and Redis
    other = Scheduler(
        db=services.db, redis=services.redis, hooks=services.loaded.hooks, pools=services.pools, name="replica-b"
    )
    replica_b = dataclasses.replace(services, scheduler=other)
    a, b = Metrics(replica=services.scheduler.name), Metrics(replica="replica-b")
    ws, _ = await api.user("team-a")
    await api.worker("w-1", "gpu-l4")  # a GPU worker: the CPU task below waits
    now_ms = int(time.time() * 1000)
    await services.scheduler.submit(_request(ws.id, "old", now_ms - 1_200_000))
    await services.scheduler.submit(_request(ws.id, "new", now_ms))

    assert await services.scheduler.lease.acquire()
    await a.refresh(services)
    await b.refresh(replica_b)
    sample_a, sample_b = a.registry.get_sample_value, b.registry.get_sample_value
    assert sample_a("levers9_planner_lease_held", {"replica": services.scheduler.name}) == 1
    assert sample_b("levers9_planner_lease_held", {"replica": "replica-b"}) == 0
    assert set(CLUSTER) <= _names(a)
    assert not set(CLUSTER) & _names(b)
    assert sample_a("levers9_backlog_depth", {}) == 2
    assert sample_a("levers9_pending_tasks", {"pool": "cpu"}) == 2
    assert sample_a("levers9_pending_tasks", {"pool": "gpu-l4"}) == 0
    oldest = sample_a("levers9_oldest_pending_seconds", {"pool": "cpu"})
    assert oldest is not None
    assert oldest >= 1200  # the old task was submitted 20 minutes ago
    assert sample_a("levers9_oldest_pending_seconds", {"pool": "gpu-l4"}) == 0
    assert sample_a("levers9_workers", {"pool": "gpu-l4", "gpu": "L4", "status": "running"}) == 1

    # the lease moves to replica b: a drops every cluster-wide series at its next refresh, b exports them
    await services.scheduler.lease.release()
    assert await other.lease.acquire()
    await a.refresh(services)
    await b.refresh(replica_b)
    assert sample_a("levers9_planner_lease_held", {"replica": services.scheduler.name}) == 0
    assert sample_b("levers9_planner_lease_held", {"replica": "replica-b"}) == 1
    assert not set(CLUSTER) & _names(a)
    assert set(CLUSTER) <= _names(b)
    assert sample_b("levers9_pending_tasks", {"pool": "cpu"}) == 2
    await other.lease.release()


async def test_a_holder_that_lost_the_lease_while_frozen_reads_0_at_its_next_scrape(api: Api) -> None:
    """A replica frozen (SIGSTOP) while it held the lease resumes with its gauge at 1 and its last snapshot in
    memory; another replica took the lease meanwhile. Its first scrape reads 0 and exports no cluster-wide
    series, so two replicas never both read 1."""
    services = api.services
    lease = services.scheduler.lease
    metrics = Metrics(lease.holder)
    assert await lease.acquire()
    await metrics.refresh(services)
    samples = await scrape(metrics)
    assert value(samples, "levers9_planner_lease_held", replica=lease.holder) == 1
    assert value(samples, "levers9_backlog_depth") == 0

    # frozen past the TTL: the key expires and another replica takes the lease (a new fencing token)
    await services.redis.delete(lease.key)
    other = Lease(services.redis, lease.key, "the-other-replica", ttl_s=15)
    assert await other.acquire()

    samples = await scrape(metrics)  # no refresh in between: what it believed before the freeze is not trusted
    assert value(samples, "levers9_planner_lease_held", replica=lease.holder) == 0
    assert not {name for name, _ in samples} & set(CLUSTER)

    # its own name in the lease under another acquisition's token (a restarted replica of a stable name): not it
    await services.redis.delete(lease.key)
    again = Lease(services.redis, lease.key, lease.holder, ttl_s=15)
    assert await again.acquire()
    samples = await scrape(metrics)
    assert value(samples, "levers9_planner_lease_held", replica=lease.holder) == 0
