"""Every REST route and gRPC method checks the caller's role, tried with each role.

The tables below are the contract, written out by hand rather than read from the code: viewers read, members run
and deploy, owners manage members, secrets, tokens and environments. A route or method missing from its table fails
the test that lists them all, so a new one cannot ship without saying which role it needs. Each is then called with
a viewer's, a member's and an owner's token (each a person, a member of the workspace with that role): a role below
the one needed is refused 403 / PERMISSION_DENIED saying which role it needs, before anything else is looked at;
a role at or above it is never refused for its role (it may still be 404, 422, ...: the probes name nothing).
Also here: a token's own role caps its person's, and a person removed from the workspace loses every token at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import message_factory

from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.grpc_volumes import VolumesService
from levers9.controlplane.http import create_http_app
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc, volume_pb2, volume_pb2_grpc
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.state.sql.records import Role
from tests.controlplane.conftest import bearer
from tests.controlplane.test_rest_schema import FILL

V, M, OWN = Role.VIEWER, Role.MEMBER, Role.OWNER
#: the routes that take no token at all
OPEN = {("GET", "/api/v1/health"), ("GET", "/api/v1/wheels"), ("GET", "/api/v1/wheels/{name}")}
#: the role each REST route needs
REST: dict[tuple[str, str], Role] = {
    ("GET", "/api/v1/workspaces"): V,
    ("POST", "/api/v1/workspaces"): OWN,
    ("GET", "/api/v1/tokens"): OWN,
    ("POST", "/api/v1/tokens"): OWN,
    ("DELETE", "/api/v1/tokens/{token_id}"): OWN,
    ("GET", "/api/v1/pools"): V,
    ("GET", "/api/v1/workers"): V,
    ("GET", "/api/v1/machines"): V,
    ("GET", "/api/v1/tasks"): V,
    ("GET", "/api/v1/tasks/{task_id}"): V,
    ("GET", "/api/v1/tasks/{task_id}/history"): V,
    ("POST", "/api/v1/tasks/{task_id}/cancel"): M,
    ("GET", "/api/v1/secrets"): V,
    ("POST", "/api/v1/secrets"): OWN,
    ("DELETE", "/api/v1/secrets/{name}"): OWN,
    ("GET", "/api/v1/clusters"): V,
    ("POST", "/api/v1/clusters"): OWN,
    ("DELETE", "/api/v1/clusters/{name}"): OWN,
    ("GET", "/api/v1/joined-machines"): V,
    ("POST", "/api/v1/joined-machines"): OWN,
    ("DELETE", "/api/v1/joined-machines/{name}"): OWN,
    ("GET", "/api/v1/deployments"): V,
    ("POST", "/api/v1/deployments/{name}/versions/{version}/stop"): M,
    ("GET", "/api/v1/me"): V,
    ("GET", "/api/v1/members"): V,
    ("PUT", "/api/v1/members/{email}"): OWN,
    ("DELETE", "/api/v1/members/{email}"): OWN,
    ("PUT", "/api/v1/workspace/join"): OWN,
    ("GET", "/api/v1/environments"): V,
    ("POST", "/api/v1/environments"): OWN,
    ("DELETE", "/api/v1/environments/{name}"): OWN,
    ("GET", "/api/v1/usage"): V,
    ("POST", "/api/v1/auth/links"): V,
    # sandboxes: reading is a viewer's, everything that starts, changes or stops something a member's
    ("POST", "/api/v1/sandboxes"): M,
    ("GET", "/api/v1/sandboxes"): V,
    ("GET", "/api/v1/sandboxes/{sandbox_id}"): V,
    ("DELETE", "/api/v1/sandboxes/{sandbox_id}"): M,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/ttl"): M,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/processes"): M,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/processes"): V,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/processes/{process}"): V,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/processes/{process}/kill"): M,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/processes/{process}/output"): V,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/ports/{port}"): M,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/image"): M,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/snapshots"): M,
    ("GET", "/api/v1/sandbox-snapshots"): V,
    ("DELETE", "/api/v1/sandbox-snapshots/{snapshot_id}"): M,
    ("PUT", "/api/v1/sandboxes/{sandbox_id}/files"): M,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/files"): V,
    ("DELETE", "/api/v1/sandboxes/{sandbox_id}/files"): M,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/files/stat"): V,
    ("GET", "/api/v1/sandboxes/{sandbox_id}/files/list"): V,
    ("POST", "/api/v1/sandboxes/{sandbox_id}/files/mkdir"): M,
}
#: the role each gRPC method needs, by service
GRPC: dict[str, dict[str, Role]] = {
    "ControlPlane": {
        "WhoAmI": V,
        "BuildImage": M,
        "ListImages": V,
        "GetOrCreateStub": M,
        "Deploy": M,
        "ListDeployments": V,
        "StopDeployment": M,
        "Invoke": M,
        "Submit": M,
        "SubmitAndWatch": M,
        "Watch": V,
        "WatchMany": V,
        "ListTasks": V,
        "GetTask": V,
        "CancelTask": M,
        "PutSecret": OWN,
        "ListSecrets": V,
        "DeleteSecret": OWN,
        "CreateJoinedMachine": OWN,
        "ListJoinedMachines": V,
        "RemoveJoinedMachine": OWN,
        "JoinCluster": OWN,
        "ListClusters": V,
        "RemoveCluster": OWN,
        "PutBlob": M,
        "GetBlob": V,
        "StreamLogs": V,
        "ListPools": V,
        "ListWorkers": V,
        "ListMachines": V,
    },
    "Volumes": {
        "GetOrCreateVolume": M,
        "ListVolumes": V,
        "DeleteVolume": M,
        "ListPath": V,
        "RemovePath": M,
        "ReadFile": V,
        "WriteFile": M,
    },
}


@dataclass
class Team:
    """A workspace with one person of each role, each holding a token."""

    services: Services
    client: httpx.AsyncClient
    channel: grpc.aio.Channel
    tokens: dict[Role, str]


@contextlib.asynccontextmanager
async def _grpc(dataplane: DataPlane) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    add: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
    add(ControlPlaneService(dataplane), server)
    add = volume_pb2_grpc.add_VolumesServicer_to_server
    add(VolumesService(dataplane.services), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


async def _person(
    services: Services, workspace_id: str, email: str, role: Role, *, token_role: Role | None = None
) -> str:
    user = await services.users.get_or_create(email)
    await services.members.put(workspace_id, user.id, role)
    _, token = await services.tokens.issue("user", workspace_id=workspace_id, user_id=user.id, role=token_role)
    return token


@pytest.fixture
async def team(services: Services) -> AsyncIterator[Team]:
    workspace = await services.workspaces.create("team")
    tokens = {role: await _person(services, workspace.id, f"{role.value}@team.example", role) for role in Role}
    dataplane = DataPlane(services, Hub(services.redis, name=services.scheduler.name))
    app = create_http_app(services, dataplane=dataplane)
    try:
        async with (
            _grpc(dataplane) as channel,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://levers9.test") as client,
        ):
            yield Team(services, client, channel, tokens)
    finally:
        await dataplane.close()


def _refused_for_role(status: int, body: dict[str, Any]) -> bool:
    return status == 403 and "role" in body.get("error", {}).get("message", "")


async def test_the_table_names_every_rest_route(team: Team) -> None:
    schema = (await team.client.get("/api/v1/openapi.json")).json()
    routes = {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}
    assert routes - OPEN == set(REST), "a route without a role in REST, or a role for a route that is gone"


async def test_each_rest_route_refuses_a_role_below_the_one_it_needs(team: Team) -> None:
    refusals = 0
    for (method, path), needed in REST.items():
        url = path.format(**FILL)
        for role, token in team.tokens.items():
            response = await team.client.request(
                method, url, headers={**bearer(token), "content-type": "application/json"}, content=b"{}"
            )
            body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
            refused = _refused_for_role(response.status_code, body)
            assert refused == (not role.allows(needed)), (method, path, role.value, response.status_code, body)
            if refused:
                refusals += 1
                assert f"needs the {needed.value} role" in body["error"]["message"]
    assert refusals > 40  # the matrix is not empty: viewers and members are refused somewhere


def _empty(method: Any) -> Any:
    """An empty request of the method's input type."""
    return message_factory.GetMessageClass(method.input_type)()


