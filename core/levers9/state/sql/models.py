"""The database schema, as SQLAlchemy 2 declarative models.

These models are the reference the Alembic migrations are tested against (an
autogenerate comparison finds no difference on SQLite or PostgreSQL), so a
change here needs a new migration under ``levers9/state/migrations/versions``.

Conventions that keep both databases alike:

* primary keys are text, a short prefix and a random UUID (``task_4f…``), so
  ids can be made before a row is written and say what they name in a log;
* every timestamp is timezone-aware UTC, also on SQLite, which has no time
  zone type (see :class:`UtcDateTime`);
* states are strings with a CHECK constraint rather than database enums,
  because adding an enum value is a migration on PostgreSQL and is not even
  expressible on SQLite;
* constraints and indexes have names from one naming convention, so a later
  migration can alter them by name on both databases.

Nothing outside the stores should see these classes: the stores return frozen
records, so no ORM object outlives its session.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from levers9.state.sql.records import ROLE_ORDER, CheckpointStatus, MachineState, TaskStatus, TokenKind

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TASK_STATUSES = tuple(status.value for status in TaskStatus)
TOKEN_KINDS = tuple(kind.value for kind in TokenKind)
MACHINE_STATES = tuple(state.value for state in MachineState)
CHECKPOINT_STATUSES = tuple(status.value for status in CheckpointStatus)
JOINED_MACHINE_STATES = ("pending", "joined", "removed")
ROLES = tuple(role.value for role in ROLE_ORDER)


def new_id(prefix: str) -> str:
    """A fresh primary key such as ``task_9f0c…``: the prefix says what it names, the UUID makes it unique."""
    return f"{prefix}_{uuid.uuid4().hex}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``; SQLite has no time zone type and would
    hand back naive datetimes, which compare wrongly with aware ones and make
    "is this token expired" a ``TypeError``. Values go in as UTC and come back
    tagged UTC on both. Naive datetimes are refused on the way in, because
    guessing their zone is how off-by-hours bugs start.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"timestamp {value.isoformat()} has no time zone; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JSON()}


metadata = Base.metadata


class Workspace(Base):
    """A workspace, or (``parent_id`` set) one of its environments: see
    :class:`~levers9.state.sql.records.WorkspaceRecord`. An environment's ``name`` is ``WORKSPACE/ENVIRONMENT``,
    which no workspace name can be (they may not contain ``/``)."""

    __tablename__ = "workspaces"
    __table_args__ = (
        UniqueConstraint("parent_id", "environment"),
        CheckConstraint(_one_of("join_role", ROLES), name="join_role"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime]
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    environment: Mapped[str] = mapped_column(String(64), server_default="main")
    join_domain: Mapped[str | None] = mapped_column(String(253))
    join_role: Mapped[str] = mapped_column(String(16), server_default="member")


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: lowercased; how invitations and email-domain joins find a person
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class Identity(Base):
    """An OpenID Connect issuer's stable id (``sub``) for a user: a second sign-in finds the same person even
    if their email changed."""

    __tablename__ = "identities"

    issuer: Mapped[str] = mapped_column(String(512), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime]


class Member(Base):
    __tablename__ = "members"
    __table_args__ = (CheckConstraint(_one_of("role", ROLES), name="role"),)

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]


class Token(Base):
    __tablename__ = "tokens"
    __table_args__ = (
        CheckConstraint(_one_of("kind", TOKEN_KINDS), name="kind"),
        CheckConstraint(_one_of("role", ROLES), name="role"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str | None] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    #: what the token stands for besides a workspace, such as a machine id
    subject: Mapped[str | None] = mapped_column(String(128), index=True)
    #: SHA-256 of the token; the token itself is never stored
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    user_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    #: None for tokens made before roles existed (they act as owners)
    role: Mapped[str | None] = mapped_column(String(16))


class App(Base):
    __tablename__ = "apps"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class Stub(Base):
    """A function as it was deployed: its image and its resource and GPU configuration."""

    __tablename__ = "stubs"
    __table_args__ = (UniqueConstraint("app_id", "config_hash"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    app_id: Mapped[str] = mapped_column(ForeignKey("apps.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    #: the cloudpickled function; deferred so listing stubs does not load code
    handler: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    app_id: Mapped[str] = mapped_column(ForeignKey("apps.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    active_version: Mapped[int | None]
    created_at: Mapped[datetime]


class DeploymentVersion(Base):
    __tablename__ = "deployment_versions"
    __table_args__ = (UniqueConstraint("deployment_id", "version"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    version: Mapped[int]
    stub_id: Mapped[str] = mapped_column(ForeignKey("stubs.id"))
    created_at: Mapped[datetime]
    #: when it stopped serving; None while it serves (older versions serve until stopped)
    stopped_at: Mapped[datetime | None]


class Task(Base):
    """One call of a function; SQL is its source of truth, Redis only its working copy."""

    __tablename__ = "tasks"
    __table_args__ = (CheckConstraint(_one_of("status", TASK_STATUSES), name="status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    stub_id: Mapped[str | None] = mapped_column(ForeignKey("stubs.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: the scheduler's serialized placement request; opaque here
    request: Mapped[dict[str, Any]]
    container_id: Mapped[str | None] = mapped_column(String(128))
    worker_id: Mapped[str | None] = mapped_column(String(128))
    pool: Mapped[str | None] = mapped_column(String(64))
    gpu: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class TaskIO(Base):
    """A call's arguments and, once it finished, its result or error detail."""

    __tablename__ = "task_io"

    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    args: Mapped[bytes] = mapped_column(LargeBinary)
    result: Mapped[bytes | None] = mapped_column(LargeBinary)
    error_type: Mapped[str | None] = mapped_column(String(255))
    traceback: Mapped[str | None] = mapped_column(Text)


