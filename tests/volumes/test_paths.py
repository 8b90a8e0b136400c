"""A volume's files are reached only beneath its root: '..', absolute links and links leading out are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from levers9.volumes.paths import (
    NotADirectoryInVolume,
    NotFoundInVolume,
    PathEscapes,
    VolumePathError,
    VolumeRoot,
    normalise,
)


@pytest.fixture
def volume(tmp_path: Path) -> VolumeRoot:
    (tmp_path / "vol").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "secret").write_text("another workspace's\n")
    return VolumeRoot(tmp_path / "vol")


def test_paths_are_normalised_and_a_climb_above_the_root_is_refused() -> None:
    assert normalise("/a/./b//c/") == "a/b/c"
    assert normalise("a/b/../c") == "a/c"
    assert normalise("/") == ""
    for escaping in ("..", "../x", "a/../../x", "/../other/secret"):
        with pytest.raises(PathEscapes, match="leads out of the volume"):
            normalise(escaping)
    with pytest.raises(VolumePathError, match="NUL"):
        normalise("a\0b")


def test_links_leading_out_are_refused_and_links_inside_are_followed(volume: VolumeRoot, tmp_path: Path) -> None:
    root = Path(volume.root)
    os.symlink("/etc/passwd", root / "absolute")
    os.symlink("../other/secret", root / "relative")
    os.symlink(str(tmp_path / "other"), root / "dir-outside")
    with volume.open_write("models/a.bin") as out:
        out.write(b"weights")
    os.symlink("models", root / "inside")
    for path in ("absolute", "relative", "dir-outside/secret"):
        with pytest.raises(PathEscapes, match="symbolic link pointing outside"):
            volume.open_read(path)
        with pytest.raises(PathEscapes):
            volume.stat(path)
    with pytest.raises(PathEscapes):
        volume.open_write("dir-outside/planted")
    assert not (tmp_path / "other" / "planted").exists()
    with volume.open_read("inside/a.bin") as f:
        assert f.read() == b"weights"


def test_list_stat_write_read_move_and_remove(volume: VolumeRoot) -> None:
    with volume.open_write("/data/x/one.txt") as out:
        out.write(b"1")
    with volume.open_write("data/two.txt") as out:
        out.write(b"22")
    assert [(e.path, e.is_dir, e.size) for e in volume.list("data")] == [
        ("data/two.txt", False, 2),
        ("data/x", True, 0),
    ]
    assert [e.path for e in volume.list("data/two.txt")] == ["data/two.txt"]
    assert sorted(e.path for e in volume.walk("")) == ["data/two.txt", "data/x/one.txt"]
    volume.move("data/two.txt", "data/x/two.txt")
    assert volume.stat("data/x/two.txt").size == 2
    with pytest.raises(VolumePathError, match="not empty; remove it recursively"):
        volume.remove("data")
    assert volume.remove("data", recursive=True) == 4
    with pytest.raises(NotFoundInVolume, match="no such file"):
        volume.stat("data")
    with pytest.raises(VolumePathError, match="the volume's root"):
        volume.remove("/")


def test_a_file_in_the_way_of_a_directory_is_named(volume: VolumeRoot) -> None:
    with volume.open_write("f") as out:
        out.write(b"")
    with pytest.raises(NotADirectoryInVolume):
        volume.open_write("f/g")
    volume.mkdir("d")
    with pytest.raises(VolumePathError, match="is a directory"):
        volume.open_read("d")


def test_removing_a_tree_removes_links_never_what_they_point_to(volume: VolumeRoot, tmp_path: Path) -> None:
    volume.mkdir("tree/sub")
    os.symlink(str(tmp_path / "other"), Path(volume.root) / "tree" / "sub" / "out")
    assert volume.remove("tree", recursive=True) == 3
    assert (tmp_path / "other" / "secret").exists()


def test_open_new_creates_only_where_nothing_is(volume: VolumeRoot, tmp_path: Path) -> None:
    with volume.open_new("fresh") as out:
        out.write(b"x")
    assert volume.stat("fresh").size == 1
    os.symlink(str(tmp_path / "other" / "planted"), Path(volume.root) / "dangling")
    for taken in ("fresh", "dangling"):
        with pytest.raises(VolumePathError, match="already exists"):
            volume.open_new(taken)
    assert not (tmp_path / "other" / "planted").exists()
    with pytest.raises(NotFoundInVolume):
        volume.open_new("missing/parent")
