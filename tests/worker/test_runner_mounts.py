"""The runner's packages a container is given: from where they are, or from copies when they are on overlayfs.

A worker in a container of the worker image has its packages on the container's overlayfs, which cannot
be idmapped; a runc container in a user namespace could then not be given them, and ran without one
(tests/e2e/test_agent_blueprints.py shows it on a joined machine). Here a real overlay mount (root) stands
for that file system.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.worker.warm.launch import _fs_type, _idmappable


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("this test mounts an overlay, which needs root: run it as root")
    for part in ("lower", "upper", "work", "merged"):
        (tmp_path / part).mkdir()
    package = tmp_path / "lower" / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "alias.py").symlink_to("__init__.py")
    options = f"lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(tmp_path / "merged")], check=True)
    try:
        yield tmp_path / "merged"
    finally:
        subprocess.run(["umount", str(tmp_path / "merged")], check=True)


def test_packages_on_overlayfs_are_mounted_from_copies(overlay: Path, tmp_path: Path) -> None:
    assert _fs_type(str(overlay / "pkg")) == "overlay"
    copies = tmp_path / "state" / "runner"
    found = _idmappable({"pkg": str(overlay / "pkg")}, copies)
    assert found == {"pkg": str(copies / "pkg")}
    assert (copies / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert os.readlink(copies / "pkg" / "alias.py") == "__init__.py"  # links stay links
    assert _fs_type(found["pkg"]) != "overlay"
    # a second worker start reuses the copy
    assert _idmappable({"pkg": str(overlay / "pkg")}, copies) == found
    assert [p.name for p in copies.iterdir()] == ["pkg"]  # no scratch left behind


def test_packages_elsewhere_are_mounted_where_they_are(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    assert _fs_type(str(package)) != "overlay"
    assert _idmappable({"pkg": str(package)}, tmp_path / "copies") == {"pkg": str(package)}
    assert not (tmp_path / "copies").exists()
    assert _fs_type("/proc/self") == "proc"
