"""Stored sandbox snapshots: recorded per workspace, found, listed and deleted only there."""

from __future__ import annotations

import pytest

from levers9.state.errors import NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.sandbox_snapshots import SandboxSnapshotStore
from levers9.state.sql.workspaces import WorkspaceStore


async def _add(store: SandboxSnapshotStore, workspace: str, snapshot_id: str) -> None:
    info = {"id": snapshot_id, "env_names": ["TOKEN"], "memory_mib": 512}
    await store.add(
        workspace,
        snapshot_id,
        sandbox_id="sb-1",
        pool="sandboxes",
        runtime="gvisor",
        key=f"sandbox-snapshots/{workspace}/{snapshot_id}",
        size_bytes=123_456_789_012,
        info=info,
    )


async def test_a_snapshot_is_found_listed_and_deleted_in_its_workspace_only(
    db: Database, workspace: WorkspaceRecord
) -> None:
    store = SandboxSnapshotStore(db)
    other = await WorkspaceStore(db).create("other")
    await _add(store, workspace.id, "sbs_0002")
    await _add(store, workspace.id, "sbs_0001")
    found = await store.get(workspace.id, "sbs_0002")
    assert (found.pool, found.runtime, found.size_bytes) == ("sandboxes", "gvisor", 123_456_789_012)
    assert found.info == {"id": "sbs_0002", "env_names": ["TOKEN"], "memory_mib": 512}
    assert [s.id for s in await store.list(workspace.id)] == ["sbs_0002", "sbs_0001"]  # oldest first
    assert await store.list(other.id) == []
    with pytest.raises(NotFound):
        await store.get(other.id, "sbs_0002")
    assert await store.delete(other.id, "sbs_0002") is False
    assert await store.delete(workspace.id, "sbs_0002") is True
    assert [s.id for s in await store.list(workspace.id)] == ["sbs_0001"]
    with pytest.raises(NotFound):
        await store.get(workspace.id, "sbs_0002")


async def test_a_snapshot_of_a_workspace_that_does_not_exist_is_refused(db: Database) -> None:
    with pytest.raises(NotFound):
        await _add(SandboxSnapshotStore(db), "ws_missing", "sbs_0003")
