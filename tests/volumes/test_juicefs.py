"""The volumes' JuiceFS file system as the config describes it, formatted and mounted for real.

``FileSystem.from_config`` for each form of the ``volumes:`` section (nothing: SQLite and a directory in the
data directory; PostgreSQL with its password in a variable; S3 with its keys in variables) and the refusals
(a variable not set, a password in the URL, a metadata engine levers9 does not take). Then a real
``juicefs format`` + ``mount`` + write + read + unmount on SQLite and a directory, and on PostgreSQL (a
database whose role must give its password) with the data in moto's S3 at the wire: the objects land in
the bucket under the file system's name, a second mount reads the file back from them, and the password
is in the ``juicefs`` processes' environment, never on their command lines. JuiceFS's own refusals (a
wrong password, a bucket that does not exist) reach the Levers9Error.

URL forms juicefs 1.4.2 takes (found here): ``postgres://ROLE@HOST:PORT/DB`` as it is (no ``sslmode`` is
needed: it tries TLS, and a server without it falls back to plain; no ``search_path``: the tables go to
``public``), the password in ``META_PASSWORD``; a path-style bucket ``http://HOST:PORT/BUCKET``.

Every test ends with no FUSE mount in /proc/mounts and no ``juicefs`` process left.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from levers9.config.volumes import VolumesConfig
from levers9.hooks.errors import Levers9Error
from levers9.volumes.juicefs import FileSystem
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
VARIABLES = {
    "metadata_password_env": "L9TEST_VOLUMES_DB_PASSWORD",
    "access_key_env": "L9TEST_VOLUMES_ACCESS_KEY",
    "secret_key_env": "L9TEST_VOLUMES_SECRET_KEY",
}


@pytest.fixture(autouse=True)
def nothing_left(tmp_path: Path) -> Iterator[None]:
    """After each test: no FUSE mount below its directory and no juicefs process mentioning it."""
    yield
    assert fuse_mounts_in(tmp_path) == []
    wait_for(lambda: not juicefs_processes(str(tmp_path)), "the juicefs processes to end", timeout=30)


def _s3_config(store: S3Store, bucket: str, **changes: object) -> VolumesConfig:
    fields: dict[str, object] = {
        "storage": "s3",
        "bucket": store.url(bucket),
        "access_key_env": VARIABLES["access_key_env"],
        "secret_key_env": VARIABLES["secret_key_env"],
        "name": "team-volumes",
    }
    return VolumesConfig.model_validate({**fields, **changes})


def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLES["access_key_env"], ACCESS_KEY)
    monkeypatch.setenv(VARIABLES["secret_key_env"], SECRET_KEY)


# --------------------------------------------------------------------------- from_config


def test_no_section_means_sqlite_and_a_directory_in_the_data_dir(tmp_path: Path) -> None:
    fs = FileSystem.from_config(VolumesConfig(), tmp_path / "data")
    home = tmp_path / "data" / "volumes"
    assert fs.metadata_url == f"sqlite3://{home / 'meta.db'}"
    assert (fs.storage, fs.bucket, fs.name) == ("file", f"{home / 'data'}/", "levers9-volumes")
    assert fs.env == {}
    assert fs.local


def test_the_credentials_come_from_the_variables_the_config_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLES["metadata_password_env"], "db-password-1")
    monkeypatch.setenv(VARIABLES["access_key_env"], "access-key-1")
    monkeypatch.setenv(VARIABLES["secret_key_env"], "secret-key-1")
    config = VolumesConfig(
        metadata_url="postgres://levers9@db.internal:5432/levers9_volumes",
        metadata_password_env=VARIABLES["metadata_password_env"],
        storage="s3",
        bucket="https://levers9-volumes.s3.eu-west-1.amazonaws.com",
        access_key_env=VARIABLES["access_key_env"],
        secret_key_env=VARIABLES["secret_key_env"],
        name="team-volumes",
    )
    fs = FileSystem.from_config(config, tmp_path)
    assert fs.metadata_url == "postgres://levers9@db.internal:5432/levers9_volumes"
    assert (fs.storage, fs.bucket, fs.name) == (
        "s3",
        "https://levers9-volumes.s3.eu-west-1.amazonaws.com",
        "team-volumes",
    )
    assert fs.env == {"META_PASSWORD": "db-password-1", "ACCESS_KEY": "access-key-1", "SECRET_KEY": "secret-key-1"}
    assert not fs.local
    for secret in ("db-password-1", "secret-key-1"):
        assert secret not in repr(fs)
    # PostgreSQL with the data in a directory: only this host reaches the data
    only_meta = VolumesConfig(metadata_url=config.metadata_url, metadata_password_env=config.metadata_password_env)
    fs = FileSystem.from_config(only_meta, tmp_path)
    assert fs.env == {"META_PASSWORD": "db-password-1"}
    assert (fs.storage, fs.bucket) == ("file", f"{tmp_path / 'volumes' / 'data'}/")
    assert fs.local


@pytest.mark.parametrize("option", sorted(VARIABLES))
@pytest.mark.parametrize("value", [None, ""])
def test_a_variable_that_is_not_set_is_named_with_its_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str | None
) -> None:
    for variable in VARIABLES.values():
        monkeypatch.setenv(variable, "set")
    if value is None:
        monkeypatch.delenv(VARIABLES[option])
    else:
        monkeypatch.setenv(VARIABLES[option], value)
    config = VolumesConfig(
        metadata_url="postgres://levers9@db.internal:5432/levers9_volumes",
        storage="s3",
        bucket="https://levers9-volumes.s3.eu-west-1.amazonaws.com",
        **VARIABLES,
    )
    with pytest.raises(Levers9Error) as refused:
        FileSystem.from_config(config, tmp_path)
    assert str(refused.value) == f"volumes.{option} names ${VARIABLES[option]}, which is not set in the controlplane"


@pytest.mark.parametrize(
    "url",
    ["postgres://levers9:hunter2@db.internal:5432/volumes", "redis://:hunter2@cache.internal:6379/1"],
)
def test_a_password_in_the_metadata_url_is_refused(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        VolumesConfig(metadata_url=url)
    assert "metadata_url holds a password; name the environment variable that holds it in metadata_password_env" in (
        str(refused.value)
    )


@pytest.mark.parametrize(
    "url", ["mysql://levers9@db.internal:3306/volumes", "postgresql://levers9@db.internal/volumes", "db.internal:5432"]
)
def test_a_metadata_engine_levers9_does_not_take_is_refused_with_those_it_does(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        VolumesConfig(metadata_url=url)
    assert (
        f"{url!r} is not a metadata URL levers9 supports; expected one of sqlite3://, redis://, rediss://, unix://, "
        "postgres://"
    ) in str(refused.value)


# --------------------------------------------------------------------------- real mounts


def _write(path: Path, size: int) -> str:
    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sqlite_and_a_directory_format_mount_write_read_and_remove(tmp_path: Path) -> None:
    fs = FileSystem.from_config(VolumesConfig(), tmp_path / "data")
    fs.format()
    fs.format()  # an existing file system is left as it is
    chunks = tmp_path / "data" / "volumes" / "data" / "levers9-volumes" / "chunks"
    mount = fs.mount(tmp_path / "mnt", cache_dir=tmp_path / "cache")
    try:
        assert fuse_mounts_in(tmp_path) == [str(tmp_path / "mnt")]
        (tmp_path / "mnt" / "ws" / "vol").mkdir(parents=True)
        digest = _write(tmp_path / "mnt" / "ws" / "vol" / "weights.bin", 5 * MIB)
        assert _digest(tmp_path / "mnt" / "ws" / "vol" / "weights.bin") == digest
        assert bytes_below(chunks) == 5 * MIB
        # the data directory is on this disk: no second copy of its blocks in a cache (juicefs' own is 100 GiB)
        assert bytes_below(tmp_path / "cache") == 0
        os.unlink(tmp_path / "mnt" / "ws" / "vol" / "weights.bin")
        # the trash is off: the blocks go in the background, once the file is gone
        wait_for(lambda: bytes_below(chunks) == 0, "the removed file's blocks to go", timeout=60)
    finally:
        mount.stop()


def test_postgres_metadata_and_s3_data_at_the_wire(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_password_database: PasswordDatabase,
    moto_s3: S3Store,
) -> None:
    db = postgres_password_database
    monkeypatch.setenv(VARIABLES["metadata_password_env"], db.password)
    _keys(monkeypatch)
    bucket = moto_s3.bucket()
    config = _s3_config(moto_s3, bucket, metadata_url=db.url, metadata_password_env=VARIABLES["metadata_password_env"])
    fs = FileSystem.from_config(config, tmp_path / "data")
    fs.format()
    fs.format()
    target = tmp_path / "mnt"
    mount = fs.mount(target, cache_dir=tmp_path / "cache")
    reader = None
    try:
        processes = juicefs_processes(str(target))
        assert processes, "no juicefs process mentions the mount point"
        for pid, (cmdline, environ) in processes.items():
            assert db.password.encode() not in cmdline, f"juicefs {pid} has the password on its command line"
            assert f"META_PASSWORD={db.password}".encode() in environ.split(b"\0")
        (target / "ws").mkdir()
        digest = _write(target / "ws" / "weights.bin", 6 * MIB + 123)
        objects = moto_s3.objects(bucket)
        assert all(key.startswith("team-volumes/") for key in objects), sorted(objects)
        blocks = {key: size for key, (_etag, size) in objects.items() if key.startswith("team-volumes/chunks/")}
        assert sum(blocks.values()) == 6 * MIB + 123, blocks
        # a second mount with a cache of its own reads the file from the bucket
        reader = fs.mount(tmp_path / "reader", cache_dir=tmp_path / "reader-cache", read_only=True)
        assert _digest(tmp_path / "reader" / "ws" / "weights.bin") == digest
        # an object store's blocks are cached where they are read
        wait_for(lambda: bytes_below(tmp_path / "reader-cache") >= 6 * MIB, "the read blocks in the cache", 30)
    finally:
        if reader is not None:
            reader.stop()
        mount.stop()


def test_a_wrong_password_is_refused_in_juicefs_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_password_database: PasswordDatabase
) -> None:
    db = postgres_password_database
    monkeypatch.setenv(VARIABLES["metadata_password_env"], "not-" + db.password)
    config = VolumesConfig(metadata_url=db.url, metadata_password_env=VARIABLES["metadata_password_env"])
    wrong = FileSystem.from_config(config, tmp_path / "data")
    with pytest.raises(Levers9Error) as refused:
        wrong.format()
    message = str(refused.value)
    where = f"{db.host}:{db.port}/{db.database}"  # the user is masked too
    assert message.startswith(
        f"formatting the volumes' file system failed (metadata postgres://***@{where}, storage file "
    )
    assert f'password authentication failed for user "{db.role}"' in message
    # formatted with the right one, a mount with the wrong one is refused too
    dataclasses.replace(wrong, env={"META_PASSWORD": db.password}).format()
    with pytest.raises(Levers9Error) as refused:
        wrong.mount(tmp_path / "mnt", cache_dir=tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith("juicefs could not mount the volumes' file system: ")
    assert f'password authentication failed for user "{db.role}"' in message
    assert db.password not in message


def test_a_bucket_that_does_not_exist_is_refused_in_juicefs_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_s3: S3Store
) -> None:
    _keys(monkeypatch)
    missing = "volumes-nobody-made"
    fs = FileSystem.from_config(_s3_config(moto_s3, missing), tmp_path / "data")
    # juicefs tries to make the bucket (moto refuses its location constraint), then gives up, saying what to do
    with pytest.raises(Levers9Error) as refused:
        fs.format()
    message = str(refused.value)
    assert message.startswith("formatting the volumes' file system failed (metadata sqlite3://")
    assert "NoSuchBucket" in message
    assert f"Please create bucket s3://{moto_s3.endpoint.removeprefix('http://')}/{missing}/team-volumes/ manually" in (
        message
    )
    assert missing not in [b["Name"] for b in moto_s3.client.list_buckets()["Buckets"]]


def test_a_container_bind_of_a_deleted_volume_or_a_dead_mount_is_still_unmounted(tmp_path: Path) -> None:
    """A warm container binds its volume's directory (runc's ``plain`` binds); the volume is deleted meanwhile,
    then the container removed. The bind answers no stat any more (ENOENT: its directory is gone; ENOTCONN
    or ECONNABORTED once juicefs is gone too), and is unmounted all the same, so the container's removal goes through."""
    from levers9.engine.rootfs import mounts_under, unmount_all
    from levers9.engine.userns import idmapped_bind

    fs = FileSystem.from_config(VolumesConfig(), tmp_path / "data")
    fs.format()
    mount = fs.mount(tmp_path / "mnt", cache_dir=tmp_path / "cache")
    container = tmp_path / "container"
    try:
        for name in ("deleted", "dead"):
            (tmp_path / "mnt" / "ws" / name).mkdir(parents=True)
            idmapped_bind(tmp_path / "mnt" / "ws" / name, container / name / "plain-0", None, read_only=False)
        os.rmdir(tmp_path / "mnt" / "ws" / "deleted")
        with pytest.raises(FileNotFoundError):
            os.stat(container / "deleted" / "plain-0")
        unmount_all(container / "deleted")
        assert mounts_under(container / "deleted") == []
        # juicefs killed: its mount and the bind are left without a server
        assert mount.process is not None
        os.killpg(mount.process.pid, signal.SIGKILL)
        mount.process.wait()
        with pytest.raises(OSError, match=r"connection abort|not connected") as dead:
            os.listdir(container / "dead" / "plain-0")  # a stat may still come from the kernel's attribute cache
        assert dead.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
        unmount_all(container / "dead")
        assert mounts_under(container / "dead") == []
    finally:
        for point in reversed(fuse_mounts_in(tmp_path)):
            subprocess.run(["umount", "-l", point], check=False)
        mount.stop()


@pytest.mark.parametrize(
    "url",
    ["postgres://levers9:hunter2@db.internal:5432/volumes", "mysql://levers9:hunter2@db.internal:3306/volumes"],
)
def test_a_refused_metadata_url_is_echoed_without_its_password(url: str) -> None:
    from levers9.config.load import ConfigError, parse_config

    with pytest.raises(ConfigError) as refused:
        parse_config(f"version: 1\nvolumes:\n  metadata_url: {url}\n", "levers9.yaml")
    said = str(refused.value)
    assert "levers9.yaml:3: volumes.metadata_url:" in said, said
    assert "hunter2" not in said, said
    assert url.replace("hunter2", "***").split("@")[0] in said, said
