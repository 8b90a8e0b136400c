"""The controlplane as the registry everyone pulls from: ``/v2/`` relayed to its backend, every request scoped.

A real controlplane (:class:`levers9.controlplane.server.Server`, in this process, on SQLite and
PostgreSQL) with its embedded ``docker-registry`` backend, spoken to over its real HTTP listener by
the registry client workers use, by raw HTTP, by ``skopeo`` and by a private ``dockerd``. Workers are
registered in the scheduler as their sessions would register them, with real pool worker tokens,
and calls and builds are placed on them by the real scheduler; so every rule of
:mod:`levers9.services.registry_access` is met by the request that exercises it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import tempfile
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from levers9.config.load import load_config
from levers9.controlplane.server import Listeners, Server
from levers9.registry.client import OCI_MANIFEST, UPLOAD_CHUNK, RegistryAuth, RegistryClient, RegistryError, push_image
from levers9.services.auth import Principal
from levers9.services.builds import BUILD_CPU_MILLICORES, BUILD_MEMORY_MIB, BUILDER_HANDLER
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.stubs import BUILD_KIND, InvalidStub
from levers9.state.redis.workers import WorkerInfo
from tests.fixtures.dockerd import Dockerd
from tests.fixtures.ports import free_port
from tests.fixtures.registry import Layer, image_config, make_layer
from tests.services.test_registry_backend import path_without

DEADLINE_S = 30.0
#: a build pool whose one worker a build fills, and a pool for calls
CONFIG = """\
version: 1
data_dir: {data_dir}
state:
  database_url: {database_url}
scheduler:
  worker_keepalive_s: 3600  # the tests' workers send no keepalives
listen:
  header_timeout_s: 600  # far beyond the tests' deadlines: a client left waiting for it fails the test
pools:
  build:
    provider: local
    runtime: runc  # workers here are registered by the tests; they never run a container
    cpu: 1
    memory: 2GiB
    max_workers: 1
    builds: true
  cpu:
    provider: local
    runtime: runc
    cpu: 2
    memory: 4GiB
    max_workers: 3
  team-a-own:
    provider: local
    runtime: runc
    cpu: 2
    memory: 4GiB
    max_workers: 1
    workspace: team-a
"""


@dataclass
class Cp:
    server: Server
    #: ``http://127.0.0.1:PORT``: the controlplane's HTTP listener, the registry of built images
    url: str

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def services(self) -> Services:
        assert self.server.services is not None
        return self.server.services

    @property
    def dp(self) -> DataPlane:
        assert self.server.dataplane is not None
        return self.server.dataplane

    async def user(self, name: str) -> tuple[Principal, str]:
        """A workspace (made if new) and a user token of it."""
        workspace = await self.services.workspaces.get_or_create(name)
        _, token = await self.services.tokens.issue("user", workspace_id=workspace.id, subject=f"someone@{name}")
        return await self.services.auth.verify(token), token

    async def worker(self, pool: str) -> tuple[str, str]:
        """A worker of ``pool`` registered as its session would register it, and a worker token of the pool."""
        spec = self.services.pools[pool]
        worker_id = f"w-{pool}-{uuid.uuid4().hex[:8]}"
        await self.services.scheduler.register_worker(
            WorkerInfo(
                id=worker_id,
                pool=pool,
                cpu_millicores=spec.cpu_millicores,
                memory_mib=spec.memory_mib,
                runtime="runc",
                address="10.0.0.7:7000",
            )
        )
        _, token = await self.services.tokens.issue("worker", subject=pool)
        return worker_id, token

    async def placed(self, worker_id: str, task_id: str) -> None:
        """Wait until the scheduler has placed ``task_id`` on ``worker_id``."""
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while task_id not in await self.services.scheduler.workers.requests_of(worker_id):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"task {task_id} was not placed on {worker_id} within {DEADLINE_S:g} s")
            await asyncio.sleep(0.05)

    async def build_of(self, user: Principal, worker_id: str) -> str:
        """A task of the workspace's build stub, placed on ``worker_id`` (the build pool's one worker)."""
        stub_id, _ = await self.dp.get_or_create_stub(
            user,
            {
                "kind": BUILD_KIND,
                "app": "levers9-builds",
                "name": "build-test",
                "cpu_millicores": BUILD_CPU_MILLICORES,
                "memory_mib": BUILD_MEMORY_MIB,
            },
            BUILDER_HANDLER,
            internal=True,
        )
        (task_id,) = await self.dp.submit(user, stub_id, [b"an order"])
        await self.placed(worker_id, task_id)
        return task_id

    async def call_of(self, user: Principal, worker_id: str) -> str:
        """A call of one of the workspace's functions, placed on ``worker_id``."""
        stub_id, _ = await self.dp.get_or_create_stub(user, {"name": "f"}, b"pickled handler")
        (task_id,) = await self.dp.submit(user, stub_id, [b"args"])
        await self.placed(worker_id, task_id)
        return task_id

    def patches(self) -> float:
        """The upload PATCH requests the HTTP listener answered 202 so far."""
        series = self.server.metrics.http_requests.labels(
            replica=self.server.metrics.replica, route="/v2/{name}/blobs/uploads/{uuid}", method="PATCH", status="202"
        )
        value: float = series._value.get()
        return value


