"""Who may do what: every authorisation rule of the controlplane, written once for every transport.

* a *user* token bound to a workspace acts on that workspace only; another
  workspace's task, token or deployment is reported exactly like a missing one
  (:class:`~levers9.state.errors.NotFound`), so ids cannot be probed;
* a user token bound to no workspace is an *operator's*: it manages
  workspaces, sees machines, every pool and every worker, but has no tasks;
* shared pools and their workers are everyone's; an attached cluster's are its
  workspace's (and operators');
* worker, agent and machine tokens never reach the user APIs: their holders run
  other people's code;
* a deployed endpoint or box is served to its own workspace's tokens, and to
  anyone (a token of another workspace, or none) only when it is public;
* within a workspace, a caller's :class:`~levers9.state.sql.records.Role` bounds
  what it may do (:func:`require_role`): viewers read, members run and deploy,
  owners manage members, secrets, tokens and environments. Every operation of
  every transport names the role it needs when it authenticates (REST's
  ``Viewer``/``Member``/``Owner`` dependencies, gRPC's ``_user(context, role)``);
  tests/controlplane/test_roles.py holds the table of what each needs and tries
  each with each role. An operator may do everything;
* an environment is a workspace of its own for isolation (see
  :class:`~levers9.services.auth.Principal`): a token acts in its own
  environment, or, when issued for the workspace rather than one environment,
  in the one its request names (:func:`authenticate_user`'s ``environment``).
"""

from __future__ import annotations

from levers9.services.auth import PermissionDenied, Principal
from levers9.services.core import Services
from levers9.state.errors import NotFound
from levers9.state.redis.workers import WorkerState
from levers9.state.sql.records import Role, TaskRecord, TokenKind

__all__ = [
    "authenticate_user",
    "is_operator",
    "may_call_served",
    "own_workspace",
    "owned_task",
    "require_operator",
    "require_role",
    "visible",
    "worker_visible",
    "workspace_named",
]


async def authenticate_user(
    services: Services, token: str | None, needed: Role = Role.VIEWER, *, environment: str | None = None
) -> Principal:
    """The user behind ``token``, acting in ``environment`` (None: the token's own), allowed what ``needed``
    allows; 403 for any other kind of token (worker, agent, machine) or too small a role, 401 for no valid token,
    404 for an environment its workspace does not have."""
    principal = await services.auth.verify(token)
    if principal.kind is not TokenKind.USER:
        raise PermissionDenied(
            f"this API takes user tokens; a {principal.kind.value} token belongs to a worker, agent or machine "
            "and cannot manage workspaces, tokens or tasks"
        )
    principal = await in_environment(services, principal, environment)
    require_role(principal, needed)
    return principal


async def in_environment(services: Services, principal: Principal, environment: str | None) -> Principal:
    """``principal`` acting in the environment a request names (None or its own: as it is)."""
    name = (environment or "").strip().lower()
    if not name or name == principal.environment:
        return principal
    if principal.workspace_root is None:
        raise PermissionDenied(
            f"an operator token is bound to no workspace, so it has no environment {name!r}; use a workspace's token"
        )
    if principal.environment_bound:
        raise PermissionDenied(
            f"this token was issued for environment {principal.environment!r} only; it cannot act in {name!r} "
            "(use a token of the workspace, such as the one `levers9 login` saves)"
        )
    found = await services.auth.environment(principal.workspace_root, name)
    if found is None:
        raise NotFound("environment", name)
    return principal.in_environment(found)


def require_role(principal: Principal, needed: Role, action: str | None = None) -> None:
    """PermissionDenied unless ``principal``'s role allows what ``needed`` does."""
    if not principal.role.allows(needed):
        doing = f" to {action}" if action else ""
        raise PermissionDenied(
            f"this needs the {needed.value} role{doing}; this token acts as a {principal.role.value} of its "
            "workspace (an owner can change that with `levers9 workspace members`)"
        )


def is_operator(principal: Principal) -> bool:
    return principal.workspace_id is None


def may_call_served(caller: Principal | None, workspace_id: str, *, public: bool) -> bool:
    """Whether ``caller`` (None: no token) may call a served stub of ``workspace_id`` (the gateway answers 404
    otherwise, or 401 without a token, exactly as for a missing one)."""
    return public or (caller is not None and caller.workspace_id == workspace_id)


def require_operator(principal: Principal, action: str) -> None:
    if not is_operator(principal):
        raise PermissionDenied(f"only an operator token (a user token bound to no workspace) may {action}")


def own_workspace(principal: Principal, action: str) -> str:
    """The caller's workspace; an operator has none and is told how to act on one."""
    if principal.workspace_id is None:
        raise PermissionDenied(
            f"an operator token is bound to no workspace, so it cannot {action}; issue a token for the "
            "workspace (POST /api/v1/tokens with its name) and use that"
        )
    return principal.workspace_id


def visible(principal: Principal, owner: str | None) -> bool:
    """Shared pools and workers are everyone's; an attached cluster's are its workspace's (and operators')."""
    return owner is None or is_operator(principal) or owner == principal.workspace_root


def worker_visible(services: Services, principal: Principal, state: WorkerState) -> bool:
    spec = services.pools.get(state.info.pool)
    return visible(principal, state.info.workspace) and (spec is None or visible(principal, spec.workspace))


async def workspace_named(services: Services, principal: Principal, name: str | None, action: str) -> str | None:
    """The id of the workspace ``name`` the caller acts on: its own when omitted (None for an operator)."""
    if principal.workspace_id is not None:
        if name is not None:
            own = await services.workspaces.get(principal.workspace_id)
            if own is None or own.name != name:
                raise PermissionDenied(f"a workspace token may only {action} its own workspace")
        return principal.workspace_id
    if name is None:
        return None
    record = await services.workspaces.by_name(name)
    if record is None:
        raise NotFound("workspace", name)
    return record.id


async def owned_task(services: Services, principal: Principal, task_id: str, action: str = "see tasks") -> TaskRecord:
    """The caller's task; another workspace's is reported exactly like a missing one, so ids cannot be probed."""
    workspace = own_workspace(principal, action)
    task = await services.tasks.get(task_id)
    if task is None or task.workspace_id != workspace:
        raise NotFound("task", task_id)
    return task
