"""levers9.volumes.rclone: real rclone mounts (FUSE) of the WebDAV server under uvicorn and of moto's S3.

Nothing is mocked: rclone 1.60 (Debian) and fusermount3 must be installed (``apt-get install rclone fuse3``).
Changes made through one side are awaited with a deadline, never timed. Every test leaves no mount below
its directory and no rclone process naming it.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from levers9.volumes import rclone
from levers9.volumes.paths import VolumeRoot
from levers9.volumes.rclone import INSTALL, RcloneError, RcloneMount, mount_s3, mount_webdav, sweep, unmount
from tests.fixtures.tls import TestCA
from tests.fixtures.volume_stores import ACCESS_KEY, SECRET_KEY, S3Store
from tests.volumes.dav_server import DavServer, serve_dav


@pytest.fixture(autouse=True)
def tools() -> None:
    for tool in ("rclone", "fusermount3"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: {INSTALL}")
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: modprobe fuse")


def _rclones_naming(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"rclone" in argv.split(b"\0")[0] and os.fsencode(str(path)) in argv:
                found.append(int(entry.name))
    return found


def _fuse_mounts_below(path: Path) -> list[str]:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split(" ")[4] for line in mounts if line.split(" ")[4].startswith(str(path)) and " fuse" in line]


@dataclass
class Mounts:
    """Mount points and cache directories below one directory; whatever is still mounted at the end is
    unmounted, and the test fails when anything was left."""

    root: Path
    made: list[RcloneMount]

    def place(self, name: str) -> tuple[Path, Path]:
        return self.root / "mnt" / name, self.root / "cache" / name

    def keep(self, mount: RcloneMount) -> RcloneMount:
        self.made.append(mount)
        return mount


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    found = Mounts(tmp_path / "mounts", [])
    yield found
    for mount in found.made:
        unmount(mount, timeout_s=10)
    assert _fuse_mounts_below(tmp_path) == []
    assert _rclones_naming(tmp_path) == []


def _eventually(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    """``check()``'s first truthy answer (an OSError counts as not yet), failing after the deadline."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = check()
        except OSError as exc:
            last = exc
        else:
            if answer:
                return answer
            last = answer
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- WebDAV


@pytest.fixture
def volume(tmp_path: Path) -> VolumeRoot:
    (tmp_path / "vol").mkdir()
    return VolumeRoot(tmp_path / "vol")


@pytest.fixture
def dav(volume: VolumeRoot) -> Iterator[DavServer]:
    with serve_dav({"vol": Path(volume.root)}) as server:
        yield server


def _mount_dav(dav: DavServer, mounts: Mounts, name: str, *, read_only: bool = False, token: str = "") -> RcloneMount:
    target, cache = mounts.place(name)
    return mounts.keep(
        mount_webdav(
            dav.url("vol"),
            token or dav.token,
            target,
            read_only=read_only,
            cache_dir=cache,
            owner_uid=1234,
            owner_gid=2345,
        )
    )