@pytest.fixture
async def cp(tmp_path: Path, database_url: str) -> AsyncIterator[Cp]:
    path = tmp_path / "levers9.yaml"
    path.write_text(CONFIG.format(data_dir=tmp_path / "data", database_url=database_url))
    loaded = load_config(path)
    listeners = Listeners("127.0.0.1", free_port(), free_port(), free_port())
    server = Server(loaded, listeners)
    try:
        await server.start()
        yield Cp(server, f"http://127.0.0.1:{listeners.http_port}")
    finally:
        await server.stop(grace_s=1)
        loaded.hooks.close()


def _repo(user: Principal) -> str:
    return f"levers9/{(user.workspace_id or '').lower()}/blueprints"


def _image(tmp_path: Path, name: str, size: int = 0) -> tuple[list[Layer], bytes]:
    files = {f"{name}.txt": f"{name}\n".encode()} | ({"big.bin": os.urandom(size)} if size else {})
    layer = make_layer(tmp_path / f"{name}.tar.gz", files)
    return [layer], image_config([layer])


def _push(url: str, auth: RegistryAuth, repo: str, layers: list[Layer], config: bytes) -> str:
    with RegistryClient(url, auth=auth) as client:
        return push_image(client, repo, "v1", [layer.spec() for layer in layers], config)


def _pull(url: str, auth: RegistryAuth, repo: str, digest: str, layer: Layer) -> bytes:
    """The manifest, and the layer read to its end (which checks its digest); the layer's bytes."""
    with RegistryClient(url, auth=auth) as client:
        assert client.get_manifest(repo, digest)[2] == digest
        with client.open_blob(repo, layer.digest) as stream:
            return stream.read()


def _read_through(url: str, auth: RegistryAuth, repo: str, digest: str, layer: Layer) -> int:
    """The manifest, then the layer read to its end in 1 MiB pieces (which checks its digest); its size."""
    with RegistryClient(url, auth=auth) as client:
        assert client.get_manifest(repo, digest)[2] == digest
        size = 0
        with client.open_blob(repo, layer.digest) as stream:
            while piece := stream.read(1 << 20):
                size += len(piece)
        return size


async def _refused(call: Callable[[], object]) -> RegistryError:
    with pytest.raises(RegistryError) as refused:
        await asyncio.to_thread(call)
    return refused.value


