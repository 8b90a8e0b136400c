"""Blobs: payloads too big to travel inside a message (a call's arguments or result), stored in chunks.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_blobs_workspace_id_workspaces"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_blobs")),
    )
    op.create_index(op.f("ix_blobs_workspace_id"), "blobs", ["workspace_id"], unique=False)
    op.create_table(
        "blob_chunks",
        sa.Column("blob_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_id"], ["blobs.id"], name=op.f("fk_blob_chunks_blob_id_blobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("blob_id", "seq", name=op.f("pk_blob_chunks")),
    )


def downgrade() -> None:
    op.drop_table("blob_chunks")
    op.drop_index(op.f("ix_blobs_workspace_id"), table_name="blobs")
    op.drop_table("blobs")
