"""Built blueprints: steps and images recorded per workspace, never seen by another workspace."""

from __future__ import annotations

from levers9.state.sql.blueprints import BlueprintStore, NewStep
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.workspaces import WorkspaceStore

KEYS = [f"sha256:{i:064x}" for i in range(4)]


async def _build(store: BlueprintStore, workspace: str, digest: str = "sha256:" + "d" * 64) -> None:
    steps = [
        NewStep(KEYS[0], "base", "a" * 64, "b" * 64, 1000),
        NewStep(KEYS[1], "env"),
        NewStep(KEYS[2], "run", "c" * 64, "e" * 64, 20),
    ]
    await store.record(
        workspace,
        steps,
        key=KEYS[2],
        repository=f"ws/{workspace}",
        manifest_digest=digest,
        size_bytes=1020,
        step_count=3,
    )


async def test_a_build_is_recorded_and_found_by_key(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlueprintStore(db)
    assert await store.steps(workspace.id, KEYS) == {}
    await _build(store, workspace.id)
    found = await store.steps(workspace.id, KEYS)
    assert sorted(found) == KEYS[:3]
    assert (found[KEYS[1]].op, found[KEYS[1]].diff_id) == ("env", None)  # a config-only step made no layer
    assert (found[KEYS[2]].diff_id, found[KEYS[2]].blob_digest, found[KEYS[2]].size_bytes) == ("c" * 64, "e" * 64, 20)
    image = await store.image(workspace.id, KEYS[2])
    assert image is not None
    assert (image.manifest_digest, image.steps, image.size_bytes) == (
        "sha256:" + "d" * 64,
        3,
        1020,
    )
    assert await store.image_by_digest(workspace.id, image.manifest_digest) == image
    assert [i.key for i in await store.images(workspace.id)] == [KEYS[2]]


async def test_recording_again_keeps_the_first_steps_and_touches_the_image(
    db: Database, workspace: WorkspaceRecord
) -> None:
    store = BlueprintStore(db)
    await _build(store, workspace.id)
    first = await store.image(workspace.id, KEYS[2])
    await _build(store, workspace.id, digest="sha256:" + "f" * 64)  # a racing build of the same blueprint
    again = await store.image(workspace.id, KEYS[2])
    assert first is not None
    assert again is not None
    assert again.manifest_digest == first.manifest_digest  # the first record stays
    assert again.last_used_at >= first.last_used_at
    touched = await store.image(workspace.id, KEYS[2], touch=True)
    assert touched is not None
    assert touched.last_used_at >= again.last_used_at


async def test_another_workspace_sees_nothing(db: Database, workspace: WorkspaceRecord) -> None:
    store = BlueprintStore(db)
    other = await WorkspaceStore(db).create("team-b")
    await _build(store, workspace.id)
    assert await store.steps(other.id, KEYS) == {}
    assert await store.image(other.id, KEYS[2]) is None
    assert await store.image_by_digest(other.id, "sha256:" + "d" * 64) is None
    assert await store.images(other.id) == []