def test_a_webdav_mount_reads_writes_lists_and_removes(dav: DavServer, mounts: Mounts, volume: VolumeRoot) -> None:
    with volume.open_write("from-volume/hello.txt") as out:
        out.write(b"written in the volume\n")
    mount = _mount_dav(dav, mounts, "rw")
    here = mount.target
    assert os.fsencode(dav.token) not in Path(f"/proc/{mount.process.pid}/cmdline").read_bytes()
    assert (here / "from-volume" / "hello.txt").read_bytes() == b"written in the volume\n"
    info = (here / "from-volume" / "hello.txt").stat()
    assert (info.st_uid, info.st_gid) == (1234, 2345)

    (here / "made").mkdir()
    (here / "made" / "by-mount.bin").write_bytes(b"through the mount\n" * 1000)
    _eventually(
        lambda: _read(Path(volume.root) / "made" / "by-mount.bin") == b"through the mount\n" * 1000,
        "the mount's file in the volume",
    )
    assert sorted(os.listdir(here)) == ["from-volume", "made"]

    with volume.open_write("from-volume/later.txt") as out:
        out.write(b"later\n")
    _eventually(lambda: _read(here / "from-volume" / "later.txt") == b"later\n", "the volume's new file in the mount")

    (here / "made" / "b.txt").write_text("b")
    _eventually(lambda: _read(Path(volume.root) / "made" / "b.txt") == b"b", "b.txt uploaded")
    os.rename(here / "made" / "by-mount.bin", here / "made" / "b.txt")  # over an existing file
    _eventually(lambda: [e.name for e in volume.list("made")] == ["b.txt"], "the rename in the volume")
    assert (Path(volume.root) / "made" / "b.txt").read_bytes() == b"through the mount\n" * 1000
    os.remove(here / "from-volume" / "hello.txt")
    with pytest.raises(OSError, match="not empty") as not_empty:
        os.rmdir(here / "from-volume")
    assert not_empty.value.errno == errno.ENOTEMPTY
    shutil.rmtree(here / "made")
    assert sorted(os.listdir(here)) == ["from-volume"]
    assert sorted(os.listdir(volume.root)) == ["from-volume"]
    assert [e.name for e in volume.list("from-volume")] == ["later.txt"]

    other_user = subprocess.run(  # started in the mount: the test's own directories are root's alone
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", "later.txt"],
        cwd=here / "from-volume",
        capture_output=True,
        timeout=60,
    )
    assert (other_user.returncode, other_user.stdout) == (0, b"later\n"), other_user.stderr  # --allow-other

    body = os.urandom(4 * 1024 * 1024)
    (here / "closed-just-before.bin").write_bytes(body)
    unmount(mount)  # at once: the upload under way when close returned is finished, not dropped
    assert mount.process.returncode is not None
    assert _fuse_mounts_below(mounts.root) == []
    assert (Path(volume.root) / "closed-just-before.bin").read_bytes() == body
    unmount(mount)  # again: nothing to do


def test_what_one_mount_closes_the_other_reads_whole(dav: DavServer, mounts: Mounts, volume: VolumeRoot) -> None:
    first, second = _mount_dav(dav, mounts, "first"), _mount_dav(dav, mounts, "second")
    body = os.urandom(6 * 1024 * 1024)
    (first.target / "shared.bin").write_bytes(body)
    seen: list[int] = []

    def read_whole() -> bool:
        got = _read(second.target / "shared.bin")
        if got is not None:
            seen.append(len(got))
            assert got == body, f"the second mount read {len(got)} bytes of {len(body)}, or other bytes"
        return got is not None

    _eventually(read_whole, "the second mount to read the file")
    (second.target / "reply.txt").write_text("got it")
    _eventually(lambda: _read(first.target / "reply.txt") == b"got it", "the first mount to read the reply")
    assert (Path(volume.root) / "shared.bin").read_bytes() == body
    assert seen
    assert set(seen) == {len(body)}


def test_a_read_only_mount_refuses_writes(dav: DavServer, mounts: Mounts, volume: VolumeRoot) -> None:
    with volume.open_write("kept.txt") as out:
        out.write(b"kept")
    mount = _mount_dav(dav, mounts, "ro", read_only=True)
    assert (mount.target / "kept.txt").read_bytes() == b"kept"
    for attempt in (
        lambda: (mount.target / "new.txt").write_bytes(b"x"),
        lambda: (mount.target / "kept.txt").write_bytes(b"x"),
        lambda: (mount.target / "dir").mkdir(),
        lambda: (mount.target / "kept.txt").unlink(),
    ):
        with pytest.raises(OSError, match="Read-only file system") as refused:
            attempt()
        assert refused.value.errno == errno.EROFS
    assert [e.name for e in volume.list("")] == ["kept.txt"]
    assert (Path(volume.root) / "kept.txt").read_bytes() == b"kept"


def test_a_wrong_token_fails_the_mount_with_the_servers_reason(dav: DavServer, mounts: Mounts) -> None:
    target, cache = mounts.place("wrong")
    with pytest.raises(RcloneError, match="401") as failed:
        mount_webdav(
            dav.url("vol"), "not-the-token", target, read_only=False, cache_dir=cache, owner_uid=0, owner_gid=0
        )
    assert "the bearer token is not valid" in str(failed.value)
    assert "not-the-token" not in str(failed.value)
    assert _fuse_mounts_below(mounts.root) == []
    assert _rclones_naming(mounts.root) == []


