"""The REST API's numbers are bounded (422 naming the field and its range, never a 500), and tokens end on time.

Over real Services (SQLite and PostgreSQL, embedded Redis), as in test_http.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from levers9.controlplane.http import ACCEPTED
from levers9.services.auth import Authenticator, Unauthenticated
from levers9.services.deployments import MAX_VERSION
from levers9.state.sql.workspaces import MAX_TOKEN_TTL_S
from tests.controlplane.conftest import Api, bearer


def _out_of_range(response: Any, field: str) -> dict[str, Any]:
    """The 422 for ``field``: its one field entry, after checking the envelope and that the range is named."""
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error"
    [entry] = error["fields"]
    assert entry["field"] == field
    assert entry["accepted"] == ACCEPTED[field]
    assert error["message"].startswith(f"{field}: ")
    assert f"(accepted: {ACCEPTED[field]})" in error["message"]
    return dict(entry)


async def test_a_huge_or_infinite_ttl_is_a_422_naming_the_field_and_its_range(api: Api) -> None:
    _, token = await api.user("team-a")
    for ttl in (1e308, MAX_TOKEN_TTL_S + 1, 10**40):
        response = await api.client.post("/api/v1/tokens", json={"ttl_s": ttl}, headers=bearer(token))
        entry = _out_of_range(response, "body.ttl_s")
        assert f"less than or equal to {MAX_TOKEN_TTL_S}" in entry["message"]
    for raw in (b'{"ttl_s": 1e400}', b'{"ttl_s": Infinity}', b'{"ttl_s": NaN}'):
        response = await api.client.post(
            "/api/v1/tokens", content=raw, headers={**bearer(token), "Content-Type": "application/json"}
        )
        assert response.status_code == 422, (raw, response.text)
        assert response.json()["error"]["type"] == "validation_error"
    assert "ten years" in ACCEPTED["body.ttl_s"]
    longest = await api.client.post("/api/v1/tokens", json={"ttl_s": MAX_TOKEN_TTL_S}, headers=bearer(token))
    assert longest.status_code == 201, longest.text


async def test_a_version_beyond_32_bits_is_a_422_not_a_500(api: Api) -> None:
    _, token = await api.user("team-a")
    for version in ("99999999999999999999", str(MAX_VERSION + 1), "0", "-1"):
        response = await api.client.post(f"/api/v1/deployments/web/versions/{version}/stop", headers=bearer(token))
        _out_of_range(response, "path.version")
    largest = await api.client.post(f"/api/v1/deployments/web/versions/{MAX_VERSION}/stop", headers=bearer(token))
    assert largest.status_code == 404  # in range: simply no such deployment
    assert largest.json()["error"]["type"] == "not_found"


async def test_a_task_limit_out_of_range_is_a_422_naming_the_range(api: Api) -> None:
    _, token = await api.user("team-a")
    for limit in ("99999999999999999999999", "0", "1001"):
        response = await api.client.get("/api/v1/tasks", params={"limit": limit}, headers=bearer(token))
        _out_of_range(response, "query.limit")


def _numeric(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any] | None:
    """The numeric schema inside ``schema`` (through $ref and Optional's anyOf), if it is a number."""
    if "$ref" in schema:
        return _numeric(components[schema["$ref"].rsplit("/", 1)[1]], components)
    if schema.get("type") in ("integer", "number"):
        return schema
    for option in schema.get("anyOf", ()):
        found = _numeric(option, components)
        if found is not None:
            return found
    return None


async def test_every_number_the_api_takes_is_bounded_and_its_range_named(api: Api) -> None:
    """The audit, kept: a numeric path, query or body field added later without bounds fails here."""
    spec = (await api.client.get("/api/v1/openapi.json")).json()
    components = spec["components"]["schemas"]
    seen: dict[str, dict[str, Any]] = {}
    for methods in spec["paths"].values():
        for operation in methods.values():
            for parameter in operation.get("parameters", ()):
                found = _numeric(parameter["schema"], components)
                if found is not None:
                    seen[f"{parameter['in']}.{parameter['name']}"] = found
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is None:
                continue
            model = _numeric(body, components) or components[body["$ref"].rsplit("/", 1)[1]]
            for name, prop in model.get("properties", {}).items():
                found = _numeric(prop, components)
                if found is not None:
                    seen[f"body.{name}"] = found
    assert set(seen) == set(ACCEPTED), "every numeric field needs its range in ACCEPTED, and only those"
    for where, schema in seen.items():
        assert "minimum" in schema or "exclusiveMinimum" in schema, where
        assert "maximum" in schema, where


async def test_a_token_is_refused_once_it_expires_even_while_cached(api: Api) -> None:
    _, token = await api.user("team-a")
    issued = await api.client.post("/api/v1/tokens", json={"ttl_s": 1}, headers=bearer(token))
    assert issued.status_code == 201
    short, expires_at = issued.json()["token"], datetime.fromisoformat(issued.json()["expires_at"])
    used = await api.client.get("/api/v1/tasks", headers=bearer(short))
    assert used.status_code == 200  # valid, and now in the auth cache (10 s)
    while datetime.now(UTC) <= expires_at:
        await asyncio.sleep(0.05)
    refused = await api.client.get("/api/v1/tasks", headers=bearer(short))
    assert refused.status_code == 401, refused.text
    assert "unknown, revoked or expired" in refused.json()["error"]["message"]


async def test_a_cache_entry_never_outlives_its_tokens_expiry(api: Api) -> None:
    services = api.services
    frozen = 0.0
    auth = Authenticator(services.tokens, cache_s=3600, clock=lambda: frozen)  # an hour-long cache
    workspace = await services.workspaces.get_or_create("team-a")
    record, token = await services.tokens.issue("user", workspace_id=workspace.id, ttl_s=1)
    forever, lasting = await services.tokens.issue("user", workspace_id=workspace.id)
    assert (await auth.verify(token)).token_id == record.id
    assert (await auth.verify(lasting)).token_id == forever.id
    assert record.expires_at is not None
    while datetime.now(UTC) <= record.expires_at:
        await asyncio.sleep(0.05)
    with pytest.raises(Unauthenticated, match="unknown, revoked or expired"):
        await auth.verify(token)
    assert (await auth.verify(lasting)).token_id == forever.id  # a token without expiry stays cached
