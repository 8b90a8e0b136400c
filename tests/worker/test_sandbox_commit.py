"""A sandbox's filesystem made an image (issue 39, ``create_image_from_filesystem``): the worker's side.

The container tests push the shared Debian base (tests/fixtures/debian_base.py) to a real registry
(tests/fixtures/registry.py) as the workspace's Blueprint image, boot a sandbox from it through the
worker's :class:`~levers9.worker.sandboxes.Sandboxes` (the registry pull path a stub's image takes),
change its filesystem, make it an image over the worker's HTTP API (``POST /sandboxes/{id}/image``) and
boot a second sandbox from that image, in real runc and gVisor containers. Each ends with the world's
leftover check of tests/worker/test_pool.py (no process, mount, cgroup, network namespace or directory).
The small tests check the rules on the repository and the image without a container.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from levers9.builder.base import BaseLayer
from levers9.builder.layout import LAYER_TAR, Layer, write_layout
from levers9.hooks.types import RuntimeContext
from levers9.registry.auth import RegistryAuth
from levers9.registry.client import RegistryClient, push_image
from levers9.registry.refs import ImageRef, parse_ref
from levers9.worker.images import ImagePulls
from levers9.worker.sandbox_api import WORKSPACE_HEADER, SandboxAPI
from levers9.worker.sandbox_images import (
    CommitRefused,
    CommitUnavailable,
    _base,
    check_repository_of,
)
from levers9.worker.sandboxes import Sandboxes
from tests.fixtures.registry import OCI_LAYER, Registry, stop_registry
from tests.worker.test_pool import ISOLATED, PYTHON, World, _world

WORKSPACE = "ws1"
REPOSITORY = f"levers9/{WORKSPACE}/blueprints"
DIGEST = "sha256:" + "a" * 64


# ----------------------------------------------------------------------------------------- the rules alone


def test_the_repository_must_be_a_valid_name_of_the_workspace() -> None:
    assert check_repository_of("levers9/ws1/blueprints", "WS1") == "levers9/ws1/blueprints"
    assert check_repository_of("corp/images/ws1/mine", "ws1") == "corp/images/ws1/mine"
    for bad, says in (
        (None, "repository is missing"),
        ("", "repository is missing"),
        (["levers9/ws1/x"], "repository is missing"),
        ("levers9/ws2/blueprints", "not one of workspace ws1's"),
        ("levers9/blueprints/ws1", "not one of workspace ws1's"),  # the workspace is a component before the last
        ("levers9/WS1/Blueprints", "not a valid repository name"),
        ("levers9/ws1/../x", "not a valid repository name"),
    ):
        with pytest.raises(CommitRefused, match=says):
            check_repository_of(bad, "ws1")


def test_only_an_image_in_a_registry_pinned_by_digest_can_be_committed_from(tmp_path: Path) -> None:
    images = ImagePulls(
        _context(tmp_path), registry_url="http://cp.example:8080", credentials=lambda: RegistryAuth("w", "t")
    )
    ours = _base(f"cp.example:8080/levers9/ws1/blueprints@{DIGEST}", images)
    assert ours == ImageRef("cp.example:8080", "levers9/ws1/blueprints", digest=DIGEST)
    assert _base(f"other.example:5000/team/python@{DIGEST}", images) == parse_ref(
        f"other.example:5000/team/python@{DIGEST}"
    )
    (tmp_path / "layout").mkdir()
    (tmp_path / "layout" / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    assert _base(str(tmp_path / "layout"), images) == tmp_path / "layout"
    refused = {
        "host": "has no image to commit",
        "/srv/images/base.tar": "not an OCI image layout directory",
        "cp.example:8080/levers9/ws1/blueprints:latest": "pinned by digest",
    }
    for image, says in refused.items():
        with pytest.raises(CommitUnavailable, match=says) as caught:
            _base(image, images)
        assert "image" in str(caught.value)
    nowhere = ImagePulls(_context(tmp_path), registry_url="", credentials=lambda: RegistryAuth("w", "t"))
    with pytest.raises(CommitUnavailable, match="no registry"):
        _base(f"cp.example:8080/levers9/ws1/blueprints@{DIGEST}", nowhere)
    with pytest.raises(CommitUnavailable, match="no registry"):
        _base(f"cp.example:8080/levers9/ws1/blueprints@{DIGEST}", None)


def _context(tmp_path: Path) -> RuntimeContext:
    return RuntimeContext(name="runc", settings=None, state_dir=str(tmp_path))


# ----------------------------------------------------------------------------------------- real containers


def push_base(registry: Registry, debian_base: BaseLayer, repository: str) -> str:
    """The Debian base pushed to ``repository`` (its one layer uncompressed: digest = diff id); its ref."""
    config = json.dumps(debian_base.config(), sort_keys=True).encode()
    with RegistryClient(registry.url) as client:
        layer = (debian_base.path, debian_base.diff_id, debian_base.size, OCI_LAYER)
        digest = push_image(client, repository, "base", [layer], config)
    return f"{registry.address}/{repository}@{digest}"


@pytest.fixture(scope="module")
def base_ref(registry: Registry, debian_base: BaseLayer) -> str:
    """The Debian base, pushed as the workspace's Blueprint image."""
    return push_base(registry, debian_base, REPOSITORY)