class TaskLog(Base):
    """A chunk of a task's output, in the order the worker sent it."""

    __tablename__ = "task_logs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Blob(Base):
    """A payload too big to travel inside a message (see levers9.payloads): a call's arguments or result.

    Its bytes are the rows of :class:`BlobChunk`, in ``seq`` order; ``finished_at`` is set once the last
    chunk is stored, and only a finished blob can be read or named by a call.
    """

    __tablename__ = "blobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class BlobChunk(Base):
    __tablename__ = "blob_chunks"

    blob_id: Mapped[str] = mapped_column(ForeignKey("blobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class TaskPlacement(Base):
    """One step of a task's placement history: where it was tried and what happened."""

    __tablename__ = "task_placements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int]
    at: Mapped[datetime]
    outcome: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str | None] = mapped_column(String(64))
    gpu: Mapped[str | None] = mapped_column(String(64))
    region: Mapped[str | None] = mapped_column(String(64))
    worker_id: Mapped[str | None] = mapped_column(String(128))
    reason: Mapped[str | None] = mapped_column(Text)


class Secret(Base):
    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    #: the value, encrypted with the secret key (see levers9.state.crypto)
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Machine(Base):
    __tablename__ = "machines"
    __table_args__ = (
        CheckConstraint(_one_of("state", MACHINE_STATES), name="state"),
        Index("ix_machines_pool_state", "pool", "state"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(64))
    #: the provider's own id for the machine (an EC2 instance id...), once it has one
    provider_id: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    gpu: Mapped[str | None] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    region: Mapped[str | None] = mapped_column(String(64))
    worker_id: Mapped[str | None] = mapped_column(String(128))
    token_id: Mapped[str | None] = mapped_column(ForeignKey("tokens.id", ondelete="SET NULL"))
    #: the machine is given up on if its worker has not registered by then
    register_by: Mapped[datetime | None]
    created_at: Mapped[datetime]
    registered_at: Mapped[datetime | None]
    terminated_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    #: where the provider put the machine (migration 0005): its zone and instance type, and the
    #: provider's own small JSON handed back to its terminate hook
    zone: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str | None] = mapped_column(String(128))
    provider_data: Mapped[dict[str, Any] | None]
    #: the offer the machine was started from (``GpuOffer.key``) and its price in US dollars per hour
    offer_key: Mapped[str | None] = mapped_column(String(255))
    price_per_hour: Mapped[float | None] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (CheckConstraint(_one_of("status", CHECKPOINT_STATUSES), name="status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    stub_id: Mapped[str | None] = mapped_column(ForeignKey("stubs.id", ondelete="SET NULL"), index=True)
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16))
    runtime: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[str | None] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Cluster(Base):
    """A Kubernetes cluster attached by a workspace; its settings hold a kubeconfig, so they are encrypted."""

    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(64))
    settings_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]


