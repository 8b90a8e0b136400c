"""The REST API under ``/api/v1``: what dashboards, scripts and operators use besides the SDK's gRPC.

Who may see what:

* every call but ``/health`` needs a *user* token; worker, agent and machine
  tokens are refused with 403, because their holders run other people's code
  and must not reach the API that manages it;
* a user token bound to a workspace sees only that workspace: its tokens, its
  tasks, the shared pools and its own attached cluster. Another workspace's
  task answers 404 exactly like a missing one, so ids cannot be probed;
* a user token bound to no workspace is an operator's: it manages workspaces,
  sees machines and every pool, but has no tasks of its own.

Secrets are write-only: their values go in and reach the functions that name
them, but no answer of this API ever carries one.

Errors are always ``{"error": {"type": ..., "message": ...}}``; which exception
becomes which status is decided in one table, :data:`ERRORS`. Every number a
request carries (path, query or body) is bounded, and one out of its bounds is
a 422 naming the field and, from :data:`ACCEPTED`, the range it takes: never a
500 from deeper down (an overflowing date, an integer the database cannot hold).
Operations shared with gRPC (cancelling a task) go through the same
:class:`~levers9.services.dataplane.DataPlane` method as the gRPC call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from starlette.exceptions import HTTPException

from levers9.__about__ import __version__
from levers9.scheduler.pools import PoolSpec
from levers9.services.auth import PermissionDenied, Principal, Unauthenticated
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.metrics import Metrics
from levers9.state.errors import AlreadyExists, Conflict, InvalidTransition, NotFound
from levers9.state.redis.workers import WorkerState
from levers9.state.sql.records import (
    MachineRecord,
    MachineState,
    PlacementEvent,
    TaskRecord,
    TaskStatus,
    TokenKind,
    TokenRecord,
    WorkspaceRecord,
)
from levers9.state.sql.secrets import MAX_NAME, SecretInfo, check_secret_name, check_secret_value
from levers9.state.sql.workspaces import MAX_TOKEN_TTL_S

__all__ = [
    "ACCEPTED",
    "ERRORS",
    "HEALTH_TIMEOUT_S",
    "MAX_TASKS_LISTED",
    "MAX_VERSION",
    "create_http_app",
    "error_answer",
]

log = logging.getLogger(__name__)

#: a health probe that waits longer than this reports the dependency as not answering, so a
#: hung database makes the load balancer's check fail instead of hang
HEALTH_TIMEOUT_S = 3.0

#: deployment versions are 32-bit everywhere (the database column, the gRPC field)
MAX_VERSION = 2**31 - 1
#: one page of ``GET /tasks``
MAX_TASKS_LISTED = 1000

#: what each numeric field of a request accepts, by the location a validation error gives it; every numeric
#: field has an entry (a test reads the OpenAPI document to hold this), and an error on it names the range
ACCEPTED: dict[str, str] = {
    "body.ttl_s": f"a number of seconds above 0 and at most {MAX_TOKEN_TTL_S} (ten years); "
    "omit it for a token that never expires",
    "path.version": f"a whole number from 1 to {MAX_VERSION}",
    "query.limit": f"a whole number from 1 to {MAX_TASKS_LISTED}",
}

#: the one place that decides how a domain error is answered: (exception, HTTP status, error type);
#: the first entry the exception is an instance of wins
ERRORS: tuple[tuple[type[Exception], int, str], ...] = (
    (NotFound, 404, "not_found"),
    (AlreadyExists, 409, "already_exists"),
    (Conflict, 409, "conflict"),
    (InvalidTransition, 409, "invalid_transition"),
    (Unauthenticated, 401, "unauthenticated"),
    (PermissionDenied, 403, "permission_denied"),
    (ValueError, 400, "invalid_request"),
)


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """The (status, type) :data:`ERRORS` gives ``exc``, or None when it is not a domain error (a bug: 500)."""
    if isinstance(exc, pydantic.ValidationError):
        # A ValueError, but raised by a model the server built itself, never by what the client sent.
        return None
    for kind, status, name in ERRORS:
        if isinstance(exc, kind):
            return status, name
    return None


# --------------------------------------------------------------------------- wire models


class _In(BaseModel):
    """Request bodies refuse unknown fields, so a misspelt option is an error instead of silently ignored."""

    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ErrorDetail(BaseModel):
    type: str
    message: str
    #: for validation errors: each offending field and what was wrong with it
    fields: list[dict[str, str]] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    #: "ok", or why the database did not answer
    database: str
    #: "ok", or why Redis did not answer
    redis: str


class WorkspaceCreate(_In):
    name: str = Field(min_length=1, max_length=128, description="Printable, without leading or trailing spaces.")


class WorkspaceOut(_Out):
    id: str
    name: str
    created_at: datetime


class TokenCreate(_In):
    workspace: str | None = Field(
        None,
        description="The workspace's name. Omitted: the caller's own workspace (for an operator: a new operator token).",
    )
    ttl_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKEN_TTL_S,
        allow_inf_nan=False,
        description=f"Seconds until the token expires, at most {MAX_TOKEN_TTL_S} (ten years); omitted: never.",
    )
    subject: str | None = Field(
        None, min_length=1, max_length=128, description="Who the token is for, shown in listings."
    )


class TokenOut(_Out):
    id: str
    kind: TokenKind
    workspace_id: str | None
    subject: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    active: bool


class IssuedToken(TokenOut):
    #: the token itself: shown this once, only its hash is stored
    token: str


class PoolOut(BaseModel):
    name: str
    provider: str
    runtime: str
    gpu: str | None
    gpu_count: int
    region: str | None
    #: what one worker of the pool has
    cpu_millicores: int
    memory_mib: int
    min_workers: int
    max_workers: int
    priority: int
    #: set for a workspace's own attached cluster
    workspace_id: str | None
    #: workers registered whose keepalive holds
    workers: int
    #: why the provider is not being asked for machines right now (no capacity, no quota...), if it is not
    unavailable: str | None
    #: how the runtime keeps calls apart: "none" (process: calls share the host), "namespaces", "sandbox", "vm"
    isolation: str = "unknown"


class WorkerOut(BaseModel):
    id: str
    pool: str
    status: str
    runtime: str
    gpu: str | None
    gpu_count: int
    gpu_free: int
    cpu_millicores: int
    cpu_free: int
    memory_mib: int
    memory_free: int
    #: requests placed on it or running there
    running: int
    registered_at: datetime
    #: since when it has had no work; None while busy
    idle_since: datetime | None
    workspace_id: str | None
    #: operators only (None for workspace users): which machine it runs on and where it listens
    machine_id: str | None
    address: str | None


class MachineOut(_Out):
    id: str
    pool: str
    provider: str
    provider_id: str | None
    state: MachineState
    gpu: str | None
    gpu_count: int
    region: str | None
    worker_id: str | None
    token_id: str | None
    register_by: datetime | None
    created_at: datetime
    registered_at: datetime | None
    terminated_at: datetime | None
    last_error: str | None


class TaskOut(_Out):
    id: str
    workspace_id: str
    stub_id: str | None
    status: TaskStatus
    attempts: int
    pool: str | None
    gpu: str | None
    worker_id: str | None
    container_id: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class TaskDetail(TaskOut):
    #: what the task asked the scheduler for (resources, GPU preference, pools)
    request: dict[str, Any]


class PlacementOut(_Out):
    attempt: int | None
    at: datetime | None
    outcome: str
    pool: str | None
    gpu: str | None
    region: str | None
    worker_id: str | None
    reason: str | None


class SecretCreate(_In):
    name: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        description="An environment variable's name (letters, digits, underscores): functions see it as one.",
    )
    value: str = Field(description="The value; stored encrypted and never shown again.")

    @pydantic.field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_secret_name(value)

    @pydantic.field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        return check_secret_value(value)


class SecretOut(BaseModel):
    """A secret as listed: its name and times, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


