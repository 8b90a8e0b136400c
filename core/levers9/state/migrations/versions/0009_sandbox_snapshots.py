"""Sandbox snapshots: each workspace's stored memory snapshots of its sandboxes (issue 39).

A new table only, so the previous release runs beside it untouched (docs/deploy.md, section 10).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sandbox_snapshots",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("sandbox_id", sa.String(length=80), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("runtime", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_sandbox_snapshots_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandbox_snapshots")),
    )
    op.create_index(op.f("ix_sandbox_snapshots_workspace_id"), "sandbox_snapshots", ["workspace_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sandbox_snapshots_workspace_id"), table_name="sandbox_snapshots")
    op.drop_table("sandbox_snapshots")
