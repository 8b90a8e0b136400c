"""Workspaces, and the API tokens that act in them.

Only a token's SHA-256 is stored (see :func:`levers9.state.crypto.hash_token`):
someone who reads the database or a backup learns nothing that lets them call
the API.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from levers9.state.crypto import hash_token, new_token
from levers9.state.errors import AlreadyExists, DataDirectoryFull, NotFound
from levers9.state.sql._common import check_name, retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import Token, Workspace, new_id, utcnow
from levers9.state.sql.records import (
    ENVIRONMENT_SEPARATOR,
    MAIN_ENVIRONMENT,
    Role,
    TokenKind,
    TokenRecord,
    WorkspaceRecord,
    parse_enum,
)

#: ``last_used_at`` is only rewritten when it is older than this, so verifying a
#: token on every RPC does not turn every RPC into a database write
LAST_USED_RESOLUTION = timedelta(seconds=60)
#: the longest lifetime a token can be issued for (ten years): anything longer is "never", which is
#: asked for by giving no ttl at all, and a bound keeps the expiry a date the database can store
MAX_TOKEN_TTL_S = 10 * 365 * 86_400


def workspace_record(row: Workspace) -> WorkspaceRecord:
    return WorkspaceRecord(
        id=row.id,
        name=row.name,
        created_at=row.created_at,
        parent_id=row.parent_id,
        environment=row.environment or MAIN_ENVIRONMENT,
        join_domain=row.join_domain,
        join_role=row.join_role or Role.MEMBER.value,
    )


_workspace = workspace_record


def check_workspace_name(name: str) -> str:
    check_name(name, "workspace name", 128)
    if "/" in name:
        raise ValueError(
            f"workspace name {name!r} is not valid: it may not contain '/' (WORKSPACE/ENV names an environment)"
        )
    return name


def check_environment_name(name: str) -> str:
    """Environment names are short slugs: they appear in URLs, contexts and ``-e NAME``."""
    if (
        not (1 <= len(name) <= 32)
        or not all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
        or not name[0].isalnum()
    ):
        raise ValueError(
            f"environment name {name!r} is not valid: 1-32 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name.lower()


def _token(row: Token) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        kind=TokenKind(row.kind),
        workspace_id=row.workspace_id,
        subject=row.subject,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        user_id=row.user_id,
        role=None if row.role is None else Role(row.role),
    )


class TokenRefused(Exception):
    """A single-use token cannot be redeemed; ``reason`` is ``unknown``, ``wrong kind``, ``used`` or ``expired``.

    ``when`` is when it was used or expired, for the last two.
    """

    def __init__(self, reason: str, when: datetime | None = None) -> None:
        super().__init__(reason if when is None else f"{reason} at {when.isoformat(timespec='seconds')}")
        self.reason = reason
        self.when = when


class WorkspaceStore:
    """Workspaces: the unit that owns apps, tasks and secrets and never sees another's."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, name: str) -> WorkspaceRecord:
        check_workspace_name(name)
        try:
            async with self._db.transaction() as session:
                row = Workspace(id=new_id("ws"), name=name, created_at=utcnow())
                session.add(row)
                await session.flush()
                return _workspace(row)
        except IntegrityError:
            raise AlreadyExists(f"a workspace named {name!r} already exists") from None

    async def get_or_create(self, name: str) -> WorkspaceRecord:
        """The workspace called ``name``, made if missing (the default workspace of a fresh install)."""
        check_workspace_name(name)

        async def attempt() -> WorkspaceRecord:
            async with self._db.transaction() as session:
                row = await session.scalar(select(Workspace).where(Workspace.name == name))
                if row is None:
                    row = Workspace(id=new_id("ws"), name=name, created_at=utcnow())
                    session.add(row)
                    await session.flush()
                return _workspace(row)

        return await retry_on_race(attempt)

    async def get(self, workspace_id: str) -> WorkspaceRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Workspace, workspace_id)
            return None if row is None else _workspace(row)

    async def by_name(self, name: str) -> WorkspaceRecord | None:
        async with self._db.transaction() as session:
            row = await session.scalar(select(Workspace).where(Workspace.name == name))
            return None if row is None else _workspace(row)

    async def list(self) -> builtins.list[WorkspaceRecord]:
        """Every workspace (not their environments), by name: for operators, who alone may see them all."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Workspace).where(Workspace.parent_id.is_(None)).order_by(Workspace.name)
            )
            return [_workspace(row) for row in rows]

    # ----------------------------------------------------------------- environments

    async def environment(self, workspace_id: str, environment: str) -> WorkspaceRecord | None:
        """The environment ``environment`` of the workspace ``workspace_id`` (``main``: the workspace's own row)."""
        env = environment.lower()
        async with self._db.transaction() as session:
            if env == MAIN_ENVIRONMENT:
                row = await session.get(Workspace, workspace_id)
                return None if row is None or row.parent_id is not None else _workspace(row)
            row = await session.scalar(
                select(Workspace).where(Workspace.parent_id == workspace_id, Workspace.environment == env)
            )
            return None if row is None else _workspace(row)

    async def environments(self, workspace_id: str) -> builtins.list[WorkspaceRecord]:
        """The workspace's environments: ``main`` (its own row) first, then the others by name."""
        async with self._db.transaction() as session:
            root = await session.get(Workspace, workspace_id)
            if root is None or root.parent_id is not None:
                raise NotFound("workspace", workspace_id)
            rows = await session.scalars(
                select(Workspace).where(Workspace.parent_id == workspace_id).order_by(Workspace.environment)
            )
            return [_workspace(root), *(_workspace(row) for row in rows)]

    async def create_environment(self, workspace_id: str, environment: str) -> WorkspaceRecord:
        env = check_environment_name(environment)
        if env == MAIN_ENVIRONMENT:
            raise AlreadyExists("every workspace has the environment main")
        try:
            async with self._db.transaction() as session:
                root = await session.get(Workspace, workspace_id)
                if root is None or root.parent_id is not None:
                    raise NotFound("workspace", workspace_id)
                row = Workspace(
                    id=f"{root.id}{ENVIRONMENT_SEPARATOR}{uuid.uuid4().hex[:8]}",
                    name=f"{root.name}/{env}",
                    created_at=utcnow(),
                    parent_id=root.id,
                    environment=env,
                    join_role=Role.MEMBER.value,
                )
                session.add(row)
                await session.flush()
                return _workspace(row)
        except IntegrityError:
            raise AlreadyExists(f"the workspace already has an environment named {env!r}") from None

    async def delete_environment(self, environment_id: str) -> bool:
        """Delete an environment's row, and with it (by cascade) its apps, tasks, secrets, volumes' records and
        tokens; the caller checks first that nothing in it still runs. ``main`` cannot be deleted."""
        async with self._db.transaction() as session:
            row = await session.get(Workspace, environment_id)
            if row is None or row.parent_id is None:
                return False
            await session.delete(row)
            return True

    async def set_join(self, workspace_id: str, domain: str | None, role: Role | str) -> WorkspaceRecord:
        """Let people whose verified email is at ``domain`` join with ``role`` (None: by invitation only)."""
        wanted = parse_enum(Role, str(role), "role")
        if domain is not None:
            domain = domain.strip().lower().lstrip("@")
            if "." not in domain or "@" in domain or not domain.isprintable() or len(domain) > 253:
                raise ValueError(f"join domain {domain!r} is not a domain name such as example.com")
        async with self._db.transaction() as session:
            row = await session.get(Workspace, workspace_id)
            if row is None or row.parent_id is not None:
                raise NotFound("workspace", workspace_id)
            row.join_domain, row.join_role = domain, wanted.value
            await session.flush()
            return _workspace(row)

    async def joinable(self, email: str) -> builtins.list[WorkspaceRecord]:
        """The workspaces anyone with this verified email may join, by its domain."""
        domain = email.strip().lower().rpartition("@")[2]
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Workspace).where(Workspace.parent_id.is_(None), Workspace.join_domain == domain)
            )
            return [_workspace(row) for row in rows]


