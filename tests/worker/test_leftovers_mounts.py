"""A killed worker's state directory is deleted only once nothing is mounted below it, never through a mount.

A worker killed while a container used a volume leaves the volumes' JuiceFS file system mounted in its state
directory (``volumes/fs``), its ``juicefs`` alive in a session of its own. `levers9 worker --cleanup` (the
local provider runs it for every worker it stops) then deleted that directory with ``shutil.rmtree``, which
went down the mount and deleted every workspace's volumes. Now the cleanup unmounts the volume mounts first,
and it, and the local provider after it, keep a directory with anything still mounted below it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.config.volumes import VolumesConfig
from levers9.engine.rootfs import mounts_under
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.volumes.juicefs import FileSystem, sweep
from levers9.worker.leftovers import remove_leftovers
from tests.fixtures.volume_stores import fuse_mounts_in, juicefs_processes
from tests.fixtures.wait import wait_for


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    made = Hooks(load_plugins(PluginPolicy()))
    try:
        yield made
    finally:
        made.close()


async def test_cleanup_unmounts_a_killed_workers_file_system_and_deletes_no_volume(
    tmp_path: Path, hooks: Hooks
) -> None:
    fs = FileSystem.from_config(VolumesConfig(), tmp_path / "data")
    fs.format()
    controlplane = fs.mount(tmp_path / "controlplane", cache_dir=tmp_path / "controlplane-cache")
    try:
        volume = tmp_path / "controlplane" / "ws_other" / "vol_1"
        volume.mkdir(parents=True)
        (volume / "weights.bin").write_bytes(b"another workspace's weights")
        state = tmp_path / "mach_1.worker"
        left = fs.mount(state / "volumes" / "fs", cache_dir=state / "volumes" / "cache" / "fs")
        left.process = None  # the worker is gone: nobody stops this mount; its juicefs runs on by itself
        await remove_leftovers(hooks, state, delete=True)
        assert (volume / "weights.bin").read_bytes() == b"another workspace's weights"
        assert not state.exists()
    finally:
        controlplane.stop()
        sweep(tmp_path)  # a failure leaves nothing mounted either
    assert fuse_mounts_in(tmp_path) == []
    wait_for(lambda: not juicefs_processes(str(tmp_path)), "the left juicefs to end once unmounted", timeout=30)


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A directory of files outside a worker's state directory, bind-mounted into it; unmounted at the end."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (mount --bind): run it as root, as scripts/setup does")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the worker's\n")
    state = tmp_path / "mach_2.worker"
    point = state / "runtime" / "stray"
    point.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(outside), str(point)], check=True, capture_output=True)
    try:
        yield state, outside
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


async def test_cleanup_keeps_a_directory_still_mounted_below(
    bound: tuple[Path, Path], hooks: Hooks, caplog: pytest.LogCaptureFixture
) -> None:
    state, outside = bound
    await remove_leftovers(hooks, state, delete=True)
    assert (outside / "keep.txt").read_text() == "not the worker's\n"
    assert mounts_under(state) == [state / "runtime" / "stray"]
    assert f"not deleting {state}: still mounted below it" in caplog.text


def test_the_local_provider_deletes_nothing_through_a_mount(bound: tuple[Path, Path]) -> None:
    from levers9_local.provider import _remove_worker_leftovers

    state, outside = bound
    _remove_worker_leftovers(state)  # runs `levers9 worker --cleanup`, then removes what is left
    assert (outside / "keep.txt").read_text() == "not the worker's\n"
    assert state.is_dir()