async def _call_grpc(team: Team, service: str, name: str, token: str) -> grpc.StatusCode:
    descriptor = {
        "ControlPlane": controlplane_pb2.DESCRIPTOR.services_by_name["ControlPlane"],
        "Volumes": volume_pb2.DESCRIPTOR.services_by_name["Volumes"],
    }[service]
    method = descriptor.methods_by_name[name]
    full = f"/{descriptor.full_name}/{name}"
    request = _empty(method)
    serialize = type(request).SerializeToString
    deserialize = message_factory.GetMessageClass(method.output_type).FromString
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        if method.client_streaming and method.server_streaming:
            stream_stream = team.channel.stream_stream(full, serialize, deserialize)
            call = stream_stream(iter([request]), metadata=metadata, timeout=10)
            async for _ in call:
                break
        elif method.client_streaming:
            stream_unary = team.channel.stream_unary(full, serialize, deserialize)
            await stream_unary(iter([request]), metadata=metadata, timeout=10)
        elif method.server_streaming:
            unary_stream = team.channel.unary_stream(full, serialize, deserialize)
            async for _ in unary_stream(request, metadata=metadata, timeout=10):
                break
        else:
            unary_unary = team.channel.unary_unary(full, serialize, deserialize)
            await unary_unary(request, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.PERMISSION_DENIED and "role" in (exc.details() or ""):
            return exc.code()
        return grpc.StatusCode.UNKNOWN if exc.code() is grpc.StatusCode.PERMISSION_DENIED else exc.code()
    return grpc.StatusCode.OK


def test_the_table_names_every_grpc_method() -> None:
    for service, module in (("ControlPlane", controlplane_pb2), ("Volumes", volume_pb2)):
        names = set(module.DESCRIPTOR.services_by_name[service].methods_by_name)
        assert names == set(GRPC[service]), service


async def test_each_grpc_method_refuses_a_role_below_the_one_it_needs(team: Team) -> None:
    for service, methods in GRPC.items():
        for name, needed in methods.items():
            for role, token in team.tokens.items():
                code = await _call_grpc(team, service, name, token)
                refused = code is grpc.StatusCode.PERMISSION_DENIED
                assert refused == (not role.allows(needed)), (service, name, role.value, code)


async def test_a_tokens_role_caps_its_persons_and_a_removed_person_loses_every_token(team: Team) -> None:
    services = team.services
    workspace = await services.workspaces.by_name("team")
    assert workspace is not None
    # an owner's token issued as a viewer's reads, and is refused the rest
    capped = await _person(services, workspace.id, "careful@team.example", Role.OWNER, token_role=Role.VIEWER)
    assert (await team.client.get("/api/v1/members", headers=bearer(capped))).status_code == 200
    response = await team.client.post("/api/v1/environments", headers=bearer(capped), json={"name": "staging"})
    assert response.status_code == 403
    assert "needs the owner role" in response.json()["error"]["message"]
    # a member cannot issue a token that does more than they may
    response = await team.client.post("/api/v1/tokens", headers=bearer(team.tokens[M]), json={"role": "owner"})
    assert response.status_code == 403
    # the owner demotes the member to viewer: the member's token reads, and runs nothing, at once
    response = await team.client.put(
        "/api/v1/members/member@team.example", headers=bearer(team.tokens[OWN]), json={"role": "viewer"}
    )
    assert response.status_code == 200
    assert response.json()["role"] == "viewer"
    response = await team.client.post("/api/v1/tasks/task_nope/cancel", headers=bearer(team.tokens[M]))
    assert response.status_code == 403
    assert "acts as a viewer" in response.json()["error"]["message"]
    # removed: every token the person held is revoked (and so refused at once on this replica)
    response = await team.client.delete("/api/v1/members/member@team.example", headers=bearer(team.tokens[OWN]))
    assert response.status_code == 204
    assert (await team.client.get("/api/v1/me", headers=bearer(team.tokens[M]))).status_code == 401
    # the last owner can neither leave nor be demoted
    response = await team.client.delete("/api/v1/members/careful@team.example", headers=bearer(team.tokens[OWN]))
    assert response.status_code == 204
    response = await team.client.delete("/api/v1/members/owner@team.example", headers=bearer(team.tokens[OWN]))
    assert response.status_code == 409
    assert "only owner" in response.json()["error"]["message"]
    response = await team.client.put(
        "/api/v1/members/owner@team.example", headers=bearer(team.tokens[OWN]), json={"role": "member"}
    )
    assert response.status_code == 409
    members = (await team.client.get("/api/v1/members", headers=bearer(team.tokens[V]))).json()
    assert [(m["email"], m["role"]) for m in members] == [
        ("owner@team.example", "owner"),
        ("viewer@team.example", "viewer"),
    ]
