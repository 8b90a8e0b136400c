"""Usage (levers9.services.usage and GET /api/v1/usage): GPU-hours and CPU-hours by environment and pool, counted
from real task rows (SQLite and PostgreSQL) whose start and finish times the test sets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.usage import usage
from levers9.state.sql.models import Task
from levers9.state.sql.records import Role, TaskStatus
from tests.controlplane.conftest import Api, bearer

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


async def _task(
    services: Services,
    workspace_id: str,
    *,
    cpu: int = 1000,
    gpus: int = 0,
    gpu: str | None = None,
    pool: str = "cpu",
    started: datetime | None = None,
    finished: datetime | None = None,
    status: TaskStatus = TaskStatus.COMPLETE,
) -> str:
    request: dict[str, Any] = {"id": "x", "cpu_millicores": cpu, "gpu": {"types": [gpu] if gpu else [], "count": gpus}}
    record = await services.tasks.create(workspace_id, request)
    async with services.db.transaction() as session:
        await session.execute(
            update(Task)
            .where(Task.id == record.id)
            .values(
                status=status.value,
                pool=pool,
                gpu=gpu,
                started_at=started,
                finished_at=finished,
                created_at=started or T0,
                updated_at=finished or started or T0,
            )
        )
    return record.id


async def _principal(services: Services, workspace_id: str) -> Principal:
    _, token = await services.tokens.issue("user", workspace_id=workspace_id, subject="someone", role=Role.VIEWER)
    return await services.auth.verify(token)


async def test_hours_by_environment_and_pool_count_only_the_period(services: Services) -> None:
    team = await services.workspaces.get_or_create("team")
    staging = await services.workspaces.create_environment(team.id, "staging")
    other = await services.workspaces.get_or_create("other")
    # 2 cores for an hour: 2 CPU-hours
    await _task(services, team.id, cpu=2000, started=T0, finished=T0 + HOUR)
    # 2 L4s and 8 cores from 12:30 to 14:00: half an hour of it falls in 12:00-13:00
    await _task(
        services, team.id, cpu=8000, gpus=2, gpu="L4", pool="gpu-l4", started=T0 + HOUR / 2, finished=T0 + 2 * HOUR
    )
    # still running in staging since 12:50: ten minutes of one core in 12:00-13:00
    await _task(services, staging.id, started=T0 + HOUR * 5 / 6, status=TaskStatus.RUNNING)
    # never started, and another workspace's: nothing
    await _task(services, team.id, started=None, status=TaskStatus.CANCELLED)
    await _task(services, other.id, cpu=64000, started=T0, finished=T0 + HOUR)

    principal = await _principal(services, team.id)
    found = await usage(services, principal, T0, T0 + HOUR, now=T0 + 3 * HOUR)
    rows = {(r.environment, r.pool): r for r in found.rows}
    assert set(rows) == {("main", "cpu"), ("main", "gpu-l4"), ("staging", "cpu")}
    assert rows["main", "cpu"].cpu_hours == pytest.approx(2.0)
    assert rows["main", "cpu"].gpu_hours == 0
    assert rows["main", "cpu"].gpu is None
    assert rows["main", "gpu-l4"].gpu_hours == pytest.approx(1.0)
    assert rows["main", "gpu-l4"].cpu_hours == pytest.approx(4.0)
    assert rows["main", "gpu-l4"].gpu == "L4"
    assert rows["staging", "cpu"].cpu_hours == pytest.approx(1 / 6)
    assert found.gpu_hours == pytest.approx(1.0)
    assert found.cpu_hours == pytest.approx(2.0 + 4.0 + 1 / 6)

    # adjacent periods add up to the whole
    later = await usage(services, principal, T0 + HOUR, T0 + 3 * HOUR, now=T0 + 3 * HOUR)
    whole = await usage(services, principal, T0, T0 + 3 * HOUR, now=T0 + 3 * HOUR)
    assert found.gpu_hours + later.gpu_hours == pytest.approx(whole.gpu_hours)
    assert found.cpu_hours + later.cpu_hours == pytest.approx(whole.cpu_hours)
    # a period before any task: nothing
    assert (await usage(services, principal, T0 - 2 * HOUR, T0 - HOUR)).rows == []


async def test_a_period_must_run_forwards_and_be_bounded(services: Services) -> None:
    team = await services.workspaces.get_or_create("team")
    principal = await _principal(services, team.id)
    with pytest.raises(ValueError, match="until: must be after since"):
        await usage(services, principal, T0, T0)
    with pytest.raises(ValueError, match="until: a period of at most 366 days"):
        await usage(services, principal, T0, T0 + timedelta(days=400))
    # a naive time is UTC
    naive = await usage(services, principal, datetime(2026, 12, 1), datetime(2026, 12, 2))
    assert naive.since == datetime(2026, 12, 1, tzinfo=UTC)


async def test_the_rest_route_answers_a_viewer_and_names_a_bad_field(api: Api) -> None:
    team = await api.services.workspaces.get_or_create("team")
    await _task(api.services, team.id, cpu=4000, started=T0, finished=T0 + 2 * HOUR)
    _, token = await api.services.tokens.issue("user", workspace_id=team.id, subject="v", role=Role.VIEWER)
    response = await api.client.get(
        "/api/v1/usage",
        params={"since": T0.isoformat(), "until": (T0 + HOUR).isoformat()},
        headers=bearer(token),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cpu_hours"] == pytest.approx(4.0)
    assert body["rows"] == [
        {"environment": "main", "pool": "cpu", "gpu": None, "tasks": 1, "gpu_hours": 0.0, "cpu_hours": 4.0}
    ]
    response = await api.client.get(
        "/api/v1/usage", params={"since": T0.isoformat(), "until": T0.isoformat()}, headers=bearer(token)
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("until:")
    response = await api.client.get("/api/v1/usage", params={"since": "soon"}, headers=bearer(token))
    assert response.status_code == 422
    assert "query.since" in response.text
    assert (await api.client.get("/api/v1/usage")).status_code == 401


async def test_the_usage_page_shows_the_hours_of_the_days_chosen(api: Api) -> None:
    team = await api.services.workspaces.get_or_create("team")
    await _task(api.services, team.id, cpu=3000, started=T0, finished=T0 + HOUR / 2)
    _, token = await api.services.tokens.issue("user", workspace_id=team.id, subject="v", role=Role.VIEWER)
    api.client.cookies.set("levers9_session", token, domain="levers9.test")
    page = await api.client.get("/dashboard/e/main/usage", params={"since": "2026-12-01", "until": "2026-12-01"})
    assert page.status_code == 200
    assert '<strong id="cpu-hours">1.500</strong>' in page.text
    assert '<strong id="gpu-hours">0.000</strong>' in page.text
    before = await api.client.get("/dashboard/e/main/usage", params={"since": "2026-11-01", "until": "2026-11-30"})
    assert '<strong id="cpu-hours">0.000</strong>' in before.text