class CancelOut(BaseModel):
    #: False when the task had already finished: it keeps the status it finished with
    cancelled: bool
    task: TaskOut


# --------------------------------------------------------------------------- who is calling

_bearer = HTTPBearer(auto_error=False, description="A user token: `Authorization: Bearer l9_user_...`")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _dataplane(request: Request) -> DataPlane:
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


async def _caller(
    services: Annotated[Services, Depends(_services)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    principal = await services.auth.verify(None if credentials is None else credentials.credentials)
    if principal.kind is not TokenKind.USER:
        raise PermissionDenied(
            f"this API takes user tokens; a {principal.kind.value} token belongs to a worker, agent or machine "
            "and cannot manage workspaces, tokens or tasks"
        )
    return principal


ServicesDep = Annotated[Services, Depends(_services)]
DataPlaneDep = Annotated[DataPlane, Depends(_dataplane)]
Caller = Annotated[Principal, Depends(_caller)]


def _is_operator(principal: Principal) -> bool:
    return principal.workspace_id is None


def _require_operator(principal: Principal, action: str) -> None:
    if not _is_operator(principal):
        raise PermissionDenied(f"only an operator token (a user token bound to no workspace) may {action}")


def _own_workspace(principal: Principal, action: str) -> str:
    if principal.workspace_id is None:
        raise PermissionDenied(
            f"an operator token is bound to no workspace, so it cannot {action}; issue a token for the "
            "workspace (POST /api/v1/tokens with its name) and use that"
        )
    return principal.workspace_id


def _visible(principal: Principal, owner: str | None) -> bool:
    """Shared pools and workers are everyone's; an attached cluster's are its workspace's (and operators')."""
    return owner is None or _is_operator(principal) or owner == principal.workspace_id


def _worker_visible(services: Services, principal: Principal, state: WorkerState) -> bool:
    spec = services.pools.get(state.info.pool)
    return _visible(principal, state.info.workspace) and (spec is None or _visible(principal, spec.workspace))


# --------------------------------------------------------------------------- conversions


def _token_out(record: TokenRecord) -> TokenOut:
    return TokenOut.model_validate(
        {
            "id": record.id,
            "kind": record.kind,
            "workspace_id": record.workspace_id,
            "subject": record.subject,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "revoked_at": record.revoked_at,
            "last_used_at": record.last_used_at,
            "active": record.revoked_at is None
            and (record.expires_at is None or record.expires_at > datetime.now(UTC)),
        }
    )


def _epoch_ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, UTC)


def _worker_out(state: WorkerState, *, operator: bool) -> WorkerOut:
    info = state.info
    return WorkerOut(
        id=info.id,
        pool=info.pool,
        status=state.status,
        runtime=info.runtime,
        gpu=info.gpu,
        gpu_count=info.gpu_count,
        gpu_free=state.gpu_free,
        cpu_millicores=info.cpu_millicores,
        cpu_free=state.cpu_free,
        memory_mib=info.memory_mib,
        memory_free=state.memory_free,
        running=state.running,
        registered_at=_epoch_ms(state.registered_ms),
        idle_since=_epoch_ms(state.idle_since_ms) if state.idle_since_ms else None,
        workspace_id=info.workspace,
        machine_id=info.machine_id if operator else None,
        address=info.address if operator else None,
    )


def _task_out(record: TaskRecord) -> TaskOut:
    return TaskOut.model_validate(record)


async def _live_workers(services: Services) -> list[WorkerState]:
    """Registered workers whose keepalive holds: a silent one is about to be reaped and takes no work."""
    registry = services.scheduler.workers
    silent = set(await registry.silent())
    ids = sorted(await registry.ids() - silent)
    return [state for state in await registry.get_many(ids) if state is not None]


async def _own_task(services: Services, principal: Principal, task_id: str) -> TaskRecord:
    """The caller's task; another workspace's is reported exactly like a missing one, so ids cannot be probed."""
    workspace = _own_workspace(principal, "see tasks")
    task = await services.tasks.get(task_id)
    if task is None or task.workspace_id != workspace:
        raise NotFound("task", task_id)
    return task


# --------------------------------------------------------------------------- routes

router = APIRouter(
    prefix="/api/v1",
    responses={
        401: {"model": ErrorBody, "description": "No token, or an unknown, revoked or expired one"},
        403: {"model": ErrorBody, "description": "Not a user token, or outside the token's scope"},
        422: {"model": ErrorBody, "description": "A parameter or body field is not valid"},
    },
)


async def _probe(check: Awaitable[object]) -> str:
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):
            await check
    except TimeoutError:
        return f"no answer within {HEALTH_TIMEOUT_S:g} s"
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"[:300]
    return "ok"


