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

from levers9.services.access import is_operator, require_role, workspace_named
from levers9.services.agent_join import JOIN_PREFIX
from levers9.services.agent_messages import publish_disconnect
from levers9.services.auth import PermissionDenied, Principal
from levers9.services.core import Services
from levers9.services.hub import publish_revoked
from levers9.state.errors import Conflict, NotFound
from levers9.state.sql.members import LastOwner
from levers9.state.sql.records import (
    MAIN_ENVIRONMENT,
    MemberRecord,
    Role,
    TaskStatus,
    TokenKind,
    TokenRecord,
    WorkspaceRecord,
)
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
    environment: str = MAIN_ENVIRONMENT
    role: Role = Role.OWNER
    #: the person the token acts for ("" for a service token)
    email: str = ""


async def whoami(services: Services, principal: Principal) -> Caller:
    """The caller's workspace (not environment: its name is the workspace's), environment, role and token."""
    principal.require_workspace()
    root = principal.workspace_root or ""
    workspace = await services.workspaces.get(root)
    user = None if principal.user_id is None else await services.users.get(principal.user_id)
    return Caller(
        root,
        workspace.name if workspace else "",
        principal.token_id,
        environment=principal.environment,
        role=principal.role,
        email="" if user is None else user.email,
    )


async def list_workspaces(services: Services, principal: Principal) -> list[WorkspaceRecord]:
    """Every workspace for an operator; a person's, those they are a member of; a service token's, its own."""
    if is_operator(principal):
        return await services.workspaces.list()
    if principal.user_id is not None:
        return [workspace for workspace, _ in await services.members.workspaces_of(principal.user_id)]
    own = await services.workspaces.get(principal.workspace_root or "")
    return [] if own is None else [own]


async def create_workspace(services: Services, principal: Principal, name: str) -> WorkspaceRecord:
    """A new workspace: an operator may make one; so may a person, who becomes its owner."""
    if not is_operator(principal) and principal.user_id is None:
        raise PermissionDenied(
            "only an operator or a signed-in person may create workspaces; this token is a workspace's service token"
        )
    workspace = await services.workspaces.create(name)
    if principal.user_id is not None:
        await services.members.put(workspace.id, principal.user_id, Role.OWNER)
    return workspace


# ----------------------------------------------------------------- members


async def _root(services: Services, principal: Principal, workspace: str | None, action: str) -> str:
    """The workspace (never an environment) the caller manages: its own, or for an operator the one named."""
    if principal.workspace_root is not None:
        if workspace is not None:
            own = await services.workspaces.get(principal.workspace_root)
            if own is None or own.name != workspace:
                raise PermissionDenied(f"a workspace's token may only {action} its own workspace")
        return principal.workspace_root
    if workspace is None:
        raise PermissionDenied(f"an operator token is bound to no workspace: name the workspace to {action}")
    record = await services.workspaces.by_name(workspace)
    if record is None or record.parent_id is not None:
        raise NotFound("workspace", workspace)
    return record.id


async def list_members(services: Services, principal: Principal, workspace: str | None = None) -> list[MemberRecord]:
    """The workspace's members and their roles (any member may see who else is)."""
    return await services.members.list(await _root(services, principal, workspace, "list the members of"))


async def invite(
    services: Services, principal: Principal, email: str, role: Role | str, workspace: str | None = None
) -> tuple[MemberRecord, bool]:
    """Make the person with ``email`` a member with ``role`` (or change their role); they sign in with that
    email. Owners only. (the member, whether they are new)."""
    require_role(principal, Role.OWNER, "invite people or change their roles")
    root = await _root(services, principal, workspace, "invite people to")
    user = await services.users.get_or_create(email)
    try:
        made = await services.members.put(root, user.id, role)
    except LastOwner as exc:
        raise Conflict(str(exc)) from None
    services.auth.forget_user(user.id)  # a new role holds at once here, within the auth cache's life elsewhere
    return made


async def remove_member(services: Services, principal: Principal, email: str, workspace: str | None = None) -> int:
    """End a person's membership and revoke every token they hold in the workspace and its environments, at
    once on every replica; how many tokens were revoked. Owners only."""
    require_role(principal, Role.OWNER, "remove people")
    root = await _root(services, principal, workspace, "remove people from")
    user = await services.users.by_email(email)
    try:
        removed = user is not None and await services.members.remove(root, user.id)
    except LastOwner as exc:
        raise Conflict(str(exc)) from None
    if not removed or user is None:
        raise NotFound("member", email)
    scopes = [env.id for env in await services.workspaces.environments(root)]
    revoked = await services.tokens.revoke_user(scopes, user.id)
    await _tell_revoked(services, revoked)
    return len(revoked)


async def set_join_domain(
    services: Services, principal: Principal, domain: str | None, role: Role | str = Role.MEMBER
) -> WorkspaceRecord:
    """Let anyone whose verified email is at ``domain`` join as ``role`` when they sign in (None: invitations
    only). Owners only."""
    require_role(principal, Role.OWNER, "change who may join")
    if Role(str(role)) is Role.OWNER:
        raise ValueError("role: people joining by their email's domain may be viewers or members, not owners")
    return await services.workspaces.set_join(
        await _root(services, principal, None, "change who may join"), domain, role
    )


