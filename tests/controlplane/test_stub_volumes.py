"""A stub's volumes, checked by the controlplane: its own workspace's volumes and secrets, paths it may mount.

The SDK checks the same on the user's machine (tests/sdk/test_volumes.py); the controlplane checks again,
for any client, and refuses a call whose volume was deleted since its stub was defined before placing it.
"""

from __future__ import annotations

import pytest

from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.stubs import InvalidStub
from levers9.state.sql.records import TokenKind

from .conftest import Api


async def _me(api: Api, name: str) -> tuple[DataPlane, Principal, str]:
    workspace, _ = await api.user(name)
    dp = DataPlane(api.services, Hub(api.services.redis, name="test"))
    return dp, Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone"), workspace.id


async def test_a_stub_names_its_workspaces_volumes_and_gets_their_ids(api: Api) -> None:
    dp, me, workspace = await _me(api, "team-a")
    _, other, _ = await _me(api, "team-b")
    weights, _ = await api.services.volumes.get_or_create(workspace, "weights")
    volumes = [{"name": "weights", "mount_path": "/data/weights"}]
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "volumes": volumes}, b"handler")
    _, settings = await dp.stub(stub_id)
    assert [(v.name, v.volume_id, v.mount_path) for v in settings.volumes] == [("weights", weights.id, "/data/weights")]
    # another workspace naming a volume of the same name it does not have is refused: names are per workspace
    with pytest.raises(InvalidStub, match="volume 'weights' does not exist in this workspace; create it"):
        await dp.get_or_create_stub(other, {"name": "f", "volumes": volumes}, b"handler")


@pytest.mark.parametrize(
    ("volumes", "message"),
    [
        ([{"name": "w", "mount_path": "/proc/x"}], "not a path a volume can be mounted at"),
        ([{"name": "w", "mount_path": "relative"}], "not a path a volume can be mounted at"),
        ([{"name": "w", "mount_path": "/a/../etc"}], "not a path a volume can be mounted at"),
        (
            [{"name": "w", "mount_path": "/data"}, {"name": "v", "mount_path": "/data/inner"}],
            "two volumes mount at or below /data",
        ),
        (
            [{"name": "b-bucket", "mount_path": "/b", "bucket": {"access_key": "NOPE", "secret_key": "NOPE"}}],
            "config.access_key names secret 'NOPE', which this workspace does not have",
        ),
    ],
)
async def test_bad_volumes_are_refused_naming_the_field(api: Api, volumes: list[object], message: str) -> None:
    dp, me, workspace = await _me(api, "team-a")
    for name in ("w", "v"):
        await api.services.volumes.get_or_create(workspace, name)
    with pytest.raises(InvalidStub, match=message):
        await dp.get_or_create_stub(me, {"name": "f", "volumes": volumes}, b"handler")


async def test_a_call_whose_volume_was_deleted_is_refused_before_it_is_placed(api: Api) -> None:
    dp, me, workspace = await _me(api, "team-a")
    await api.services.volumes.get_or_create(workspace, "weights")
    volumes = [{"name": "weights", "mount_path": "/data"}]
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "volumes": volumes}, b"handler")
    await api.services.volumes.delete(workspace, "weights")
    with pytest.raises(InvalidStub, match="volume 'weights' was deleted after this function was defined"):
        await dp.submit(me, stub_id, [b"args"])
    assert await api.services.tasks.unfinished() == []
