"""The REST API over real Services: who may see what, what each endpoint answers, and how errors look."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import httpx
import pydantic
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import create_async_engine

from levers9.controlplane.http import create_http_app
from levers9.services.auth import PermissionDenied, Unauthenticated
from levers9.services.errors import ERRORS, error_answer
from levers9.state.errors import AlreadyExists, Conflict, DataDirectoryFull, InvalidTransition, NotFound
from levers9.state.sql.database import Database
from tests.controlplane.conftest import Api, bearer

USER_APIS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/api/v1/workspaces", None),
    ("POST", "/api/v1/workspaces", {"name": "x"}),
    ("GET", "/api/v1/tokens", None),
    ("POST", "/api/v1/tokens", {}),
    ("DELETE", "/api/v1/tokens/tok_x", None),
    ("GET", "/api/v1/pools", None),
    ("GET", "/api/v1/workers", None),
    ("GET", "/api/v1/machines", None),
    ("GET", "/api/v1/tasks", None),
    ("GET", "/api/v1/tasks/task_x", None),
    ("GET", "/api/v1/tasks/task_x/history", None),
    ("POST", "/api/v1/tasks/task_x/cancel", None),
]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://levers9.test")


async def _call(api: Api, method: str, path: str, body: dict[str, Any] | None, token: str | None) -> httpx.Response:
    headers = bearer(token) if token is not None else {}
    return await api.client.request(method, path, json=body, headers=headers)


# --------------------------------------------------------------------------- health


async def test_health_needs_no_token_and_reports_both_stores(api: Api) -> None:
    response = await api.client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok", "disk": "ok"}


async def test_health_is_degraded_when_redis_does_not_answer(api: Api) -> None:
    port = _closed_port()
    broken = Redis.from_url(f"redis://127.0.0.1:{port}/0", decode_responses=True)
    try:
        app = create_http_app(dataclasses.replace(api.services, redis=broken))
        async with _client(app) as client:
            response = await client.get("/api/v1/health")
    finally:
        await broken.aclose()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["database"] == "ok"
    assert body["redis"].startswith("ConnectionError:")
    assert str(port) in body["redis"]


async def test_health_is_degraded_when_the_database_does_not_answer(api: Api, tmp_path: Any) -> None:
    unreachable = Database(create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/missing/dir/levers9.db"))
    try:
        app = create_http_app(dataclasses.replace(api.services, db=unreachable))
        async with _client(app) as client:
            response = await client.get("/api/v1/health")
    finally:
        await unreachable.close()
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["redis"]) == ("degraded", "ok")
    assert body["database"].startswith("OperationalError:")
    assert "unable to open database file" in body["database"]


# --------------------------------------------------------------------------- authentication


async def test_every_user_api_refuses_a_missing_or_unknown_token(api: Api) -> None:
    for method, path, body in USER_APIS:
        for token in (None, "l9_user_not-a-real-token"):
            response = await _call(api, method, path, body, token)
            assert response.status_code == 401, (method, path, token, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["type"] == "unauthenticated"
            expected = "no token" if token is None else "unknown, revoked or expired"
            assert expected in error["message"], (method, path, error)


async def test_a_basic_auth_header_is_not_a_token(api: Api) -> None:
    response = await api.client.get("/api/v1/pools", headers={"Authorization": f"Basic {api.operator}"})
    assert response.status_code == 401


async def test_worker_agent_and_machine_tokens_are_refused_on_the_user_api(api: Api) -> None:
    workspace, _ = await api.user("team-a")
    tokens = api.services.tokens
    issued = [
        await tokens.issue("worker", workspace_id=workspace.id),
        await tokens.issue("agent", workspace_id=workspace.id),
        await tokens.issue("machine", subject="mach_1"),
    ]
    for record, token in issued:
        for method, path, body in USER_APIS:
            response = await _call(api, method, path, body, token)
            assert response.status_code == 403, (record.kind, method, path, response.text)
            error = response.json()["error"]
            assert error["type"] == "permission_denied"
            assert f"a {record.kind.value} token" in error["message"]
            assert "user tokens" in error["message"]


# --------------------------------------------------------------------------- workspaces


async def test_operators_list_and_create_workspaces(api: Api) -> None:
    await api.user("team-b")
    await api.user("team-a")
    response = await api.client.post("/api/v1/workspaces", json={"name": "team-c"}, headers=bearer(api.operator))
    assert response.status_code == 201
    created = response.json()
    assert created["name"] == "team-c"
    assert created["id"].startswith("ws_")
    assert created["created_at"]

    listed = (await api.client.get("/api/v1/workspaces", headers=bearer(api.operator))).json()
    assert [w["name"] for w in listed] == ["team-a", "team-b", "team-c"]
    assert created in listed

    again = await api.client.post("/api/v1/workspaces", json={"name": "team-c"}, headers=bearer(api.operator))
    assert again.status_code == 409
    assert again.json() == {"error": {"type": "already_exists", "message": "a workspace named 'team-c' already exists"}}


async def test_workspace_users_see_only_their_own_workspace_and_cannot_create_one(api: Api) -> None:
    await api.user("team-b")
    workspace, token = await api.user("team-a")
    listed = (await api.client.get("/api/v1/workspaces", headers=bearer(token))).json()
    assert [(w["id"], w["name"]) for w in listed] == [(workspace.id, "team-a")]

    response = await api.client.post("/api/v1/workspaces", json={"name": "mine"}, headers=bearer(token))
    assert response.status_code == 403
    assert "only an operator or a signed-in person may create workspaces" in response.json()["error"]["message"]
    assert await api.services.workspaces.by_name("mine") is None


async def test_workspace_bodies_are_validated_naming_the_field(api: Api) -> None:
    headers = bearer(api.operator)
    missing = await api.client.post("/api/v1/workspaces", json={}, headers=headers)
    assert missing.status_code == 422
    error = missing.json()["error"]
    assert error["type"] == "validation_error"
    assert error["fields"] == [{"field": "body.name", "message": "Field required"}]
    assert error["message"] == "body.name: Field required"

    typo = await api.client.post("/api/v1/workspaces", json={"name": "x", "nmae": "y"}, headers=headers)
    assert typo.status_code == 422
    assert "body.nmae" in typo.json()["error"]["message"]

    not_json = await api.client.post(
        "/api/v1/workspaces", content=b'{"name": ', headers={**headers, "Content-Type": "application/json"}
    )
    assert not_json.status_code == 422
    error = not_json.json()["error"]
    assert error["fields"][0]["field"] == "body"
    assert "not valid JSON" in error["message"]

    padded = await api.client.post("/api/v1/workspaces", json={"name": " padded"}, headers=headers)
    assert padded.status_code == 400
    assert padded.json()["error"]["type"] == "invalid_request"
    assert "workspace name ' padded' is not valid" in padded.json()["error"]["message"]


# --------------------------------------------------------------------------- tokens


async def test_tokens_are_listed_for_the_callers_workspace_without_secrets(api: Api) -> None:
    a, token_a = await api.user("team-a")
    b, token_b = await api.user("team-b")
    await api.services.tokens.issue("worker", workspace_id=a.id, subject="cluster-agent")

    listed = (await api.client.get("/api/v1/tokens", headers=bearer(token_a))).json()
    assert sorted(t["kind"] for t in listed) == ["user", "worker"]
    assert {t["workspace_id"] for t in listed} == {a.id}
    for item in listed:
        assert set(item) == {
            "id",
            "kind",
            "workspace_id",
            "subject",
            "role",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "active",
        }
        assert item["active"] is True
    assert not any(token_a in str(value) for item in listed for value in item.values())

    own_by_name = await api.client.get("/api/v1/tokens", params={"workspace": "team-a"}, headers=bearer(token_a))
    assert own_by_name.json() == listed
    other = await api.client.get("/api/v1/tokens", params={"workspace": "team-b"}, headers=bearer(token_a))
    assert other.status_code == 403

    # Operators name the workspace, or list the tokens bound to none (their own).
    of_b = (await api.client.get("/api/v1/tokens", params={"workspace": "team-b"}, headers=bearer(api.operator))).json()
    assert [(t["workspace_id"], t["subject"]) for t in of_b] == [(b.id, "someone@team-b")]
    unbound = (await api.client.get("/api/v1/tokens", headers=bearer(api.operator))).json()
    assert [(t["workspace_id"], t["subject"]) for t in unbound] == [(None, "root")]
    missing = await api.client.get("/api/v1/tokens", params={"workspace": "nope"}, headers=bearer(api.operator))
    assert missing.status_code == 404
    assert token_b  # issued only to exist in another workspace


async def test_a_new_token_works_and_a_revoked_one_stops_at_once(api: Api) -> None:
    a, token_a = await api.user("team-a")
    response = await api.client.post("/api/v1/tokens", json={"ttl_s": 3600, "subject": "ci"}, headers=bearer(token_a))
    assert response.status_code == 201
    issued = response.json()
    new = issued["token"]
    assert new.startswith("l9_user_")
    assert (issued["workspace_id"], issued["subject"], issued["active"]) == (a.id, "ci", True)
    assert issued["expires_at"] is not None

    seen = await api.client.get("/api/v1/workspaces", headers=bearer(new))
    assert [w["id"] for w in seen.json()] == [a.id]  # ...and the authenticator now caches it

    revoked = await api.client.delete(f"/api/v1/tokens/{issued['id']}", headers=bearer(token_a))
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert revoked.json()["active"] is False
    after = await api.client.get("/api/v1/workspaces", headers=bearer(new))
    assert after.status_code == 401
    assert (await api.client.get("/api/v1/workspaces", headers=bearer(token_a))).status_code == 200

    again = await api.client.delete(f"/api/v1/tokens/{issued['id']}", headers=bearer(token_a))
    assert again.status_code == 200  # revoking twice keeps the first revocation
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]


async def test_users_issue_and_revoke_only_in_their_own_workspace(api: Api) -> None:
    a, token_a = await api.user("team-a")
    b, token_b = await api.user("team-b")
    [record_b] = await api.services.tokens.list_for_workspace(b.id)

    refused = await api.client.post("/api/v1/tokens", json={"workspace": "team-b"}, headers=bearer(token_a))
    assert refused.status_code == 403
    assert "its own workspace" in refused.json()["error"]["message"]
    own = await api.client.post("/api/v1/tokens", json={"workspace": "team-a"}, headers=bearer(token_a))
    assert own.status_code == 201
    assert own.json()["workspace_id"] == a.id

    # Another workspace's token is "not found", like a missing one, and keeps working.
    for token_id in (record_b.id, "tok_missing"):
        response = await api.client.delete(f"/api/v1/tokens/{token_id}", headers=bearer(token_a))
        assert response.status_code == 404
        assert response.json() == {"error": {"type": "not_found", "message": f"token {token_id!r} does not exist"}}
    assert (await api.client.get("/api/v1/tasks", headers=bearer(token_b))).status_code == 200

    # The operator can revoke it.
    response = await api.client.delete(f"/api/v1/tokens/{record_b.id}", headers=bearer(api.operator))
    assert response.status_code == 200
    assert (await api.client.get("/api/v1/tasks", headers=bearer(token_b))).status_code == 401


async def test_operators_issue_tokens_for_any_workspace(api: Api) -> None:
    b, _ = await api.user("team-b")
    response = await api.client.post("/api/v1/tokens", json={"workspace": "team-b"}, headers=bearer(api.operator))
    assert response.status_code == 201
    assert response.json()["workspace_id"] == b.id
    tasks = await api.client.get("/api/v1/tasks", headers=bearer(response.json()["token"]))
    assert tasks.status_code == 200

    unknown = await api.client.post("/api/v1/tokens", json={"workspace": "nope"}, headers=bearer(api.operator))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "workspace 'nope' does not exist"

    another = await api.client.post("/api/v1/tokens", json={}, headers=bearer(api.operator))
    assert another.status_code == 201
    assert another.json()["workspace_id"] is None
    listed = await api.client.get("/api/v1/workspaces", headers=bearer(another.json()["token"]))
    assert [w["name"] for w in listed.json()] == ["team-b"]


async def test_token_bodies_are_validated_naming_the_field(api: Api) -> None:
    _, token = await api.user("team-a")
    for body, field in (({"ttl_s": -1}, "body.ttl_s"), ({"ttl_s": "soon"}, "body.ttl_s"), ({"ttl": 5}, "body.ttl")):
        response = await api.client.post("/api/v1/tokens", json=body, headers=bearer(token))
        assert response.status_code == 422, body
        error = response.json()["error"]
        assert [f["field"] for f in error["fields"]] == [field]
        assert error["message"].startswith(f"{field}: ")
    negative = await api.client.post("/api/v1/tokens", json={"ttl_s": -1}, headers=bearer(token))
    assert "greater than 0" in negative.json()["error"]["message"]
    listed = (await api.client.get("/api/v1/tokens", headers=bearer(token))).json()
    assert len(listed) == 1  # nothing was issued


# --------------------------------------------------------------------------- pools and workers


def _attach(api: Api, name: str, workspace_id: str) -> None:
    """A workspace's attached cluster, as a pool only that workspace may use."""
    shared = api.services.pools["cpu"]
    pool = shared.pool.model_copy(update={"name": name, "provider": "attached_cluster"})
    api.services.pools[name] = dataclasses.replace(shared, pool=pool, workspace=workspace_id, configured=False)


