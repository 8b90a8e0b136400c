"""The REST API's wire models: every request body and answer of ``/api/v1``, as its OpenAPI document shows them.

Request bodies refuse unknown fields, so a misspelt option is an error instead
of silently ignored; every number they carry is bounded (see
:data:`levers9.controlplane.http.ACCEPTED`). Answers never carry a secret's
value or a token's hash; a token itself appears once, in :class:`IssuedToken`
(and a joined machine's join token once, in :class:`JoinedMachineCreated`).
The ``*_out`` functions render what the services return.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from levers9.services.agent_pools.clusters import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_IDLE_S,
    MAX_MEMORY_MIB,
    MAX_WORKERS,
    ClusterView,
)
from levers9.services.agent_pools.joined_machines import JoinedMachineView
from levers9.services.deployments import MAX_VERSION, DeploymentView
from levers9.services.pools import PoolView, WorkerView
from levers9.services.secrets import MAX_NAME, check_secret_name, check_secret_value
from levers9.services.workspaces import MAX_TOKEN_TTL_S
from levers9.state.sql.records import (
    MachineState,
    Role,
    SecretInfo,
    TaskRecord,
    TaskStatus,
    TokenKind,
    TokenRecord,
    WorkspaceRecord,
)

__all__ = [
    "MAX_TASKS_LISTED",
    "MAX_VERSION",
    "CancelOut",
    "DeploymentOut",
    "DeploymentVersionOut",
    "ErrorBody",
    "ErrorDetail",
    "Health",
    "IssuedToken",
    "JoinedMachineCreate",
    "JoinedMachineCreated",
    "JoinedMachineOut",
    "JoinedMachineRemoved",
    "MachineOut",
    "PlacementOut",
    "PoolOut",
    "SecretCreate",
    "SecretOut",
    "TaskDetail",
    "TaskOut",
    "TokenCreate",
    "TokenOut",
    "WheelList",
    "WheelOut",
    "WorkerOut",
    "WorkspaceCreate",
    "WorkspaceOut",
    "deployment_out",
    "joined_machine_out",
    "pool_out",
    "secret_out",
    "task_out",
    "token_out",
    "worker_out",
]

#: one page of ``GET /tasks``
MAX_TASKS_LISTED = 1000


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
    #: "ok", or "data directory full: ..." (naming the directory and what is free there)
    disk: str


class WorkspaceCreate(_In):
    name: str = Field(min_length=1, max_length=128, description="Printable, without leading or trailing spaces.")


class WorkspaceOut(_Out):
    id: str
    name: str
    created_at: datetime
    #: people whose verified email has this domain may join when they sign in (null: by invitation only)
    join_domain: str | None = None
    join_role: Role = Role.MEMBER


class MeOut(BaseModel):
    """Who the token acts as: never the token itself."""

    workspace_id: str
    workspace: str
    environment: str
    role: Role
    token_id: str
    #: the person the token acts for; empty for a service token
    email: str


class MemberPut(_In):
    role: Role = Field(Role.MEMBER, description="viewer (reads), member (runs and deploys) or owner (manages).")


class MemberOut(_Out):
    email: str
    name: str
    role: Role
    created_at: datetime


class JoinPut(_In):
    domain: str | None = Field(
        None, max_length=253, description="An email domain such as example.com; null: people join by invitation only."
    )
    role: Role = Field(Role.MEMBER, description="The role people joining by their domain get: viewer or member.")


class EnvironmentCreate(_In):
    name: str = Field(min_length=1, max_length=32, description="1-32 letters, digits, '-' or '_'.")


class EnvironmentOut(BaseModel):
    name: str
    #: the id its apps, tasks, secrets and volumes are stored under
    id: str
    created_at: datetime


def environment_out(record: WorkspaceRecord) -> EnvironmentOut:
    return EnvironmentOut(name=record.environment, id=record.id, created_at=record.created_at)


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
    role: Role | None = Field(
        None, description="The most the token may do (viewer, member or owner); omitted: the caller's own role."
    )


class TokenOut(_Out):
    id: str
    kind: TokenKind
    workspace_id: str | None
    subject: str | None
    #: the most it may do (null: a token made before roles, which acts as an owner)
    role: Role | None = None
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


class JoinedMachineCreate(_In):
    pool: str = Field(min_length=1, max_length=64, description="A pool of provider agent_machine the caller may use.")
    name: str | None = Field(
        None, min_length=1, max_length=64, description="Unique among the workspace's machines; left out: its id."
    )
    ttl_s: float = Field(3600.0, gt=0, le=30 * 86_400, description="The join token's lifetime in seconds.")


class GpuCountOut(BaseModel):
    gpu: str
    count: int
    free: int


class JoinedMachineOut(BaseModel):
    """A joined machine and what its agent last reported (zeros before it ever did)."""

    id: str
    name: str
    pool: str
    workspace_id: str | None
    #: pending (join token issued), joined, removed
    state: str
    hostname: str | None
    created_at: datetime
    joined_at: datetime | None
    connected: bool
    #: epoch seconds of the agent's last message; 0: never connected
    last_seen: float
    version: str
    gpus: list[GpuCountOut]
    cpu_millicores: int
    memory_mib: int
    free_cpu_millicores: int
    free_memory_mib: int
    #: levers9 machine ids of the worker containers running there
    workers: list[str]
    #: the box's Docker as the agent last reported it (empty: none reported), and its architecture
    docker_version: str = ""
    docker_runtimes: list[str] = []
    arch: str = ""


class JoinedMachineCreated(BaseModel):
    """The new machine and its single-use join token, shown this once."""

    machine: JoinedMachineOut
    join_token: str
    expires_at: datetime | None
    controlplane_url: str
    ca_pem: str
    join_command: str
    #: the pool's ssh settings: the defaults ``levers9 machine create --ssh`` starts from
    ssh: dict[str, Any]
    #: levers9's own wheel on this controlplane and its sha256, which the join command installs
    wheel_url: str = ""
    wheel_sha256: str = ""


class WheelOut(BaseModel):
    """One of levers9's own wheels this controlplane serves."""

    filename: str
    #: hex; check it before installing
    sha256: str
    size: int
    url: str


