"""What a call carries and leaves: stub handlers, call arguments and results, and task output.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Arguments and results live in their own table, not in ``tasks``, so listing
and rebuilding tasks never drags megabytes of pickles along. Output is kept
as appended chunks, so a running task's log can be followed.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("stubs") as batch:
        batch.add_column(sa.Column("handler", sa.LargeBinary(), nullable=True))
    op.create_table(
        "task_io",
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("args", sa.LargeBinary(), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("error_type", sa.String(255), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_io_task_id_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_task_io")),
    )
    op.create_table(
        "task_logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_logs_task_id_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_logs")),
    )
    op.create_index(op.f("ix_task_logs_task_id"), "task_logs", ["task_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_task_logs_task_id"), table_name="task_logs")
    op.drop_table("task_logs")
    op.drop_table("task_io")
    with op.batch_alter_table("stubs") as batch:
        batch.drop_column("handler")
