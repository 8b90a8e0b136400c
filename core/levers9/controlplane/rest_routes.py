"""The REST API's routes under ``/api/v1``: each parses its request, calls one service, renders the answer.

Who may do what is decided in :mod:`levers9.services` (see
:mod:`levers9.services.access`), never here: this module only knows that every
route but ``/health`` needs a user token (:func:`_caller`).

Every route's OpenAPI ``responses`` list each status it can answer, each error
with the error body's schema (:class:`ErrorBody`): :data:`ALWAYS` on every
route (405 with its ``Allow`` header, 500), :data:`USER_ERRORS` on every route
behind a user token (one entry per status of the domain error table
:data:`levers9.services.errors.ERRORS`, which the app's exception handlers
answer, and 422 for validation), and the route's own beside them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from levers9.controlplane.rest_schemas import (
    MAX_TASKS_LISTED,
    MAX_VERSION,
    CancelOut,
    ClusterJoin,
    ClusterJoined,
    ClusterOut,
    ClusterRemoved,
    DeploymentOut,
    DeploymentVersionOut,
    ErrorBody,
    Health,
    IssuedToken,
    JoinedMachineCreate,
    JoinedMachineCreated,
    JoinedMachineOut,
    JoinedMachineRemoved,
    MachineOut,
    PlacementOut,
    PoolOut,
    SecretCreate,
    SecretOut,
    TaskDetail,
    TaskOut,
    TokenCreate,
    TokenOut,
    WheelList,
    WheelOut,
    WorkerOut,
    WorkspaceCreate,
    WorkspaceOut,
    cluster_out,
    deployment_out,
    joined_machine_out,
    pool_out,
    secret_out,
    task_out,
    token_out,
    worker_out,
)
from levers9.controlplane.wheels import OwnWheels
from levers9.services import deployments, machines, pools, secrets, tasks, workspaces
from levers9.services import health as health_service
from levers9.services.access import authenticate_user
from levers9.services.agent_pools import clusters, joined_machines
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.errors import ERRORS
from levers9.state.sql.records import MachineState, Role, TaskStatus

__all__ = [
    "ALWAYS",
    "ENVIRONMENT_HEADER",
    "USER_ERRORS",
    "Member",
    "Owner",
    "Responses",
    "ServicesDep",
    "Viewer",
    "error_doc",
    "router",
]

Responses = dict[int | str, dict[str, Any]]


def error_doc(description: str) -> dict[str, Any]:
    """An error answer of a route, for its OpenAPI ``responses``."""
    return {"model": ErrorBody, "description": description}


_error = error_doc


#: what any route may answer, whatever it does
ALWAYS: Responses = {
    405: {
        **_error("The path does not take this method (type `method_not_allowed`)"),
        "headers": {
            "Allow": {"description": "Every method the path takes, comma-separated", "schema": {"type": "string"}}
        },
    },
    500: _error("A fault of the controlplane (type `internal`); its log has the details"),
}

#: what each status of the domain error table means to a caller of the REST API
_MEANING = {
    400: "A value the service refused, naming the field and what it accepts, or a body that is not UTF-8 text",
    401: "No token, or an unknown, revoked or expired one",
    403: "Not a user token, or outside the token's scope",
    404: "No such object, or one outside the token's workspace",
    409: "The request conflicts with what exists",
    507: "The controlplane's data directory is full: new work is refused until space is freed there",
}


def _user_errors() -> Responses:
    kinds: dict[int, list[str]] = {}
    for _, status, kind in ERRORS:
        kinds.setdefault(status, []).append(f"`{kind}`")
    responses: Responses = {
        status: _error(f"{_MEANING.get(status, 'A domain error')} (type {' or '.join(names)})")
        for status, names in sorted(kinds.items())
    }
    responses[422] = _error(
        "A parameter or body field is not valid, or the body is not JSON (type `validation_error`, "
        "with each field and what it accepts)"
    )
    return responses


#: what every route behind a user token may answer besides its own: each domain error, and validation
USER_ERRORS: Responses = _user_errors()

_bearer = HTTPBearer(auto_error=False, description="A user token: `Authorization: Bearer l9_user_...`")


# the dependencies are coroutines: FastAPI runs a plain function in a worker thread, a hop per request
async def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _dataplane(request: Request) -> DataPlane:
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


#: the header naming the environment a request acts in, for a token issued for its whole workspace
ENVIRONMENT_HEADER = "X-Levers9-Environment"


def _caller(needed: Role) -> Callable[..., Awaitable[Principal]]:
    """The dependency that authenticates a route's caller and checks its role allows ``needed``."""

    async def caller(
        services: Annotated[Services, Depends(_services)],
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        environment: Annotated[
            str | None,
            Header(
                alias=ENVIRONMENT_HEADER,
                description="The environment to act in (a token issued for its whole workspace; default main).",
            ),
        ] = None,
    ) -> Principal:
        token = None if credentials is None else credentials.credentials
        return await authenticate_user(services, token, needed, environment=environment)

    caller.__name__ = f"caller_{needed.value}"
    return caller


