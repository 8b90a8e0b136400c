"""What the stores return: frozen records and the state enums.

Records are plain dataclasses rather than ORM objects so that nothing handed
to the scheduler or the API is tied to a database session: an ORM object used
after its session ends either raises or, worse, silently loads stale data.
``CheckpointRecord`` and ``CheckpointStatus`` are defined in
:mod:`levers9.checkpoint.record` (the worker builds them too) and re-exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

# the checkpoint record lives with the checkpoint code, which the worker uses without any SQL: re-exported here
from levers9.checkpoint.record import CheckpointRecord, CheckpointStatus


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    ERROR = "error"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"

    @property
    def terminal(self) -> bool:
        """A finished task never changes status again."""
        return self not in (TaskStatus.PENDING, TaskStatus.RUNNING)


class TokenKind(StrEnum):
    USER = "user"
    WORKER = "worker"
    AGENT = "agent"
    MACHINE = "machine"


class Role(StrEnum):
    """What a member of a workspace may do; each role may do everything the ones before it may.

    * viewer: reads (tasks, logs, apps, pools, volumes' files, secrets' names);
    * member: runs, deploys and stops (calls, deployments, sandboxes, volumes' writes);
    * owner: manages the workspace: members, secrets, tokens and environments.
    """

    VIEWER = "viewer"
    MEMBER = "member"
    OWNER = "owner"

    @property
    def rank(self) -> int:
        return ROLE_ORDER.index(self)

    def allows(self, needed: Role) -> bool:
        """Whether this role may do what ``needed`` may."""
        return self.rank >= needed.rank


#: the roles from least to most allowed
ROLE_ORDER: tuple[Role, ...] = (Role.VIEWER, Role.MEMBER, Role.OWNER)
#: an environment every workspace has, where everything made before environments existed lives
MAIN_ENVIRONMENT = "main"
#: an environment's id is its workspace's id, this, and a random part: its workspace is read off the id itself,
#: which the scheduler and the workers' checks do without a lookup (:func:`root_workspace`)
ENVIRONMENT_SEPARATOR = "."


def root_workspace(workspace_id: str) -> str:
    """The workspace of ``workspace_id``, which names a workspace (its main environment) or an environment."""
    return workspace_id.partition(ENVIRONMENT_SEPARATOR)[0]


class MachineState(StrEnum):
    REQUESTED = "requested"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


class PlacementOutcome(StrEnum):
    """The outcomes the core records; the column takes any short string, so a new one needs no migration."""

    PLACED = "placed"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    REQUEUED = "requeued"
    GAVE_UP = "gave_up"


E = TypeVar("E", bound=StrEnum)


def parse_enum(enum: type[E], value: str, what: str) -> E:
    """``value`` as a member of ``enum``, or a ValueError that lists what would be accepted."""
    try:
        return enum(value)
    except ValueError:
        accepted = ", ".join(member.value for member in enum)
        raise ValueError(f"{what} {value!r} is not one of: {accepted}") from None


@dataclass(frozen=True, slots=True)
class WorkspaceRecord:
    """A workspace, or one of its environments.

    An environment is stored as a workspace row of its own (``parent_id`` names its workspace), so everything
    that is isolated by workspace id (apps, tasks, secrets, volumes, sandboxes, images) is isolated by
    environment with no other change. A workspace's own row is its ``main`` environment.
    """

    id: str
    name: str
    created_at: datetime
    #: the workspace this is an environment of; None for a workspace (its main environment)
    parent_id: str | None = None
    environment: str = "main"
    #: people whose verified email has this domain may join (as ``join_role``); None: by invitation only
    join_domain: str | None = None
    join_role: str = "member"

    @property
    def root_id(self) -> str:
        """The workspace's id, for the workspace or any of its environments."""
        return self.parent_id or self.id


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A person who signs in; tokens they hold act for them, within their role in each workspace."""

    id: str
    email: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class MemberRecord:
    workspace_id: str
    user_id: str
    email: str
    name: str
    role: Role
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A token's metadata; the token itself is shown once, when issued, and its hash never leaves the store."""

    id: str
    kind: TokenKind
    workspace_id: str | None
    subject: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    #: the person it acts for (None: a service token, or one made before sign-in existed)
    user_id: str | None = None
    #: the most it may do; a person's token also never more than their role in the workspace.
    #: None: a token made before roles existed, which may do what an owner may
    role: Role | None = None


@dataclass(frozen=True, slots=True)
class AppRecord:
    id: str
    workspace_id: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StubRecord:
    id: str
    workspace_id: str
    app_id: str
    name: str
    kind: str
    #: image, cpu, memory, GPU preference, timeout, retries...
    config: dict[str, Any]
    config_hash: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    id: str
    workspace_id: str
    app_id: str
    name: str
    active_version: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeploymentVersionRecord:
    id: str
    deployment_id: str
    version: int
    stub_id: str
    created_at: datetime
    stopped_at: datetime | None = None

    @property
    def serving(self) -> bool:
        return self.stopped_at is None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    workspace_id: str
    stub_id: str | None
    status: TaskStatus
    #: how many times the task was requeued after a failed or lost attempt
    attempts: int
    #: the scheduler's serialized placement request
    request: dict[str, Any]
    container_id: str | None
    worker_id: str | None
    pool: str | None
    gpu: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class PlacementEvent:
    """One entry of a task's placement history.

    When recording, ``attempt`` and ``at`` may be left out: they default to the
    task's current attempt number and the time of recording. Read back from
    :meth:`~levers9.state.sql.tasks.TaskStore.history`, both are always set.
    """

    task_id: str
    outcome: str
    pool: str | None = None
    gpu: str | None = None
    region: str | None = None
    worker_id: str | None = None
    reason: str | None = None
    attempt: int | None = None
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class MachineRecord:
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
    #: where the provider put it, as its provision (or listing) said: zone, instance type and the
    #: provider's own small JSON (what its terminate needs to find the machine again)
    zone: str | None = None
    instance_type: str | None = None
    provider_data: dict[str, Any] | None = None
    #: the offer it was started from (``GpuOffer.key``) and that offer's price, when there was one
    offer_key: str | None = None
    price_per_hour: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """An attached cluster; its settings stay encrypted until asked for with ``ClusterStore.settings``."""

    id: str
    workspace_id: str
    name: str
    kind: str
    pool: str
    has_settings: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class JoinedMachineRecord:
    """A machine joined (or being joined) with ``levers9 machine create``; its id is its agent's (``agt_...``)."""

    id: str
    name: str
    #: None: an operator's machine, serving shared pools
    workspace_id: str | None
    pool: str
    provider: str
    #: ``pending`` (join token issued), ``joined`` (the agent spent it), ``removed`` (``levers9 machine remove``)
    state: str
    hostname: str | None
    created_at: datetime
    joined_at: datetime | None
    removed_at: datetime | None
    #: the id of the user token that created it
    created_by: str | None


__all__ = [
    "AppRecord",
    "CallResult",
    "CheckpointRecord",
    "CheckpointStatus",
    "ClusterRecord",
    "DeploymentRecord",
    "DeploymentVersionRecord",
    "JoinedMachineRecord",
    "MachineRecord",
    "MachineState",
    "PlacementEvent",
    "PlacementOutcome",
    "SecretInfo",
    "StubRecord",
    "TaskRecord",
    "TaskStatus",
    "TokenKind",
    "TokenRecord",
    "WorkspaceRecord",
    "parse_enum",
]


@dataclass(frozen=True, slots=True)
class CallResult:
    """A finished (or failed, cancelled) call as its caller is told: the result or error as stored."""

    task_id: str
    workspace_id: str
    status: str
    result: bytes | None
    error: str | None
    error_type: str | None
    traceback: str | None
    attempts: int


@dataclass(frozen=True)
class SecretInfo:
    """What may be shown of a secret: never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class BlueprintStepRecord:
    """A step a workspace built: its key, and the layer it made (None for a config-only step)."""

    workspace_id: str
    key: str
    op: str
    diff_id: str | None
    blob_digest: str | None
    size_bytes: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class BlueprintImageRecord:
    """An image a workspace built: the key of its last step, and its manifest in the registry."""

    workspace_id: str
    key: str
    repository: str
    manifest_digest: str
    size_bytes: int
    steps: int
    created_at: datetime
    last_used_at: datetime


@dataclass(frozen=True, slots=True)
class SandboxSnapshotRecord:
    """A stored memory snapshot of a sandbox; ``info`` is what restores it (sent to a worker of ``pool``)."""

    id: str
    workspace_id: str
    sandbox_id: str
    pool: str
    runtime: str
    key: str
    size_bytes: int
    info: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class VolumeRecord:
    """A workspace's volume: its id names its directory in the volumes' file system."""

    id: str
    workspace_id: str
    name: str
    created_at: datetime