def test_a_missing_server_or_rclone_is_named(mounts: Mounts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target, cache = mounts.place("nowhere")
    with pytest.raises(RcloneError, match="listing it failed"):
        mount_webdav(
            "http://127.0.0.1:9/dav/vol/",
            "t",
            target,
            read_only=False,
            cache_dir=cache,
            owner_uid=0,
            owner_gid=0,
            timeout_s=20,
        )
    assert _fuse_mounts_below(mounts.root) == []
    (tmp_path / "empty-path").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(RcloneError, match="apt-get install rclone fuse3"):
        mount_webdav("http://127.0.0.1:9/", "t", target, read_only=False, cache_dir=cache, owner_uid=0, owner_gid=0)
    with pytest.raises(RcloneError, match="url 'ftp://x'"):
        mount_webdav("ftp://x", "t", target, read_only=False, cache_dir=cache, owner_uid=0, owner_gid=0)


def test_a_server_with_a_ca_of_its_own_is_trusted_with_ca_file(tmp_path: Path, mounts: Mounts) -> None:
    (tmp_path / "tls-vol").mkdir()
    (tmp_path / "tls-vol" / "f.txt").write_text("over TLS")
    ca = TestCA()
    ca.issue().write(tmp_path / "server.pem", tmp_path / "server.key")
    with serve_dav({"vol": tmp_path / "tls-vol"}, tls=(tmp_path / "server.pem", tmp_path / "server.key")) as dav:
        target, cache = mounts.place("untrusted")
        with pytest.raises(RcloneError, match="certificate signed by unknown authority"):
            mount_webdav(dav.url("vol"), dav.token, target, read_only=True, cache_dir=cache, owner_uid=0, owner_gid=0)
        target, cache = mounts.place("tls")
        mount = mounts.keep(
            mount_webdav(
                dav.url("vol"),
                dav.token,
                target,
                read_only=True,
                cache_dir=cache,
                owner_uid=0,
                owner_gid=0,
                ca_file=ca.write(tmp_path / "ca.pem"),
            )
        )
        assert (mount.target / "f.txt").read_text() == "over TLS"
        unmount(mount)


def test_sweep_unmounts_what_a_killed_worker_left(dav: DavServer, mounts: Mounts, volume: VolumeRoot) -> None:
    dead, orphan = _mount_dav(dav, mounts, "dead"), _mount_dav(dav, mounts, "orphan")
    os.killpg(dead.process.pid, signal.SIGKILL)
    dead.process.wait(30)
    with pytest.raises(OSError, match="not connected") as gone:
        os.listdir(dead.target)
    assert gone.value.errno == errno.ENOTCONN  # rclone's mount outlived it
    assert sorted(_fuse_mounts_below(mounts.root)) == sorted([str(dead.target), str(orphan.target)])
    (orphan.target / "last.txt").write_text("written before the sweep")

    swept = sweep(mounts.root / "mnt")
    assert sorted(swept) == sorted([dead.target, orphan.target])
    assert _fuse_mounts_below(mounts.root) == []
    assert orphan.process.wait(30) is not None  # the orphan's rclone ended
    assert (Path(volume.root) / "last.txt").read_text() == "written before the sweep"
    assert sweep(mounts.root / "mnt") == []


# --------------------------------------------------------------------------- S3 (moto)


@dataclass
class Bucket:
    name: str
    client: Any
    endpoint: str


@pytest.fixture
def bucket(moto_s3: S3Store) -> Bucket:
    """A new bucket of moto's S3 server (tests/fixtures/volume_stores.py), its keys the store's."""
    return Bucket(moto_s3.bucket("vol"), moto_s3.client, moto_s3.endpoint)


def _mount_bucket(bucket: Bucket, mounts: Mounts, name: str, *, read_only: bool = False) -> RcloneMount:
    target, cache = mounts.place(name)
    return mounts.keep(
        mount_s3(
            bucket.name,
            target,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint=bucket.endpoint,
            region="us-east-1",
            force_path_style=True,
            read_only=read_only,
            cache_dir=cache,
            owner_uid=1234,
            owner_gid=2345,
        )
    )


def _object(bucket: Bucket, key: str) -> bytes | None:
    try:
        body: bytes = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
    except bucket.client.exceptions.NoSuchKey:
        return None
    return body


def test_an_s3_mount_reads_objects_and_uploads_closed_files(bucket: Bucket, mounts: Mounts) -> None:
    bucket.client.put_object(Bucket=bucket.name, Key="data/in.txt", Body=b"an object\n")
    mount = _mount_bucket(bucket, mounts, "s3")
    argv = Path(f"/proc/{mount.process.pid}/cmdline").read_bytes()
    assert ACCESS_KEY.encode() not in argv
    assert SECRET_KEY.encode() not in argv
    assert SECRET_KEY.encode() in Path(f"/proc/{mount.process.pid}/environ").read_bytes()  # where it went
    assert (mount.target / "data" / "in.txt").read_bytes() == b"an object\n"
    assert (mount.target / "data" / "in.txt").stat().st_uid == 1234
    body = os.urandom(3 * 1024 * 1024)
    (mount.target / "data" / "out.bin").write_bytes(body)
    _eventually(lambda: _object(bucket, "data/out.bin") == body, "the closed file as an object")
    bucket.client.put_object(Bucket=bucket.name, Key="data/later.txt", Body=b"later\n")
    _eventually(lambda: _read(mount.target / "data" / "later.txt") == b"later\n", "the new object in the mount")
    os.remove(mount.target / "data" / "in.txt")
    _eventually(lambda: _object(bucket, "data/in.txt") is None, "the removed object gone")


def test_a_read_only_s3_mount_refuses_writes(bucket: Bucket, mounts: Mounts) -> None:
    bucket.client.put_object(Bucket=bucket.name, Key="kept.txt", Body=b"kept")
    mount = _mount_bucket(bucket, mounts, "s3-ro", read_only=True)
    assert (mount.target / "kept.txt").read_bytes() == b"kept"
    for attempt in (
        lambda: (mount.target / "new.txt").write_bytes(b"x"),
        lambda: (mount.target / "kept.txt").unlink(),
    ):
        with pytest.raises(OSError, match="Read-only file system") as refused:
            attempt()
        assert refused.value.errno == errno.EROFS
    listed = bucket.client.list_objects_v2(Bucket=bucket.name)
    assert [o["Key"] for o in listed["Contents"]] == ["kept.txt"]


def test_bad_s3_settings_are_named(mounts: Mounts) -> None:
    target, cache = mounts.place("bad")
    with pytest.raises(RcloneError, match="bucket 'No_Such'"):
        mount_s3(
            "No_Such", target, access_key="a", secret_key="b", read_only=True, cache_dir=cache, owner_uid=0, owner_gid=0
        )
    with pytest.raises(RcloneError, match="access_key and secret_key"):
        mount_s3(
            "bucket", target, access_key="", secret_key="b", read_only=True, cache_dir=cache, owner_uid=0, owner_gid=0
        )
    assert rclone.FSTYPE == "fuse.rclone"


def test_a_file_written_then_renamed_reaches_the_server_under_its_new_name(
    dav: DavServer, mounts: Mounts, volume: VolumeRoot
) -> None:
    """Write, then rename into place: the pattern of every atomic save. Uploaded once, under the final name."""
    mount = _mount_dav(dav, mounts, "rw")
    with open(mount.target / "model.bin.tmp", "wb") as f:
        f.write(b"weights" * 10_000)
    os.rename(mount.target / "model.bin.tmp", mount.target / "model.bin")
    _eventually(lambda: [e.path for e in volume.list("")] == ["model.bin"], "the file under its final name")
    with volume.open_read("model.bin") as f:
        assert f.read() == b"weights" * 10_000


def test_a_files_metadata_caught_being_rewritten_counts_as_not_uploaded(tmp_path: Path) -> None:
    # rclone rewrites a cached file's metadata in place (truncate, then encode): an unmount that read it empty
    # took the file for uploaded and ended rclone before sending it (the webdav test lost its last file, 1 run
    # in the full suite under load)
    meta = tmp_path / "vfsMeta" / "remote"
    meta.mkdir(parents=True)
    (meta / "sent.bin").write_text('{\n\t"ModTime": "2026-12-06T23:00:00Z",\n\t"Dirty": false\n}\n')
    (meta / "waiting.bin").write_text('{\n\t"ModTime": "2026-12-06T23:00:00Z",\n\t"Dirty": true\n}\n')
    (meta / "being-written.bin").write_text("")
    (meta / "cut-short.bin").write_text('{\n\t"ModTime": "2026-12-')
    assert sorted(rclone._dirty(tmp_path)) == ["being-written.bin", "cut-short.bin", "waiting.bin"]