ServicesDep = Annotated[Services, Depends(_services)]
DataPlaneDep = Annotated[DataPlane, Depends(_dataplane)]
#: a caller who may read (any member of the workspace)
Viewer = Annotated[Principal, Depends(_caller(Role.VIEWER))]
#: a caller who may run, deploy and stop
Member = Annotated[Principal, Depends(_caller(Role.MEMBER))]
#: a caller who may manage the workspace: its members, secrets, tokens and environments
Owner = Annotated[Principal, Depends(_caller(Role.OWNER))]

#: the routes that take no token, so answer none of the user token's errors
_open = APIRouter(prefix="/api/v1", responses=ALWAYS)


@_open.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Degraded"}})
async def health(services: ServicesDep, response: Response) -> Health:
    """Unauthenticated, for load balancers: 503 when the database or Redis does not answer, or the data
    directory is full (new work is refused then)."""
    report = await health_service.health(services)
    if report.degraded:
        response.status_code = 503
    return Health(
        status="degraded" if report.degraded else "ok", database=report.database, redis=report.redis, disk=report.disk
    )


def _wheels(request: Request) -> OwnWheels:
    wheels: OwnWheels = request.app.state.wheels
    return wheels


def _wheel_base(request: Request) -> str:
    """The advertised HTTP URL, else the URL this request came to (the app served without a listener's own)."""
    return _wheels(request).http_url or str(request.base_url)


@_open.get("/wheels")
async def list_wheels(request: Request) -> WheelList:
    """levers9's own wheels, which boxes install the agent from (no token: the code is not secret, and a box
    fetches it before it holds a credential). Each with its sha256: check it before installing."""
    wheels = _wheels(request)
    base = _wheel_base(request)
    return WheelList(
        wheels=[
            WheelOut(filename=w.filename, sha256=w.sha256, size=w.size, url=wheels.url(w, base))
            for w in await wheels.wheels()
        ]
    )


@_open.get(
    "/wheels/{name}",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The wheel file"},
        404: _error("No wheel of that name is served (type `not_found`; the message lists those that are)"),
        422: _error("A parameter is not valid (type `validation_error`)"),
    },
)
async def get_wheel(request: Request, name: str) -> Response:
    """One of the wheels ``GET /api/v1/wheels`` lists, by its file name; nothing else is ever read or relayed."""
    wheels = _wheels(request)
    found = await wheels.find(name)
    if found is None:
        served = ", ".join(w.filename for w in await wheels.wheels())
        raise HTTPException(404, f"no wheel {name!r} is served here; the wheels served: {served}")
    return Response(
        found.data,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{found.filename}"', "X-Checksum-Sha256": found.sha256},
    )


#: the routes behind a user token (:data:`Caller`)
_user = APIRouter(prefix="/api/v1", responses={**ALWAYS, **USER_ERRORS})


@_user.get("/workspaces")
async def list_workspaces(services: ServicesDep, principal: Viewer) -> list[WorkspaceOut]:
    return [WorkspaceOut.model_validate(r) for r in await workspaces.list_workspaces(services, principal)]


@_user.post("/workspaces", status_code=201)
async def create_workspace(services: ServicesDep, principal: Owner, body: WorkspaceCreate) -> WorkspaceOut:
    return WorkspaceOut.model_validate(await workspaces.create_workspace(services, principal, body.name))


@_user.get("/tokens")
async def list_tokens(
    services: ServicesDep,
    principal: Owner,
    workspace: Annotated[
        str | None,
        Query(description="Operators: the workspace's name (omitted: the tokens bound to no workspace)."),
    ] = None,
) -> list[TokenOut]:
    """Metadata only: a token is shown once when issued, and its hash never leaves the store."""
    return [token_out(r) for r in await workspaces.list_tokens(services, principal, workspace)]


@_user.post("/tokens", status_code=201)
async def create_token(services: ServicesDep, principal: Owner, body: TokenCreate) -> IssuedToken:
    record, token = await workspaces.issue_token(
        services, principal, body.workspace, subject=body.subject, ttl_s=body.ttl_s, role=body.role
    )
    return IssuedToken.model_validate({**token_out(record).model_dump(), "token": token})


