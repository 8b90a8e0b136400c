"""Who a sign-in lets in, and where: one-time links, ``levers9 up``'s own person, workspaces to enter, codes for
``levers9 login``, and the addresses sign-in pages and answers name.

Invariants:

* a one-time link (``BASE/auth/link/CODE``) names one person in one workspace (never an environment: a session
  picks its environment per page), works once and for ``auth.link_ttl_s``; it is only made for a token that acts
  for a person (:func:`make_link` refuses any other with 403, since a link must say whom it signs in);
* ``levers9 up``'s person (:data:`UP_EMAIL`) is made once and is an owner of the ``default`` workspace from then
  on; a database where someone changed that role keeps the change;
* nobody is let into a workspace they are not a member of: :func:`workspace_for` finds one they are a member of,
  or makes them a member of one whose join domain is their email's (with its join role), else answers None,
  and every session starts only after that;
* a ``levers9 login`` code (:func:`cli_code`) lives :data:`CLI_CODE_TTL_S` and is bound to the PKCE challenge,
  the person, the workspace and the environment it was made for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request

from levers9.dashboard.auth_codes import OneTimeCodes
from levers9.services.auth import PermissionDenied, Principal
from levers9.services.core import Services
from levers9.state.sql.records import Role, UserRecord, WorkspaceRecord

__all__ = [
    "CLI_CODE_TTL_S",
    "LINK",
    "UP_EMAIL",
    "Link",
    "base_url",
    "cli_code",
    "codes",
    "make_link",
    "ttl_words",
    "up_person",
    "workspace_for",
]

#: the kinds of one-time codes (each under keys of its own)
LINK = "link"
OIDC_STATE = "oidc"
CLI = "cli"
#: how long a ``levers9 login`` code waits for its exchange
CLI_CODE_TTL_S = 120.0
#: how long an OpenID Connect sign-in may take at the issuer
OIDC_STATE_TTL_S = 600.0
#: the person ``levers9 up`` signs in as (the email check wants a dot in the domain; .localhost is never routed)
UP_EMAIL = "owner@levers9.localhost"
UP_NAME = "levers9 up"


def codes(services: Services) -> OneTimeCodes:
    """The one-time codes of this controlplane, under its Redis prefix."""
    return OneTimeCodes(services.redis, services.agents.prefix)


def base_url(services: Services, request: Request | None = None) -> str:
    """Where browsers reach this controlplane: ``auth.public_url``, else the address ``request`` came to."""
    configured = services.config.auth.public_url
    if configured:
        return configured
    if request is None:
        raise ValueError("auth.public_url is not set and there is no request to take the address from")
    return str(request.base_url).rstrip("/")


def ttl_words(seconds: float) -> str:
    """``900`` -> ``15 min``; ``90`` -> ``90 s``; ``7200`` -> ``2 h``."""
    if seconds < 120:
        return f"{math.ceil(seconds)} s"
    if seconds < 7200:
        return f"{math.ceil(seconds / 60)} min"
    return f"{seconds / 3600:g} h"


@dataclass(frozen=True)
class Link:
    url: str
    expires_at: datetime


async def make_link(services: Services, user_id: str, workspace_id: str, base: str) -> Link:
    """A one-time sign-in link for the person ``user_id`` in ``workspace_id`` (a workspace, not an environment)."""
    ttl_s = services.config.auth.link_ttl_s
    code = await codes(services).put(LINK, {"user": user_id, "workspace": workspace_id}, ttl_s)
    return Link(f"{base.rstrip('/')}/auth/link/{code}", datetime.now(UTC) + timedelta(seconds=ttl_s))


async def link_for(services: Services, principal: Principal, base: str) -> Link:
    """A link for the caller's own person and workspace; PermissionDenied for a token that acts for nobody."""
    workspace = principal.workspace_root
    if principal.user_id is None or workspace is None:
        raise PermissionDenied(
            "this token acts for no person, so there is no one a sign-in link could sign in: sign in to the "
            "dashboard (or run `levers9 login`), or use the context `levers9 up` wrote, whose token is its person's"
        )
    return await make_link(services, principal.user_id, workspace, base)


async def up_person(services: Services, workspace: WorkspaceRecord) -> UserRecord:
    """``levers9 up``'s person, made an owner of ``workspace`` the first time (see the module docstring)."""
    person = await services.users.get_or_create(UP_EMAIL, UP_NAME)
    if await services.members.role_of(workspace.id, person.id) is None:
        await services.members.put(workspace.id, person.id, Role.OWNER)
    return person


async def workspace_for(services: Services, person: UserRecord) -> tuple[WorkspaceRecord, Role] | None:
    """The workspace ``person`` signs in to: the first (by name) they are a member of, else one whose join domain
    is their email's, which they join with its join role; None when there is neither."""
    mine = await services.members.workspaces_of(person.id)
    if mine:
        return mine[0]
    for workspace in await services.workspaces.joinable(person.email):
        role = Role(workspace.join_role)
        await services.members.put(workspace.id, person.id, role)
        return workspace, role
    return None


async def cli_code(services: Services, challenge: str, user_id: str, workspace_id: str, environment: str) -> str:
    payload: dict[str, Any] = {
        "challenge": challenge,
        "user": user_id,
        "workspace": workspace_id,
        "environment": environment,
    }
    return await codes(services).put(CLI, payload, CLI_CODE_TTL_S)
