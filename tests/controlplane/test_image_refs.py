"""Which images a stub may name: never a path on the workers outside the operator's list, never another
workspace's built image, never a moving tag. Checked through the data plane on real Services too."""

from __future__ import annotations

import pytest

from levers9.services.auth import Principal
from levers9.services.image_refs import check_image
from levers9.services.stubs import InvalidStub
from levers9.state.sql.records import TokenKind
from tests.controlplane.conftest import Cp

DIGEST = "sha256:" + "a" * 64
HOST = "10.0.0.5:8080"


def _check(image: str, local_dirs: tuple[str, ...] = ()) -> None:
    check_image(image, "ws_abc", registry_host=HOST, repository_prefix="levers9", local_dirs=local_dirs)


@pytest.mark.parametrize(
    "image",
    [
        "host",
        f"{HOST}/levers9/ws_abc/blueprints@{DIGEST}",
        f"registry.example.com/team/python@{DIGEST}",
        f"registry.example.com:5000/team/python:3.11@{DIGEST}",
        "/srv/images/python.tar",
        "/srv/images",
    ],
)
def test_accepted(image: str) -> None:
    _check(image, ("/srv/images",))


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("/", "outside the directories the operator allows"),
        ("/var/lib/levers9/data", "outside the directories the operator allows"),
        ("/srv/images/../../etc", "outside the directories the operator allows"),
        ("/srv/images-evil/x.tar", "outside the directories the operator allows"),
        (f"{HOST}/levers9/ws_other/blueprints@{DIGEST}", "not an image of this workspace"),
        (f"{HOST}/elsewhere/ws_abc/blueprints@{DIGEST}", "not an image of this workspace"),
        ("registry.example.com/team/python:3.11", "names a tag; pin it by digest"),
        ("python:3.11", "is not an image this controlplane can run"),
        ("relative/path.tar", "is not an image this controlplane can run"),
    ],
)
def test_refused(image: str, why: str) -> None:
    with pytest.raises(InvalidStub, match=why):
        _check(image, ("/srv/images",))


def test_no_local_dirs_refuses_every_path() -> None:
    with pytest.raises(InvalidStub, match=r"images.local_dirs: none are listed"):
        _check("/srv/images/python.tar")


async def test_the_data_plane_refuses_a_workers_root_filesystem(cp: Cp) -> None:
    workspace = await cp.services.workspaces.get_or_create("team-a")
    someone = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    with pytest.raises(InvalidStub, match="image: '/' is a path on the workers"):
        await cp.dataplane.get_or_create_stub(someone, {"name": "f", "image": "/"}, b"handler")
    stub_id, _ = await cp.dataplane.get_or_create_stub(someone, {"name": "f"}, b"handler")
    assert stub_id