async def test_pools_show_sizes_live_workers_and_unavailability(api: Api) -> None:
    _, token = await api.user("team-a")
    await api.worker("w-1", "cpu")
    await api.worker("w-2", "cpu")
    await api.worker("w-silent", "cpu")
    await api.services.redis.delete("l9:alive:w-silent")  # its keepalive lapsed: not live any more
    await api.services.scheduler.ctx.unavailable.mark("gpu-l4", "L4", None, "insufficient_capacity: none left", 60)

    response = await api.client.get("/api/v1/pools", headers=bearer(token))
    assert response.status_code == 200
    pools = {p["name"]: p for p in response.json()}
    assert pools["cpu"] == {
        "name": "cpu",
        "provider": "local",
        "runtime": "runc",
        "gpu": None,
        "gpu_count": 0,
        "region": None,
        "cpu_millicores": 2000,
        "memory_mib": 4096,
        "min_workers": 0,
        "max_workers": 3,
        "priority": 0,
        "workspace_id": None,
        "workers": 2,
        "unavailable": None,
        "isolation": "namespaces",
    }
    assert pools["gpu-l4"] == {
        "name": "gpu-l4",
        "provider": "local",
        "runtime": "runc",
        "gpu": "L4",
        "gpu_count": 1,
        "region": None,
        "cpu_millicores": 8000,
        "memory_mib": 32768,
        "min_workers": 0,
        "max_workers": 2,
        "priority": 5,
        "workspace_id": None,
        "workers": 0,
        "unavailable": "insufficient_capacity: none left",
        "isolation": "namespaces",
    }