async def test_pushes_and_pulls_are_scoped_to_placed_builds_calls_and_workspaces(cp: Cp, tmp_path: Path) -> None:
    alice, alice_token = await cp.user("team-a")
    bob, bob_token = await cp.user("team-b")
    repo = _repo(alice)
    layers, config = _image(tmp_path, "a")
    builder, builder_token = await cp.worker("build")
    as_builder = RegistryAuth(builder, builder_token)

    # no build of team-a placed on the build worker: it may not push (nor pull: it runs nothing of team-a)
    refused = await _refused(lambda: _push(cp.url, as_builder, repo, layers, config))
    assert refused.status == 403  # on the HEAD that asks whether the blob is there: an answer with no body
    async with httpx.AsyncClient(base_url=cp.url, auth=(builder, builder_token)) as raw:
        upload = await raw.post(f"/v2/{repo}/blobs/uploads/")
    assert (upload.status_code, upload.json()["errors"][0]["code"]) == (403, "DENIED")
    assert "no build of that workspace is placed on it" in upload.json()["errors"][0]["message"]

    build = await cp.build_of(alice, builder)
    digest = await asyncio.to_thread(_push, cp.url, as_builder, repo, layers, config)
    # ... but not to another workspace's repository, nor mount another's blob into its own
    refused = await _refused(lambda: _push(cp.url, as_builder, _repo(bob), layers, config))
    assert refused.status == 403
    async with httpx.AsyncClient(base_url=cp.url, auth=(builder, builder_token)) as raw:
        mount = await raw.post(f"/v2/{repo}/blobs/uploads/", params={"mount": layers[0].digest, "from": _repo(bob)})
        assert mount.status_code == 403, mount.text
        assert mount.json()["errors"][0]["code"] == "DENIED"
    # a user of team-a pulls its image, and may not push
    as_alice = RegistryAuth("anyone", alice_token)
    assert await asyncio.to_thread(_pull, cp.url, as_alice, repo, digest, layers[0]) == layers[0].path.read_bytes()
    refused = await _refused(lambda: _push(cp.url, as_alice, repo, *_image(tmp_path, "by-user")))
    assert refused.status == 403
    async with httpx.AsyncClient(base_url=cp.url, auth=("anyone", alice_token)) as raw:
        upload = await raw.post(f"/v2/{repo}/blobs/uploads/")
    assert (upload.status_code, upload.json()["errors"][0]["code"]) == (403, "DENIED")
    assert "a user token may not push" in upload.json()["errors"][0]["message"]
    # a user of team-b may not pull team-a's image
    refused = await _refused(lambda: _pull(cp.url, RegistryAuth("x", bob_token), repo, digest, layers[0]))
    assert (refused.status, refused.code) == (403, "DENIED")
    assert "not of this token's workspace" in refused.message

    # a worker with a call of team-a placed on it pulls the image; a worker with none may not
    runner, runner_token = await cp.worker("cpu")
    call = await cp.call_of(alice, runner)
    pulled = await asyncio.to_thread(_pull, cp.url, RegistryAuth(runner, runner_token), repo, digest, layers[0])
    assert pulled == layers[0].path.read_bytes()
    # taken by the worker (as its session takes it) and then ended: the worker ran team-a's call lately, and
    # may still pull (its later containers of the stub start from the image it has)
    assert [d.task_id for d in await cp.dp.take(runner)] == [call]
    assert await cp.dp.cancel(alice, call)
    assert call not in await cp.services.scheduler.workers.requests_of(runner)
    pulled = await asyncio.to_thread(_pull, cp.url, RegistryAuth(runner, runner_token), repo, digest, layers[0])
    assert pulled == layers[0].path.read_bytes()
    idle, idle_token = await cp.worker("cpu")
    refused = await _refused(lambda: _pull(cp.url, RegistryAuth(idle, idle_token), repo, digest, layers[0]))
    assert (refused.status, refused.code) == (403, "DENIED")
    assert f"worker {idle} may not pull" in refused.message
    refusals = cp.server.metrics.worker_refusals.labels(replica=cp.server.metrics.replica, what="image pull")
    assert refusals._value.get() >= 1  # counted (and logged) as a security event
    # a worker token speaks only for the workers of its own pool (the build pool's token, for the cpu worker)
    refused = await _refused(lambda: _pull(cp.url, RegistryAuth(runner, builder_token), repo, digest, layers[0]))
    assert refused.status == 403
    # the worker may name itself in a header when it sends its token as a bearer token
    headers = {"Authorization": f"Bearer {runner_token}", "X-Levers9-Worker": runner, "Accept": OCI_MANIFEST}
    async with httpx.AsyncClient(base_url=cp.url, headers=headers) as raw:
        head = await raw.head(f"/v2/{repo}/manifests/{digest}")
        assert (head.status_code, head.headers["Docker-Content-Digest"]) == (200, digest)

    # a worker of a pool bound to team-a pulls team-a's images with nothing placed on it, and no other's
    own, own_token = await cp.worker("team-a-own")
    pulled = await asyncio.to_thread(_pull, cp.url, RegistryAuth(own, own_token), repo, digest, layers[0])
    assert pulled == layers[0].path.read_bytes()
    refused = await _refused(lambda: _pull(cp.url, RegistryAuth(own, own_token), _repo(bob), digest, layers[0]))
    assert (refused.status, refused.code) == (403, "DENIED")

    # once the build has ended (cancelled: its room freed), the build worker may push no more
    assert await cp.dp.cancel(alice, build)
    refused = await _refused(lambda: _push(cp.url, as_builder, repo, *_image(tmp_path, "late")))
    assert refused.status == 403


