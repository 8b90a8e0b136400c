"""The initial schema: workspaces, tokens, apps, stubs, deployments, tasks and their placement history,
secrets, machines, checkpoints and clusters.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand and kept free of imports from levers9.state.sql.models, so that
later model changes cannot silently change what this migration creates.
Timestamps are ``timestamptz`` on PostgreSQL; on SQLite they are stored as UTC
text (the models' UtcDateTime adds the zone back when reading).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id(name: str = "id") -> sa.Column[str]:
    return sa.Column(name, sa.String(64), nullable=False)


def _ref(name: str, *, nullable: bool = False) -> sa.Column[str]:
    return sa.Column(name, sa.String(64), nullable=nullable)


def _at(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _fk(table: str, column: str, target: str, ondelete: str | None = "CASCADE") -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}"), ondelete=ondelete
    )


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "workspaces",
        _id(),
        sa.Column("name", sa.String(128), nullable=False),
        _at("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("name", name=op.f("uq_workspaces_name")),
    )
    op.create_table(
        "tokens",
        _id(),
        _ref("workspace_id", nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(128), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        _at("created_at"),
        _at("expires_at", nullable=True),
        _at("revoked_at", nullable=True),
        _at("last_used_at", nullable=True),
        sa.CheckConstraint(_in("kind", ("user", "worker", "agent", "machine")), name=op.f("ck_tokens_kind")),
        _fk("tokens", "workspace_id", "workspaces"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )
    op.create_index(op.f("ix_tokens_subject"), "tokens", ["subject"])
    op.create_table(
        "apps",
        _id(),
        _ref("workspace_id"),
        sa.Column("name", sa.String(128), nullable=False),
        _at("created_at"),
        _fk("apps", "workspace_id", "workspaces"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_apps")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_apps_workspace_id_name")),
    )
    op.create_table(
        "stubs",
        _id(),
        _ref("workspace_id"),
        _ref("app_id"),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        _at("created_at"),
        _fk("stubs", "workspace_id", "workspaces"),
        _fk("stubs", "app_id", "apps"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stubs")),
        sa.UniqueConstraint("app_id", "config_hash", name=op.f("uq_stubs_app_id_config_hash")),
    )
    op.create_table(
        "deployments",
        _id(),
        _ref("workspace_id"),
        _ref("app_id"),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("active_version", sa.Integer(), nullable=True),
        _at("created_at"),
        _fk("deployments", "workspace_id", "workspaces"),
        _fk("deployments", "app_id", "apps"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_deployments_workspace_id_name")),
    )
    op.create_table(
        "deployment_versions",
        _id(),
        _ref("deployment_id"),
        sa.Column("version", sa.Integer(), nullable=False),
        _ref("stub_id"),
        _at("created_at"),
        _fk("deployment_versions", "deployment_id", "deployments"),
        _fk("deployment_versions", "stub_id", "stubs", ondelete=None),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_versions")),
        sa.UniqueConstraint("deployment_id", "version", name=op.f("uq_deployment_versions_deployment_id_version")),
    )
    op.create_table(
        "tasks",
        _id(),
        _ref("workspace_id"),
        _ref("stub_id", nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("container_id", sa.String(128), nullable=True),
        sa.Column("worker_id", sa.String(128), nullable=True),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("gpu", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _at("created_at"),
        _at("updated_at"),
        _at("started_at", nullable=True),
        _at("finished_at", nullable=True),
        sa.CheckConstraint(
            _in("status", ("pending", "running", "complete", "error", "cancelled", "timeout")),
            name=op.f("ck_tasks_status"),
        ),
        _fk("tasks", "workspace_id", "workspaces"),
        _fk("tasks", "stub_id", "stubs", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    op.create_index(op.f("ix_tasks_status"), "tasks", ["status"])
    op.create_index(op.f("ix_tasks_workspace_id"), "tasks", ["workspace_id"])
    op.create_table(
        "task_placements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _ref("task_id"),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _at("at"),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("gpu", sa.String(64), nullable=True),
        sa.Column("region", sa.String(64), nullable=True),
        sa.Column("worker_id", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        _fk("task_placements", "task_id", "tasks"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_placements")),
    )
    op.create_index(op.f("ix_task_placements_task_id"), "task_placements", ["task_id"])
    op.create_table(
        "secrets",
        _id(),
        _ref("workspace_id"),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        _at("created_at"),
        _at("updated_at"),
        _fk("secrets", "workspace_id", "workspaces"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_secrets")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_secrets_workspace_id_name")),
    )
    op.create_table(
        "machines",
        _id(),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("provider_id", sa.String(255), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("gpu", sa.String(64), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(64), nullable=True),
        sa.Column("worker_id", sa.String(128), nullable=True),
        _ref("token_id", nullable=True),
        _at("register_by", nullable=True),
        _at("created_at"),
        _at("registered_at", nullable=True),
        _at("terminated_at", nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            _in("state", ("requested", "starting", "running", "draining", "terminating", "terminated", "failed")),
            name=op.f("ck_machines_state"),
        ),
        _fk("machines", "token_id", "tokens", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machines")),
    )
    op.create_index("ix_machines_pool_state", "machines", ["pool", "state"])
    op.create_table(
        "checkpoints",
        _id(),
        _ref("workspace_id"),
        _ref("stub_id", nullable=True),
        _ref("task_id", nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("runtime", sa.String(64), nullable=False),
        sa.Column("gpu", sa.String(64), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _at("created_at"),
        _at("updated_at"),
        sa.CheckConstraint(
            _in("status", ("pending", "available", "failed", "restore_failed")), name=op.f("ck_checkpoints_status")
        ),
        _fk("checkpoints", "workspace_id", "workspaces"),
        _fk("checkpoints", "stub_id", "stubs", ondelete="SET NULL"),
        _fk("checkpoints", "task_id", "tasks", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    op.create_index(op.f("ix_checkpoints_stub_id"), "checkpoints", ["stub_id"])
    op.create_table(
        "clusters",
        _id(),
        _ref("workspace_id"),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("settings_ciphertext", sa.LargeBinary(), nullable=True),
        _at("created_at"),
        _fk("clusters", "workspace_id", "workspaces"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_clusters_workspace_id_name")),
    )


def downgrade() -> None:
    # Children before parents, so foreign keys never point at a dropped table.
    for table in (
        "clusters",
        "checkpoints",
        "machines",
        "secrets",
        "task_placements",
        "tasks",
        "deployment_versions",
        "deployments",
        "stubs",
        "apps",
        "tokens",
        "workspaces",
    ):
        op.drop_table(table)