@_user.delete("/tokens/{token_id}")
async def revoke_token(services: ServicesDep, principal: Owner, token_id: str) -> TokenOut:
    """Takes effect at once on this replica and within the auth cache's lifetime on the others."""
    return token_out(await workspaces.revoke_token(services, principal, token_id))


@_user.get("/pools")
async def list_pools(services: ServicesDep, principal: Viewer) -> list[PoolOut]:
    return [pool_out(p) for p in await pools.list_pools(services, principal)]


@_user.get("/workers")
async def list_workers(
    services: ServicesDep,
    principal: Viewer,
    pool: Annotated[str | None, Query(description="Only this pool's workers.")] = None,
) -> list[WorkerOut]:
    return [worker_out(w) for w in await pools.list_workers(services, principal, pool)]


@_user.get("/machines")
async def list_machines(
    services: ServicesDep,
    principal: Viewer,
    pool: Annotated[str | None, Query(description="Only this pool's machines.")] = None,
    state: Annotated[list[MachineState] | None, Query(description="Only machines in these states.")] = None,
) -> list[MachineOut]:
    states = None if state is None else [s.value for s in state]
    return [
        MachineOut.model_validate(r)
        for r in await machines.list_machines(services, principal, pool=pool, states=states)
    ]


@_user.get("/tasks")
async def list_tasks(
    dataplane: DataPlaneDep,
    principal: Viewer,
    status: Annotated[list[TaskStatus] | None, Query(description="Only tasks with these statuses.")] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_TASKS_LISTED, description=f"At most this many (1-{MAX_TASKS_LISTED}), newest first.")
    ] = 100,
) -> list[TaskOut]:
    statuses = None if status is None else [s.value for s in status]
    return [task_out(r) for r in await tasks.list_tasks(dataplane, principal, statuses=statuses, limit=limit)]


@_user.get("/tasks/{task_id}", responses={404: _error("No such task, or another workspace's")})
async def get_task(dataplane: DataPlaneDep, principal: Viewer, task_id: str) -> TaskDetail:
    return TaskDetail.model_validate(await tasks.get_task(dataplane, principal, task_id))


@_user.get("/tasks/{task_id}/history", responses={404: _error("No such task, or another workspace's")})
async def task_history(dataplane: DataPlaneDep, principal: Viewer, task_id: str) -> list[PlacementOut]:
    return [PlacementOut.model_validate(e) for e in await tasks.task_history(dataplane, principal, task_id)]


@_user.post("/tasks/{task_id}/cancel", responses={404: _error("No such task, or another workspace's")})
async def cancel_task(dataplane: DataPlaneDep, principal: Member, task_id: str) -> CancelOut:
    """Stop the task: its worker is told to end it (its process and the processes it started).

    Cancelling a task that already finished is not an error: it answers ``cancelled: false``.
    The same operation as gRPC's CancelTask (``levers9 cancel``).
    """
    cancelled, task = await tasks.cancel_task(dataplane, principal, task_id)
    return CancelOut(cancelled=cancelled, task=task_out(task))


@_user.get("/secrets")
async def list_secrets(services: ServicesDep, principal: Viewer) -> list[SecretOut]:
    """The workspace's secrets, by name: names and times only, never values."""
    return [secret_out(s) for s in await secrets.list_secrets(services, principal)]


@_user.post("/secrets", status_code=201, responses={200: {"model": SecretOut, "description": "Replaced"}})
async def put_secret(services: ServicesDep, principal: Owner, body: SecretCreate, response: Response) -> SecretOut:
    """Create a secret (201), or replace the value of one of the same name (200). The value is not echoed.

    Functions naming it in ``secrets=[...]`` see it as an environment variable; containers already
    running keep the value they started with.
    """
    info, created = await secrets.put_secret(services, principal, body.name, body.value)
    if not created:
        response.status_code = 200
    return secret_out(info)


@_user.delete("/secrets/{name}", status_code=204, responses={404: _error("The workspace has no secret of that name")})
async def delete_secret(services: ServicesDep, principal: Owner, name: str) -> Response:
    """Delete a secret of the caller's workspace; 204, or 404 when it has none of that name."""
    await secrets.delete_secret(services, principal, name)
    return Response(status_code=204)


@_user.get("/clusters")
async def list_clusters(services: ServicesDep, principal: Viewer) -> list[ClusterOut]:
    """The caller's workspace's attached clusters, connected or not, with their agents' last report."""
    return [cluster_out(v) for v in await clusters.list_clusters(services, principal)]


