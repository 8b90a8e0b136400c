"""Machines keep where the provider put them: zone, instance type, the provider's own data, and the offer taken.

Every column is nullable, so the previous release keeps inserting machines
without them while a rolling upgrade runs (docs/deploy.md, section 10); its
records simply have none, and the reconciler fills ``provider_data`` from the
provider's listing when it has it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("zone", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("instance_type", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("provider_data", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("offer_key", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("price_per_hour", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("price_per_hour")
        batch.drop_column("offer_key")
        batch.drop_column("provider_data")
        batch.drop_column("instance_type")
        batch.drop_column("zone")
