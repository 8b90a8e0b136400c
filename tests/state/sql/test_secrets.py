"""Secrets: encrypted at rest, per workspace, readable only with the right key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text

from levers9.state.crypto import SecretBox
from levers9.state.errors import DecryptionError, NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.secrets import SecretStore
from levers9.state.sql.workspaces import WorkspaceStore

PLAINTEXT = "plaintext-canary-7f3a9c1e-never-on-disk"

RawStored = Callable[[Database, str], Awaitable[bytes]]


async def test_put_get_update_names_delete(db: Database, box: SecretBox, workspace: WorkspaceRecord) -> None:
    secrets = SecretStore(db, box)
    await secrets.put(workspace.id, "OPENAI_API_KEY", "sk-1")
    await secrets.put(workspace.id, "DB_PASSWORD", "pw")
    assert await secrets.get(workspace.id, "OPENAI_API_KEY") == "sk-1"
    await secrets.put(workspace.id, "OPENAI_API_KEY", "sk-2")
    assert await secrets.get(workspace.id, "OPENAI_API_KEY") == "sk-2"
    assert await secrets.names(workspace.id) == ["DB_PASSWORD", "OPENAI_API_KEY"]
    assert await secrets.delete(workspace.id, "DB_PASSWORD") is True
    assert await secrets.delete(workspace.id, "DB_PASSWORD") is False
    assert await secrets.get(workspace.id, "DB_PASSWORD") is None
    assert await secrets.names(workspace.id) == ["OPENAI_API_KEY"]
    with pytest.raises(NotFound, match="workspace 'ws_missing'"):
        await secrets.put("ws_missing", "X", "y")


async def test_the_stored_bytes_never_hold_the_plaintext(
    db: Database, box: SecretBox, workspace: WorkspaceRecord, raw_stored: RawStored
) -> None:
    await SecretStore(db, box).put(workspace.id, "CANARY_SECRET_NAME", PLAINTEXT)
    stored = await raw_stored(db, "SELECT name, ciphertext FROM secrets")
    assert b"CANARY_SECRET_NAME" in stored  # the search reads the real data: the name is stored as is
    assert PLAINTEXT.encode() not in stored
    assert PLAINTEXT.encode("utf-16-le") not in stored


async def test_workspaces_never_see_each_others_secrets(
    db: Database, box: SecretBox, workspace: WorkspaceRecord
) -> None:
    other = await WorkspaceStore(db).create("team-b")
    secrets = SecretStore(db, box)
    await secrets.put(workspace.id, "TOKEN", "a-value")
    assert await secrets.get(other.id, "TOKEN") is None
    assert await secrets.names(other.id) == []
    await secrets.put(other.id, "TOKEN", "b-value")
    assert await secrets.get(workspace.id, "TOKEN") == "a-value"
    assert await secrets.get(other.id, "TOKEN") == "b-value"
    assert await secrets.delete(other.id, "TOKEN") is True
    assert await secrets.get(workspace.id, "TOKEN") == "a-value"


async def test_a_row_moved_to_another_workspace_is_refused(
    db: Database, box: SecretBox, workspace: WorkspaceRecord
) -> None:
    other = await WorkspaceStore(db).create("team-b")
    secrets = SecretStore(db, box)
    await secrets.put(workspace.id, "TOKEN", "a-value")
    async with db.engine.begin() as conn:
        await conn.execute(text("UPDATE secrets SET workspace_id = :other"), {"other": other.id})
    with pytest.raises(DecryptionError, match="encrypted for another record"):
        await secrets.get(other.id, "TOKEN")


async def test_the_wrong_key_gives_a_clear_error(db: Database, box: SecretBox, workspace: WorkspaceRecord) -> None:
    await SecretStore(db, box).put(workspace.id, "TOKEN", PLAINTEXT)
    with pytest.raises(DecryptionError, match="does not match") as caught:
        await SecretStore(db, SecretBox([Fernet.generate_key()])).get(workspace.id, "TOKEN")
    assert PLAINTEXT not in str(caught.value)


async def test_key_rotation_keeps_old_secrets_readable(db: Database, workspace: WorkspaceRecord) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    await SecretStore(db, SecretBox([old])).put(workspace.id, "TOKEN", "kept")
    rotated = SecretStore(db, SecretBox([new, old]))
    assert await rotated.get(workspace.id, "TOKEN") == "kept"
    assert await rotated.reencrypt() == 1
    new_only = SecretStore(db, SecretBox([new]))
    assert await new_only.get(workspace.id, "TOKEN") == "kept"
    with pytest.raises(DecryptionError):
        await SecretStore(db, SecretBox([old])).get(workspace.id, "TOKEN")
