"""Apps, stubs deduplicated by configuration, and deployment versions."""

from __future__ import annotations

import asyncio

import pytest

from levers9.state.errors import Conflict, NotFound
from levers9.state.sql.apps import AppStore, DeploymentStore, StubStore, config_hash
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.workspaces import WorkspaceStore

CONFIG = {"image": "python:3.12", "cpu": 2, "memory": 4096, "gpu": ["H100", "A100"], "timeout": 600, "retries": 2}


async def test_apps_are_made_once_per_workspace_and_name(db: Database, workspace: WorkspaceRecord) -> None:
    apps = AppStore(db)
    app = await apps.get_or_create(workspace.id, "inference")
    assert app.id.startswith("app_")
    assert await apps.get_or_create(workspace.id, "inference") == app
    assert await apps.get(app.id) == app
    other = await WorkspaceStore(db).create("team-b")
    assert (await apps.get_or_create(other.id, "inference")).id != app.id
    with pytest.raises(NotFound, match="workspace 'ws_missing'"):
        await apps.get_or_create("ws_missing", "inference")


async def test_stubs_are_deduplicated_by_their_configuration(db: Database, workspace: WorkspaceRecord) -> None:
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    stubs = StubStore(db)
    stub = await stubs.get_or_create(workspace.id, app.id, "generate", "function", CONFIG)
    assert stub.config == CONFIG
    reordered = dict(reversed(list(CONFIG.items())))
    assert await stubs.get_or_create(workspace.id, app.id, "generate", "function", reordered) == stub
    changed = await stubs.get_or_create(workspace.id, app.id, "generate", "function", {**CONFIG, "gpu": ["L4"]})
    assert changed.id != stub.id
    same_config_other_function = await stubs.get_or_create(workspace.id, app.id, "embed", "function", CONFIG)
    assert same_config_other_function.id != stub.id
    assert await stubs.get(stub.id) == stub


async def test_a_stub_cannot_be_added_to_another_workspaces_app(db: Database, workspace: WorkspaceRecord) -> None:
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    other = await WorkspaceStore(db).create("team-b")
    with pytest.raises(NotFound, match=f"app '{app.id}'"):
        await StubStore(db).get_or_create(other.id, app.id, "generate", "function", CONFIG)


def test_config_hash_is_stable_and_needs_json() -> None:
    assert config_hash("f", "function", {"a": 1, "b": [1, 2]}) == config_hash("f", "function", {"b": [1, 2], "a": 1})
    assert config_hash("f", "function", {"a": 1}) != config_hash("f", "function", {"a": 2})
    with pytest.raises(ValueError, match="must be JSON"):
        config_hash("f", "function", {"a": object()})


async def test_deployment_versions_count_up_and_one_is_active(db: Database, workspace: WorkspaceRecord) -> None:
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    stubs = StubStore(db)
    first = await stubs.get_or_create(workspace.id, app.id, "generate", "function", CONFIG)
    second = await stubs.get_or_create(workspace.id, app.id, "generate", "function", {**CONFIG, "cpu": 4})
    deployments = DeploymentStore(db)
    assert await deployments.create_version(workspace.id, app.id, "prod", first.id) == 1
    assert await deployments.create_version(workspace.id, app.id, "prod", second.id) == 2
    assert await deployments.create_version(workspace.id, app.id, "staging", first.id) == 1
    prod = await deployments.get(workspace.id, "prod")
    assert prod is not None
    assert prod.active_version is None
    activated = await deployments.activate(prod.id, 2)
    assert activated.active_version == 2
    rolled_back = await deployments.activate(prod.id, 1)
    assert rolled_back.active_version == 1
    assert await deployments.by_id(prod.id) == rolled_back
    assert [(v.version, v.stub_id) for v in await deployments.versions(prod.id)] == [(1, first.id), (2, second.id)]
    with pytest.raises(NotFound, match="prod v9"):
        await deployments.activate(prod.id, 9)
    with pytest.raises(NotFound, match="deployment 'dep_missing'"):
        await deployments.activate("dep_missing", 1)
    assert await deployments.get(workspace.id, "missing") is None


