"""Members, roles and environments (issue 40): people, their identities and roles in workspaces, tokens that act
for a person within a role, and environments (rows of ``workspaces`` with a ``parent_id``).

New tables, and new nullable or defaulted columns only, so the previous release runs beside it untouched
(docs/deploy.md, section 10): it never reads the new columns, a token it issues has no role (an owner's, as
before), and a workspace it creates is its own main environment.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = "'viewer', 'member', 'owner'"


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
    )
    op.create_table(
        "identities",
        sa.Column("issuer", sa.String(length=512), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_identities_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("issuer", "subject", name=op.f("pk_identities")),
    )
    op.create_index(op.f("ix_identities_user_id"), "identities", ["user_id"], unique=False)
    op.create_table(
        "members",
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(f"role IN ({ROLES})", name=op.f("ck_members_role")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_members_user_id_users"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_members_workspace_id_workspaces"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("workspace_id", "user_id", name=op.f("pk_members")),
    )
    op.create_index(op.f("ix_members_user_id"), "members", ["user_id"], unique=False)
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("environment", sa.String(length=64), server_default="main", nullable=False))
        batch.add_column(sa.Column("join_domain", sa.String(length=253), nullable=True))
        batch.add_column(sa.Column("join_role", sa.String(length=16), server_default="member", nullable=False))
        batch.create_foreign_key(
            op.f("fk_workspaces_parent_id_workspaces"), "workspaces", ["parent_id"], ["id"], ondelete="CASCADE"
        )
        batch.create_unique_constraint(op.f("uq_workspaces_parent_id_environment"), ["parent_id", "environment"])
        batch.create_check_constraint(op.f("ck_workspaces_join_role"), f"join_role IN ({ROLES})")
        batch.create_index(op.f("ix_workspaces_parent_id"), ["parent_id"], unique=False)
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("user_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("role", sa.String(length=16), nullable=True))
        batch.create_foreign_key(op.f("fk_tokens_user_id_users"), "users", ["user_id"], ["id"], ondelete="CASCADE")
        batch.create_check_constraint(op.f("ck_tokens_role"), f"role IN ({ROLES})")
        batch.create_index(op.f("ix_tokens_user_id"), ["user_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_index(op.f("ix_tokens_user_id"))
        batch.drop_constraint(op.f("ck_tokens_role"), type_="check")
        batch.drop_constraint(op.f("fk_tokens_user_id_users"), type_="foreignkey")
        batch.drop_column("role")
        batch.drop_column("user_id")
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_index(op.f("ix_workspaces_parent_id"))
        batch.drop_constraint(op.f("ck_workspaces_join_role"), type_="check")
        batch.drop_constraint(op.f("uq_workspaces_parent_id_environment"), type_="unique")
        batch.drop_constraint(op.f("fk_workspaces_parent_id_workspaces"), type_="foreignkey")
        batch.drop_column("join_role")
        batch.drop_column("join_domain")
        batch.drop_column("environment")
        batch.drop_column("parent_id")
    op.drop_index(op.f("ix_members_user_id"), table_name="members")
    op.drop_table("members")
    op.drop_index(op.f("ix_identities_user_id"), table_name="identities")
    op.drop_table("identities")
    op.drop_table("users")
