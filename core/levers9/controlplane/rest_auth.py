"""The REST API's route for signing people in to the dashboard: a one-time sign-in link for the caller.

``POST /api/v1/auth/links`` (any member, a viewer included) answers a link that signs its holder in to the
dashboard once, as the caller's person in the caller's workspace (see :mod:`levers9.dashboard.auth_signin`):
``levers9 dashboard`` opens it. A token that acts for no person (an operator's, a service's, one made before
sign-in existed) gets 403 saying how to get one that does. The link is as good as a session until it is used or
expires, so it is only ever answered to the caller, never logged.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel

from levers9.controlplane.rest_routes import ALWAYS, USER_ERRORS, ServicesDep, Viewer
from levers9.dashboard.auth_signin import base_url, link_for

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses={**ALWAYS, **USER_ERRORS})


class SignInLinkOut(BaseModel):
    """A one-time sign-in link: it works once, until ``expires_at``."""

    url: str
    expires_at: datetime


@router.post("/auth/links", status_code=201)
async def create_sign_in_link(services: ServicesDep, principal: Viewer, request: Request) -> SignInLinkOut:
    """A one-time link that signs its holder in to the dashboard as the caller's person, in its workspace."""
    link = await link_for(services, principal, base_url(services, request))
    return SignInLinkOut(url=link.url, expires_at=link.expires_at)