async def _ping_database(services: Services) -> None:
    async with services.db.engine.connect() as connection:
        await connection.execute(text("SELECT 1"))


async def _ping_redis(services: Services) -> None:
    await services.redis.ping()


@router.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Degraded"}})
async def health(services: ServicesDep, response: Response) -> Health:
    """Unauthenticated, for load balancers: 503 when the database or Redis does not answer."""
    database, redis = await asyncio.gather(_probe(_ping_database(services)), _probe(_ping_redis(services)))
    degraded = database != "ok" or redis != "ok"
    if degraded:
        response.status_code = 503
    return Health(status="degraded" if degraded else "ok", database=database, redis=redis)


@router.get("/workspaces")
async def list_workspaces(services: ServicesDep, principal: Caller) -> list[WorkspaceOut]:
    if principal.workspace_id is None:
        records: list[WorkspaceRecord] = await services.workspaces.list()
    else:
        own = await services.workspaces.get(principal.workspace_id)
        records = [] if own is None else [own]
    return [WorkspaceOut.model_validate(r) for r in records]


@router.post("/workspaces", status_code=201)
async def create_workspace(services: ServicesDep, principal: Caller, body: WorkspaceCreate) -> WorkspaceOut:
    _require_operator(principal, "create workspaces")
    return WorkspaceOut.model_validate(await services.workspaces.create(body.name))