class WheelList(BaseModel):
    wheels: list[WheelOut]


class ClusterJoin(_In):
    name: str = Field(min_length=1, max_length=40, description="A DNS label, unique in the workspace (like gpu-lab).")
    gpu: str | None = Field(
        None, description="The GPU type of the cluster's pool (levers9 gpu normalize); left out: CPU."
    )
    gpu_count: int | None = Field(None, ge=1, le=MAX_GPUS, description="GPUs per worker pod (default 1 with a GPU).")
    cpu: float = Field(1.0, gt=0, le=MAX_CPUS, description="CPU cores per worker pod.")
    memory: Annotated[int, Field(ge=1, le=MAX_MEMORY_MIB)] | str = Field(
        2048, description="Memory per worker pod, in MiB or as a size like 16GiB."
    )
    min_workers: int = Field(0, ge=0, le=MAX_WORKERS)
    max_workers: int = Field(10, ge=0, le=MAX_WORKERS)
    idle_timeout_s: float = Field(
        300.0, ge=0, le=MAX_IDLE_S, description="An idle worker above min_workers is released after this."
    )
    runtime: str = Field("runc", description="The container runtime plugin the workers use.")
    namespace: str = Field("levers9", description="Where the agent creates worker Jobs in the cluster.")
    worker_image: str = Field("", description="The worker image the cluster pulls (required).")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="Further attached_cluster settings: tolerations, node_selector, privileged..."
    )
    ttl_s: float = Field(3600.0, gt=0, le=30 * 86_400, description="The join token's lifetime in seconds.")
    pool: str | None = Field(
        None, description="Operators only: the configured attached_cluster pool of a shared cluster whose agent joins."
    )


