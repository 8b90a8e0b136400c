"""Checkpoint images: stored in the workspace's storage, cached on the node, recorded in the database."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from levers9.checkpoint import storage as checkpoints
from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.publish import dump_fits, fetch_for_start, publish
from levers9.checkpoint.storage import (
    CheckpointMissing,
    LocalStorage,
    S3Storage,
    StorageError,
    storage_from_url,
    storage_key,
)
from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import CheckpointImage
from levers9.state.sql.apps import AppStore, StubStore
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.records import CheckpointStatus, StubRecord, WorkspaceRecord
from levers9.state.sql.workspaces import WorkspaceStore

REPO = Path(__file__).resolve().parents[2]
BIG = 20 * 2**20


def make_image(root: Path, *, big: bool = False) -> Path:
    """A directory shaped like a runtime's dump: nested files, several modes, a relative link."""
    root.mkdir(parents=True)
    (root / "pages").mkdir()
    (root / "pages" / "deep").mkdir()
    (root / "checkpoint.img").write_bytes(b"state" * 1000)
    (root / "pages" / "deep" / "pages-1.img").write_bytes(os.urandom(4096))
    (root / "run.sh").write_text("#!/bin/sh\necho restored\n")
    (root / "run.sh").chmod(0o755)
    (root / "pages" / "secret.img").write_bytes(b"private")
    (root / "pages" / "secret.img").chmod(0o640)
    (root / "pages" / "deep").chmod(0o750)
    (root / "latest").symlink_to("checkpoint.img")
    if big:
        with open(root / "pages" / "big.img", "wb") as out:
            for _ in range(BIG // 2**20):
                out.write(os.urandom(2**20))
    return root


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root``: its kind, permission bits and content hash (or link target)."""
    seen: dict[str, tuple[str, int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            seen[rel] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            seen[rel] = ("dir", stat.S_IMODE(info.st_mode), "")
        else:
            digest = hashlib.sha256()
            with open(path, "rb") as data:
                while chunk := data.read(2**20):
                    digest.update(chunk)
            seen[rel] = ("file", stat.S_IMODE(info.st_mode), digest.hexdigest())
    return seen


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# --------------------------------------------------------------------------- local storage


def test_local_storage_round_trip_keeps_layout_modes_links_and_big_files(tmp_path: Path) -> None:
    image = make_image(tmp_path / "image", big=True)
    storage = LocalStorage(tmp_path / "store")
    stored = storage.put_dir("ws_1/stub_1/ckpt_1", image)
    tar = tmp_path / "store" / "ws_1" / "stub_1" / "ckpt_1.tar"
    assert stored == tar.stat().st_size > BIG
    storage.get_dir("ws_1/stub_1/ckpt_1", tmp_path / "out" / "restored")
    assert snapshot(tmp_path / "out" / "restored") == snapshot(image)
    assert snapshot(image)["run.sh"][1] == 0o755
    assert snapshot(image)["pages/secret.img"][1] == 0o640
    assert leftovers(tmp_path / "out") == []
    assert leftovers(tar.parent) == []


def test_local_storage_replaces_a_key_and_deletes_idempotently(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    first = make_image(tmp_path / "first")
    second = tmp_path / "second"
    second.mkdir()
    (second / "only.img").write_text("second")
    storage.put_dir("ws_1/_/ckpt_1", first)
    storage.put_dir("ws_1/_/ckpt_1", second)
    storage.get_dir("ws_1/_/ckpt_1", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["only.img"]
    storage.delete("ws_1/_/ckpt_1")
    storage.delete("ws_1/_/ckpt_1")
    storage.delete("ws_1/_/never")
    with pytest.raises(CheckpointMissing):
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "again")


def test_local_storage_missing_key_leaves_nothing_behind(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    (tmp_path / "cache").mkdir()
    with pytest.raises(CheckpointMissing, match="ckpt_9"):
        storage.get_dir("ws_1/_/ckpt_9", tmp_path / "cache" / "ckpt_9")
    assert list((tmp_path / "cache").iterdir()) == []
    assert isinstance(CheckpointMissing("x"), Levers9Error)


def test_local_storage_corrupt_image_leaves_no_half_directory(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    (tmp_path / "store" / "ws_1" / "_").mkdir(parents=True)
    (tmp_path / "store" / "ws_1" / "_" / "ckpt_1.tar").write_bytes(b"not a tar at all" * 100)
    (tmp_path / "cache").mkdir()
    with pytest.raises(tarfile.ReadError):
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "cache" / "ckpt_1")
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_image_cannot_write_outside_its_directory(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    (tmp_path / "store" / "ws_1" / "_").mkdir(parents=True)
    evil = tmp_path / "evil.img"
    evil.write_text("owned")
    with tarfile.open(tmp_path / "store" / "ws_1" / "_" / "ckpt_1.tar", "w") as tar:
        tar.add(evil, arcname="../../escaped.img")
    with pytest.raises(tarfile.TarError):
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "cache" / "ckpt_1")
    assert not (tmp_path / "escaped.img").exists()
    assert not (tmp_path / "cache" / "ckpt_1").exists()


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs/key", "ws_1//ckpt", "ws_1/./ckpt", "ws_1/.hidden", ""])
def test_keys_that_could_escape_the_root_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="key"):
        LocalStorage(tmp_path).delete(key)


# --------------------------------------------------------------------------- S3 against a real (moto) server


@dataclass
class S3:
    endpoint: str
    client: Any

    def bucket(self) -> str:
        name = f"ckpt-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3:
    """Credentials for the default chain to find, and nothing from the developer's own AWS files."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    client = boto3.session.Session().client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    return S3(moto_endpoint, client)


def test_s3_round_trip_streams_a_big_image(s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    storage = storage_from_url(
        f"s3://{bucket}/team/images?endpoint_url={s3.endpoint}&region=us-east-1", default_root=tmp_path
    )
    image = make_image(tmp_path / "image", big=True)
    stored = storage.put_dir("ws_1/stub_1/ckpt_1", image)
    head = s3.client.head_object(Bucket=bucket, Key="team/images/ws_1/stub_1/ckpt_1.tar")
    assert stored == head["ContentLength"] > BIG
    storage.get_dir("ws_1/stub_1/ckpt_1", tmp_path / "cache" / "ckpt_1")
    assert snapshot(tmp_path / "cache" / "ckpt_1") == snapshot(image)
    assert leftovers(tmp_path / "cache") == []
    storage.delete("ws_1/stub_1/ckpt_1")
    storage.delete("ws_1/stub_1/ckpt_1")
    with pytest.raises(CheckpointMissing, match=f"s3://{bucket}/team/images/ws_1/stub_1/ckpt_1.tar"):
        storage.get_dir("ws_1/stub_1/ckpt_1", tmp_path / "cache" / "again")
    assert leftovers(tmp_path / "cache") == []


def test_s3_missing_key_is_checkpoint_missing(s3: S3, tmp_path: Path) -> None:
    storage = S3Storage(s3.bucket(), endpoint_url=s3.endpoint, region="us-east-1")
    (tmp_path / "cache").mkdir()
    with pytest.raises(CheckpointMissing):
        storage.get_dir("ws_1/_/ckpt_none", tmp_path / "cache" / "ckpt_none")
    assert list((tmp_path / "cache").iterdir()) == []


def test_s3_bad_bucket_is_a_storage_error_with_the_code(s3: S3, tmp_path: Path) -> None:
    bucket = f"absent-{uuid.uuid4().hex[:12]}"
    storage = S3Storage(bucket, "p", endpoint_url=s3.endpoint, region="us-east-1")
    image = make_image(tmp_path / "image")
    with pytest.raises(StorageError, match=bucket) as put:
        storage.put_dir("ws_1/_/ckpt_1", image)
    assert put.value.code == "NoSuchBucket"
    assert "p/ws_1/_/ckpt_1.tar" in str(put.value)
    with pytest.raises(StorageError, match=bucket) as get:
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "cache" / "ckpt_1")
    assert get.value.code == "NoSuchBucket"
    with pytest.raises(StorageError) as delete:
        storage.delete("ws_1/_/ckpt_1")
    assert delete.value.code == "NoSuchBucket"


def test_s3_a_tar_that_dies_half_way_is_not_stored(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the multipart threshold, so parts were already sent when the image turned out unreadable."""

    def dying(source: Path, out: IO[bytes]) -> None:
        out.write(b"\0" * (9 * 2**20))
        raise OSError(errno.EIO, "the disk went away")

    storage = S3Storage(s3.bucket(), endpoint_url=s3.endpoint, region="us-east-1")
    monkeypatch.setattr(checkpoints, "_write_tar", dying)
    with pytest.raises(OSError, match="the disk went away"):
        storage.put_dir("ws_1/_/ckpt_1", tmp_path)
    with pytest.raises(CheckpointMissing):
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "out")


def test_s3_corrupt_object_fails_without_hanging_or_leftovers(s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    s3.client.put_object(Bucket=bucket, Key="ws_1/_/ckpt_1.tar", Body=b"garbage!" * (2**20))
    storage = S3Storage(bucket, endpoint_url=s3.endpoint)
    (tmp_path / "cache").mkdir()
    with pytest.raises(tarfile.ReadError):
        storage.get_dir("ws_1/_/ckpt_1", tmp_path / "cache" / "ckpt_1")
    assert list((tmp_path / "cache").iterdir()) == []


# --------------------------------------------------------------------------- storage URLs


def test_storage_urls(tmp_path: Path) -> None:
    for url in (None, ""):
        default = storage_from_url(url, default_root=tmp_path / "default")
        assert isinstance(default, LocalStorage)
        assert default.describe() == str(tmp_path / "default")
    plain = storage_from_url("/var/lib/levers9/checkpoints", default_root=tmp_path)
    assert isinstance(plain, LocalStorage)
    assert plain.root == Path("/var/lib/levers9/checkpoints")
    file_url = storage_from_url("file:///srv/ckpt", default_root=tmp_path)
    assert isinstance(file_url, LocalStorage)
    assert file_url.root == Path("/srv/ckpt")
    s3 = storage_from_url("s3://bucket/a/b/?endpoint_url=http://minio:9000&region=eu-west-1", default_root=tmp_path)
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix, s3.endpoint_url, s3.region) == ("bucket", "a/b", "http://minio:9000", "eu-west-1")
    assert s3.describe() == "s3://bucket/a/b"
    bare = storage_from_url("s3://bucket", default_root=tmp_path)
    assert isinstance(bare, S3Storage)
    assert (bare.prefix, bare.endpoint_url, bare.region, bare.describe()) == ("", None, None, "s3://bucket")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("relative/dir", "expected nothing"),
        ("gs://bucket/x", "s3://bucket/prefix"),
        ("file://host/srv", "absolute path"),
        ("file:relative", "absolute path"),
        ("s3:///prefix", "no bucket"),
        ("s3://b/p?endpoint=http://x", "unknown option"),
        ("s3://b/p?region=a&region=b", "exactly once"),
        ("s3://b/p?region=", "exactly once"),
    ],
)
def test_bad_storage_urls_say_what_is_accepted(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage_from_url(url, default_root=tmp_path)


# --------------------------------------------------------------------------- the node cache


class CountingStorage(LocalStorage):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.downloads: list[str] = []

    def get_dir(self, key: str, dest: Path) -> None:
        self.downloads.append(key)
        super().get_dir(key, dest)


def sized_image(root: Path, size: int) -> Path:
    root.mkdir(parents=True)
    (root / "pages.img").write_bytes(b"x" * size)
    return root


def test_adopt_moves_the_image_into_the_cache(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=10**9)
    image = make_image(tmp_path / "image")
    before = snapshot(image)
    assert not cache.has("ckpt_1")
    path = cache.adopt("ckpt_1", image)
    assert path == cache.path_for("ckpt_1") == tmp_path / "cache" / "ckpt_1"
    assert cache.has("ckpt_1")
    assert not image.exists()
    assert snapshot(path) == before
    with pytest.raises(FileExistsError):
        cache.adopt("ckpt_1", make_image(tmp_path / "again"))


def test_adopt_copies_across_filesystems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image = make_image(tmp_path / "image")
    before = snapshot(image)
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        if Path(src) == image:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    cache = NodeCache(tmp_path / "cache", max_bytes=10**9)
    path = cache.adopt("ckpt_1", image)
    assert snapshot(path) == before
    assert not image.exists()
    assert leftovers(tmp_path / "cache") == [".locks"]


def test_fetch_downloads_once_then_hits(tmp_path: Path) -> None:
    storage = CountingStorage(tmp_path / "store")
    image = make_image(tmp_path / "image")
    storage.put_dir("ws_1/_/ckpt_1", image)
    cache = NodeCache(tmp_path / "cache", max_bytes=10**9)
    first = cache.fetch("ckpt_1", storage, "ws_1/_/ckpt_1")
    second = cache.fetch("ckpt_1", storage, "ws_1/_/ckpt_1")
    assert first == second == cache.path_for("ckpt_1")
    assert storage.downloads == ["ws_1/_/ckpt_1"]
    assert snapshot(first) == snapshot(image)
    with pytest.raises(CheckpointMissing):
        cache.fetch("ckpt_2", storage, "ws_1/_/ckpt_2")
    assert not cache.has("ckpt_2")


def test_fetch_clears_a_download_that_died(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    storage.put_dir("ws_1/_/ckpt_1", make_image(tmp_path / "image"))
    cache = NodeCache(tmp_path / "cache", max_bytes=10**9)
    (tmp_path / "cache" / ".ckpt_1.dead").mkdir()
    (tmp_path / "cache" / ".ckpt_1.dead" / "half.img").write_text("half")
    (tmp_path / "cache" / ".ckpt_10.other").mkdir()  # another id's download, not this one's to clear
    cache.fetch("ckpt_1", storage, "ws_1/_/ckpt_1")
    assert leftovers(tmp_path / "cache") == [".ckpt_10.other", ".locks"]


def test_eviction_removes_least_recently_used_until_under_the_limit(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    cache = NodeCache(tmp_path / "cache", max_bytes=2500)
    for name in ("ckpt_a", "ckpt_b", "ckpt_c"):
        cache.adopt(name, sized_image(tmp_path / name, 1000))
    assert cache.size_bytes() == 3000
    cache.fetch("ckpt_a", storage, "unused/key")  # a hit: ckpt_a becomes the most recently used
    assert cache.evict() == ["ckpt_b"]
    assert [cache.has(n) for n in ("ckpt_a", "ckpt_b", "ckpt_c")] == [True, False, True]
    assert cache.size_bytes() == 2000 <= cache.max_bytes
    assert cache.evict() == []
    cache.max_bytes = 0
    assert cache.evict(keep=1) == ["ckpt_c"]
    assert cache.has("ckpt_a")
    assert cache.evict() == ["ckpt_a"]
    assert cache.size_bytes() == 0


def test_eviction_spares_images_in_use(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=0)
    cache.adopt("ckpt_a", sized_image(tmp_path / "a", 100))
    cache.adopt("ckpt_b", sized_image(tmp_path / "b", 100))
    with cache.hold("ckpt_a") as held:
        assert cache.evict() == ["ckpt_b"]
        assert (held / "pages.img").read_bytes() == b"x" * 100
    assert cache.evict() == ["ckpt_a"]
    with pytest.raises(CheckpointMissing), cache.hold("ckpt_a"):
        pass


def test_an_evicted_image_is_downloaded_again(tmp_path: Path) -> None:
    storage = CountingStorage(tmp_path / "store")
    storage.put_dir("ws_1/_/ckpt_1", make_image(tmp_path / "image"))
    cache = NodeCache(tmp_path / "cache", max_bytes=0)
    cache.fetch("ckpt_1", storage, "ws_1/_/ckpt_1")
    assert cache.evict() == ["ckpt_1"]
    cache.fetch("ckpt_1", storage, "ws_1/_/ckpt_1")
    assert storage.downloads == ["ws_1/_/ckpt_1", "ws_1/_/ckpt_1"]
    assert cache.free_bytes() > 0


FETCHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from levers9.checkpoint.node_cache import NodeCache
    from levers9.checkpoint.storage import LocalStorage

    cache_root, store_root, marks, name = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]

    class Slow(LocalStorage):
        def get_dir(self, key, dest):
            (marks / f"download-{name}").touch()
            time.sleep(0.5)  # widen the window in which a second, unlocked download would start
            super().get_dir(key, dest)

    (marks / f"ready-{name}").touch()
    while not (marks / "go").exists():
        time.sleep(0.005)
    path = NodeCache(cache_root, 10**9).fetch("ckpt_1", Slow(store_root), "ws_1/_/ckpt_1")
    print(sorted(p.name for p in path.iterdir()))
    """
)


def test_two_processes_fetching_the_same_image_download_it_once(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    storage.put_dir("ws_1/_/ckpt_1", make_image(tmp_path / "image"))
    marks = tmp_path / "marks"
    marks.mkdir()
    args = [str(tmp_path / "cache"), str(tmp_path / "store"), str(marks)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FETCHER, *args, name],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("one", "two")
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((marks / f"ready-{n}").exists() for n in ("one", "two")):
            assert time.monotonic() < deadline, "the fetchers never started"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        (marks / "go").touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0] != ""
    assert len(list(marks.glob("download-*"))) == 1
    assert leftovers(tmp_path / "cache") == [".locks"]


# --------------------------------------------------------------------------- publishing and starting


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await open_database(f"sqlite:///{tmp_path}/l.db")
    try:
        yield database
    finally:
        await database.close()


async def new_stub(db: Database, workspace_name: str) -> tuple[WorkspaceRecord, StubRecord]:
    workspace = await WorkspaceStore(db).create(workspace_name)
    app = await AppStore(db).get_or_create(workspace.id, "inference")
    stub = await StubStore(db).get_or_create(workspace.id, app.id, "generate", "function", {"gpu": ["H100"]})
    return workspace, stub


def dumped(path: Path) -> CheckpointImage:
    make_image(path)
    return CheckpointImage(checkpoint_id=uuid.uuid4().hex, runtime="gvisor", path=str(path), size_bytes=0)


async def test_publish_records_the_storage_key_and_another_node_restores_from_it(db: Database, tmp_path: Path) -> None:
    workspace, stub = await new_stub(db, "team-a")
    store = CheckpointStore(db)
    storage = CountingStorage(tmp_path / "store")
    cache = NodeCache(tmp_path / "node-1", max_bytes=10**9)
    image = dumped(tmp_path / "dump")
    expected = snapshot(Path(image.path))
    record = await publish(
        image,
        workspace_id=workspace.id,
        stub_id=stub.id,
        task_id=None,
        gpu="H100",
        store=store,
        storage=storage,
        cache=cache,
    )
    key = storage_key(workspace.id, stub.id, record.id)
    assert record.status is CheckpointStatus.AVAILABLE
    assert record.path == key == f"{workspace.id}/{stub.id}/{record.id}"
    assert record.size_bytes == (tmp_path / "store" / f"{key}.tar").stat().st_size
    assert (record.gpu, record.runtime) == ("H100", "gvisor")
    assert await store.latest(stub.id, gpu="H100") == record
    assert cache.has(record.id)
    assert not Path(image.path).exists()

    # the node that took it restores from its cache
    local = await fetch_for_start(record, storage=storage, cache=cache)
    assert storage.downloads == []
    assert local.path == str(cache.path_for(record.id))
    # another node downloads it, once
    other = NodeCache(tmp_path / "node-2", max_bytes=10**9)
    for _ in range(2):
        remote = await fetch_for_start(record, storage=storage, cache=other)
    assert storage.downloads == [key]
    assert (remote.checkpoint_id, remote.runtime, remote.size_bytes) == (record.id, "gvisor", record.size_bytes)
    assert remote.path == str(other.path_for(record.id)) != record.path
    assert snapshot(Path(remote.path)) == expected


class BrokenStorage(LocalStorage):
    def put_dir(self, key: str, source: Path) -> int:
        raise StorageError("the bucket refused: AccessDenied", code="AccessDenied")


async def test_publish_marks_the_checkpoint_failed_when_the_upload_fails(db: Database, tmp_path: Path) -> None:
    workspace, stub = await new_stub(db, "team-a")
    store = CheckpointStore(db)
    cache = NodeCache(tmp_path / "cache", max_bytes=10**9)
    with pytest.raises(StorageError, match="AccessDenied"):
        await publish(
            dumped(tmp_path / "dump"),
            workspace_id=workspace.id,
            stub_id=stub.id,
            task_id=None,
            gpu=None,
            store=store,
            storage=BrokenStorage(tmp_path / "store"),
            cache=cache,
        )
    [record] = await store.list(workspace.id)
    assert record.status is CheckpointStatus.FAILED
    assert record.error is not None
    assert "StorageError" in record.error
    assert "AccessDenied" in record.error
    assert await store.latest(stub.id) is None
    assert not cache.has(record.id)


async def test_publish_marks_failed_when_the_image_is_not_there(db: Database, tmp_path: Path) -> None:
    workspace, _ = await new_stub(db, "team-a")
    store = CheckpointStore(db)
    image = CheckpointImage(checkpoint_id="x", runtime="gvisor", path=str(tmp_path / "nothing"), size_bytes=0)
    with pytest.raises(NotADirectoryError):
        await publish(
            image,
            workspace_id=workspace.id,
            stub_id=None,
            task_id=None,
            gpu=None,
            store=store,
            storage=LocalStorage(tmp_path / "store"),
            cache=NodeCache(tmp_path / "cache", max_bytes=10**9),
        )
    [record] = await store.list(workspace.id)
    assert record.status is CheckpointStatus.FAILED
    assert record.error is not None
    assert "nothing" in record.error


async def test_workspaces_never_share_keys(db: Database, tmp_path: Path) -> None:
    store = CheckpointStore(db)
    storage = LocalStorage(tmp_path / "store")
    records = []
    for name in ("team-a", "team-b"):
        workspace, stub = await new_stub(db, name)
        records.append(
            await publish(
                dumped(tmp_path / f"dump-{name}"),
                workspace_id=workspace.id,
                stub_id=stub.id,
                task_id=None,
                gpu=None,
                store=store,
                storage=storage,
                cache=NodeCache(tmp_path / f"cache-{name}", max_bytes=10**9),
            )
        )
    a, b = records
    assert a.path is not None
    assert b.path is not None
    assert a.path.split("/")[0] == a.workspace_id != b.workspace_id == b.path.split("/")[0]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == sorted([a.workspace_id, b.workspace_id])
    storage.delete(a.path)
    with pytest.raises(CheckpointMissing):
        await fetch_for_start(a, storage=storage, cache=NodeCache(tmp_path / "fresh", max_bytes=10**9))
    restored = await fetch_for_start(b, storage=storage, cache=NodeCache(tmp_path / "fresh", max_bytes=10**9))
    assert Path(restored.path).is_dir()
    # the same checkpoint id in two workspaces still has two keys
    assert storage_key("ws_a", None, "ckpt_1") != storage_key("ws_b", None, "ckpt_1")
    assert storage_key("ws_a", None, "ckpt_1") == "ws_a/_/ckpt_1"


@pytest.mark.parametrize(
    ("workspace", "stub", "checkpoint"), [("../ws", None, "c"), ("ws", "a/b", "c"), ("ws", "_", "c")]
)
def test_storage_keys_refuse_ids_that_could_collide_or_escape(
    workspace: str, stub: str | None, checkpoint: str
) -> None:
    with pytest.raises(ValueError, match="cannot name a checkpoint"):
        storage_key(workspace, stub, checkpoint)


async def test_a_record_without_a_stored_image_cannot_be_fetched(db: Database, tmp_path: Path) -> None:
    workspace, _ = await new_stub(db, "team-a")
    record = await CheckpointStore(db).create(workspace.id, "gvisor")
    with pytest.raises(CheckpointMissing, match=record.id):
        await fetch_for_start(
            record, storage=LocalStorage(tmp_path), cache=NodeCache(tmp_path / "cache", max_bytes=10**9)
        )


# --------------------------------------------------------------------------- whether to checkpoint at all

GiB = 2**30


def test_dump_fits() -> None:
    assert dump_fits(2 * GiB, 4 * GiB, 100 * GiB) is None
    assert dump_fits(4 * GiB, 4 * GiB, 4 * GiB) is None
    over_limit = dump_fits(5 * GiB, 4 * GiB, 100 * GiB)
    assert over_limit is not None
    assert "memory limit (4.0 GiB)" in over_limit
    assert "5.0 GiB" in over_limit
    no_room = dump_fits(3 * GiB, 4 * GiB, GiB)
    assert no_room is not None
    assert "1.0 GiB free" in no_room
    assert "cache" in no_room
    assert dump_fits(8 * GiB, 0, 100 * GiB) is None  # no limit
    assert dump_fits(0, 4 * GiB, 0) is None
    with pytest.raises(ValueError, match="negative"):
        dump_fits(-1, 4 * GiB, GiB)


def test_memory_in_use_is_read_below_the_runtimes_cgroup_parent(tmp_path: Path) -> None:
    """Where the cgroup is comes from the runtime's capabilities, not from the OCI engine's layout."""
    from levers9.checkpoint.restore import memory_in_use

    (tmp_path / "pods" / "app").mkdir(parents=True)
    (tmp_path / "pods" / "app" / "memory.current").write_text("4096\n")
    (tmp_path / "memory" / "levers9" / "app").mkdir(parents=True)
    (tmp_path / "memory" / "levers9" / "app" / "memory.usage_in_bytes").write_text("8192\n")
    assert memory_in_use("app", "/pods", root=tmp_path) == 4096  # cgroup v2
    assert memory_in_use("app", "/levers9", root=tmp_path) == 8192  # cgroup v1
    assert memory_in_use("app", None, root=tmp_path) is None  # the runtime gives containers no cgroup
    assert memory_in_use("other", "/pods", root=tmp_path) is None


def _tar_with(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    path = tmp_path / "image.tar"
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_info("a/../../outside"), "outside"),
        (_info("link", tarfile.SYMTYPE, linkname="../../outside"), "outside"),
        (_info("link", tarfile.SYMTYPE, linkname="/etc/passwd"), "absolute"),
        (_info("hard", tarfile.LNKTYPE, linkname="../outside"), "outside"),
        (_info("null", tarfile.CHRTYPE), "device"),
    ],
)
def test_a_member_that_reaches_out_or_is_a_device_is_refused_before_anything_is_written(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    """The data rules, on this Python (Debian 12's 3.11.2 has no tarfile filter: levers9's own rules apply)."""
    from levers9.checkpoint.untar import extract_all

    dest = tmp_path / "dest"
    dest.mkdir()
    archive = _tar_with(tmp_path, (member, b"" if member.type != tarfile.REGTYPE else b"owned"))
    with open(archive, "rb") as stream, pytest.raises(tarfile.TarError) as refused:
        extract_all(stream, dest, bufsize=65536)
    # levers9's words on a Python without tarfile's filters, the standard library's on one with them
    assert any(word in str(refused.value).lower() for word in {"device": ("device", "special")}.get(why, (why,)))
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "outside").exists()