async def test_a_worker_running_a_sandbox_pulls_its_workspaces_images_and_pushes_its_sandbox_images_only(
    cp: Cp, tmp_path: Path
) -> None:
    alice, _ = await cp.user("team-a")
    bob, _ = await cp.user("team-b")
    builder, builder_token = await cp.worker("build")
    layers, config = _image(tmp_path, "base")
    await cp.build_of(alice, builder)
    digest = await asyncio.to_thread(_push, cp.url, RegistryAuth(builder, builder_token), _repo(alice), layers, config)
    worker, token = await cp.worker("cpu")
    as_worker = RegistryAuth(worker, token)
    sandboxes = f"levers9/{(alice.workspace_id or '').lower()}/sandboxes"
    image = _image(tmp_path, "made")
    # nothing of team-a on it yet: neither
    refused = await _refused(lambda: _pull(cp.url, as_worker, _repo(alice), digest, layers[0]))
    assert "no call or sandbox of that workspace is placed on it" in refused.message
    assert (await _refused(lambda: _push(cp.url, as_worker, sandboxes, *image))).status == 403
    # a sandbox of team-a holds room on it: it pulls team-a's images, and pushes to team-a's sandboxes only
    workers, now = cp.services.scheduler.workers, cp.services.scheduler.ctx.now_ms
    assert await workers.hold_sandbox(
        "h1", worker, cpu=100, mem=64, gpus=0, now_ms=now(), workspace=alice.workspace_id or ""
    )
    assert await workers.sandbox_workspaces(worker) == {(alice.workspace_id or "").lower()}
    pulled = await asyncio.to_thread(_pull, cp.url, as_worker, _repo(alice), digest, layers[0])
    assert pulled == layers[0].path.read_bytes()
    await asyncio.to_thread(_push, cp.url, as_worker, sandboxes, *image)
    for other in (_repo(alice), f"levers9/{(bob.workspace_id or '').lower()}/sandboxes"):
        assert (await _refused(lambda repo=other: _push(cp.url, as_worker, repo, *image))).status == 403
    # the sandbox ended: neither again
    assert await workers.release_sandbox("h1", now_ms=now())
    assert await workers.sandbox_workspaces(worker) == set()
    assert (await _refused(lambda: _push(cp.url, as_worker, sandboxes, *image))).status == 403