@dataclass
class Served:
    world: World
    sandboxes: Sandboxes
    http: httpx.AsyncClient

    async def create(self, **fields: Any) -> str:
        body = {"workspace_id": WORKSPACE, "python_version": "3.11", **fields}
        answer = await self.http.post("/sandboxes", json=body)
        assert answer.status_code == 201, answer.text
        self.world.seen.add(answer.json()["container_id"])
        sid: str = answer.json()["id"]
        return sid

    async def run(self, sid: str, script: str) -> tuple[str, int]:
        """``sh -c script`` in the sandbox: its stdout and stderr, and its exit code."""
        started = await self.http.post(f"/sandboxes/{sid}/processes", json={"argv": ["sh", "-c", script]})
        assert started.status_code == 201, started.text
        number = started.json()["process"]
        async with self.http.stream("GET", f"/sandboxes/{sid}/processes/{number}/output") as answer:
            pieces = [json.loads(line) async for line in answer.aiter_lines() if line]
        text = "".join(p["data"] for p in pieces if "data" in p)
        return text, pieces[-1]["exit"]

    async def commit(self, sid: str, body: dict[str, Any], workspace: str = WORKSPACE) -> httpx.Response:
        return await self.http.post(f"/sandboxes/{sid}/image", json=body, headers={WORKSPACE_HEADER: workspace})


@contextlib.asynccontextmanager
async def served(runtime: str, tmp_path: Path, registry: Registry) -> AsyncIterator[Served]:
    async with _world(runtime, tmp_path) as world:
        pool = world.pool
        images = ImagePulls(world.ctx, registry_url=registry.url, credentials=lambda: RegistryAuth("worker", "unused"))
        sandboxes = Sandboxes(pool.launcher, pool.client, pool._ports, state_dir=pool.state_dir, images=images)
        api = SandboxAPI(sandboxes)
        await api.start()
        http = httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {api.secret}"}, timeout=300)
        try:
            yield Served(world, sandboxes, http)
        finally:
            await http.aclose()
            await api.close()
            await sandboxes.close()
            assert not (pool.state_dir / "sandboxes").exists()
            assert not (pool.state_dir / "sandbox-commits").exists()


CHANGE = (
    "mkdir -p /work && echo made > /work/new.txt && echo changed > /etc/debian_version && rm /etc/issue"
    " && ln -s /work/new.txt /work/link && ln -s /etc/passwd /work/outside"
)
LOOK = (
    "cat /work/new.txt /etc/debian_version; test -e /etc/issue || echo issue-gone;"
    " test -L /work/link && readlink /work/link; cat /work/link; readlink /work/outside"
)
SEEN = "made\nchanged\nissue-gone\n/work/new.txt\nmade\n/etc/passwd\n"


