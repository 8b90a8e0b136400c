"""The REST API's routes for who may act in a workspace: the caller itself, members, the email domain that may
join, and environments. Each route names the role it needs (see :mod:`levers9.services.access`); the service
layer (:mod:`levers9.services.workspaces`) decides everything else."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from levers9.controlplane.rest_routes import ALWAYS, USER_ERRORS, Owner, ServicesDep, Viewer, error_doc
from levers9.controlplane.rest_schemas import (
    EnvironmentCreate,
    EnvironmentOut,
    JoinPut,
    MemberOut,
    MemberPut,
    MeOut,
    WorkspaceOut,
    environment_out,
)
from levers9.services import workspaces

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses={**ALWAYS, **USER_ERRORS})
Email = Annotated[str, Path(min_length=3, max_length=320, description="The person's email address.")]


@router.get("/me")
async def me(services: ServicesDep, principal: Viewer) -> MeOut:
    """The workspace, environment and role the token acts with, and the person it acts for (never the token)."""
    caller = await workspaces.whoami(services, principal)
    return MeOut(
        workspace_id=caller.workspace_id,
        workspace=caller.workspace_name,
        environment=caller.environment,
        role=caller.role,
        token_id=caller.token_id,
        email=caller.email,
    )


@router.get("/members")
async def list_members(services: ServicesDep, principal: Viewer) -> list[MemberOut]:
    """The workspace's members and their roles, owners first."""
    return [MemberOut.model_validate(m) for m in await workspaces.list_members(services, principal)]


@router.put(
    "/members/{email}",
    responses={
        200: {"model": MemberOut, "description": "Their role changed"},
        201: {"model": MemberOut, "description": "Invited"},
        409: error_doc("It would leave the workspace without an owner"),
    },
)
async def put_member(
    services: ServicesDep, principal: Owner, email: Email, body: MemberPut, response: Response
) -> MemberOut:
    """Invite the person with this email (201), or change their role (200). They sign in with that email."""
    member, created = await workspaces.invite(services, principal, email, body.role)
    if created:
        response.status_code = 201
    return MemberOut.model_validate(member)


@router.delete(
    "/members/{email}",
    status_code=204,
    responses={404: error_doc("No member with that email"), 409: error_doc("That is the only owner")},
)
async def remove_member(services: ServicesDep, principal: Owner, email: Email) -> Response:
    """End their membership; every token they hold in the workspace and its environments is revoked."""
    await workspaces.remove_member(services, principal, email)
    return Response(status_code=204)


@router.put("/workspace/join")
async def put_join(services: ServicesDep, principal: Owner, body: JoinPut) -> WorkspaceOut:
    """Who may join without an invitation: people whose verified email is at ``domain``, as ``role``."""
    return WorkspaceOut.model_validate(await workspaces.set_join_domain(services, principal, body.domain, body.role))


@router.get("/environments")
async def list_environments(services: ServicesDep, principal: Viewer) -> list[EnvironmentOut]:
    """The workspace's environments, main first."""
    return [environment_out(e) for e in await workspaces.list_environments(services, principal)]


@router.post(
    "/environments", status_code=201, responses={409: error_doc("The workspace has an environment of that name")}
)
async def create_environment(services: ServicesDep, principal: Owner, body: EnvironmentCreate) -> EnvironmentOut:
    """A new environment: its own apps, deployments, secrets, volumes and tokens."""
    return environment_out(await workspaces.create_environment(services, principal, body.name))


@router.delete(
    "/environments/{name}",
    responses={
        404: error_doc("No environment of that name"),
        409: error_doc("main, or one where tasks, deployments or volumes remain"),
    },
)
async def delete_environment(services: ServicesDep, principal: Owner, name: str) -> EnvironmentOut:
    """Delete an environment with its apps, secrets and tokens; refused while tasks run, deployments serve or
    volumes remain in it (the answer says which)."""
    return environment_out(await workspaces.delete_environment(services, principal, name))