async def test_tokens_are_asked_for_and_nothing_outside_the_workspaces_is_served(cp: Cp) -> None:
    alice, alice_token = await cp.user("team-a")
    repo = _repo(alice)
    async with httpx.AsyncClient(base_url=cp.url) as raw:
        for path in ("/v2/", f"/v2/{repo}/manifests/v1", "/v2/_catalog"):
            answer = await raw.get(path)
            assert answer.status_code == 401, path
            assert answer.headers["WWW-Authenticate"] == 'Basic realm="levers9"'
            assert answer.headers["Docker-Distribution-API-Version"] == "registry/2.0"
            assert answer.json()["errors"][0]["code"] == "UNAUTHORIZED"
        wrong = await raw.get("/v2/", auth=("x", "not-a-token"))
        assert wrong.status_code == 401
        assert "unknown, revoked or expired" in wrong.json()["errors"][0]["message"]
        raw.headers["Authorization"] = "Bearer " + alice_token
        assert (await raw.get("/v2/")).status_code == 200
        basic = "Basic " + base64.b64encode(f"docker:{alice_token}".encode()).decode()
        assert (await raw.get("/v2/", headers={"Authorization": basic})).status_code == 200
        catalog = await raw.get("/v2/_catalog")
        assert (catalog.status_code, catalog.json()["errors"][0]["code"]) == (403, "DENIED")
        for outside in ("other/repo", f"levers9/{(alice.workspace_id or '').lower()}", "levers9"):
            answer = await raw.get(f"/v2/{outside}/manifests/v1")
            assert (answer.status_code, answer.json()["errors"][0]["code"]) == (404, "NAME_UNKNOWN"), outside
        deleted = await raw.delete(f"/v2/{repo}/manifests/sha256:{'0' * 64}")
        assert deleted.status_code == 405
        # a user's pull of its own workspace reaches the backend, whose own answer comes back
        missing = await raw.get(f"/v2/{repo}/manifests/v1")
        assert (missing.status_code, missing.json()["errors"][0]["code"]) == (404, "MANIFEST_UNKNOWN")
        # the REST API behind the same listener is untouched
        assert (await raw.get("/api/v1/health")).status_code == 200


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_layer_over_the_upload_chunk_is_pushed_in_pieces_and_nothing_holds_a_whole_layer(
    cp: Cp, tmp_path: Path
) -> None:
    alice, alice_token = await cp.user("team-a")
    repo = _repo(alice)
    builder, builder_token = await cp.worker("build")
    await cp.build_of(alice, builder)
    layers, config = _image(tmp_path, "big", size=2 * UPLOAD_CHUNK + (5 << 20))  # random: gzip keeps its size
    assert layers[0].size > 2 * UPLOAD_CHUNK
    before = cp.patches()
    tracemalloc.start()
    try:
        digest = await asyncio.to_thread(_push, cp.url, RegistryAuth(builder, builder_token), repo, layers, config)
        _, pushing = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        read = await asyncio.to_thread(_read_through, cp.url, RegistryAuth("x", alice_token), repo, digest, layers[0])
        _, pulling = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read == layers[0].size  # read to its end: its digest checked
    assert cp.patches() - before == 3  # 16 MiB, 16 MiB and the rest, each a request of its own
    # the relay and the client in this process held pieces, never a whole layer (37 MiB) nor a whole chunk
    assert pushing < UPLOAD_CHUNK, f"{pushing / 2**20:.1f} MiB held at once while pushing"
    assert pulling < UPLOAD_CHUNK, f"{pulling / 2**20:.1f} MiB held at once while pulling"

    # one PUT of a whole layer (as other clients upload) streams through the relay as well
    other = make_layer(tmp_path / "other.tar.gz", {"big.bin": os.urandom(2 * UPLOAD_CHUNK)})

    async def pieces() -> AsyncIterator[bytes]:
        with other.path.open("rb") as handle:
            while piece := handle.read(1 << 20):
                yield piece

    async with httpx.AsyncClient(base_url=cp.url, auth=(builder, builder_token), timeout=60) as raw:
        started = await raw.post(f"/v2/{repo}/blobs/uploads/")
        assert started.status_code == 202, started.text
        location = started.headers["Location"]
        assert location.startswith(f"/v2/{repo}/blobs/uploads/")  # a path on the controlplane, not the backend's
        tracemalloc.start()
        try:
            target = httpx.URL(location).copy_merge_params({"digest": other.digest})  # the upload's _state kept
            done = await raw.put(target, content=pieces(), headers={"Content-Length": str(other.size)})
            _, monolithic = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert done.status_code == 201, done.text
        assert done.headers["Docker-Content-Digest"] == other.digest
        assert (await raw.head(f"/v2/{repo}/blobs/{other.digest}")).headers["Content-Length"] == str(other.size)
    assert monolithic < UPLOAD_CHUNK, f"{monolithic / 2**20:.1f} MiB held at once while relaying one PUT"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the clients' side: not the database
