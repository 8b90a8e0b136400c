"""Secrets over REST, on real Services: write-only values, environment-variable names, one workspace each."""

from __future__ import annotations

from tests.controlplane.conftest import Api, bearer

VALUE = "sk-canary-5b1e0c7d-never-in-an-answer"


async def test_create_list_replace_and_delete_a_secret(api: Api) -> None:
    workspace, token = await api.user("team-a")
    created = await api.client.post("/api/v1/secrets", json={"name": "API_KEY", "value": VALUE}, headers=bearer(token))
    assert created.status_code == 201, created.text
    assert set(created.json()) == {"name", "created_at", "updated_at"}
    assert created.json()["name"] == "API_KEY"
    replaced = await api.client.post(
        "/api/v1/secrets", json={"name": "API_KEY", "value": "second-canary"}, headers=bearer(token)
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["created_at"] == created.json()["created_at"]
    assert replaced.json()["updated_at"] > created.json()["updated_at"]
    assert await api.services.secrets.get(workspace.id, "API_KEY") == "second-canary"

    listed = await api.client.get("/api/v1/secrets", headers=bearer(token))
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()] == ["API_KEY"]
    assert set(listed.json()[0]) == {"name", "created_at", "updated_at"}
    for answer in (created, replaced, listed):
        assert VALUE not in answer.text
        assert "second-canary" not in answer.text

    deleted = await api.client.delete("/api/v1/secrets/API_KEY", headers=bearer(token))
    assert deleted.status_code == 204
    assert (await api.client.get("/api/v1/secrets", headers=bearer(token))).json() == []
    again = await api.client.delete("/api/v1/secrets/API_KEY", headers=bearer(token))
    assert again.status_code == 404
    assert again.json() == {"error": {"type": "not_found", "message": "secret 'API_KEY' does not exist"}}


async def test_a_secret_name_must_be_an_environment_variable_name(api: Api) -> None:
    _, token = await api.user("team-a")
    for name in ("MY-KEY", "1PASSWORD", "with space", "KEY=1", "ÄKEY", "a" * 256):
        response = await api.client.post("/api/v1/secrets", json={"name": name, "value": "x"}, headers=bearer(token))
        assert response.status_code == 422, (name, response.text)
        error = response.json()["error"]
        assert [f["field"] for f in error["fields"]] == ["body.name"]
        if name != "a" * 256:  # the length check of the field comes first there
            assert "environment variable" in error["message"], error
            assert "letters, digits and underscores" in error["message"]
    for body, why in (({"name": "K", "value": ""}, "empty"), ({"name": "K", "value": "a\0b"}, "NUL")):
        response = await api.client.post("/api/v1/secrets", json=body, headers=bearer(token))
        assert response.status_code == 422
        assert why in response.json()["error"]["message"]
        assert response.json()["error"]["fields"][0]["field"] == "body.value"
    missing = await api.client.post("/api/v1/secrets", json={"name": "K"}, headers=bearer(token))
    assert missing.json()["error"]["fields"] == [{"field": "body.value", "message": "Field required"}]
    for name in ("_PRIVATE", "lower_case_9", "A" * 255):
        ok = await api.client.post("/api/v1/secrets", json={"name": name, "value": "x"}, headers=bearer(token))
        assert ok.status_code == 201, (name, ok.text)


async def test_another_workspaces_secret_is_answered_exactly_like_a_missing_one(api: Api) -> None:
    a, token_a = await api.user("team-a")
    b, token_b = await api.user("team-b")
    made = await api.client.post("/api/v1/secrets", json={"name": "SHARED", "value": VALUE}, headers=bearer(token_a))
    assert made.status_code == 201

    assert (await api.client.get("/api/v1/secrets", headers=bearer(token_b))).json() == []
    by_b = await api.client.delete("/api/v1/secrets/SHARED", headers=bearer(token_b))
    never = await api.client.delete("/api/v1/secrets/NEVER_MADE", headers=bearer(token_b))
    assert by_b.status_code == never.status_code == 404
    assert by_b.json()["error"] == {**never.json()["error"], "message": "secret 'SHARED' does not exist"}
    assert await api.services.secrets.get(a.id, "SHARED") == VALUE  # untouched

    # B making its own of the same name is B's: A's value stays
    own = await api.client.post("/api/v1/secrets", json={"name": "SHARED", "value": "b's"}, headers=bearer(token_b))
    assert own.status_code == 201
    assert await api.services.secrets.get(a.id, "SHARED") == VALUE
    assert await api.services.secrets.get(b.id, "SHARED") == "b's"


async def test_an_operator_token_has_no_secrets(api: Api) -> None:
    for method, path, body in (
        ("GET", "/api/v1/secrets", None),
        ("POST", "/api/v1/secrets", {"name": "K", "value": "v"}),
        ("DELETE", "/api/v1/secrets/K", None),
    ):
        response = await api.client.request(method, path, json=body, headers=bearer(api.operator))
        assert response.status_code == 403, (method, response.text)
        assert "bound to no workspace" in response.json()["error"]["message"]
    for method, path in (("GET", "/api/v1/secrets"), ("DELETE", "/api/v1/secrets/K")):
        assert (await api.client.request(method, path)).status_code == 401
