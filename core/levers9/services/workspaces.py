"""Workspaces and the user tokens that act in them: who the caller is, creating, listing and revoking.

Operators (user tokens bound to no workspace) create workspaces and issue
tokens for any of them; a workspace's token sees and issues only its own.
A token is shown once, when issued: listings carry metadata only, and its hash
never leaves the store. Revoking takes effect at once on this replica and, as
fast as Redis carries the notice, on the others (:func:`~levers9.services.hub.publish_revoked`):
each forgets the token and ends the streams it opened there. Were the notice
lost, a replica still refuses the token within the auth cache's lifetime
(:data:`~levers9.services.auth.CACHE_S`) and ends its streams within
:data:`~levers9.services.revocation.RECHECK_S`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from levers9.services.access import is_operator, require_operator, workspace_named
from levers9.services.agent_join import JOIN_PREFIX
from levers9.services.agent_messages import publish_disconnect
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.hub import publish_revoked
from levers9.state.errors import NotFound
from levers9.state.sql.records import TokenKind, TokenRecord, WorkspaceRecord
from levers9.state.sql.workspaces import MAX_TOKEN_TTL_S

log = logging.getLogger(__name__)

__all__ = [
    "MAX_TOKEN_TTL_S",
    "Caller",
    "create_workspace",
    "issue_token",
    "list_tokens",
    "list_workspaces",
    "revoke_token",
    "whoami",
    "workspace_id_named",
]


@dataclass(frozen=True)
class Caller:
    workspace_id: str
    workspace_name: str
    token_id: str


async def whoami(services: Services, principal: Principal) -> Caller:
    """The caller's workspace and token."""
    workspace_id = principal.require_workspace()
    workspace = await services.workspaces.get(workspace_id)
    return Caller(workspace_id, workspace.name if workspace else "", principal.token_id)


async def list_workspaces(services: Services, principal: Principal) -> list[WorkspaceRecord]:
    """Every workspace for an operator; the caller's own otherwise."""
    if is_operator(principal):
        return await services.workspaces.list()
    own = await services.workspaces.get(principal.workspace_id or "")
    return [] if own is None else [own]


async def create_workspace(services: Services, principal: Principal, name: str) -> WorkspaceRecord:
    require_operator(principal, "create workspaces")
    return await services.workspaces.create(name)


async def workspace_id_named(services: Services, name: str) -> str | None:
    """The id of the workspace called ``name``; None when there is none (for URLs that name a workspace)."""
    record = await services.workspaces.by_name(name)
    return None if record is None else record.id


async def list_tokens(services: Services, principal: Principal, workspace: str | None) -> list[TokenRecord]:
    """Tokens of ``workspace`` (by name; omitted: the caller's own, for an operator those bound to none)."""
    workspace_id = await workspace_named(services, principal, workspace, "list the tokens of")
    return await services.tokens.list_for_workspace(workspace_id)


async def issue_token(
    services: Services, principal: Principal, workspace: str | None, *, subject: str | None, ttl_s: float | None
) -> tuple[TokenRecord, str]:
    """A new user token for ``workspace`` (as :func:`list_tokens` names it); (its record, the token itself)."""
    workspace_id = await workspace_named(services, principal, workspace, "issue tokens for")
    return await services.tokens.issue(TokenKind.USER.value, workspace_id=workspace_id, subject=subject, ttl_s=ttl_s)


async def revoke_token(services: Services, principal: Principal, token_id: str) -> TokenRecord:
    """Revoke one of the caller's workspace's tokens (any, for an operator); the token as it is now."""
    record = await services.tokens.get(token_id)
    if record is None or not (is_operator(principal) or record.workspace_id == principal.workspace_id):
        raise NotFound("token", token_id)
    await services.tokens.revoke(token_id)
    services.auth.revoked([token_id])  # its streams here end now
    try:  # and on the other replicas as soon as they hear of it
        await publish_revoked(services.redis, [token_id], sender=services.scheduler.name, prefix=services.agents.prefix)
    except Exception as exc:
        log.warning(
            "could not tell the other replicas that token %s is revoked (their re-check will): %s", token_id, exc
        )
    if record.kind == TokenKind.AGENT.value and record.subject and not record.subject.startswith(JOIN_PREFIX):
        # an agent's stream re-checks its credential only now and then: cut it now, on every replica
        try:
            await publish_disconnect(
                services.redis, services.agents.prefix, record.subject, "this agent's credential was revoked"
            )
        except Exception as exc:
            log.warning("could not ask the replicas to cut agent %s's stream: %s", record.subject, exc)
    revoked = await services.tokens.get(token_id)
    if revoked is None:
        raise NotFound("token", token_id)
    return revoked
