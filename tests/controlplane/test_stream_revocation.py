"""A stream opened with a token ends when the token is revoked: on its replica, on another, and without a notice.

Each replica here is the real thing in-process: its services on a real database and Redis, its event hub
listening, its data plane, the ControlPlane gRPC service on a port and the REST API over the same data plane.
Streams are opened by a real gRPC client (Watch, WatchMany, SubmitAndWatch, StreamLogs following a task that
never runs: no worker exists), the token is revoked through the REST API (or straight in SQL, as
``levers9 server token revoke`` does without any controlplane), and every stream must end with
UNAUTHENTICATED, "token revoked", before a deadline. Before this, each stayed open until its task finished.
A worker's Session and Tunnel (the Worker service, registered with its machine's join token) end the same
way when its session credential is revoked, or its machine's tokens are (as terminating the machine does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.http import create_http_app
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc, worker_pb2
from levers9.services import workspaces
from levers9.services.auth import Authenticator
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from tests.controlplane.conftest import CONFIG, Cp, bearer
from tests.fixtures.services import opened_services

#: how long a stream may take to end once its token is revoked before the test fails (a hang, not a timing)
DEADLINE_S = 15.0


@dataclass
class Replica:
    services: Services
    dataplane: DataPlane
    grpc: Any
    rest: httpx.AsyncClient

    def metadata(self, token: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {token}"),)

    async def task(self, token: str) -> str:
        """A task of a new stub in the token's workspace, submitted and left pending (no worker exists)."""
        config = controlplane_pb2.StubConfig(name="never-runs")
        request = controlplane_pb2.GetOrCreateStubRequest(config=config, handler=b"not run")
        stub = await self.grpc.GetOrCreateStub(request, metadata=self.metadata(token))
        submit = controlplane_pb2.SubmitRequest(stub_id=stub.stub_id, calls=[controlplane_pb2.Call(args=b"x")])
        submitted = await self.grpc.Submit(submit, metadata=self.metadata(token))
        task_id: str = submitted.task_ids[0]
        return task_id

    async def streams_open(self, count: int) -> None:
        """Wait until ``count`` streams hold their token's guard here."""
        async with asyncio.timeout(DEADLINE_S):
            while len(self.services.auth.streams) != count:
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def replica(services: Services, name: str) -> AsyncIterator[Replica]:
    """``services`` served as one replica: hub (listening), data plane, gRPC service, REST API."""
    hub = Hub(services.redis, name=name)
    await hub.start()
    await asyncio.wait_for(hub._subscribed.wait(), 10)
    dataplane = DataPlane(services, hub)
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
            stub = controlplane_pb2_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
            yield Replica(services, dataplane, stub, client)
    finally:
        await server.stop(None)
        await dataplane.close()
        await hub.close()


async def _user(services: Services, **kw: Any) -> tuple[str, str]:
    """A user token of workspace ``team``: its id and value."""
    workspace = await services.workspaces.get_or_create("team")
    record, token = await services.tokens.issue("user", workspace_id=workspace.id, subject="someone", **kw)
    return record.id, token


async def _drain(call: Any) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while await call.read() is not grpc.aio.EOF:
            pass


async def _ends_revoked(call: Any) -> None:
    """Read ``call`` (a server-streaming call) to its end: it must end UNAUTHENTICATED, "token revoked"."""
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await _drain(call)
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
    assert (ended.value.details() or "").startswith("token revoked"), ended.value.details()


def _open_streams(rep: Replica, token: str, task_id: str) -> dict[str, Any]:
    """Every kind of long-lived stream a user opens, each waiting on ``task_id`` (which never finishes)."""
    metadata = rep.metadata(token)
    watch = controlplane_pb2.WatchRequest(task_ids=[task_id])
    return {
        "Watch": rep.grpc.Watch(watch, metadata=metadata),
        "WatchMany": rep.grpc.WatchMany(watch, metadata=metadata),
        "StreamLogs": rep.grpc.StreamLogs(
            controlplane_pb2.StreamLogsRequest(task_id=task_id, follow=True), metadata=metadata
        ),
    }


async def test_revoking_a_token_ends_every_stream_it_opened_and_no_other(services: Services) -> None:
    async with replica(services, "replica-a") as rep:
        token_id, token = await _user(services)
        _, other = await _user(services)
        _, operator = await services.tokens.issue("user", subject="root")
        task_id = await rep.task(token)
        streams = _open_streams(rep, token, task_id)
        stub = (
            await rep.grpc.GetOrCreateStub(
                controlplane_pb2.GetOrCreateStubRequest(
                    config=controlplane_pb2.StubConfig(name="never-runs"), handler=b"not run"
                ),
                metadata=rep.metadata(token),
            )
        ).stub_id
        submit_and_watch = rep.grpc.SubmitAndWatch(
            controlplane_pb2.SubmitRequest(stub_id=stub, calls=[controlplane_pb2.Call(args=b"y")]),
            metadata=rep.metadata(token),
        )
        pending = await submit_and_watch.read()  # the submitted calls, pending: the stream is open
        assert [e.status for e in pending.events] == ["pending"]
        streams["SubmitAndWatch"] = submit_and_watch
        untouched = rep.grpc.Watch(controlplane_pb2.WatchRequest(task_ids=[task_id]), metadata=rep.metadata(other))
        await rep.streams_open(5)

        revoked = await rep.rest.delete(f"/api/v1/tokens/{token_id}", headers=bearer(operator))
        assert revoked.status_code == 200, revoked.text

        for name, call in streams.items():
            try:
                await _ends_revoked(call)
            except BaseException as exc:
                raise AssertionError(f"{name} did not end with 'token revoked'") from exc
        await rep.streams_open(1)  # the other token's watch is still open
        untouched.cancel()
        await rep.streams_open(0)


