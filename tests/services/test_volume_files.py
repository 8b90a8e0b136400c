"""The controlplane's mount of the volumes' file system: deleted volumes' files go, even after a stop cut it short."""

from __future__ import annotations

from pathlib import Path

from levers9.services.volume_files import DELETED_DIR, VolumeFiles
from levers9.state.sql.models import utcnow
from levers9.state.sql.records import VolumeRecord
from levers9.volumes.juicefs import FileSystem, fuse_mounts_below


def _files(tmp_path: Path) -> VolumeFiles:
    fs = FileSystem(
        metadata_url=f"sqlite3://{tmp_path / 'meta.db'}",
        storage="file",
        bucket=f"{tmp_path / 'data'}/",
        name="test-volumes",
    )
    return VolumeFiles(fs, tmp_path / "home")


async def test_what_a_stopped_controlplane_left_of_a_deleted_volume_goes_after_the_next_first_mount(
    tmp_path: Path,
) -> None:
    first = _files(tmp_path)
    try:
        root = await first.root(VolumeRecord("vol_old", "ws_a", "old", utcnow()))
        with root.open_write("models/a.bin") as out:
            out.write(b"x" * 1000)
        # a removal cut short: the directory is aside, its files still there, when the controlplane stops
        aside = first.mountpoint / DELETED_DIR / "vol_old"
        aside.parent.mkdir(exist_ok=True)
        (first.mountpoint / "ws_a" / "vol_old").rename(aside)
    finally:
        await first.close()
    assert fuse_mounts_below(tmp_path) == []
    second = _files(tmp_path)
    try:
        await second.root(VolumeRecord("vol_new", "ws_a", "new", utcnow()))
        await second.drain()
        assert list((second.mountpoint / DELETED_DIR).iterdir()) == []
        assert (second.mountpoint / "ws_a" / "vol_new").is_dir()
    finally:
        await second.close()
    assert fuse_mounts_below(tmp_path) == []
