"""The deterministic tar of a copy step's local files: what it holds, and what never reaches it."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import tarfile
from pathlib import Path

import pytest

from levers9.blueprints.context import LocalCopy, LocalFiles
from levers9.blueprints.spec import BlueprintError


def _tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "b.py").write_text("b\n")
    (root / "pkg" / "a.py").write_text("a\n")
    (root / "pkg" / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (root / "pkg" / "sub" / "run.sh").chmod(0o4755)  # setuid: dropped
    (root / "pkg" / "link").symlink_to("a.py")
    (root / "pkg" / "away").symlink_to("/etc/passwd")
    return root / "pkg"


def _members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


def test_the_tar_is_sorted_owned_by_nobody_in_particular_and_dated_zero(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    files = LocalFiles("test", (("pkg", pkg),))
    members = _members(files.tar())
    assert [m.name for m in members] == [
        "pkg",
        "pkg/a.py",
        "pkg/away",
        "pkg/b.py",
        "pkg/link",
        "pkg/sub",
        "pkg/sub/run.sh",
    ]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
    by_name = {m.name: m for m in members}
    assert by_name["pkg/sub/run.sh"].mode == 0o755
    assert by_name["pkg/a.py"].mode == (pkg / "a.py").stat().st_mode & 0o777
    assert by_name["pkg/link"].issym()
    assert by_name["pkg/link"].linkname == "a.py"
    assert by_name["pkg/away"].linkname == "/etc/passwd", "a symlink is kept, never followed"
    assert by_name["pkg/away"].size == 0


def test_the_digest_is_the_sha256_of_the_tar_and_does_not_depend_on_times_or_listing_order(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    files = LocalFiles("test", (("pkg", pkg),))
    data = files.tar()
    assert files.digest() == "sha256:" + hashlib.sha256(data).hexdigest()
    for path in pkg.rglob("*"):
        os.utime(path, (5, 5), follow_symlinks=False)
    assert files.tar() == data
    # another tree made in another order holds the same
    other = tmp_path / "other"
    other.mkdir()
    (other / "link").symlink_to("a.py")
    (other / "away").symlink_to("/etc/passwd")
    (other / "sub").mkdir()
    (other / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (other / "sub" / "run.sh").chmod(0o755)
    (other / "b.py").write_text("b\n")
    (other / "a.py").write_text("a\n")
    for path in (other, other / "a.py", other / "b.py", other / "sub"):
        path.chmod((pkg / path.relative_to(other)).stat().st_mode & 0o777)
    assert LocalFiles("x", (("pkg", other),)).digest() == files.digest()


def test_names_place_files_and_imply_their_parents(tmp_path: Path) -> None:
    (tmp_path / "one").write_text("1")
    (tmp_path / "two").write_text("2")
    files = LocalFiles("test", (("deep/er/renamed", tmp_path / "one"), ("top", tmp_path / "two")))
    members = _members(files.tar())
    assert [(m.name, m.type) for m in members] == [
        ("deep", tarfile.DIRTYPE),
        ("deep/er", tarfile.DIRTYPE),
        ("deep/er/renamed", tarfile.REGTYPE),
        ("top", tarfile.REGTYPE),
    ]
    assert members[0].mode == 0o755


def test_a_later_entry_for_a_name_replaces_an_earlier_one(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("first")
    (tmp_path / "b").write_text("second")
    data = LocalFiles("test", (("x", tmp_path / "a"), ("x", tmp_path / "b"))).tar()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [m.name for m in tar.getmembers()] == ["x"]
        extracted = tar.extractfile("x")
        assert extracted is not None
        assert extracted.read() == b"second"


def test_no_entries_is_an_empty_tar(tmp_path: Path) -> None:
    assert _members(LocalFiles("test", ()).tar()) == []


def test_a_fifo_or_a_socket_is_refused_naming_it(tmp_path: Path) -> None:
    fifo = tmp_path / "d" / "fifo"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(BlueprintError) as caught:
        LocalFiles("add_local_path('d')", (("d", fifo.parent),)).digest()
    assert caught.value.field == "add_local_path('d')"
    assert str(fifo) in caught.value.problem
    assert "not a regular file, directory or symlink" in caught.value.problem
    fifo.unlink()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(fifo.parent / "sock"))
        with pytest.raises(BlueprintError, match="sock is not a regular file"):
            LocalFiles("x", (("d", fifo.parent),)).digest()
    finally:
        listener.close()


def test_a_missing_path_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(BlueprintError, match=f"x: {tmp_path / 'gone'} does not exist"):
        LocalFiles("x", (("gone", tmp_path / "gone"),)).digest()


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "./a", "a//b", "a/"])
def test_a_name_must_stay_inside_the_destination(tmp_path: Path, name: str) -> None:
    with pytest.raises(BlueprintError, match="is not a path inside the destination"):
        LocalFiles("x", ((name, tmp_path),))


def test_a_copy_step_s_destination_is_checked_as_the_spec_checks_paths(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("f")
    files = LocalFiles("COPY line 3", (("f", tmp_path / "f"),))
    assert LocalCopy("/app", files).step().args == ("/app",)
    with pytest.raises(BlueprintError, match="COPY line 3: destination 'app' is not absolute"):
        LocalCopy("app", files).step()