async def test_a_token_revoked_without_a_notice_or_expired_ends_its_streams_at_the_recheck(
    services: Services,
) -> None:
    """Revoked straight in SQL (no controlplane told), or expired: the replica's periodic re-check ends them."""
    quick = dataclasses.replace(services, auth=Authenticator(services.tokens, recheck_s=0.2))
    async with replica(quick, "replica-a") as rep:
        token_id, token = await _user(services)
        task_id = await rep.task(token)
        streams = _open_streams(rep, token, task_id)
        await rep.streams_open(3)
        assert await services.tokens.revoke(token_id)  # what `levers9 server token revoke` does
        for call in streams.values():
            await _ends_revoked(call)

        _, short = await _user(services, ttl_s=2.0)
        task_id = await rep.task(short)
        streams = _open_streams(rep, short, task_id)
        await rep.streams_open(3)
        for call in streams.values():  # open when it expires, and ended by the re-check after
            await _ends_revoked(call)
        await rep.streams_open(0)


REDIS_CONFIG = CONFIG.replace("state:\n", "state:\n  redis_url: {redis_url}\n")


@pytest.fixture
async def two_replicas(tmp_path: Path, postgres_url: str, redis_url: str) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two replicas on one PostgreSQL database and one Redis; B's re-check is an hour away, so only A's notice
    can end B's streams within the test's deadline."""
    config = REDIS_CONFIG.replace("{redis_url}", redis_url)
    opened: Callable[[str], Any] = lambda name: opened_services(tmp_path / name, config, postgres_url)  # noqa: E731
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with opened("a") as services_a, opened("b") as services_b:
        slow = dataclasses.replace(services_b, auth=Authenticator(services_b.tokens, recheck_s=3600))
        async with replica(services_a, "replica-a") as a, replica(slow, "replica-b") as b:
            yield a, b


async def test_a_token_revoked_on_one_replica_ends_its_streams_on_another(
    two_replicas: tuple[Replica, Replica],
) -> None:
    a, b = two_replicas
    token_id, token = await _user(a.services)
    _, operator = await a.services.tokens.issue("user", subject="root")
    task_id = await b.task(token)
    streams = _open_streams(b, token, task_id)
    await b.streams_open(3)
    # B has the token in its auth cache now; the notice drops it there too
    await b.grpc.WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=b.metadata(token))

    revoked = await a.rest.delete(f"/api/v1/tokens/{token_id}", headers=bearer(operator))
    assert revoked.status_code == 200, revoked.text

    for call in streams.values():
        await _ends_revoked(call)
    await b.streams_open(0)
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # not served from B's cache for the next 10 s
        await b.grpc.WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=b.metadata(token))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def _idle() -> AsyncIterator[Any]:
    """A worker's side of a stream that sends nothing (until the stream ends)."""
    await asyncio.Event().wait()
    yield worker_pb2.WorkerMessage()


async def _worker_streams(cp: Cp) -> tuple[str, str, dict[str, Any]]:
    """A registered worker's Session and Tunnel, open: its machine id, its session credential's id, the calls."""
    machine_id, join = await cp.machine()
    registered = await cp.register(join, machine_id)
    record = await cp.services.tokens.find(registered.session_token)
    assert record is not None
    metadata = (("authorization", f"Bearer {registered.session_token}"), (WORKER_ID_METADATA, registered.worker_id))
    calls = {
        "Session": cp.stub.Session(_idle(), metadata=metadata),
        "Tunnel": cp.stub.Tunnel(_idle(), metadata=metadata),
    }
    async with asyncio.timeout(DEADLINE_S):
        while len(cp.services.auth.streams) != 2:
            await asyncio.sleep(0.02)
    return machine_id, record.id, calls


async def test_revoking_a_workers_credential_ends_its_session_and_tunnel(cp: Cp) -> None:
    _, token_id, calls = await _worker_streams(cp)
    _, operator = await cp.services.tokens.issue("user", subject="root")
    principal = await cp.services.auth.verify(operator)
    await workspaces.revoke_token(cp.services, principal, token_id)  # what DELETE /api/v1/tokens/ID does
    for call in calls.values():
        await _ends_revoked(call)
    assert len(cp.services.auth.streams) == 0


async def test_a_terminated_machines_worker_is_cut_off_at_the_recheck(cp: Cp) -> None:
    """Terminating a machine revokes its tokens in SQL and tells no replica: the re-check ends its streams."""
    cp.services.auth.streams.recheck_s = 0.2
    machine_id, _, calls = await _worker_streams(cp)
    assert await cp.services.tokens.revoke_subject(machine_id) >= 1  # what terminating the machine does
    for call in calls.values():
        await _ends_revoked(call)