class ClusterOut(BaseModel):
    """An attached cluster and what its agent last reported (zeros before it ever did)."""

    id: str
    name: str
    pool: str
    gpu: str | None
    gpu_count: int
    namespace: str
    agent_id: str
    connected: bool
    #: epoch seconds of the agent's last message; 0: never connected
    last_seen: float
    version: str
    nodes: int
    gpus: list[GpuCountOut]
    cpu_millicores: int
    memory_mib: int
    #: levers9 machine ids of the worker Jobs running there
    workers: list[str]
    created_at: datetime


class ClusterJoined(BaseModel):
    """The attached cluster and its agent's single-use join token, shown this once."""

    cluster: ClusterOut
    join_token: str
    expires_at: datetime | None
    controlplane_url: str
    ca_pem: str


class ClusterRemoved(BaseModel):
    cluster: ClusterOut
    #: the cluster's agents, revoked
    agents: list[str]
    terminated: list[str]
    not_terminated: list[str]


class JoinedMachineRemoved(BaseModel):
    machine: JoinedMachineOut
    terminated: list[str]
    not_terminated: list[str]


class CancelOut(BaseModel):
    #: False when the task had already finished: it keeps the status it finished with
    cancelled: bool
    task: TaskOut


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


def token_out(record: TokenRecord) -> TokenOut:
    return TokenOut.model_validate(
        {
            "id": record.id,
            "kind": record.kind,
            "workspace_id": record.workspace_id,
            "subject": record.subject,
            "role": record.role,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "revoked_at": record.revoked_at,
            "last_used_at": record.last_used_at,
            "active": record.revoked_at is None
            and (record.expires_at is None or record.expires_at > datetime.now(UTC)),
        }
    )


def task_out(record: TaskRecord) -> TaskOut:
    return TaskOut.model_validate(record)


def pool_out(view: PoolView) -> PoolOut:
    fields = dataclasses.asdict(view)
    return PoolOut.model_validate({name: fields[name] for name in PoolOut.model_fields})


def worker_out(view: WorkerView) -> WorkerOut:
    return WorkerOut.model_validate(dataclasses.asdict(view))


def joined_machine_out(view: JoinedMachineView) -> JoinedMachineOut:
    m = view.machine
    return JoinedMachineOut(
        id=m.id,
        name=m.name,
        pool=m.pool,
        workspace_id=m.workspace_id,
        state=m.state,
        hostname=m.hostname,
        created_at=m.created_at,
        joined_at=m.joined_at,
        connected=view.connected,
        last_seen=view.last_seen,
        version=view.version,
        gpus=[GpuCountOut(gpu=g, count=n, free=view.free_gpus.get(g, 0)) for g, n in sorted(view.gpus.items())],
        cpu_millicores=view.cpu_millicores,
        memory_mib=view.memory_mib,
        free_cpu_millicores=view.free_cpu_millicores,
        free_memory_mib=view.free_memory_mib,
        workers=view.workers,
        docker_version=view.docker_version,
        docker_runtimes=view.docker_runtimes,
        arch=view.arch,
    )


def cluster_out(view: ClusterView) -> ClusterOut:
    c = view.cluster
    return ClusterOut(
        id=c.id,
        name=c.name,
        pool=view.pool,
        gpu=view.gpu,
        gpu_count=view.gpu_count,
        namespace=view.namespace,
        agent_id=view.agent_id,
        connected=view.connected,
        last_seen=view.last_seen,
        version=view.version,
        nodes=view.nodes,
        gpus=[GpuCountOut(gpu=g, count=n, free=view.free_gpus.get(g, 0)) for g, n in sorted(view.gpus.items())],
        cpu_millicores=view.cpu_millicores,
        memory_mib=view.memory_mib,
        workers=view.workers,
        created_at=c.created_at,
    )


def secret_out(info: SecretInfo) -> SecretOut:
    return SecretOut(name=info.name, created_at=info.created_at, updated_at=info.updated_at)


def deployment_out(view: DeploymentView) -> DeploymentOut:
    d = view.deployment
    return DeploymentOut(
        id=d.id,
        name=d.name,
        active_version=d.active_version,
        versions=[DeploymentVersionOut.model_validate(v) for v in view.versions],
    )
