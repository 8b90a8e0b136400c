"""Blueprints: the steps each workspace built (their keys and layers) and the images they made (issue 33).

New tables only, so the previous release runs beside it untouched (docs/deploy.md, section 10).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blueprint_steps",
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=80), nullable=False),
        sa.Column("op", sa.String(length=16), nullable=False),
        sa.Column("diff_id", sa.String(length=64), nullable=True),
        sa.Column("blob_digest", sa.String(length=64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_blueprint_steps_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "key", name=op.f("pk_blueprint_steps")),
    )
    op.create_table(
        "blueprint_images",
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=80), nullable=False),
        sa.Column("repository", sa.String(length=255), nullable=False),
        sa.Column("manifest_digest", sa.String(length=80), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_blueprint_images_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "key", name=op.f("pk_blueprint_images")),
    )


def downgrade() -> None:
    op.drop_table("blueprint_images")
    op.drop_table("blueprint_steps")
