"""Each workspace's volumes, by name (issue 34).

A name is unique within its workspace only; two workspaces may each have a volume ``weights``, and
neither ever finds the other's: every read is by (workspace, name) or by (workspace, id). A volume's
id, not its name, names its directory in the file system, so a name deleted and made again is a new,
empty volume even while the old one's files are still being removed.
"""

from __future__ import annotations

import builtins
import re

from sqlalchemy import delete, select

from levers9.state.errors import NotFound
from levers9.state.sql._common import retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import Volume, Workspace, new_id, utcnow
from levers9.state.sql.records import VolumeRecord

__all__ = ["MAX_VOLUME_NAME", "VolumeStore", "check_volume_name"]

MAX_VOLUME_NAME = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_volume_name(name: str) -> str:
    """``name`` when it can name a volume, else ValueError saying what is accepted."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_VOLUME_NAME:
        raise ValueError(
            f"volume name {str(name)[:100]!r} is not valid: use 1-{MAX_VOLUME_NAME} letters, digits, '.', '_' "
            "and '-', starting with a letter or digit (for example model-weights)"
        )
    return name


def _record(row: Volume) -> VolumeRecord:
    return VolumeRecord(row.id, row.workspace_id, row.name, row.created_at)


class VolumeStore:
    """Named volumes per workspace; a workspace only ever sees its own."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_or_create(self, workspace_id: str, name: str) -> tuple[VolumeRecord, bool]:
        """The workspace's volume ``name``, made when it has none; and whether it was made now."""
        check_volume_name(name)

        async def attempt() -> tuple[VolumeRecord, bool]:
            async with self._db.transaction() as session:
                row = await session.scalar(
                    select(Volume).where(Volume.workspace_id == workspace_id, Volume.name == name)
                )
                if row is not None:
                    return _record(row), False
                if await session.get(Workspace, workspace_id) is None:
                    raise NotFound("workspace", workspace_id)
                row = Volume(id=new_id("vol"), workspace_id=workspace_id, name=name, created_at=utcnow())
                session.add(row)
                await session.flush()
                return _record(row), True

        return await retry_on_race(attempt)

    async def get(self, workspace_id: str, name: str) -> VolumeRecord | None:
        async with self._db.transaction() as session:
            row = await session.scalar(select(Volume).where(Volume.workspace_id == workspace_id, Volume.name == name))
            return None if row is None else _record(row)

    async def by_names(self, workspace_id: str, names: builtins.list[str]) -> dict[str, VolumeRecord]:
        """The workspace's volumes among ``names``, by name (those it has none of are absent)."""
        if not names:
            return {}
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Volume).where(Volume.workspace_id == workspace_id, Volume.name.in_(names))
            )
            return {row.name: _record(row) for row in rows}

    async def by_ids(self, workspace_id: str, ids: builtins.list[str]) -> dict[str, VolumeRecord]:
        """The workspace's volumes among ``ids``, by id."""
        if not ids:
            return {}
        async with self._db.transaction() as session:
            rows = await session.scalars(select(Volume).where(Volume.workspace_id == workspace_id, Volume.id.in_(ids)))
            return {row.id: _record(row) for row in rows}

    async def list(self, workspace_id: str) -> builtins.list[VolumeRecord]:
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Volume).where(Volume.workspace_id == workspace_id).order_by(Volume.name)
            )
            return [_record(row) for row in rows]

    async def delete(self, workspace_id: str, name: str) -> VolumeRecord:
        """Remove the volume's row (its files are the caller's to remove); NotFound when there is none."""
        async with self._db.transaction() as session:
            row = await session.scalar(
                select(Volume).where(Volume.workspace_id == workspace_id, Volume.name == name).with_for_update()
            )
            if row is None:
                raise NotFound("volume", name)
            record = _record(row)
            await session.execute(delete(Volume).where(Volume.id == row.id))
            return record