async def test_another_workspaces_attached_cluster_is_hidden(api: Api) -> None:
    _, token_a = await api.user("team-a")
    b, token_b = await api.user("team-b")
    _attach(api, "b-cluster", b.id)
    await api.worker("w-shared", "cpu")
    await api.worker("w-b", "b-cluster", workspace=b.id)

    async def names(path: str, token: str, key: str = "name") -> list[str]:
        response = await api.client.get(path, headers=bearer(token))
        assert response.status_code == 200, response.text
        return sorted(item[key] for item in response.json())

    assert await names("/api/v1/pools", token_a) == ["cpu", "gpu-l4"]
    assert await names("/api/v1/pools", token_b) == ["b-cluster", "cpu", "gpu-l4"]
    assert await names("/api/v1/pools", api.operator) == ["b-cluster", "cpu", "gpu-l4"]
    assert await names("/api/v1/workers", token_a, "id") == ["w-shared"]
    assert await names("/api/v1/workers", token_b, "id") == ["w-b", "w-shared"]
    assert await names("/api/v1/workers", api.operator, "id") == ["w-b", "w-shared"]

    hidden = await api.client.get("/api/v1/workers", params={"pool": "b-cluster"}, headers=bearer(token_a))
    missing = await api.client.get("/api/v1/workers", params={"pool": "nope"}, headers=bearer(token_a))
    assert (hidden.status_code, missing.status_code) == (404, 404)
    assert hidden.json()["error"]["message"] == "pool 'b-cluster' does not exist"
    own = await api.client.get("/api/v1/workers", params={"pool": "b-cluster"}, headers=bearer(token_b))
    assert [w["id"] for w in own.json()] == ["w-b"]