# ----------------------------------------------------------------- environments


async def list_environments(services: Services, principal: Principal) -> list[WorkspaceRecord]:
    root = await _root(services, principal, None, "list the environments of")
    return await services.workspaces.environments(root)


async def create_environment(services: Services, principal: Principal, name: str) -> WorkspaceRecord:
    """A new environment of the caller's workspace: its own apps, deployments, secrets, volumes and tokens.
    Owners only."""
    require_role(principal, Role.OWNER, "create environments")
    root = await _root(services, principal, None, "create environments in")
    return await services.workspaces.create_environment(root, name)


async def _in_use(services: Services, environment_id: str) -> list[str]:
    """What in an environment still runs or keeps data outside the database: deleting it would strand them."""
    found = []
    unfinished = await services.tasks.for_workspace(
        environment_id, statuses=[TaskStatus.PENDING.value, TaskStatus.RUNNING.value], limit=1000
    )
    if unfinished:
        found.append(f"{len(unfinished)} unfinished task(s) (levers9 cancel)")
    live = [
        d.name
        for d, versions in await services.deployments.for_workspace(environment_id)
        if any(v.stopped_at is None for v in versions)
    ]
    if live:
        found.append(f"deployments serving: {', '.join(sorted(live))} (levers9 deploy stop)")
    volumes = [v.name for v in await services.volumes.list(environment_id)]
    if volumes:
        found.append(f"volumes: {', '.join(sorted(volumes))} (levers9 volume delete)")
    return found


async def delete_environment(services: Services, principal: Principal, name: str) -> WorkspaceRecord:
    """Delete an environment and everything stored in it; refused (409) while anything in it still runs or
    holds data outside the database, and for ``main``. Owners only."""
    require_role(principal, Role.OWNER, "delete environments")
    root = await _root(services, principal, None, "delete environments of")
    env = await services.workspaces.environment(root, name)
    if env is None:
        raise NotFound("environment", name)
    if env.parent_id is None:
        raise Conflict("the main environment is the workspace itself and cannot be deleted")
    busy = await _in_use(services, env.id)
    if busy:
        raise Conflict(f"environment {env.environment!r} still has {', '.join(busy)}: stop or delete them first")
    tokens = [t.id for t in await services.tokens.list_for_workspace(env.id) if t.revoked_at is None]
    await services.workspaces.delete_environment(env.id)
    services.auth.forget_environment(root, env.environment)
    await _tell_revoked(services, tokens)
    return env


async def workspace_id_named(services: Services, name: str) -> str | None:
    """The id of the workspace called ``name``; None when there is none (for URLs that name a workspace)."""
    record = await services.workspaces.by_name(name)
    return None if record is None else record.id


async def list_tokens(services: Services, principal: Principal, workspace: str | None) -> list[TokenRecord]:
    """Tokens of ``workspace`` (by name; omitted: the caller's own, for an operator those bound to none)."""
    workspace_id = await workspace_named(services, principal, workspace, "list the tokens of")
    return await services.tokens.list_for_workspace(workspace_id)


async def issue_token(
    services: Services,
    principal: Principal,
    workspace: str | None,
    *,
    subject: str | None,
    ttl_s: float | None,
    role: Role | str | None = None,
) -> tuple[TokenRecord, str]:
    """A new user token for ``workspace`` (as :func:`list_tokens` names it); (its record, the token itself).

    Issued from the workspace's main environment, it may act in any of its environments; from another
    environment, in that one only. It acts for the caller's person, if any (removing them revokes it), and
    may do at most ``role`` (default: the caller's role), never more than the caller."""
    workspace_id = await workspace_named(services, principal, workspace, "issue tokens for")
    wanted = principal.role if role is None else Role(str(role))
    if not principal.role.allows(wanted):
        raise PermissionDenied(f"a {principal.role.value} cannot issue a token that acts as an {wanted.value}")
    return await services.tokens.issue(
        TokenKind.USER.value,
        workspace_id=workspace_id,
        subject=subject,
        ttl_s=ttl_s,
        user_id=principal.user_id if workspace_id is not None else None,
        role=wanted if workspace_id is not None else None,
    )


async def _tell_revoked(services: Services, token_ids: list[str]) -> None:
    """Tokens were revoked: their streams here end now, and on the other replicas as soon as they hear of it."""
    if not token_ids:
        return
    services.auth.revoked(token_ids)
    try:
        await publish_revoked(services.redis, token_ids, sender=services.scheduler.name, prefix=services.agents.prefix)
    except Exception as exc:
        log.warning(
            "could not tell the other replicas that tokens %s are revoked (their re-check will): %s", token_ids, exc
        )


async def revoke_token(services: Services, principal: Principal, token_id: str) -> TokenRecord:
    """Revoke one of the caller's workspace's tokens (any, for an operator); the token as it is now."""
    record = await services.tokens.get(token_id)
    if record is None or not (is_operator(principal) or record.workspace_id == principal.workspace_id):
        raise NotFound("token", token_id)
    await services.tokens.revoke(token_id)
    await _tell_revoked(services, [token_id])
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
