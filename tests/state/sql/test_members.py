"""People, identities, memberships and environments in SQL, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from levers9.state.errors import AlreadyExists, NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.members import LastOwner, MemberStore, UserStore, check_email
from levers9.state.sql.records import Role, WorkspaceRecord
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore


def test_emails_are_checked_and_kept_lowercase() -> None:
    assert check_email("  Ada@Example.COM ") == "ada@example.com"
    for bad in ("ada", "ada@", "@example.com", "ada@localhost", "a b@example.com\n"):
        with pytest.raises(ValueError, match="email"):
            check_email(bad)


async def test_one_user_per_email_and_an_identity_stays_with_its_user(db: Database) -> None:
    users = UserStore(db)
    made = await asyncio.gather(*(users.get_or_create("Ada@example.com") for _ in range(5)))
    assert len({u.id for u in made}) == 1  # racing creators find the same person
    ada = made[0]
    assert (ada.email, ada.name) == ("ada@example.com", "ada")
    # first sign-in through a provider links the identity to the person with that (verified) email
    assert (await users.signed_in("https://idp.example", "sub-1", "ada@example.com", "Ada L.")).id == ada.id
    # later, the identity finds her even under another email
    assert (await users.signed_in("https://idp.example", "sub-1", "ada@elsewhere.example")).id == ada.id
    # another issuer's same sub is someone else
    other = await users.signed_in("https://other.example", "sub-1", "bob@example.com")
    assert other.id != ada.id
    assert await users.by_email("BOB@example.com") == other


async def test_roles_and_the_last_owner(db: Database, workspace: WorkspaceRecord) -> None:
    users, members = UserStore(db), MemberStore(db)
    ada, bob = await users.get_or_create("ada@example.com"), await users.get_or_create("bob@example.com")
    assert await members.role_of(workspace.id, ada.id) is None
    (member, created) = await members.put(workspace.id, ada.id, "owner")
    assert (member.role, created) == (Role.OWNER, True)
    assert (await members.put(workspace.id, bob.id, Role.VIEWER))[1] is True
    assert (await members.put(workspace.id, bob.id, Role.MEMBER))[1] is False
    assert [(m.email, m.role) for m in await members.list(workspace.id)] == [
        ("ada@example.com", Role.OWNER),
        ("bob@example.com", Role.MEMBER),
    ]
    with pytest.raises(LastOwner):
        await members.put(workspace.id, ada.id, Role.MEMBER)
    with pytest.raises(LastOwner):
        await members.remove(workspace.id, ada.id)
    with pytest.raises(ValueError, match="role"):
        await members.put(workspace.id, bob.id, "admin")
    await members.put(workspace.id, bob.id, Role.OWNER)
    assert await members.remove(workspace.id, ada.id) is True
    assert await members.remove(workspace.id, ada.id) is False
    assert [(w.name, r) for w, r in await members.workspaces_of(bob.id)] == [("team-a", Role.OWNER)]


async def test_environments_are_rows_of_their_workspace(db: Database, workspace: WorkspaceRecord) -> None:
    workspaces, members, users = WorkspaceStore(db), MemberStore(db), UserStore(db)
    staging = await workspaces.create_environment(workspace.id, "Staging")
    assert (staging.environment, staging.parent_id, staging.root_id, staging.name) == (
        "staging",
        workspace.id,
        workspace.id,
        "team-a/staging",
    )
    with pytest.raises(AlreadyExists):
        await workspaces.create_environment(workspace.id, "staging")
    with pytest.raises(AlreadyExists):
        await workspaces.create_environment(workspace.id, "main")
    with pytest.raises(ValueError, match="environment name"):
        await workspaces.create_environment(workspace.id, "a/b")
    with pytest.raises(NotFound):
        await workspaces.create_environment(staging.id, "nested")  # an environment has no environments
    assert [e.environment for e in await workspaces.environments(workspace.id)] == ["main", "staging"]
    assert await workspaces.environment(workspace.id, "main") == workspace
    assert await workspaces.environment(workspace.id, "STAGING") == staging
    assert await workspaces.environment(workspace.id, "prod") is None
    assert [w.name for w in await workspaces.list()] == ["team-a"]  # environments are not workspaces
    with pytest.raises(ValueError, match="'/'"):
        await workspaces.create("team-a/prod")
    # memberships are of workspaces, never of environments
    ada = await users.get_or_create("ada@example.com")
    with pytest.raises(NotFound):
        await members.put(staging.id, ada.id, Role.MEMBER)
    # deleting an environment takes its tokens; main cannot be deleted this way
    tokens = TokenStore(db)
    record, _ = await tokens.issue("user", workspace_id=staging.id, user_id=ada.id, role=Role.VIEWER)
    assert (record.user_id, record.role) == (ada.id, Role.VIEWER)
    assert await workspaces.delete_environment(workspace.id) is False
    assert await workspaces.delete_environment(staging.id) is True
    assert await tokens.get(record.id) is None
    assert await workspaces.environments(workspace.id) == [workspace]


async def test_join_domain_and_revoking_a_persons_tokens(db: Database, workspace: WorkspaceRecord) -> None:
    workspaces, users, tokens = WorkspaceStore(db), UserStore(db), TokenStore(db)
    assert await workspaces.joinable("ada@example.com") == []
    updated = await workspaces.set_join(workspace.id, "@Example.com", Role.VIEWER)
    assert (updated.join_domain, updated.join_role) == ("example.com", "viewer")
    assert [w.id for w in await workspaces.joinable("ada@EXAMPLE.com")] == [workspace.id]
    with pytest.raises(ValueError, match="domain"):
        await workspaces.set_join(workspace.id, "not a domain", Role.MEMBER)
    ada = await users.get_or_create("ada@example.com")
    staging = await workspaces.create_environment(workspace.id, "staging")
    mine = [(await tokens.issue("user", workspace_id=w, user_id=ada.id))[0].id for w in (workspace.id, staging.id)]
    others, _ = await tokens.issue("user", workspace_id=workspace.id)
    assert sorted(await tokens.revoke_user([workspace.id, staging.id], ada.id)) == sorted(mine)
    assert await tokens.revoke_user([workspace.id, staging.id], ada.id) == []
    assert (await tokens.get(others.id)) is not None
    assert (await tokens.verify((await tokens.issue("user", workspace_id=workspace.id))[1])) is not None