async def test_workers_show_capacity_and_what_is_free(api: Api) -> None:
    a, token = await api.user("team-a")
    await api.worker("w-cpu", "cpu")
    await api.worker("w-gpu", "gpu-l4")
    await api.submit(a, "task-1", cpu_millicores=500, memory_mib=1024)
    result = await api.services.scheduler.place_once()
    assert [p.request for p in result.placed] == ["task-1"]

    response = await api.client.get("/api/v1/workers", params={"pool": "cpu"}, headers=bearer(token))
    assert response.status_code == 200
    [worker] = response.json()
    assert {k: worker[k] for k in worker if k not in ("registered_at", "idle_since")} == {
        "id": "w-cpu",
        "pool": "cpu",
        "status": "running",
        "runtime": "runc",
        "gpu": None,
        "gpu_count": 0,
        "gpu_free": 0,
        "cpu_millicores": 2000,
        "cpu_free": 1500,
        "memory_mib": 4096,
        "memory_free": 3072,
        "running": 1,
        "workspace_id": None,
        "machine_id": None,
        "address": None,
    }
    assert worker["registered_at"]
    assert worker["idle_since"] is None  # busy

    everything = (await api.client.get("/api/v1/workers", headers=bearer(api.operator))).json()
    by_id = {w["id"]: w for w in everything}
    assert set(by_id) == {"w-cpu", "w-gpu"}
    assert (by_id["w-gpu"]["gpu"], by_id["w-gpu"]["gpu_free"], by_id["w-gpu"]["running"]) == ("L4", 1, 0)
    assert by_id["w-gpu"]["idle_since"] is not None
    assert by_id["w-cpu"]["address"] == "10.0.0.7:7000"  # operators see where workers listen


