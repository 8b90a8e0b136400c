"""REST routes (being built: issue 40)."""

from __future__ import annotations

from fastapi import APIRouter

from levers9.controlplane.rest_routes import ALWAYS, USER_ERRORS

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses={**ALWAYS, **USER_ERRORS})