class TokenStore:
    """API tokens for users, workers, agents and machines."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @property
    def db(self) -> Database:
        return self._db

    async def issue(
        self,
        kind: str,
        *,
        workspace_id: str | None = None,
        subject: str | None = None,
        ttl_s: float | None = None,
        user_id: str | None = None,
        role: Role | str | None = None,
    ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself, which is returned this once and never stored.

        ``user_id``: the person it acts for; ``role``: the most it may do (None: an owner's, as tokens made before
        roles did)."""
        token_kind = parse_enum(TokenKind, kind, "token kind")
        token_role = None if role is None else parse_enum(Role, str(role), "role")
        if ttl_s is not None and not 0 < ttl_s <= MAX_TOKEN_TTL_S:  # NaN fails this too
            raise ValueError(
                f"ttl_s must be above 0 and at most {MAX_TOKEN_TTL_S} seconds (ten years), or None for a token "
                f"that never expires; got {ttl_s}"
            )
        token = new_token(token_kind.value)
        now = utcnow()
        async with self._db.transaction() as session:
            if workspace_id is not None and await session.get(Workspace, workspace_id) is None:
                raise NotFound("workspace", workspace_id)
            row = Token(
                id=new_id("tok"),
                workspace_id=workspace_id,
                kind=token_kind.value,
                subject=subject,
                token_hash=hash_token(token),
                created_at=now,
                expires_at=None if ttl_s is None else now + timedelta(seconds=ttl_s),
                revoked_at=None,
                last_used_at=None,
                user_id=user_id,
                role=None if token_role is None else token_role.value,
            )
            session.add(row)
            await session.flush()
            return _token(row), token

    async def verify(self, token: str, *, kind: str | None = None) -> TokenRecord | None:
        """The token's record if it is valid (known, not revoked, not expired, of ``kind`` if given), else None.

        Every failure gives the same None, so a caller cannot tell an attacker
        which of them it was.
        """
        wanted = None if kind is None else parse_enum(TokenKind, kind, "token kind")
        now = utcnow()
        async with self._db.transaction() as session:
            row = await session.scalar(select(Token).where(Token.token_hash == hash_token(token)))
            if row is None or row.revoked_at is not None:
                return None
            if row.expires_at is not None and row.expires_at <= now:
                return None
            if wanted is not None and row.kind != wanted.value:
                return None
            record = _token(row)
        if record.last_used_at is None or now - record.last_used_at >= LAST_USED_RESOLUTION:
            # A transaction of its own, after the read: the stamp is bookkeeping, and a disk too full to
            # write it must not refuse a valid token (every read of the API would fail with it).
            try:
                async with self._db.transaction() as session:
                    await session.execute(update(Token).where(Token.id == record.id).values(last_used_at=now))
            except DataDirectoryFull:
                return record
            record = replace(record, last_used_at=now)
        return record

    async def get(self, token_id: str) -> TokenRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Token, token_id)
            return None if row is None else _token(row)

    async def find(self, token: str) -> TokenRecord | None:
        """The record of the token itself (revoked and expired ones too), for an operator revoking it by value."""
        async with self._db.transaction() as session:
            row = await session.scalar(select(Token).where(Token.token_hash == hash_token(token)))
            return None if row is None else _token(row)

    async def list_for_workspace(self, workspace_id: str | None) -> builtins.list[TokenRecord]:
        """A workspace's tokens, oldest first, revoked and expired ones included so their history stays visible.

        ``None`` lists only the tokens bound to no workspace (operators' tokens,
        the machines of shared pools), never every token: a None that slipped
        through cannot widen a listing to all workspaces at once.
        """
        owner = Token.workspace_id.is_(None) if workspace_id is None else Token.workspace_id == workspace_id
        async with self._db.transaction() as session:
            rows = await session.scalars(select(Token).where(owner).order_by(Token.created_at, Token.id))
            return [_token(row) for row in rows]

    async def revoke(self, token_id: str) -> bool:
        """Revoke one token; False if it does not exist. Revoking twice keeps the first time."""
        async with self._db.transaction() as session:
            row = await session.get(Token, token_id, with_for_update=True)
            if row is None:
                return False
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            return True

    async def exchange(
        self, token: str, *, kind: str, subject_prefix: str, issue_kind: str
    ) -> tuple[TokenRecord, TokenRecord, str]:
        """Spend the single-use ``token`` and issue its successor, in one transaction.

        ``token`` must be live, of ``kind``, and its subject must start with
        ``subject_prefix``; it is revoked by a conditional update, so of two
        exchanges racing on one token exactly one wins. The new token (of
        ``issue_kind``, never expiring) has the same workspace and the subject
        after the prefix. Returns (the spent token's record, the new record,
        the new token itself, shown this once). Raises :class:`TokenRefused`
        saying why: unknown, already used, expired, or not such a token.
        """
        wanted = parse_enum(TokenKind, kind, "token kind")
        new_kind = parse_enum(TokenKind, issue_kind, "token kind")
        key = hash_token(token)
        now = utcnow()
        async with self._db.transaction() as session:
            row = await session.scalar(select(Token).where(Token.token_hash == key))
            if row is None:
                raise TokenRefused("unknown")
            if row.kind != wanted.value or not (row.subject or "").startswith(subject_prefix):
                raise TokenRefused("wrong kind")
            if row.revoked_at is not None:
                raise TokenRefused("used", row.revoked_at)
            if row.expires_at is not None and row.expires_at <= now:
                raise TokenRefused("expired", row.expires_at)
            spent = await session.execute(
                update(Token)
                .where(Token.id == row.id, Token.revoked_at.is_(None))
                .values(revoked_at=now, last_used_at=now)
                .execution_options(synchronize_session=False)
            )
            if spent.rowcount != 1:  # type: ignore[attr-defined]
                raise TokenRefused("used", now)
            await session.refresh(row)
            successor = new_token(new_kind.value)
            new_row = Token(
                id=new_id("tok"),
                workspace_id=row.workspace_id,
                kind=new_kind.value,
                subject=(row.subject or "")[len(subject_prefix) :] or None,
                token_hash=hash_token(successor),
                created_at=now,
                expires_at=None,
                revoked_at=None,
                last_used_at=None,
                user_id=row.user_id,
                role=row.role,
            )
            session.add(new_row)
            await session.flush()
            return _token(row), _token(new_row), successor

    async def redeem(self, token_id: str) -> bool:
        """Spend a single-use token (a machine's join token): True for the one caller that spent it.

        Spending is revoking, in one conditional update, so of two registrations racing with the same
        join token exactly one gets True; an expired, revoked or already spent token gives False.
        """
        now = utcnow()
        async with self._db.transaction() as session:
            result = await session.execute(
                update(Token)
                .where(
                    Token.id == token_id,
                    Token.revoked_at.is_(None),
                    (Token.expires_at.is_(None)) | (Token.expires_at > now),
                )
                .values(revoked_at=now)
                .execution_options(synchronize_session=False)
            )
            count: int = result.rowcount  # type: ignore[attr-defined]
            return count == 1

    async def revoke_user(self, workspace_ids: Iterable[str], user_id: str) -> builtins.list[str]:
        """Revoke every live token ``user_id`` holds in these workspaces or environments; the ids revoked."""
        scopes = list(workspace_ids)
        async with self._db.transaction() as session:
            ids = list(
                await session.scalars(
                    select(Token.id).where(
                        Token.user_id == user_id, Token.workspace_id.in_(scopes), Token.revoked_at.is_(None)
                    )
                )
            )
            if ids:
                await session.execute(
                    update(Token)
                    .where(Token.id.in_(ids))
                    .values(revoked_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
            return ids

    async def revoke_subject(self, subject: str) -> int:
        """Revoke every live token of ``subject`` (a machine being terminated); returns how many."""
        async with self._db.transaction() as session:
            result = await session.execute(
                update(Token)
                .where(Token.subject == subject, Token.revoked_at.is_(None))
                .values(revoked_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            count: int = result.rowcount  # type: ignore[attr-defined]
            return count

    async def invalid(self, token_ids: Iterable[str]) -> builtins.set[str]:
        """Which of ``token_ids`` are no longer valid (revoked, expired or unknown), in one read per 500 ids.

        For the open streams' re-check (:mod:`levers9.services.revocation`): one query for all of them.
        """
        wanted = builtins.list(dict.fromkeys(token_ids))
        now = utcnow()
        valid: builtins.set[str] = builtins.set()
        async with self._db.transaction() as session:
            for start in range(0, len(wanted), 500):
                rows = await session.execute(
                    select(Token.id, Token.revoked_at, Token.expires_at).where(
                        Token.id.in_(wanted[start : start + 500])
                    )
                )
                valid.update(
                    token_id
                    for token_id, revoked_at, expires_at in rows
                    if revoked_at is None and (expires_at is None or expires_at > now)
                )
        return builtins.set(wanted) - valid


__all__ = ["LAST_USED_RESOLUTION", "MAX_TOKEN_TTL_S", "TokenRefused", "TokenStore", "WorkspaceStore"]
