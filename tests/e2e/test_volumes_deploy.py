"""Volumes of a deployment on a real `levers9 up`: metadata in PostgreSQL, data in S3 (moto's, at the wire); and a
deleted volume leaves no data behind, there and in `up`'s own SQLite and data directory.

The deployment's way: a ``volumes:`` section naming a PostgreSQL database (its role must give the password,
which `up` reads from the variable ``metadata_password_env`` names) and a path-style S3 bucket (keys from
two more variables). `levers9 cp` puts a file in, a function on a runc pool with
``volumes=[levers9.Volume(...)]`` reads it back by hash and writes another, `levers9 cp` takes that out;
the bucket holds the data under the file system's name. `levers9 volume delete --yes` then removes the
volume: its objects leave the bucket (JuiceFS deletes a removed file's blocks in the background, its trash
being off: the controlplane's mount, which removed the files, does it within a second here, and a clean
unmount finishes it first; a juicefs killed meanwhile leaves them pending in the metadata, which
``juicefs gc --delete`` removes) while another volume's objects stay, untouched. The controlplane's cache
drops its copies too; a worker's keeps them while the worker lives (gone with its state directory). With
no ``volumes:`` section (SQLite and a directory in the data directory) the deleted volume's chunk files
leave that directory the same way.

The volume is deleted while the call's warm container still binds it, so its removal meets a bind that
answers no stat (levers9.engine.rootfs.unmount). Nothing outlives a test: `up` stops (no FUSE mount in
/proc/mounts below its directory, none of its file system anywhere on the host, no juicefs process), the
fixtures stop moto and drop the database.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import Up
from tests.fixtures.volume_stores import (
    ACCESS_KEY,
    SECRET_KEY,
    PasswordDatabase,
    S3Store,
    bytes_below,
    fuse_mounts_in,
    juicefs_processes,
)
from tests.fixtures.wait import wait_for

MIB = 1024 * 1024
#: how long a deleted volume's data may take to leave the store before the test gives up (it takes well under 1 s)
GONE_TIMEOUT_S = 120.0

APP = """\
import hashlib
import json
import os
import subprocess
import levers9

weights = levers9.Volume(name="weights", mount_path="/data/weights")


@levers9.function(volumes=[weights], memory=256)
def check_and_write(name: str, size: int) -> dict:
    with open(f"/data/weights/{{name}}", "rb") as f:
        read = hashlib.sha256(f.read()).hexdigest()
    data = os.urandom(size)
    os.makedirs("/data/weights/out", exist_ok=True)
    with open("/data/weights/out/result.bin", "wb") as f:
        f.write(data)
    return {{"read": read, "wrote": hashlib.sha256(data).hexdigest()}}


def main() -> None:
    print(json.dumps(check_and_write.remote("in/data.bin", {size})))
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _random_file(path: Path, size: int) -> str:
    path.write_bytes(os.urandom(size))
    return _digest(path)


def _ok(up: Up, *args: str) -> str:
    done = up.levers9(*args)
    assert done.returncode == 0, f"levers9 {' '.join(args)}: {done.stdout}\n{done.stderr}\n--- up:\n{up.log()[-3000:]}"
    return done.stdout


def _nothing_left(up: Up, fs_name: str | None = None) -> None:
    """`up` stopped: no FUSE mount below its directory, none of the file system ``fs_name`` anywhere (a container's
    bind of a volume lives in /run/levers9/userns), no juicefs process of its own."""
    up.stop()
    assert fuse_mounts_in(up.root) == []
    if fs_name is not None:
        anywhere = [line for line in Path("/proc/mounts").read_text().splitlines() if f"JuiceFS:{fs_name} " in line]
        for line in anywhere:  # taken down before failing, so a failure leaks nothing either
            subprocess.run(["umount", "-l", line.split()[1]], capture_output=True, check=False)
        assert anywhere == [], f"mounts of the volumes' file system left after levers9 up stopped: {anywhere}"
    wait_for(
        lambda: not juicefs_processes(str(up.root)),
        "juicefs to end with levers9 up",
        timeout=30,
        why=lambda: (
            "\n".join(f"{pid}: {cmd[:300]!r}" for pid, (cmd, _env) in juicefs_processes(str(up.root)).items())
            + f"\n--- up:\n{up.log()[-3000:]}"
        ),
    )