def test_an_absolute_name_lands_inside_the_destination(tmp_path: Path) -> None:
    from levers9.checkpoint.untar import extract_all

    name = f"/tmp/levers9-owned-{uuid.uuid4().hex}"
    dest = tmp_path / "dest"
    dest.mkdir()
    with open(_tar_with(tmp_path, (_info(name), b"owned")), "rb") as stream:
        extract_all(stream, dest, bufsize=65536)
    assert not Path(name).exists()
    assert (dest / name.lstrip("/")).read_bytes() == b"owned"


def test_set_id_bits_and_owners_are_dropped_and_directories_keep_owner_access(tmp_path: Path) -> None:
    from levers9.checkpoint.untar import extract_all

    owned = _info("bin/tool", mode=0o6777)
    owned.uid, owned.gid, owned.uname, owned.gname = 4242, 4242, "mallory", "mallory"
    archive = _tar_with(tmp_path, (_info("bin", tarfile.DIRTYPE, mode=0o500), b""), (owned, b"#!/bin/sh\n"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with open(archive, "rb") as stream:
        extract_all(stream, dest, bufsize=65536)
    tool = (dest / "bin" / "tool").stat()
    assert tool.st_mode & 0o7777 == 0o755, oct(tool.st_mode)
    assert (tool.st_uid, tool.st_gid) == (os.getuid(), os.getgid())
    assert (dest / "bin").stat().st_mode & 0o700 == 0o700