async def test_concurrent_deploys_get_distinct_versions(db: Database, workspace: WorkspaceRecord) -> None:
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    stub = await StubStore(db).get_or_create(workspace.id, app.id, "generate", "function", CONFIG)
    deployments = DeploymentStore(db)
    numbers = await asyncio.gather(
        *(deployments.create_version(workspace.id, app.id, "prod", stub.id) for _ in range(5))
    )
    assert sorted(numbers) == [1, 2, 3, 4, 5]
    prod = await deployments.get(workspace.id, "prod")
    assert prod is not None
    assert [v.version for v in await deployments.versions(prod.id)] == [1, 2, 3, 4, 5]


async def test_a_deployment_name_belongs_to_one_app(db: Database, workspace: WorkspaceRecord) -> None:
    apps, stubs, deployments = AppStore(db), StubStore(db), DeploymentStore(db)
    first_app = await apps.get_or_create(workspace.id, "one")
    second_app = await apps.get_or_create(workspace.id, "two")
    first_stub = await stubs.get_or_create(workspace.id, first_app.id, "f", "function", CONFIG)
    second_stub = await stubs.get_or_create(workspace.id, second_app.id, "f", "function", CONFIG)
    await deployments.create_version(workspace.id, first_app.id, "prod", first_stub.id)
    with pytest.raises(Conflict, match="deployment 'prod' belongs to app"):
        await deployments.create_version(workspace.id, second_app.id, "prod", second_stub.id)
    with pytest.raises(Conflict, match=f"stub '{second_stub.id}' belongs to app"):
        await deployments.create_version(workspace.id, first_app.id, "prod", second_stub.id)


async def test_older_versions_serve_until_stopped(db: Database, workspace: WorkspaceRecord) -> None:
    app = await AppStore(db).get_or_create(workspace.id, "web")
    stubs = StubStore(db)
    one = await stubs.get_or_create(workspace.id, app.id, "api", "endpoint", CONFIG)
    two = await stubs.get_or_create(workspace.id, app.id, "api", "endpoint", {**CONFIG, "cpu": 4})
    deployments = DeploymentStore(db)
    for stub in (one, two):
        version = await deployments.create_version(workspace.id, app.id, "api", stub.id)
        deployment = await deployments.get(workspace.id, "api")
        assert deployment is not None
        await deployments.activate(deployment.id, version)
    # both answer; no version given means the newest
    assert (await deployments.serving(workspace.id, "api", 1)).stub_id == one.id
    assert (await deployments.serving(workspace.id, "api")).stub_id == two.id
    [(listed, versions)] = await deployments.for_workspace(workspace.id)
    assert (listed.name, listed.active_version) == ("api", 2)
    assert [(v.version, v.serving) for v in versions] == [(1, True), (2, True)]

    stopped = await deployments.stop(workspace.id, "api", 2)
    assert stopped.stopped_at is not None
    assert not stopped.serving
    assert (await deployments.stop(workspace.id, "api", 2)).stopped_at == stopped.stopped_at  # again: no change
    with pytest.raises(NotFound, match="api v2"):
        await deployments.serving(workspace.id, "api", 2)
    assert (await deployments.serving(workspace.id, "api")).version == 1  # the newest still serving
    after = await deployments.get(workspace.id, "api")
    assert after is not None
    assert after.active_version == 1

    await deployments.stop(workspace.id, "api", 1)
    with pytest.raises(NotFound, match="all stopped"):
        await deployments.serving(workspace.id, "api")
    with pytest.raises(NotFound, match="api v7"):
        await deployments.stop(workspace.id, "api", 7)
    # another workspace sees nothing of it: the same answer as for a name that does not exist
    other = await WorkspaceStore(db).create("someone-else")
    with pytest.raises(NotFound, match="deployment 'api'"):
        await deployments.serving(other.id, "api")
    with pytest.raises(NotFound, match="deployment 'api'"):
        await deployments.stop(other.id, "api", 1)
    assert await deployments.for_workspace(other.id) == []