def test_a_deployment_on_postgres_and_s3_and_a_deleted_volume_leaves_no_object(
    levers9_up: Up,
    postgres_password_database: PasswordDatabase,
    moto_s3: S3Store,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    up, db, s3 = levers9_up, postgres_password_database, moto_s3
    bucket = s3.bucket()
    fs_name = f"e2e-{uuid.uuid4().hex[:12]}"  # its own, so a mount of it anywhere on the host is this test's
    # the credentials reach `up` in its environment only (Up.env passes this process's on)
    monkeypatch.setenv("L9TEST_VOLUMES_DB_PASSWORD", db.password)
    monkeypatch.setenv("L9TEST_VOLUMES_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("L9TEST_VOLUMES_SECRET_KEY", SECRET_KEY)
    up.use_runtime("runc")
    up.home.mkdir(parents=True, exist_ok=True)
    (up.home / "levers9.yaml").write_text(
        up.config_text() + f"volumes:\n  metadata_url: {db.url}\n  metadata_password_env: L9TEST_VOLUMES_DB_PASSWORD\n"
        f"  storage: s3\n  bucket: {s3.url(bucket)}\n  access_key_env: L9TEST_VOLUMES_ACCESS_KEY\n"
        f"  secret_key_env: L9TEST_VOLUMES_SECRET_KEY\n  name: {fs_name}\n"
    )
    up.start()
    chunks = f"{fs_name}/chunks/"

    # a volume that stays, and the objects that are its data
    _ok(up, "volume", "create", "keep")
    kept_digest = _random_file(tmp_path / "kept.bin", 2 * MIB + 17)
    _ok(up, "cp", str(tmp_path / "kept.bin"), "keep:kept.bin")
    kept = s3.objects(bucket, chunks)
    assert sum(size for _etag, size in kept.values()) == 2 * MIB + 17, kept

    # the volume to delete: a file in by the CLI, read back by a call on runc, which writes another
    _ok(up, "volume", "create", "weights")
    (tmp_path / "in").mkdir()
    sent = _random_file(tmp_path / "in" / "data.bin", 4 * MIB + 5)
    _ok(up, "cp", str(tmp_path / "in" / "data.bin"), "weights:in/")
    app = up.root / "deploy_volume_app.py"
    app.write_text(APP.format(size=3 * MIB + 3))
    run = up.levers9("run", f"{app.name}::main", timeout=600)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- up:\n{up.log()[-4000:]}"
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["read"] == sent
    (tmp_path / "back").mkdir()
    _ok(up, "cp", "weights:out/result.bin", str(tmp_path / "back"))
    assert _digest(tmp_path / "back" / "result.bin") == answer["wrote"]

    # the bucket holds both volumes' data under the file system's name, and nothing outside it
    everything = s3.objects(bucket)
    assert all(key.startswith(f"{fs_name}/") for key in everything), sorted(everything)
    stored = s3.objects(bucket, chunks)
    assert {key: stored[key] for key in kept} == kept
    doomed = {key: size for key, (_etag, size) in stored.items() if key not in kept}
    assert sum(doomed.values()) == (4 * MIB + 5) + (3 * MIB + 3), doomed

    _ok(up, "volume", "delete", "weights", "--yes")
    started = time.monotonic()
    wait_for(
        lambda: not set(doomed) & set(s3.objects(bucket, chunks)),
        "the deleted volume's objects to leave the bucket",
        timeout=GONE_TIMEOUT_S,
        why=lambda: f"left: {sorted(set(doomed) & set(s3.objects(bucket, chunks)))}\n--- up:\n{up.log()[-3000:]}",
    )
    print(f"the deleted volume's {len(doomed)} objects left the bucket {time.monotonic() - started:.2f} s after delete")
    # nothing else of the bucket was touched: the other volume's objects are all there, unchanged
    assert s3.objects(bucket, chunks) == kept
    assert set(s3.objects(bucket)) == set(everything) - set(doomed)
    (tmp_path / "kept-back").mkdir()
    _ok(up, "cp", "keep:kept.bin", str(tmp_path / "kept-back"))
    assert _digest(tmp_path / "kept-back" / "kept.bin") == kept_digest
    listed = up.levers9("ls", "weights:")
    assert listed.returncode == 1, listed.stderr
    assert "volume 'weights' does not exist" in listed.stderr
    # the controlplane's cache dropped its copies of the deleted blocks (a worker's keeps them while it runs)
    blocks = {key.removeprefix(f"{fs_name}/") for key in doomed}
    assert not blocks & _cached(up.home / "data" / "volumes" / "cache")
    _nothing_left(up, fs_name)
    # and once `up` has stopped, no copy of them is left anywhere in its directories
    assert not blocks & _cached(up.root)


def _cached(directory: Path) -> set[str]:
    """The blocks JuiceFS caches below ``directory`` (``<cache>/<uuid>/raw/chunks/...``), named as in the bucket."""
    return {str(p).split("/raw/", 1)[1] for p in directory.rglob("*") if p.is_file() and "/raw/chunks/" in str(p)}


def test_up_alone_a_deleted_volume_leaves_no_chunk_file(levers9_up: Up, tmp_path: Path) -> None:
    up = levers9_up
    up.min_workers = 0  # the CLI alone: no call runs
    up.start()
    chunks = up.home / "data" / "volumes" / "data" / "levers9-volumes" / "chunks"
    _ok(up, "volume", "create", "keep")
    _random_file(tmp_path / "kept.bin", MIB + 1)
    _ok(up, "cp", str(tmp_path / "kept.bin"), "keep:")
    _ok(up, "volume", "create", "weights")
    _random_file(tmp_path / "weights.bin", 5 * MIB)
    _ok(up, "cp", str(tmp_path / "weights.bin"), "weights:models/")
    assert bytes_below(chunks) == 6 * MIB + 1
    _ok(up, "volume", "delete", "weights", "--yes")
    started = time.monotonic()
    wait_for(
        lambda: bytes_below(chunks) == MIB + 1,
        "the deleted volume's chunk files to leave the data directory",
        timeout=GONE_TIMEOUT_S,
        why=lambda: f"{bytes_below(chunks)} bytes under {chunks}\n--- up:\n{up.log()[-3000:]}",
    )
    print(f"the deleted volume's chunk files left {time.monotonic() - started:.2f} s after delete")
    _nothing_left(up)
