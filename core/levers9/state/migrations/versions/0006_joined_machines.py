"""Joined machines: the boxes ``levers9 machine create`` joins, one row per agent (issue 17).

A new table only, so the previous release runs beside it untouched (docs/deploy.md, section 10).
``live_key`` is unique while a machine is live and NULL once removed (see the model's docstring).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "joined_machines",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("workspace_id", sa.String(length=64), nullable=True),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("live_key", sa.String(length=255), nullable=True),
        sa.CheckConstraint("state IN ('pending', 'joined', 'removed')", name=op.f("ck_joined_machines_state")),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_joined_machines_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["created_by"], ["tokens.id"], name=op.f("fk_joined_machines_created_by_tokens"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_joined_machines")),
        sa.UniqueConstraint("live_key", name=op.f("uq_joined_machines_live_key")),
    )
    op.create_index(op.f("ix_joined_machines_workspace_id"), "joined_machines", ["workspace_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_joined_machines_workspace_id"), table_name="joined_machines")
    op.drop_table("joined_machines")