# --------------------------------------------------------------------------- machines


async def test_machines_are_for_operators_only(api: Api) -> None:
    _, token = await api.user("team-a")
    machines = api.services.machines
    first = await machines.create("gpu-l4", "local", gpu="L4", gpu_count=1)
    second = await machines.create("cpu", "local")
    await machines.set_state(second.id, "failed", error="no capacity")

    response = await api.client.get("/api/v1/machines", headers=bearer(api.operator))
    assert response.status_code == 200
    listed = response.json()
    assert [(m["id"], m["pool"], m["state"]) for m in listed] == [
        (first.id, "gpu-l4", "requested"),
        (second.id, "cpu", "failed"),
    ]
    assert (listed[0]["gpu"], listed[0]["gpu_count"], listed[1]["last_error"]) == ("L4", 1, "no capacity")

    failed = await api.client.get("/api/v1/machines", params={"state": "failed"}, headers=bearer(api.operator))
    assert [m["id"] for m in failed.json()] == [second.id]
    of_pool = await api.client.get("/api/v1/machines", params={"pool": "gpu-l4"}, headers=bearer(api.operator))
    assert [m["id"] for m in of_pool.json()] == [first.id]
    bogus = await api.client.get("/api/v1/machines", params={"state": "asleep"}, headers=bearer(api.operator))
    assert bogus.status_code == 422
    assert bogus.json()["error"]["message"].startswith("query.state.0: Input should be 'requested', 'starting'")

    refused = await api.client.get("/api/v1/machines", headers=bearer(token))
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == (
        "only an operator token (a user token bound to no workspace) may list machines"
    )


# --------------------------------------------------------------------------- tasks


