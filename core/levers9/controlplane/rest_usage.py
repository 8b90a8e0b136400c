"""REST route of a workspace's usage: GPU-hours and CPU-hours by environment and pool over a period
(:mod:`levers9.services.usage` counts them; the dashboard's usage page shows the same numbers). Viewer role."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from levers9.controlplane.rest_routes import ALWAYS, USER_ERRORS, ServicesDep, Viewer
from levers9.services import usage as usage_service

__all__ = ["DEFAULT_DAYS", "UsageOut", "UsageRowOut", "router"]

router = APIRouter(prefix="/api/v1", responses={**ALWAYS, **USER_ERRORS})

#: the period asked about when none is given: the last this many days
DEFAULT_DAYS = 30


class UsageRowOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    environment: str
    pool: str
    gpu: str | None
    tasks: int
    gpu_hours: float
    cpu_hours: float


class UsageOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    since: datetime
    until: datetime
    gpu_hours: float
    cpu_hours: float
    rows: list[UsageRowOut]


@router.get("/usage")
async def get_usage(
    services: ServicesDep,
    principal: Viewer,
    since: Annotated[
        datetime | None,
        Query(description=f"Start of the period (ISO 8601; naive is UTC). Default: {DEFAULT_DAYS} days ago."),
    ] = None,
    until: Annotated[
        datetime | None, Query(description="End of the period, excluded (ISO 8601). Default: now.")
    ] = None,
) -> UsageOut:
    """GPU-hours and CPU-hours the workspace's tasks held in the period, by environment and pool (every
    environment of the workspace the token acts in). A task counts for the part of its run inside the period."""
    end = until or datetime.now(UTC)
    start = since or end - timedelta(days=DEFAULT_DAYS)
    found = await usage_service.usage(services, principal, start, end)
    return UsageOut(
        since=found.since,
        until=found.until,
        gpu_hours=found.gpu_hours,
        cpu_hours=found.cpu_hours,
        rows=[UsageRowOut(**vars(r)) for r in found.rows],
    )