async def _workspace_named(services: Services, principal: Principal, name: str | None, action: str) -> str | None:
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


@router.get("/tokens")
async def list_tokens(
    services: ServicesDep,
    principal: Caller,
    workspace: Annotated[
        str | None,
        Query(description="Operators: the workspace's name (omitted: the tokens bound to no workspace)."),
    ] = None,
) -> list[TokenOut]:
    """Metadata only: a token is shown once when issued, and its hash never leaves the store."""
    workspace_id = await _workspace_named(services, principal, workspace, "list the tokens of")
    return [_token_out(r) for r in await services.tokens.list_for_workspace(workspace_id)]


@router.post("/tokens", status_code=201)
async def create_token(services: ServicesDep, principal: Caller, body: TokenCreate) -> IssuedToken:
    workspace_id = await _workspace_named(services, principal, body.workspace, "issue tokens for")
    record, token = await services.tokens.issue(
        TokenKind.USER.value, workspace_id=workspace_id, subject=body.subject, ttl_s=body.ttl_s
    )
    return IssuedToken.model_validate({**_token_out(record).model_dump(), "token": token})


@router.delete("/tokens/{token_id}")
async def revoke_token(services: ServicesDep, principal: Caller, token_id: str) -> TokenOut:
    """Takes effect at once on this replica and within the auth cache's lifetime on the others."""
    record = await services.tokens.get(token_id)
    if record is None or not (_is_operator(principal) or record.workspace_id == principal.workspace_id):
        raise NotFound("token", token_id)
    await services.tokens.revoke(token_id)
    services.auth.forget(token_id)
    revoked = await services.tokens.get(token_id)
    if revoked is None:
        raise NotFound("token", token_id)
    return _token_out(revoked)


@router.get("/pools")
async def list_pools(services: ServicesDep, principal: Caller) -> list[PoolOut]:
    specs: list[PoolSpec] = [s for s in services.pools.values() if _visible(principal, s.workspace)]
    live: dict[str, int] = {}
    for state in await _live_workers(services):
        live[state.info.pool] = live.get(state.info.pool, 0) + 1
    unavailable = services.scheduler.ctx.unavailable
    from levers9.services.isolation import pool_isolation

    out = []
    for spec in specs:
        pool = spec.pool
        out.append(
            PoolOut(
                name=spec.name,
                provider=pool.provider,
                runtime=pool.runtime,
                gpu=spec.gpu,
                gpu_count=spec.gpu_count,
                region=pool.region,
                cpu_millicores=spec.cpu_millicores,
                memory_mib=spec.memory_mib,
                min_workers=spec.min_workers,
                max_workers=spec.max_workers,
                priority=spec.priority,
                workspace_id=spec.workspace,
                workers=live.get(spec.name, 0),
                unavailable=await unavailable.reason(spec.name, spec.gpu, pool.region),
                isolation=await pool_isolation(services, spec.name, pool.runtime),
            )
        )
    return out


