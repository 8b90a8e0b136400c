"""Joined machines in SQL: one row per box ``levers9 machine create`` joins, keyed by its agent's id.

A row is ``pending`` from the join token's issue, ``joined`` once the agent
spent the token, ``removed`` after ``levers9 machine remove`` (kept for its
history; a removed machine is never live again). A name is unique per
workspace among live machines (the operator's, workspace None, included):
``live_key`` enforces it and is cleared on removal, so the name may be used
again. :class:`~levers9.state.errors.AlreadyExists` names a taken name;
:class:`~levers9.state.errors.NotFound` an unknown one.
"""

from __future__ import annotations

import builtins
import re

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from levers9.state.errors import AlreadyExists, NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.models import JoinedMachine, utcnow
from levers9.state.sql.records import JoinedMachineRecord

__all__ = ["JoinedMachineStore", "check_machine_name"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_machine_name(name: str) -> str:
    """A joined machine's name: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"machine name {name!r} is not valid: 1-64 letters, digits, '_', '.' or '-', starting with a letter "
            "or digit (a host name such as 'gpu-box-1' works)"
        )
    return name


def _live_key(workspace_id: str | None, name: str) -> str:
    return f"{workspace_id or '-'}/{name}"


def _record(row: JoinedMachine) -> JoinedMachineRecord:
    return JoinedMachineRecord(
        id=row.id,
        name=row.name,
        workspace_id=row.workspace_id,
        pool=row.pool,
        provider=row.provider,
        state=row.state,
        hostname=row.hostname,
        created_at=row.created_at,
        joined_at=row.joined_at,
        removed_at=row.removed_at,
        created_by=row.created_by,
    )


def _owner(workspace_id: str | None) -> object:
    return JoinedMachine.workspace_id.is_(None) if workspace_id is None else JoinedMachine.workspace_id == workspace_id


class JoinedMachineStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, agent_id: str, *, name: str, workspace_id: str | None, pool: str, provider: str, created_by: str | None
    ) -> JoinedMachineRecord:
        """A pending machine; :class:`AlreadyExists` when the workspace has a live machine of that name."""
        check_machine_name(name)
        try:
            async with self._db.transaction() as session:
                row = JoinedMachine(
                    id=agent_id,
                    name=name,
                    workspace_id=workspace_id,
                    pool=pool,
                    provider=provider,
                    state="pending",
                    hostname=None,
                    created_at=utcnow(),
                    joined_at=None,
                    removed_at=None,
                    created_by=created_by,
                    live_key=_live_key(workspace_id, name),
                )
                session.add(row)
                await session.flush()
                return _record(row)
        except IntegrityError:
            where = "the operator's machines" if workspace_id is None else "this workspace"
            raise AlreadyExists(
                f"{where} already has a machine named {name!r}: choose another --name, or remove it first "
                f"(levers9 machine remove {name})"
            ) from None

    async def get(self, agent_id: str) -> JoinedMachineRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(JoinedMachine, agent_id)
            return None if row is None else _record(row)

    async def by_name(self, workspace_id: str | None, name: str) -> JoinedMachineRecord:
        """The workspace's live machine called ``name`` (None: the operator's); :class:`NotFound` otherwise."""
        async with self._db.transaction() as session:
            row = await session.scalar(
                select(JoinedMachine).where(JoinedMachine.live_key == _live_key(workspace_id, name))
            )
            if row is None:
                raise NotFound("machine", name)
            return _record(row)

    async def list(self, workspace_id: str | None, *, removed: bool = False) -> builtins.list[JoinedMachineRecord]:
        """The workspace's machines by name (None: the operator's, never every workspace's); live ones unless
        ``removed``."""
        query = select(JoinedMachine).where(_owner(workspace_id))  # type: ignore[arg-type]
        if not removed:
            query = query.where(JoinedMachine.state != "removed")
        async with self._db.transaction() as session:
            rows = await session.scalars(query.order_by(JoinedMachine.name, JoinedMachine.created_at))
            return [_record(row) for row in rows]

    async def mark_joined(self, agent_id: str, *, hostname: str) -> JoinedMachineRecord | None:
        """The agent spent its join token; None when no row is its (an agent joined some other way)."""
        async with self._db.transaction() as session:
            row = await session.get(JoinedMachine, agent_id, with_for_update=True)
            if row is None:
                return None
            if row.state == "pending":
                row.state = "joined"
                row.joined_at = utcnow()
            if hostname:
                row.hostname = hostname[:255]
            await session.flush()
            return _record(row)

    async def mark_removed(self, agent_id: str) -> JoinedMachineRecord:
        """Removed for good (idempotent); the name is free again."""
        async with self._db.transaction() as session:
            row = await session.get(JoinedMachine, agent_id, with_for_update=True)
            if row is None:
                raise NotFound("machine", agent_id)
            if row.state != "removed":
                row.state = "removed"
                row.removed_at = utcnow()
                row.live_key = None
                await session.flush()
            return _record(row)
