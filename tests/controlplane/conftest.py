"""Real controlplane Services (SQLite and PostgreSQL, embedded Redis) from a config file, and an API client on them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx
import pytest

from levers9.__about__ import __version__
from levers9.controlplane.grpc_worker import WorkerService
from levers9.controlplane.http import create_http_app
from levers9.gpu.preference import parse_gpu
from levers9.proto.v1 import worker_pb2, worker_pb2_grpc
from levers9.scheduler.request import PlacementRequest
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.metrics import Metrics
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.records import WorkspaceRecord
from tests.fixtures.services import opened_services

CONFIG = """\
version: 1
data_dir: {data_dir}
state:
  database_url: {database_url}
pools:
  cpu:
    provider: local
    runtime: runc  # workers here are registered by the tests; they never run a container
    cpu: 2
    memory: 4GiB
    min_workers: 0
    max_workers: 3
  gpu-l4:
    provider: local
    runtime: runc  # workers here are registered by the tests; they never run a container
    gpu: L4
    cpu: 8
    memory: 32GiB
    max_workers: 2
    priority: 5
"""


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, CONFIG, database_url) as opened:
        yield opened


@dataclass
class Api:
    services: Services
    metrics: Metrics
    client: httpx.AsyncClient
    #: a user token bound to no workspace
    operator: str

    async def user(self, name: str) -> tuple[WorkspaceRecord, str]:
        """A workspace (made if missing) and a new user token in it."""
        workspace = await self.services.workspaces.get_or_create(name)
        _, token = await self.services.tokens.issue("user", workspace_id=workspace.id, subject=f"someone@{name}")
        return workspace, token

    async def submit(self, workspace: WorkspaceRecord, task_id: str, *, gpu: str | None = None, **kw: int) -> None:
        """A task through the scheduler, as the SDK's submit would make it."""
        request = PlacementRequest(
            id=task_id,
            workspace=workspace.id,
            gpu=parse_gpu(gpu),
            submitted_ms=int(time.time() * 1000),
            **kw,
        )
        await self.services.scheduler.submit(request)

    async def worker(self, worker_id: str, pool: str, *, workspace: str | None = None) -> WorkerInfo:
        """A worker of ``pool`` registered as its process would, sized like the pool."""
        spec = self.services.pools[pool]
        info = WorkerInfo(
            id=worker_id,
            pool=pool,
            cpu_millicores=spec.cpu_millicores,
            memory_mib=spec.memory_mib,
            gpu=spec.gpu,
            gpu_count=spec.gpu_count,
            runtime=spec.pool.runtime,
            address="10.0.0.7:7000",
            workspace=workspace,
        )
        await self.services.scheduler.register_worker(info)
        return info


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(services: Services) -> AsyncIterator[Api]:
    metrics = Metrics()
    app = create_http_app(services, metrics=metrics)
    _, operator = await services.tokens.issue("user", subject="root")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://levers9.test") as client:
        yield Api(services, metrics, client, operator)


@dataclass
class Cp:
    """The real Worker gRPC service on :func:`services`, as a booted machine's worker calls it."""

    services: Services
    stub: worker_pb2_grpc.WorkerStub
    port: int
    #: the data plane behind the service (its metrics are :attr:`metrics`)
    dataplane: DataPlane
    metrics: Metrics

    async def machine(self, pool: str = "cpu", *, register_in_s: float = 600.0) -> tuple[str, str]:
        """A machine record and its join token, as the provisioner makes them before calling the provider."""
        machines, tokens = self.services.machines, self.services.tokens
        record = await machines.create(pool, "local", register_by=datetime.now(UTC) + timedelta(seconds=register_in_s))
        token_record, token = await tokens.issue("machine", subject=record.id)
        await machines.set_token(record.id, token_record.id)
        return record.id, token

    async def register(
        self, token: str, machine_id: str, worker_id: str = "", *, version: str = __version__
    ) -> worker_pb2.RegisterResponse:
        request = worker_pb2.RegisterRequest(
            pool="cpu", machine_id=machine_id, hostname="box", version=version, worker_id=worker_id
        )
        response: worker_pb2.RegisterResponse = await self.stub.Register(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=30
        )
        return response


@contextlib.asynccontextmanager
async def worker_service(
    services: Services, name: str, dataplane: DataPlane | None = None
) -> AsyncIterator[tuple[worker_pb2_grpc.WorkerStub, int]]:
    """The real Worker gRPC service on ``services`` (and ``dataplane``, else its own), on a free port, and a stub
    dialling it; stopped on exit."""
    dataplane = dataplane or DataPlane(services, Hub(services.redis, name=name))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerService(dataplane), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            factory = worker_pb2_grpc.WorkerStub  # generated, unannotated
            yield factory(channel), port  # type: ignore[no-untyped-call]
    finally:
        await server.stop(None)
        await dataplane.close()


@pytest.fixture
async def cp(services: Services) -> AsyncIterator[Cp]:
    metrics = Metrics()
    dataplane = DataPlane(services, Hub(services.redis, name="worker-service-test"), metrics)
    async with worker_service(services, "worker-service-test", dataplane) as (stub, port):
        yield Cp(services, stub, port, dataplane, metrics)