@pytest.mark.parametrize("runtime", ISOLATED)
async def test_a_sandbox_filesystem_becomes_an_image_another_sandbox_boots(
    runtime: str, tmp_path: Path, registry: Registry, base_ref: str
) -> None:
    async with served(runtime, tmp_path, registry) as s:
        first = await s.create(image=base_ref)
        assert await s.run(first, CHANGE) == ("", 0)
        data = os.urandom(3 * 1024 * 1024 + 5)  # written by the runner itself, while the sandbox runs on
        put = await s.http.put(f"/sandboxes/{first}/files", params={"path": "/work/put.bin"}, content=data)
        assert put.status_code == 200, put.text
        sleeper = await s.http.post(f"/sandboxes/{first}/processes", json={"argv": ["sleep", "300"]})
        sleeper_id = sleeper.json()["process"]

        made = await s.commit(first, {"repository": REPOSITORY})
        assert made.status_code == 201, made.text
        answer = made.json()
        assert set(answer) == {"image", "size_bytes", "layers"}
        ref = answer["image"]
        assert ref.startswith(f"{registry.address}/{REPOSITORY}@sha256:")
        assert answer["layers"] == 2  # the base's one, and the sandbox's changes

        # the pushed image: the base's layer as it was, one new layer of the changes, the base's config
        with RegistryClient(registry.url) as client:
            manifest = json.loads(client.get_manifest(REPOSITORY, ref.split("@")[1])[0])
            base = json.loads(client.get_manifest(REPOSITORY, base_ref.split("@")[1])[0])
            config = json.loads(client.read_blob(REPOSITORY, manifest["config"]["digest"]))
            base_config = json.loads(client.read_blob(REPOSITORY, base["config"]["digest"]))
            with client.open_blob(REPOSITORY, manifest["layers"][1]["digest"]) as stream:
                layer = b"".join(iter(lambda: stream.read(1 << 20), b""))
        assert manifest["layers"][0] == base["layers"][0]
        assert answer["size_bytes"] == manifest["config"]["size"] + sum(x["size"] for x in manifest["layers"])
        assert config["config"] == base_config["config"]  # environment, command, working directory
        assert config["rootfs"]["diff_ids"][0] == base_config["rootfs"]["diff_ids"][0]
        assert len(config["rootfs"]["diff_ids"]) == 2
        assert config["history"][:-1] == base_config["history"]
        assert config["history"][-1]["created_by"] == f"levers9: committed from sandbox {first}"
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
            members = {m.name: m for m in tar}
        assert "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest() == config["rootfs"]["diff_ids"][1]
        assert members["work/new.txt"].isfile()
        assert members["etc/debian_version"].isfile()
        assert (members["etc/.wh.issue"].isfile(), members["etc/.wh.issue"].size) == (True, 0)
        assert "etc/issue" not in members
        assert (members["work/link"].issym(), members["work/link"].linkname) == (True, "/work/new.txt")
        assert (members["work/outside"].issym(), members["work/outside"].linkname) == (True, "/etc/passwd")
        assert "etc/passwd" not in members  # a symlink is stored, never followed
        assert members["work/put.bin"].size == len(data)

        # the first sandbox runs on, its process too
        assert (await s.http.get(f"/sandboxes/{first}/processes/{sleeper_id}")).json()["running"] is True
        assert await s.run(first, "cat /work/new.txt") == ("made\n", 0)

        # a sandbox of the committed image has the files
        second = await s.create(image=ref)
        assert await s.run(second, LOOK) == (SEEN, 0)
        got = await s.http.get(f"/sandboxes/{second}/files", params={"path": "/work/put.bin"})
        assert hashlib.sha256(got.content).digest() == hashlib.sha256(data).digest()

        # and a commit of that one stacks a third layer on the same base
        assert await s.run(second, "echo again > /work/again.txt") == ("", 0)
        again = await s.commit(second, {"repository": REPOSITORY})
        assert again.status_code == 201, again.text
        assert again.json()["layers"] == 3

        # the errors, each named
        await _refusals(s, first)
        ended = await s.http.delete(f"/sandboxes/{second}")
        assert ended.status_code == 200
        gone = await s.commit(second, {"repository": REPOSITORY})
        assert (gone.status_code, gone.json()["error"]["code"]) == (409, "SandboxEnded")