async def test_tasks_are_listed_for_the_callers_workspace_only(api: Api) -> None:
    a, token_a = await api.user("team-a")
    b, _ = await api.user("team-b")
    await api.submit(a, "task-a1")
    await api.submit(a, "task-a2")
    await api.submit(b, "task-b1")
    await api.services.tasks.finish("task-a1", "complete")

    async def ids(**params: Any) -> list[str]:
        response = await api.client.get("/api/v1/tasks", params=params, headers=bearer(token_a))
        assert response.status_code == 200, response.text
        return sorted(t["id"] for t in response.json())

    assert await ids() == ["task-a1", "task-a2"]
    assert await ids(status="pending") == ["task-a2"]
    assert await ids(status=["pending", "complete"]) == ["task-a1", "task-a2"]
    assert await ids(status="running") == []
    assert len(await ids(limit=1)) == 1

    listed = (await api.client.get("/api/v1/tasks", headers=bearer(token_a))).json()
    assert {t["workspace_id"] for t in listed} == {a.id}
    assert "request" not in listed[0]

    bad = await api.client.get("/api/v1/tasks", params={"status": "done"}, headers=bearer(token_a))
    assert bad.status_code == 422
    message = bad.json()["error"]["message"]
    assert message.startswith("query.status.0: Input should be 'pending', 'running', 'complete'")
    too_many = await api.client.get("/api/v1/tasks", params={"limit": 5000}, headers=bearer(token_a))
    assert too_many.status_code == 422
    assert too_many.json()["error"]["message"] == (
        "query.limit: Input should be less than or equal to 1000 (accepted: a whole number from 1 to 1000)"
    )

    operator = await api.client.get("/api/v1/tasks", headers=bearer(api.operator))
    assert operator.status_code == 403
    assert "bound to no workspace" in operator.json()["error"]["message"]


async def test_another_workspaces_task_is_not_found_exactly_like_a_missing_one(api: Api) -> None:
    _, token_a = await api.user("team-a")
    b, token_b = await api.user("team-b")
    await api.submit(b, "task-b1")
    for suffix, method in (("", "GET"), ("/history", "GET"), ("/cancel", "POST")):
        for task_id in ("task-b1", "task-missing"):
            response = await api.client.request(method, f"/api/v1/tasks/{task_id}{suffix}", headers=bearer(token_a))
            assert response.status_code == 404, (suffix, task_id)
            assert response.json() == {"error": {"type": "not_found", "message": f"task {task_id!r} does not exist"}}
    task = await api.services.tasks.get("task-b1")
    assert task is not None
    assert task.status == "pending"  # A's cancel did not touch it
    assert (await api.client.get("/api/v1/tasks/task-b1", headers=bearer(token_b))).status_code == 200


async def test_a_task_its_history_and_cancelling_it(api: Api) -> None:
    a, token = await api.user("team-a")
    await api.worker("w-1", "cpu")
    await api.submit(a, "task-1", cpu_millicores=1500)
    await api.services.scheduler.place_once()

    response = await api.client.get("/api/v1/tasks/task-1", headers=bearer(token))
    assert response.status_code == 200
    task = response.json()
    assert (task["id"], task["status"], task["pool"], task["worker_id"]) == ("task-1", "pending", "cpu", "w-1")
    assert task["request"]["cpu_millicores"] == 1500
    assert task["request"]["workspace"] == a.id

    history = (await api.client.get("/api/v1/tasks/task-1/history", headers=bearer(token))).json()
    assert [(h["outcome"], h["pool"], h["worker_id"], h["attempt"]) for h in history] == [("placed", "cpu", "w-1", 0)]
    assert history[0]["at"]

    cancelled = await api.client.post("/api/v1/tasks/task-1/cancel", headers=bearer(token))
    assert cancelled.status_code == 200
    body = cancelled.json()
    assert body["cancelled"] is True
    assert body["task"]["status"] == "cancelled"
    assert body["task"]["finished_at"] is not None
    # The scheduler forgot it and gave its worker the resources back.
    assert await api.services.scheduler.backlog.get("task-1") is None
    worker = await api.services.scheduler.workers.get("w-1")
    assert worker is not None
    assert worker.cpu_free == 2000
    sample = api.metrics.registry.get_sample_value
    assert sample("levers9_tasks_finished_total", {"replica": "local", "status": "cancelled"}) == 1
    assert sample("levers9_task_duration_seconds_count", {"replica": "local", "status": "cancelled"}) == 1
    assert sample("levers9_task_duration_seconds_sum", {"replica": "local", "status": "cancelled"}) == 0  # it never ran

    again = await api.client.post("/api/v1/tasks/task-1/cancel", headers=bearer(token))
    assert again.status_code == 200
    assert again.json()["cancelled"] is False
    assert again.json()["task"]["status"] == "cancelled"
    assert api.metrics.registry.get_sample_value("levers9_tasks_finished_total", _CANCELLED) == 1


