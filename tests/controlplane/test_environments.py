"""Environments keep their apps, tasks, secrets and tokens apart, as workspaces do, over REST and gRPC.

An environment is a workspace row of its own, so these tests check the parts that are new: which environment a
request acts in (the X-Levers9-Environment header, gRPC's x-levers9-environment metadata, or the token's own), that
a token issued in one environment stays there, that another workspace's environment names nothing, and that
deleting an environment is refused while something in it runs and then takes its tokens with it.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.state.sql.records import Role, WorkspaceRecord
from tests.controlplane.conftest import Api, bearer

STAGING = {"X-Levers9-Environment": "staging"}


async def _owner(api: Api, name: str) -> tuple[WorkspaceRecord, str]:
    services = api.services
    workspace = await services.workspaces.create(name)
    user = await services.users.get_or_create(f"owner@{name}.example")
    await services.members.put(workspace.id, user.id, Role.OWNER)
    _, token = await services.tokens.issue("user", workspace_id=workspace.id, user_id=user.id)
    return workspace, token


@pytest.fixture
async def staging(api: Api) -> tuple[WorkspaceRecord, str]:
    workspace, owner = await _owner(api, "acme")
    response = await api.client.post("/api/v1/environments", headers=bearer(owner), json={"name": "Staging"})
    assert response.status_code == 201, response.text
    assert response.json()["name"] == "staging"  # names are kept lowercase
    return workspace, owner


async def _secret_names(api: Api, headers: dict[str, str]) -> list[str]:
    response = await api.client.get("/api/v1/secrets", headers=headers)
    assert response.status_code == 200, response.text
    return [s["name"] for s in response.json()]


async def test_secrets_and_tasks_of_one_environment_are_not_seen_from_another(
    api: Api, staging: tuple[WorkspaceRecord, str]
) -> None:
    workspace, owner = staging
    listed = (await api.client.get("/api/v1/environments", headers=bearer(owner))).json()
    assert [e["name"] for e in listed] == ["main", "staging"]
    assert listed[0]["id"] == workspace.id  # main is the workspace itself: what it had before stays in main
    for headers, value in ((bearer(owner), "main-value"), ({**bearer(owner), **STAGING}, "staging-value")):
        response = await api.client.post("/api/v1/secrets", headers=headers, json={"name": "db", "value": value})
        assert response.status_code == 201
    response = await api.client.post(
        "/api/v1/secrets", headers={**bearer(owner), **STAGING}, json={"name": "only_staging", "value": "x"}
    )
    assert response.status_code == 201
    assert await _secret_names(api, bearer(owner)) == ["db"]
    assert await _secret_names(api, {**bearer(owner), **STAGING}) == ["db", "only_staging"]
    env = await api.services.workspaces.environment(workspace.id, "staging")
    assert env is not None
    assert await api.services.secrets.get(env.id, "db") == "staging-value"
    assert await api.services.secrets.get(workspace.id, "db") == "main-value"

    await api.submit(env, "task_in_staging")
    assert (await api.client.get("/api/v1/tasks/task_in_staging", headers=bearer(owner))).status_code == 404
    seen = await api.client.get("/api/v1/tasks/task_in_staging", headers={**bearer(owner), **STAGING})
    assert seen.status_code == 200
    assert [t["id"] for t in (await api.client.get("/api/v1/tasks", headers=bearer(owner))).json()] == []

    # deleting it is refused while its task is unfinished, and says what to do
    refused = await api.client.delete("/api/v1/environments/staging", headers=bearer(owner))
    assert refused.status_code == 409
    assert "1 unfinished task" in refused.json()["error"]["message"]
    cancelled = await api.client.post("/api/v1/tasks/task_in_staging/cancel", headers={**bearer(owner), **STAGING})
    assert cancelled.status_code == 200
    deleted = await api.client.delete("/api/v1/environments/staging", headers=bearer(owner))
    assert deleted.status_code == 200, deleted.text
    gone = await api.client.get("/api/v1/secrets", headers={**bearer(owner), **STAGING})
    assert gone.status_code == 404
    assert "environment" in gone.json()["error"]["message"]
    assert await _secret_names(api, bearer(owner)) == ["db"]  # main kept its own


async def test_a_token_issued_in_an_environment_acts_only_there(api: Api, staging: tuple[WorkspaceRecord, str]) -> None:
    _workspace, owner = staging
    issued = await api.client.post("/api/v1/tokens", headers={**bearer(owner), **STAGING}, json={"role": "member"})
    assert issued.status_code == 201, issued.text
    bound = issued.json()["token"]
    me = (await api.client.get("/api/v1/me", headers=bearer(bound))).json()
    assert (me["workspace"], me["environment"], me["role"], me["email"]) == (
        "acme",
        "staging",
        "member",
        "owner@acme.example",
    )
    for elsewhere in ("main", "prod"):
        response = await api.client.get(
            "/api/v1/secrets", headers={**bearer(bound), "X-Levers9-Environment": elsewhere}
        )
        assert response.status_code == 403
        assert "issued for environment 'staging' only" in response.json()["error"]["message"]
    # the staging token shows among staging's tokens, not main's
    main_tokens = (await api.client.get("/api/v1/tokens", headers=bearer(owner))).json()
    staging_tokens = (await api.client.get("/api/v1/tokens", headers={**bearer(owner), **STAGING})).json()
    assert issued.json()["id"] in [t["id"] for t in staging_tokens]
    assert issued.json()["id"] not in [t["id"] for t in main_tokens]
    # deleting the environment revokes its tokens
    assert (await api.client.delete("/api/v1/environments/staging", headers=bearer(owner))).status_code == 200
    assert (await api.client.get("/api/v1/me", headers=bearer(bound))).status_code == 401
    # main cannot be deleted
    response = await api.client.delete("/api/v1/environments/main", headers=bearer(owner))
    assert response.status_code == 409


async def test_another_workspaces_environment_and_an_unknown_one_name_nothing(
    api: Api, staging: tuple[WorkspaceRecord, str]
) -> None:
    _, other = await _owner(api, "globex")
    for name in ("staging", "nope"):
        response = await api.client.get("/api/v1/secrets", headers={**bearer(other), "X-Levers9-Environment": name})
        assert response.status_code == 404, name
        assert response.json()["error"]["message"] == f"environment {name!r} does not exist"
    bad = await api.client.post("/api/v1/environments", headers=bearer(other), json={"name": "no spaces"})
    assert bad.status_code == 400
    assert "environment name" in bad.json()["error"]["message"]
    twice = await api.client.post("/api/v1/environments", headers=bearer(other), json={"name": "main"})
    assert twice.status_code == 409
    # an operator's token has no environments
    response = await api.client.get("/api/v1/secrets", headers={**bearer(api.operator), **STAGING})
    assert response.status_code == 403


async def test_grpc_calls_act_in_the_environment_their_metadata_names(
    api: Api, staging: tuple[WorkspaceRecord, str]
) -> None:
    _, owner = staging
    await api.client.post(
        "/api/v1/secrets", headers={**bearer(owner), **STAGING}, json={"name": "staging_only", "value": "v"}
    )
    dataplane = DataPlane(api.services, Hub(api.services.redis, name=api.services.scheduler.name))
    server = grpc.aio.server()
    add: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
    add(ControlPlaneService(dataplane), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub: Any = controlplane_pb2_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
            auth = ("authorization", f"Bearer {owner}")
            main = await stub.ListSecrets(controlplane_pb2.ListSecretsRequest(), metadata=(auth,))
            assert [s.name for s in main.secrets] == []
            there = await stub.ListSecrets(
                controlplane_pb2.ListSecretsRequest(), metadata=(auth, ("x-levers9-environment", "staging"))
            )
            assert [s.name for s in there.secrets] == ["staging_only"]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ListSecrets(
                    controlplane_pb2.ListSecretsRequest(), metadata=(auth, ("x-levers9-environment", "nope"))
                )
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(None)
        await dataplane.close()