@_user.post(
    "/clusters", status_code=201, responses={409: _error("The workspace has a cluster of that name, or a pool has it")}
)
async def join_cluster(services: ServicesDep, principal: Owner, body: ClusterJoin) -> ClusterJoined:
    """Attach a Kubernetes cluster to the caller's workspace: its pool, and its agent's join token (this answer
    only). ``levers9 cluster join`` renders the manifest that starts the agent from this answer."""
    options = clusters.ClusterOptions(**body.model_dump())
    made = await clusters.join(services, principal, options)
    view = clusters.ClusterView(
        made.cluster,
        made.pool.name,
        gpu=made.pool.gpu,
        gpu_count=made.pool.gpu_count,
        namespace=str(getattr(made.pool.pool.settings, "namespace", "")),
    )
    return ClusterJoined(
        cluster=cluster_out(view),
        join_token=made.join.token,
        expires_at=made.join.expires_at,
        controlplane_url=made.controlplane_url,
        ca_pem=made.ca_pem,
    )


@_user.delete("/clusters/{name}", responses={404: _error("The workspace has no cluster of that name")})
async def remove_cluster(services: ServicesDep, principal: Owner, name: str) -> ClusterRemoved:
    """Stop the cluster's workers, revoke its agent (which then deletes its worker Jobs) and forget it; 404 for
    no such cluster."""
    removed = await clusters.remove(services, principal, name)
    return ClusterRemoved(
        cluster=cluster_out(clusters.ClusterView(removed.cluster, removed.cluster.pool)),
        agents=removed.agents,
        terminated=removed.terminated,
        not_terminated=removed.not_terminated,
    )


@_user.get("/joined-machines")
async def list_joined_machines(services: ServicesDep, principal: Viewer) -> list[JoinedMachineOut]:
    """The caller's joined machines (an operator's: those serving shared pools) with their agents' last report."""
    return [joined_machine_out(v) for v in await joined_machines.list_machines(services, principal)]


@_user.post("/joined-machines", status_code=201, responses={409: _error("A machine of that name exists")})
async def create_joined_machine(
    services: ServicesDep, principal: Owner, body: JoinedMachineCreate, request: Request
) -> JoinedMachineCreated:
    """Record a machine for a pool of provider agent_machine and issue its join token (in this answer only)."""
    made = await joined_machines.create(services, principal, body.pool, body.name, ttl_s=body.ttl_s)
    assert made.join is not None  # not existing_ok: a name taken is a 409
    wheel = await _wheels(request).ref(_wheel_base(request))
    wheel_url, wheel_sha256 = (wheel.url, wheel.sha256) if wheel else ("", "")
    command = joined_machines.join_command(
        made.controlplane_url, made.join.token, ca_pem=made.ca_pem, wheel_url=wheel_url, wheel_sha256=wheel_sha256
    )
    return JoinedMachineCreated(
        machine=joined_machine_out(joined_machines.JoinedMachineView(made.machine)),
        join_token=made.join.token,
        expires_at=made.join.expires_at,
        controlplane_url=made.controlplane_url,
        ca_pem=made.ca_pem,
        join_command=command,
        ssh=made.ssh,
        wheel_url=wheel_url,
        wheel_sha256=wheel_sha256,
    )


@_user.delete("/joined-machines/{name}", responses={404: _error("No joined machine of that name")})
async def remove_joined_machine(services: ServicesDep, principal: Owner, name: str) -> JoinedMachineRemoved:
    """Drain and stop the machine's workers, revoke its agent and cut its stream; 404 for no such machine."""
    removed = await joined_machines.remove(services, principal, name)
    return JoinedMachineRemoved(
        machine=joined_machine_out(joined_machines.JoinedMachineView(removed.machine)),
        terminated=removed.terminated,
        not_terminated=removed.not_terminated,
    )


@_user.get("/deployments")
async def list_deployments(dataplane: DataPlaneDep, principal: Viewer) -> list[DeploymentOut]:
    return [deployment_out(d) for d in await deployments.list_deployments(dataplane, principal)]


@_user.post("/deployments/{name}/versions/{version}/stop", responses={404: _error("No such deployment or version")})
async def stop_deployment_version(
    dataplane: DataPlaneDep,
    principal: Member,
    name: str,
    version: Annotated[int, Path(ge=1, le=MAX_VERSION, description=f"The version, 1 to {MAX_VERSION}.")],
) -> DeploymentVersionOut:
    """Stop one version; the others keep serving. Stopping a stopped version again is not an error."""
    return DeploymentVersionOut.model_validate(await deployments.stop_version(dataplane, principal, name, version))


#: every route of the REST API, each with the responses of its kind
router = APIRouter()
router.include_router(_open)
router.include_router(_user)