#: the series of tasks cancelled through the API client's replica ("local": the Metrics default)
_CANCELLED = {"replica": "local", "status": "cancelled"}


async def test_a_finished_task_stays_finished_when_cancelled(api: Api) -> None:
    a, token = await api.user("team-a")
    await api.submit(a, "task-1")
    await api.services.scheduler.release_many(["task-1"])  # out of the backlog, then finished in SQL
    await api.services.tasks.finish("task-1", "complete")
    response = await api.client.post("/api/v1/tasks/task-1/cancel", headers=bearer(token))
    assert response.status_code == 200
    assert (response.json()["cancelled"], response.json()["task"]["status"]) == (False, "complete")
    assert api.metrics.registry.get_sample_value("levers9_tasks_finished_total", _CANCELLED) is None


# --------------------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (NotFound("task", "t1"), 404, "not_found"),
        (AlreadyExists("taken"), 409, "already_exists"),
        (Conflict("contradicts"), 409, "conflict"),
        (InvalidTransition("finished"), 409, "invalid_transition"),
        (Unauthenticated("who?"), 401, "unauthenticated"),
        (PermissionDenied("not yours"), 403, "permission_denied"),
        (ValueError("bad value"), 400, "invalid_request"),
        (DataDirectoryFull("/var/lib/levers9", 4096, 64 << 20), 507, "insufficient_storage"),
    ],
)
async def test_domain_errors_map_to_statuses_in_one_table(api: Api, exc: Exception, status: int, kind: str) -> None:
    assert error_answer(exc) == (status, kind)
    assert any(isinstance(exc, cls) and (code, name) == (status, kind) for cls, code, name in ERRORS)
    app = create_http_app(api.services)

    async def boom() -> None:
        raise exc

    app.add_api_route("/api/v1/boom", boom)
    async with _client(app) as client:
        response = await client.get("/api/v1/boom")
    assert response.status_code == status
    assert response.json() == {"error": {"type": kind, "message": str(exc)}}


async def test_a_server_bug_is_a_500_that_reveals_nothing(api: Api) -> None:
    app = create_http_app(api.services)

    class Model(pydantic.BaseModel):
        n: int

    async def broken_model() -> None:
        Model.model_validate({"n": "secret-internal-value"})

    async def broken() -> None:
        raise RuntimeError("secret-internal-state")

    app.add_api_route("/api/v1/broken-model", broken_model)
    app.add_api_route("/api/v1/broken", broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://levers9.test") as client:
        for path in ("/api/v1/broken-model", "/api/v1/broken"):
            response = await client.get(path)
            assert response.status_code == 500, path
            assert response.json()["error"]["type"] == "internal"
            assert "secret" not in response.text


async def test_unknown_routes_and_methods_answer_in_the_same_shape(api: Api) -> None:
    missing = await api.client.get("/api/v1/nothing-here", headers=bearer(api.operator))
    assert missing.status_code == 404
    assert missing.json() == {"error": {"type": "not_found", "message": "Not Found"}}
    wrong = await api.client.put("/api/v1/pools", headers=bearer(api.operator))
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "method_not_allowed"
    assert "GET" in wrong.headers["allow"]


async def test_the_openapi_document_lists_the_api(api: Api) -> None:
    schema = (await api.client.get("/api/v1/openapi.json")).json()
    assert {
        "/api/v1/health",
        "/api/v1/workspaces",
        "/api/v1/tokens",
        "/api/v1/tokens/{token_id}",
        "/api/v1/pools",
        "/api/v1/workers",
        "/api/v1/machines",
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/history",
        "/api/v1/tasks/{task_id}/cancel",
    } <= set(schema["paths"])
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