async def test_skopeo_and_docker_pull_through_the_controlplane(cp: Cp, tmp_path: Path, dockerd: Dockerd) -> None:
    alice, alice_token = await cp.user("team-a")
    repo = _repo(alice)
    builder, builder_token = await cp.worker("build")
    await cp.build_of(alice, builder)
    layers, config = _image(tmp_path, "docker")
    digest = await asyncio.to_thread(_push, cp.url, RegistryAuth(builder, builder_token), repo, layers, config)
    ref = f"{cp.host}/{repo}@{digest}"

    inspected = await asyncio.to_thread(
        subprocess.run,
        ["skopeo", "inspect", "--creds", f"x:{alice_token}", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inspected.returncode == 0, inspected.stderr
    assert digest in inspected.stdout
    _, bob_token = await cp.user("team-b")
    refused = await asyncio.to_thread(
        subprocess.run,
        ["skopeo", "inspect", "--creds", f"x:{bob_token}", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert "denied" in refused.stderr.lower()

    with tempfile.TemporaryDirectory(prefix="l9-docker-config-") as docker_config:
        env = {**dockerd.env, "DOCKER_CONFIG": docker_config}

        def docker(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["docker", *args], env=env, input=stdin, capture_output=True, text=True, timeout=180)

        login = await asyncio.to_thread(
            docker, "login", "-u", "levers9", "--password-stdin", cp.host, stdin=alice_token
        )
        assert login.returncode == 0, login.stderr
        pulled = await asyncio.to_thread(docker, "pull", ref)
        assert pulled.returncode == 0, pulled.stderr
        try:
            shown = await asyncio.to_thread(docker, "image", "inspect", "--format", "{{.RepoDigests}}", ref)
            assert digest in shown.stdout, shown.stderr
        finally:
            await asyncio.to_thread(docker, "image", "rm", "-f", ref)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_tls_handshake_on_the_plain_listener_is_refused_at_once(cp: Cp) -> None:
    """docker and skopeo try HTTPS first and fall back to HTTP on a loopback registry: the first try must fail now,
    not after the header timeout (which cost them 10 s per try)."""
    port = int(cp.host.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(bytes.fromhex("16030100a5010000a10303") + os.urandom(32))  # the start of a ClientHello
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), DEADLINE_S)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_controlplane_names_images_by_its_own_http_address(cp: Cp) -> None:
    assert cp.server.builds is not None
    assert cp.server.builds.registry is not None
    assert cp.server.builds.registry.url == cp.url  # the order's push URL and the host of every built ref
    assert cp.server.builds.registry.host == cp.host
    assert cp.dp.registry_host == cp.host  # where a stub may name only its own workspace's images
    alice, _ = await cp.user("team-a")
    bob, _ = await cp.user("team-b")
    image = f"{cp.host}/{_repo(alice)}@sha256:{'a' * 64}"
    await cp.dp.get_or_create_stub(alice, {"name": "g", "image": image}, b"pickled handler")
    with pytest.raises(InvalidStub, match="not an image of this workspace"):
        await cp.dp.get_or_create_stub(bob, {"name": "g", "image": image}, b"pickled handler")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_without_the_registry_binary_the_controlplane_starts_and_pulls_say_how_to_install_it(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", path_without("docker-registry", tmp_path / "bin"))
    path = tmp_path / "levers9.yaml"
    path.write_text(CONFIG.format(data_dir=tmp_path / "data", database_url=database_url))
    loaded = load_config(path)
    listeners = Listeners("127.0.0.1", free_port(), free_port(), free_port())
    server = Server(loaded, listeners)
    try:
        await server.start()
        assert server.builds is None  # BuildImage says the controlplane has no registry
        assert server.services is not None
        _, token = await server.services.tokens.issue("user", subject="root")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listeners.http_port}", auth=("x", token)) as raw:
            answer = await raw.get("/v2/levers9/ws_x/blueprints/manifests/v1")
        assert answer.status_code == 403, answer.text  # an operator's token pulls nothing: refused before the backend
        workspace = await server.services.workspaces.get_or_create("team-a")
        _, token = await server.services.tokens.issue("user", workspace_id=workspace.id, subject="someone")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listeners.http_port}", auth=("x", token)) as raw:
            answer = await raw.get(f"/v2/levers9/{workspace.id.lower()}/blueprints/manifests/v1")
        assert answer.status_code == 503, answer.text
        assert answer.json()["errors"][0]["code"] == "UNAVAILABLE"
        assert "apt-get install -y docker-registry" in answer.json()["errors"][0]["message"]
    finally:
        await server.stop(grace_s=1)
        loaded.hooks.close()