class JoinedMachine(Base):
    """A machine joined with ``levers9 machine create`` (migration 0006); its id is its agent's.

    ``live_key`` is ``<workspace id or '-'>/<name>`` while the machine is not removed and NULL once it is:
    its unique constraint makes a name unique per workspace among live machines (the operator's
    included, whose workspace is NULL), on SQLite and PostgreSQL alike, with no partial index.
    """

    __tablename__ = "joined_machines"
    __table_args__ = (
        CheckConstraint(_one_of("state", JOINED_MACHINE_STATES), name="state"),
        UniqueConstraint("live_key"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    workspace_id: Mapped[str | None] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    pool: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    hostname: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime]
    joined_at: Mapped[datetime | None]
    removed_at: Mapped[datetime | None]
    created_by: Mapped[str | None] = mapped_column(ForeignKey("tokens.id", ondelete="SET NULL"))
    live_key: Mapped[str | None] = mapped_column(String(255))


__all__ = [
    "CHECKPOINT_STATUSES",
    "JOINED_MACHINE_STATES",
    "MACHINE_STATES",
    "NAMING_CONVENTION",
    "TASK_STATUSES",
    "TOKEN_KINDS",
    "App",
    "Base",
    "Checkpoint",
    "Cluster",
    "Deployment",
    "DeploymentVersion",
    "JoinedMachine",
    "Machine",
    "Secret",
    "Stub",
    "Task",
    "TaskPlacement",
    "Token",
    "UtcDateTime",
    "Workspace",
    "metadata",
    "new_id",
    "utcnow",
]


class BlueprintStep(Base):
    """A built step of a blueprint (migration 0007): its content key and the layer it made, per workspace.

    ``key`` is the step's content key (:func:`levers9.blueprints.spec.step_key`); a workspace's step is
    never used by another workspace's build. A step that changes only the image config (env, workdir) made
    no layer: its layer columns are NULL.
    """

    __tablename__ = "blueprint_steps"

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    op: Mapped[str] = mapped_column(String(16))
    #: sha256 hex of the uncompressed layer tar (what image configs list), and of the blob the registry holds
    diff_id: Mapped[str | None] = mapped_column(String(64))
    blob_digest: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime]


class BlueprintImage(Base):
    """A built image of a workspace (migration 0007): the key of its last step and where it is stored."""

    __tablename__ = "blueprint_images"

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    repository: Mapped[str] = mapped_column(String(255))
    manifest_digest: Mapped[str] = mapped_column(String(80))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    steps: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime]


class Volume(Base):
    """A workspace's volume (migration 0008): its files are the directory ``/<workspace_id>/<id>`` of the volumes'
    file system (:mod:`levers9.volumes.juicefs`). A deleted volume's row goes at once (its name is free again);
    its files are removed after."""

    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]


class SandboxSnapshot(Base):
    """A memory snapshot of one of a workspace's sandboxes (migration 0009): ``info`` is what its worker answered
    (:class:`levers9.worker.sandbox_snapshots.SnapshotInfo` as JSON, never a secret's value), the object it names
    lives in the checkpoint storage under ``key``. Deleting the row comes after deleting the object."""

    __tablename__ = "sandbox_snapshots"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    sandbox_id: Mapped[str] = mapped_column(String(80))
    #: the pool whose workers restore it (of its runtime, reading the same storage)
    pool: Mapped[str] = mapped_column(String(128))
    runtime: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    info: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
