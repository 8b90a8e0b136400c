"""Checkpoints: pending until written, then available, failed or restore_failed."""

from __future__ import annotations

import pytest

from levers9.state.errors import InvalidTransition, NotFound
from levers9.state.sql.apps import AppStore, StubStore
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.database import Database
from levers9.state.sql.records import CheckpointStatus, StubRecord, WorkspaceRecord
from levers9.state.sql.tasks import TaskStore


@pytest.fixture
async def stub(db: Database, workspace: WorkspaceRecord) -> StubRecord:
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    return await StubStore(db).get_or_create(workspace.id, app.id, "generate", "function", {"gpu": ["H100"]})


async def test_a_checkpoint_becomes_available_then_fails_to_restore(
    db: Database, workspace: WorkspaceRecord, stub: StubRecord
) -> None:
    checkpoints = CheckpointStore(db)
    task = await TaskStore(db).create(workspace.id, {}, stub_id=stub.id)
    taken = await checkpoints.create(workspace.id, "criu", stub_id=stub.id, task_id=task.id, gpu="H100")
    assert taken.status is CheckpointStatus.PENDING
    assert await checkpoints.latest(stub.id) is None  # not usable until written
    available = await checkpoints.set_status(taken.id, "available", path="/ckpt/1", size_bytes=3 * 2**30)
    assert (available.status, available.path, available.size_bytes) == (
        CheckpointStatus.AVAILABLE,
        "/ckpt/1",
        3 * 2**30,
    )
    assert await checkpoints.latest(stub.id) == available
    assert await checkpoints.latest(stub.id, gpu="H100") == available
    assert await checkpoints.latest(stub.id, gpu="A100") is None
    broken = await checkpoints.set_status(taken.id, "restore_failed", error="CUDA driver mismatch")
    assert (broken.status, broken.error, broken.path) == (
        CheckpointStatus.RESTORE_FAILED,
        "CUDA driver mismatch",
        "/ckpt/1",
    )
    assert await checkpoints.latest(stub.id) is None
    assert await checkpoints.get(taken.id) == broken


async def test_refused_transitions_and_filters(db: Database, workspace: WorkspaceRecord, stub: StubRecord) -> None:
    checkpoints = CheckpointStore(db)
    first = await checkpoints.create(workspace.id, "criu", stub_id=stub.id)
    second = await checkpoints.create(workspace.id, "gvisor")
    failed = await checkpoints.set_status(first.id, "failed", error="disk full")
    assert failed.status is CheckpointStatus.FAILED
    with pytest.raises(InvalidTransition, match="is failed; it cannot become available"):
        await checkpoints.set_status(first.id, "available")
    with pytest.raises(InvalidTransition, match="is pending; it cannot become restore_failed"):
        await checkpoints.set_status(second.id, "restore_failed")
    with pytest.raises(ValueError, match="checkpoint status 'ok' is not one of"):
        await checkpoints.set_status(second.id, "ok")
    with pytest.raises(NotFound, match="checkpoint 'ckpt_missing'"):
        await checkpoints.set_status("ckpt_missing", "failed")
    with pytest.raises(NotFound, match="workspace 'ws_missing'"):
        await checkpoints.create("ws_missing", "criu")
    assert {c.id for c in await checkpoints.list(workspace.id)} == {first.id, second.id}
    assert [c.id for c in await checkpoints.list(workspace.id, stub_id=stub.id)] == [first.id]
    assert [c.id for c in await checkpoints.list(workspace.id, statuses=["pending"])] == [second.id]