@router.get("/workers")
async def list_workers(
    services: ServicesDep,
    principal: Caller,
    pool: Annotated[str | None, Query(description="Only this pool's workers.")] = None,
) -> list[WorkerOut]:
    states = [s for s in await _live_workers(services) if _worker_visible(services, principal, s)]
    if pool is not None:
        spec = services.pools.get(pool)
        if spec is not None and not _visible(principal, spec.workspace):
            raise NotFound("pool", pool)
        states = [s for s in states if s.info.pool == pool]
        if spec is None and not states:
            raise NotFound("pool", pool)
    operator = _is_operator(principal)
    return [_worker_out(s, operator=operator) for s in states]


@router.get("/machines")
async def list_machines(
    services: ServicesDep,
    principal: Caller,
    pool: Annotated[str | None, Query(description="Only this pool's machines.")] = None,
    state: Annotated[list[MachineState] | None, Query(description="Only machines in these states.")] = None,
) -> list[MachineOut]:
    _require_operator(principal, "list machines")
    records: list[MachineRecord] = await services.machines.list(
        pool, None if state is None else [s.value for s in state]
    )
    return [MachineOut.model_validate(r) for r in records]


@router.get("/tasks")
async def list_tasks(
    services: ServicesDep,
    principal: Caller,
    status: Annotated[list[TaskStatus] | None, Query(description="Only tasks with these statuses.")] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_TASKS_LISTED, description=f"At most this many (1-{MAX_TASKS_LISTED}), newest first.")
    ] = 100,
) -> list[TaskOut]:
    workspace = _own_workspace(principal, "list tasks")
    records = await services.tasks.for_workspace(
        workspace, statuses=None if status is None else [s.value for s in status], limit=limit
    )
    return [_task_out(r) for r in records]


@router.get("/tasks/{task_id}", responses={404: {"model": ErrorBody}})
async def get_task(services: ServicesDep, principal: Caller, task_id: str) -> TaskDetail:
    return TaskDetail.model_validate(await _own_task(services, principal, task_id))


@router.get("/tasks/{task_id}/history", responses={404: {"model": ErrorBody}})
async def task_history(services: ServicesDep, principal: Caller, task_id: str) -> list[PlacementOut]:
    await _own_task(services, principal, task_id)
    events: list[PlacementEvent] = await services.tasks.history(task_id)
    return [PlacementOut.model_validate(e) for e in events]


@router.post("/tasks/{task_id}/cancel", responses={404: {"model": ErrorBody}})
async def cancel_task(services: ServicesDep, dataplane: DataPlaneDep, principal: Caller, task_id: str) -> CancelOut:
    """Stop the task: its worker is told to end it (its process and the processes it started).

    Cancelling a task that already finished is not an error: it answers ``cancelled: false``.
    The same operation as gRPC's CancelTask (``levers9 cancel``).
    """
    await _own_task(services, principal, task_id)
    cancelled = await dataplane.cancel(principal, task_id)
    task = await services.tasks.get(task_id)
    if task is None:
        raise NotFound("task", task_id)
    return CancelOut(cancelled=cancelled, task=_task_out(task))


def _secret_out(info: SecretInfo) -> SecretOut:
    return SecretOut(name=info.name, created_at=info.created_at, updated_at=info.updated_at)


@router.get("/secrets")
async def list_secrets(services: ServicesDep, principal: Caller) -> list[SecretOut]:
    """The workspace's secrets, by name: names and times only, never values."""
    workspace = _own_workspace(principal, "list secrets")
    return [_secret_out(s) for s in await services.secrets.list(workspace)]


@router.post("/secrets", status_code=201, responses={200: {"model": SecretOut, "description": "Replaced"}})
async def put_secret(services: ServicesDep, principal: Caller, body: SecretCreate, response: Response) -> SecretOut:
    """Create a secret (201), or replace the value of one of the same name (200). The value is not echoed.

    Functions naming it in ``secrets=[...]`` see it as an environment variable; containers already
    running keep the value they started with.
    """
    workspace = _own_workspace(principal, "create secrets")
    info, created = await services.secrets.put(workspace, body.name, body.value)
    if not created:
        response.status_code = 200
    return _secret_out(info)


