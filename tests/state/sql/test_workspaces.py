"""Workspaces, and tokens: stored hashed, valid only while neither revoked nor expired."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from levers9.state.crypto import hash_token
from levers9.state.errors import AlreadyExists, NotFound
from levers9.state.sql import workspaces as workspaces_module
from levers9.state.sql.database import Database
from levers9.state.sql.models import utcnow
from levers9.state.sql.records import TokenKind, WorkspaceRecord
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore


async def test_workspaces_by_id_and_name(db: Database) -> None:
    store = WorkspaceStore(db)
    created = await store.create("research")
    assert created.id.startswith("ws_")
    assert await store.get(created.id) == created
    assert await store.by_name("research") == created
    assert await store.get("ws_missing") is None
    assert await store.by_name("missing") is None
    with pytest.raises(AlreadyExists, match="'research' already exists"):
        await store.create("research")
    assert await store.get_or_create("research") == created
    other = await store.get_or_create("other")
    assert other.id != created.id


@pytest.mark.parametrize("name", ["", " padded", "x" * 129, "tab\there"])
async def test_workspace_names_are_checked(db: Database, name: str) -> None:
    with pytest.raises(ValueError, match="workspace name"):
        await WorkspaceStore(db).create(name)


async def test_the_database_holds_only_the_token_hash(db: Database, workspace: WorkspaceRecord) -> None:
    record, token = await TokenStore(db).issue("user", workspace_id=workspace.id)
    assert token.startswith("l9_user_")
    assert record.kind is TokenKind.USER
    assert record.workspace_id == workspace.id
    async with db.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT * FROM tokens"))).all()
    assert len(rows) == 1
    stored = [str(value) for value in rows[0]]
    assert hash_token(token) in stored
    assert not any(token in value or token.split("_", 2)[2] in value for value in stored)


async def test_verify_accepts_a_valid_token_and_notes_its_use(db: Database) -> None:
    tokens = TokenStore(db)
    record, token = await tokens.issue("worker", subject="mach_1", ttl_s=3600)
    assert record.last_used_at is None
    assert record.expires_at is not None
    assert record.expires_at - record.created_at == timedelta(hours=1)
    verified = await tokens.verify(token)
    assert verified is not None
    assert verified.id == record.id
    assert verified.last_used_at is not None
    assert await tokens.verify(token, kind="worker") is not None
    stored = await tokens.get(record.id)
    assert stored is not None
    assert stored.last_used_at == verified.last_used_at


async def test_unknown_wrong_kind_revoked_and_expired_tokens_are_refused(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = TokenStore(db)
    assert await tokens.verify("l9_user_never-issued") is None
    _, user_token = await tokens.issue("user")
    assert await tokens.verify(user_token, kind="machine") is None
    revoked, revoked_token = await tokens.issue("agent")
    assert await tokens.revoke(revoked.id) is True
    assert await tokens.verify(revoked_token) is None
    assert await tokens.revoke("tok_missing") is False
    _, expiring_token = await tokens.issue("user", ttl_s=60)
    assert await tokens.verify(expiring_token) is not None
    later = utcnow() + timedelta(seconds=61)
    monkeypatch.setattr(workspaces_module, "utcnow", lambda: later)
    assert await tokens.verify(expiring_token) is None
    assert await tokens.verify(user_token) is not None  # no expiry: still valid later


async def test_last_used_is_only_rewritten_once_a_minute(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = TokenStore(db)
    record, token = await tokens.issue("worker")
    start = utcnow()
    for offset_s in (0, 30, 59):
        now = start + timedelta(seconds=offset_s)
        monkeypatch.setattr(workspaces_module, "utcnow", lambda now=now: now)
        await tokens.verify(token)
    after_a_minute = await tokens.get(record.id)
    assert after_a_minute is not None
    assert after_a_minute.last_used_at == start
    later = start + timedelta(seconds=61)
    monkeypatch.setattr(workspaces_module, "utcnow", lambda: later)
    await tokens.verify(token)
    refreshed = await tokens.get(record.id)
    assert refreshed is not None
    assert refreshed.last_used_at == later


async def test_revoke_subject_revokes_every_live_token_of_a_machine(db: Database) -> None:
    tokens = TokenStore(db)
    _, first = await tokens.issue("machine", subject="mach_a")
    _, second = await tokens.issue("worker", subject="mach_a")
    _, elsewhere = await tokens.issue("machine", subject="mach_b")
    assert await tokens.revoke_subject("mach_a") == 2
    assert await tokens.verify(first) is None
    assert await tokens.verify(second) is None
    assert await tokens.verify(elsewhere) is not None
    assert await tokens.revoke_subject("mach_a") == 0


async def test_issue_checks_its_arguments(db: Database) -> None:
    tokens = TokenStore(db)
    with pytest.raises(ValueError, match="token kind 'admin' is not one of: user, worker, agent, machine"):
        await tokens.issue("admin")
    with pytest.raises(ValueError, match="ttl_s must be above 0"):
        await tokens.issue("user", ttl_s=0)
    with pytest.raises(NotFound, match="workspace 'ws_missing'"):
        await tokens.issue("user", workspace_id="ws_missing")
    with pytest.raises(ValueError, match="token kind 'root'"):
        await tokens.verify("anything", kind="root")
