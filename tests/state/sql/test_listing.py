"""Listing workspaces and tokens, which the REST API shows to operators and workspace users."""

from __future__ import annotations

from levers9.state.sql.database import Database
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore


async def test_workspaces_are_listed_by_name(db: Database) -> None:
    store = WorkspaceStore(db)
    assert await store.list() == []
    zeta = await store.create("zeta")
    alpha = await store.create("alpha")
    mid = await store.get_or_create("mid")
    assert await store.list() == [alpha, mid, zeta]


async def test_tokens_are_listed_per_workspace_oldest_first_with_revoked_ones(db: Database) -> None:
    workspaces = WorkspaceStore(db)
    tokens = TokenStore(db)
    a = await workspaces.create("team-a")
    b = await workspaces.create("team-b")
    first, _ = await tokens.issue("user", workspace_id=a.id, subject="alice")
    second, _ = await tokens.issue("worker", workspace_id=a.id, ttl_s=60)
    other, _ = await tokens.issue("user", workspace_id=b.id)
    operator, _ = await tokens.issue("user", subject="root")
    machine, _ = await tokens.issue("machine", subject="mach_1")
    assert await tokens.revoke(second.id)

    listed = await tokens.list_for_workspace(a.id)
    assert [t.id for t in listed] == [first.id, second.id]
    assert listed[0] == first
    assert listed[1].revoked_at is not None
    assert [t.id for t in await tokens.list_for_workspace(b.id)] == [other.id]
    # None lists the tokens bound to no workspace, and only them.
    assert [t.id for t in await tokens.list_for_workspace(None)] == [operator.id, machine.id]
    assert await tokens.list_for_workspace("ws_missing") == []