@router.delete("/secrets/{name}", responses={404: {"model": ErrorBody}})
async def delete_secret(services: ServicesDep, principal: Caller, name: str) -> Response:
    """Delete a secret of the caller's workspace; 204, or 404 when it has none of that name."""
    workspace = _own_workspace(principal, "delete secrets")
    if not await services.secrets.delete(workspace, name):
        raise NotFound("secret", name)
    return Response(status_code=204)


class DeploymentVersionOut(_Out):
    version: int
    stub_id: str
    created_at: datetime
    #: None while the version serves
    stopped_at: datetime | None
    serving: bool


class DeploymentOut(_Out):
    id: str
    name: str
    #: the version answering when none is named: the newest still serving (None when all are stopped)
    active_version: int | None
    versions: list[DeploymentVersionOut]


@router.get("/deployments")
async def list_deployments(services: ServicesDep, principal: Caller) -> list[DeploymentOut]:
    workspace = _own_workspace(principal, "list deployments")
    return [
        DeploymentOut(
            id=d.id,
            name=d.name,
            active_version=d.active_version,
            versions=[DeploymentVersionOut.model_validate(v) for v in versions],
        )
        for d, versions in await services.deployments.for_workspace(workspace)
    ]


@router.post("/deployments/{name}/versions/{version}/stop", responses={404: {"model": ErrorBody}})
async def stop_deployment_version(
    services: ServicesDep,
    principal: Caller,
    name: str,
    version: Annotated[int, Path(ge=1, le=MAX_VERSION, description=f"The version, 1 to {MAX_VERSION}.")],
) -> DeploymentVersionOut:
    """Stop one version; the others keep serving. Stopping a stopped version again is not an error."""
    workspace = _own_workspace(principal, "stop deployments")
    return DeploymentVersionOut.model_validate(await services.deployments.stop(workspace, name, version))


# --------------------------------------------------------------------------- errors


def _error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    detail = ErrorDetail(type=kind, message=message, **extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": detail.model_dump(exclude_none=True)}, status_code=status, headers=headers)


async def _domain_error(request: Request, exc: Exception) -> Response:
    answer = error_answer(exc)
    if answer is None:
        raise exc
    status, kind = answer
    return _error(status, kind, str(exc))


def _location(loc: tuple[int | str, ...] | list[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "request"


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    fields = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid":
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            reason = (err.get("ctx") or {}).get("error", "")
            fields.append({"field": "body", "message": f"not valid JSON{where}: {reason}".rstrip(": ")})
        else:
            where = _location(loc)
            message = str(err.get("msg", "invalid"))
            if err.get("type") == "value_error":  # our own validators' messages, without pydantic's prefix
                message = str((err.get("ctx") or {}).get("error", message))
            field = {"field": where, "message": message}
            accepted = ACCEPTED.get(where)
            if accepted is not None:
                field["message"] = f"{message} (accepted: {accepted})"
                field["accepted"] = accepted
            fields.append(field)
    message = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "the request is not valid"
    return _error(422, "validation_error", message, fields=fields)


_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's "error parsing the body": JSON nested too deeply
        message = "body: not valid JSON: its arrays and objects nest too deeply (a few hundred levels at most)"
        return _error(422, "validation_error", message, fields=[{"field": "body", "message": message[6:]}])
    response = _error(exc.status_code, _HTTP_TYPES.get(exc.status_code, "http_error"), str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the exception after this answer; the client learns nothing about the server's insides.
    return _error(500, "internal", "internal error; the controlplane's log has the details")


def create_http_app(
    services: Services, *, metrics: Metrics | None = None, dataplane: DataPlane | None = None
) -> FastAPI:
    """The REST app over ``services``, acting on calls through ``dataplane`` (the one gRPC uses).

    Without a ``dataplane`` (the REST API served on its own) one is made over ``services``, counting into
    ``metrics``: like any replica's, it reaches workers through Redis.
    """
    app = FastAPI(
        title="levers9",
        version=__version__,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
    )
    app.state.services = services
    if dataplane is None:
        dataplane = DataPlane(services, Hub(services.redis, name=services.scheduler.name), metrics)
    app.state.dataplane = dataplane
    app.include_router(router)
    for kind, _, _ in ERRORS:
        app.add_exception_handler(kind, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    return app
