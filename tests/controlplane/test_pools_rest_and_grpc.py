"""Pools and workers are listed once, in levers9.services: REST and gRPC answer the same for the same token.

The two front ends used to list them each their own way (gRPC refused
operators, counted workers whose keepalive had lapsed and showed workspace
users which machine a worker runs on); now both render the same service call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.http import create_http_app
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.state.redis.workers import WorkerInfo
from tests.controlplane.conftest import bearer


@dataclass
class Both:
    services: Services
    rest: httpx.AsyncClient
    grpc: Any

    async def rest_pools(self, token: str) -> list[dict[str, Any]]:
        response = await self.rest.get("/api/v1/pools", headers=bearer(token))
        assert response.status_code == 200, response.text
        pools: list[dict[str, Any]] = response.json()
        return pools

    async def grpc_pools(self, token: str) -> list[controlplane_pb2.PoolInfo]:
        response = await self.grpc.ListPools(controlplane_pb2.ListPoolsRequest(), metadata=_auth(token))
        return list(response.pools)

    async def rest_workers(self, token: str, pool: str | None = None) -> list[dict[str, Any]]:
        params = {"pool": pool} if pool else {}
        response = await self.rest.get("/api/v1/workers", params=params, headers=bearer(token))
        assert response.status_code == 200, response.text
        workers: list[dict[str, Any]] = response.json()
        return workers

    async def grpc_workers(self, token: str, pool: str | None = None) -> list[controlplane_pb2.WorkerSummary]:
        request = controlplane_pb2.ListWorkersRequest(pool=pool or "")
        response = await self.grpc.ListWorkers(request, metadata=_auth(token))
        return list(response.workers)


def _auth(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def both(services: Services) -> AsyncIterator[Both]:
    dataplane = DataPlane(services, Hub(services.redis, name=services.scheduler.name))
    server = grpc.aio.server()
    add: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
    add(ControlPlaneService(dataplane), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    app = create_http_app(services, dataplane=dataplane)
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://levers9.test") as client,
        ):
            yield Both(services, client, controlplane_pb2_grpc.ControlPlaneStub(channel))  # type: ignore[no-untyped-call]
    finally:
        await server.stop(None)
        await dataplane.close()


async def _worker(services: Services, worker_id: str, pool: str, *, workspace: str | None = None) -> None:
    spec = services.pools[pool]
    await services.machines.create(pool, spec.pool.provider, machine_id=f"m-{worker_id}")
    await services.scheduler.register_worker(
        WorkerInfo(
            id=worker_id,
            pool=pool,
            cpu_millicores=spec.cpu_millicores,
            memory_mib=spec.memory_mib,
            gpu=spec.gpu,
            gpu_count=spec.gpu_count,
            runtime=spec.pool.runtime,
            machine_id=f"m-{worker_id}",
            address="10.0.0.7:7000",
            workspace=workspace,
        )
    )


async def test_rest_and_grpc_list_the_same_pools_and_workers_for_an_operator_and_for_users(both: Both) -> None:
    services = both.services
    a = await services.workspaces.create("team-a")
    b = await services.workspaces.create("team-b")
    _, operator = await services.tokens.issue("user", subject="root")
    _, token_a = await services.tokens.issue("user", workspace_id=a.id, subject="someone@a")
    _, token_b = await services.tokens.issue("user", workspace_id=b.id, subject="someone@b")
    # team-b's attached cluster: a pool only team-b (and operators) may see
    shared = services.pools["cpu"]
    pool = shared.pool.model_copy(update={"name": "b-cluster", "provider": "attached_cluster"})
    services.pools["b-cluster"] = dataclasses.replace(shared, pool=pool, workspace=b.id, configured=False)
    await _worker(services, "w-shared", "cpu")
    await _worker(services, "w-b", "b-cluster", workspace=b.id)
    await _worker(services, "w-silent", "cpu")
    await services.redis.delete("l9:alive:w-silent")  # its keepalive lapsed: about to be reaped, not listed
    await services.scheduler.ctx.unavailable.mark("gpu-l4", "L4", None, "insufficient_capacity: none left", 60)

    expected_pools = {
        operator: {"b-cluster", "cpu", "gpu-l4"},
        token_a: {"cpu", "gpu-l4"},
        token_b: {"b-cluster", "cpu", "gpu-l4"},
    }
    expected_workers = {operator: {"w-b", "w-shared"}, token_a: {"w-shared"}, token_b: {"w-b", "w-shared"}}
    for token in (operator, token_a, token_b):
        rest = {p["name"]: p for p in await both.rest_pools(token)}
        over_grpc = {p.name: p for p in await both.grpc_pools(token)}
        assert set(rest) == set(over_grpc) == expected_pools[token]
        for name, p in over_grpc.items():
            fields = (
                p.provider,
                p.runtime,
                p.gpu or None,
                p.gpu_count,
                p.min_workers,
                p.max_workers,
                p.workers,
                p.unavailable or None,
                p.isolation,
            )
            r = rest[name]
            assert fields == (
                r["provider"],
                r["runtime"],
                r["gpu"],
                r["gpu_count"],
                r["min_workers"],
                r["max_workers"],
                r["workers"],
                r["unavailable"],
                r["isolation"],
            )
        assert rest["cpu"]["workers"] == 1  # w-silent is not counted, on either

        rest_workers = {w["id"]: w for w in await both.rest_workers(token)}
        grpc_workers = {w.id: w for w in await both.grpc_workers(token)}
        assert set(rest_workers) == set(grpc_workers) == expected_workers[token]
        for worker_id, w in grpc_workers.items():
            # which machine a worker runs on is the operators' to see, on both
            assert (w.machine_id or None) == rest_workers[worker_id]["machine_id"]
            assert (w.machine_id == f"m-{worker_id}") is (token == operator)
            assert (w.pool, w.cpu_free, w.running) == tuple(
                rest_workers[worker_id][k] for k in ("pool", "cpu_free", "running")
            )

    own = [w.id for w in await both.grpc_workers(token_b, "b-cluster")]
    assert own == [w["id"] for w in await both.rest_workers(token_b, "b-cluster")] == ["w-b"]
    # another workspace's cluster is answered like a pool that does not exist, on both
    hidden = await both.rest.get("/api/v1/workers", params={"pool": "b-cluster"}, headers=bearer(token_a))
    assert hidden.status_code == 404
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await both.grpc_workers(token_a, "b-cluster")
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    assert raised.value.details() == hidden.json()["error"]["message"] == "pool 'b-cluster' does not exist"