async def _refusals(s: Served, sid: str) -> None:
    for body, says in (
        ({}, "repository is missing"),
        ({"repository": "levers9/ws2/blueprints"}, "not one of workspace ws1's"),
        ({"repository": REPOSITORY, "tag": "x"}, "unknown fields ['tag']"),
    ):
        answer = await s.commit(sid, body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "BadRequest"), answer.text
        assert says in answer.json()["error"]["message"]
    other = await s.commit(sid, {"repository": "levers9/ws2/blueprints"}, workspace="ws2")
    assert (other.status_code, other.json()["error"]["code"]) == (404, "SandboxNotFound")
    on_host = await s.create(image="host", python_version=PYTHON)
    answer = await s.commit(on_host, {"repository": REPOSITORY})
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "CommitUnavailable")
    assert "image is 'host'" in answer.json()["error"]["message"]


async def test_a_base_outside_the_controlplanes_registry_has_its_layers_copied(
    tmp_path: Path, registry: Registry, registry_factory: Callable[..., Registry], debian_base: BaseLayer
) -> None:
    """A base in another registry or an OCI layout on the worker: its blobs are copied through the worker."""
    other = registry_factory()
    elsewhere = push_base(other, debian_base, "team/debian")
    async with served("runc", tmp_path, registry) as s:
        sid = await s.create(image=elsewhere)
        assert await s.run(sid, "echo made > /root/made.txt") == ("", 0)
        repository = f"levers9/{WORKSPACE}/copied"
        made = await s.commit(sid, {"repository": repository})
        assert made.status_code == 201, made.text
        assert made.json()["layers"] == 2
        with RegistryClient(registry.url) as client:
            manifest = json.loads(client.get_manifest(repository, made.json()["image"].split("@")[1])[0])
            assert manifest["layers"][0]["digest"] == debian_base.diff_id  # the base's blob, copied whole
            assert client.has_blob(repository, debian_base.diff_id)
        assert await s.run(sid, "cat /root/made.txt") == ("made\n", 0)

        # a base in an OCI layout directory on the worker: its blob is uploaded from there
        layout = tmp_path / "layout"
        base_layer = Layer(debian_base.diff_id, debian_base.diff_id, debian_base.path, debian_base.size, LAYER_TAR)
        write_layout(layout, [base_layer], debian_base.config())
        local = await s.create(image=str(layout))
        assert await s.run(local, "echo local > /root/local.txt") == ("", 0)
        from_layout = await s.commit(local, {"repository": f"levers9/{WORKSPACE}/local"})
        assert from_layout.status_code == 201, from_layout.text
        assert from_layout.json()["layers"] == 2
        with RegistryClient(registry.url) as client:
            assert client.has_blob(f"levers9/{WORKSPACE}/local", debian_base.diff_id)

        # the base's registry gone: the commit fails naming the cause, and the sandbox runs on, not paused
        stop_registry(other)
        failed = await s.commit(sid, {"repository": f"levers9/{WORKSPACE}/again"})
        assert (failed.status_code, failed.json()["error"]["code"]) == (502, "CommitFailed"), failed.text
        assert other.address in failed.json()["error"]["message"]
        assert await s.run(sid, "cat /root/made.txt") == ("made\n", 0)
