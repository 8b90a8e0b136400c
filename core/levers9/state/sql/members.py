"""People and their roles in workspaces: users, the identities they sign in with, and memberships.

Invariants the stores keep:

* an email is stored lowercased and names one user; an OpenID Connect issuer's
  ``sub`` names one user for good (an identity is never moved to another user);
* a membership is of a workspace, never of one of its environments: a role holds
  in every environment of the workspace;
* a workspace with members always keeps at least one owner: demoting or removing
  the last one raises :class:`LastOwner`, and nothing is changed.
"""

from __future__ import annotations

import builtins

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from levers9.state.errors import NotFound
from levers9.state.sql._common import check_name, retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import Identity, Member, User, Workspace, new_id, utcnow
from levers9.state.sql.records import MemberRecord, Role, UserRecord, WorkspaceRecord, parse_enum
from levers9.state.sql.workspaces import workspace_record

__all__ = ["LastOwner", "MemberStore", "UserStore", "check_email"]


class LastOwner(Exception):
    """The change would leave a workspace with members but no owner."""


def check_email(value: str) -> str:
    """An email address, lowercased; ValueError naming what is wrong."""
    email = value.strip().lower()
    local, at, domain = email.partition("@")
    bad = not email.isprintable() or any(c.isspace() for c in email) or "@" in domain
    if not at or not local or "." not in domain.strip(".") or len(email) > 320 or bad:
        raise ValueError(f"email {value!r} is not an address: it must look like name@example.com")
    return email


def _user(row: User) -> UserRecord:
    return UserRecord(id=row.id, email=row.email, name=row.name, created_at=row.created_at)


class UserStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, user_id: str) -> UserRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(User, user_id)
            return None if row is None else _user(row)

    async def by_email(self, email: str) -> UserRecord | None:
        address = check_email(email)
        async with self._db.transaction() as session:
            row = await session.scalar(select(User).where(User.email == address))
            return None if row is None else _user(row)

    async def get_or_create(self, email: str, name: str = "") -> UserRecord:
        """The user with ``email``, made if missing (an invitation names a person before they ever sign in)."""
        address = check_email(email)
        display = check_name(name, "name", 128) if name else address.partition("@")[0]

        async def attempt() -> UserRecord:
            async with self._db.transaction() as session:
                row = await session.scalar(select(User).where(User.email == address))
                if row is None:
                    row = User(id=new_id("usr"), email=address, name=display, created_at=utcnow())
                    session.add(row)
                    await session.flush()
                return _user(row)

        return await retry_on_race(attempt)

    async def signed_in(self, issuer: str, subject: str, email: str, name: str = "") -> UserRecord:
        """The user an identity provider vouched for: the one this (issuer, subject) signed in as before, else
        the one with this (verified) email, linked to the identity from now on, else a new user."""

        async def attempt() -> UserRecord:
            async with self._db.transaction() as session:
                known = await session.get(Identity, (issuer, subject))
                if known is not None:
                    row = await session.get(User, known.user_id)
                    if row is not None:
                        return _user(row)
            user = await self.get_or_create(email, name)
            async with self._db.transaction() as session:
                session.add(Identity(issuer=issuer, subject=subject, user_id=user.id, created_at=utcnow()))
                await session.flush()
            return user

        return await retry_on_race(attempt)


class MemberStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def role_of(self, workspace_id: str, user_id: str) -> Role | None:
        """The user's role in the workspace (its id, not an environment's); None for no membership."""
        async with self._db.transaction() as session:
            row = await session.get(Member, (workspace_id, user_id))
            return None if row is None else Role(row.role)

    async def list(self, workspace_id: str) -> builtins.list[MemberRecord]:
        """The workspace's members, owners first, then by email."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(Member, User).join(User, User.id == Member.user_id).where(Member.workspace_id == workspace_id)
            )
            members = [
                MemberRecord(
                    workspace_id=m.workspace_id,
                    user_id=u.id,
                    email=u.email,
                    name=u.name,
                    role=Role(m.role),
                    created_at=m.created_at,
                )
                for m, u in rows
            ]
        return sorted(members, key=lambda m: (-m.role.rank, m.email))

    async def put(self, workspace_id: str, user_id: str, role: Role | str) -> tuple[MemberRecord, bool]:
        """Make the user a member with ``role``, or change their role; (the member, whether they are new).
        Raises LastOwner when that would demote the workspace's last owner."""
        wanted = parse_enum(Role, str(role), "role")

        async def attempt() -> tuple[MemberRecord, bool]:
            async with self._db.transaction() as session:
                workspace = await session.get(Workspace, workspace_id)
                if workspace is None or workspace.parent_id is not None:
                    raise NotFound("workspace", workspace_id)
                user = await session.get(User, user_id)
                if user is None:
                    raise NotFound("user", user_id)
                row = await session.get(Member, (workspace_id, user_id), with_for_update=True)
                created = row is None
                if row is None:
                    row = Member(workspace_id=workspace_id, user_id=user_id, role=wanted.value, created_at=utcnow())
                    session.add(row)
                elif row.role != wanted.value:
                    if row.role == Role.OWNER.value and await self._owners(session, workspace_id) <= 1:
                        raise LastOwner(f"{user.email} is the workspace's only owner; make someone else owner first")
                    row.role = wanted.value
                await session.flush()
                record = MemberRecord(
                    workspace_id=workspace_id,
                    user_id=user_id,
                    email=user.email,
                    name=user.name,
                    role=wanted,
                    created_at=row.created_at,
                )
                return record, created

        try:
            return await retry_on_race(attempt)
        except IntegrityError:
            raise NotFound("workspace", workspace_id) from None

    async def remove(self, workspace_id: str, user_id: str) -> bool:
        """End a membership; False when there was none. Raises LastOwner for the workspace's last owner."""
        async with self._db.transaction() as session:
            row = await session.get(Member, (workspace_id, user_id), with_for_update=True)
            if row is None:
                return False
            if row.role == Role.OWNER.value and await self._owners(session, workspace_id) <= 1:
                raise LastOwner("that is the workspace's only owner; make someone else owner first")
            await session.execute(delete(Member).where(Member.workspace_id == workspace_id, Member.user_id == user_id))
            return True

    async def workspaces_of(self, user_id: str) -> builtins.list[tuple[WorkspaceRecord, Role]]:
        """The workspaces the user is a member of, by name, with their role in each."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(Workspace, Member.role)
                .join(Member, Member.workspace_id == Workspace.id)
                .where(Member.user_id == user_id)
                .order_by(Workspace.name)
            )
            return [(workspace_record(w), Role(role)) for w, role in rows]

    @staticmethod
    async def _owners(session: AsyncSession, workspace_id: str) -> int:
        count = await session.scalar(
            select(func.count())
            .select_from(Member)
            .where(Member.workspace_id == workspace_id, Member.role == Role.OWNER.value)
        )
        return int(count or 0)
