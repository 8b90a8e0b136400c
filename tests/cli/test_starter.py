"""The config `levers9 up` writes when there is none: runc, else gVisor where it runs (building images), and a process pool
bound to the workspace of `up`'s own token, allowed to run calls as this user only where they cannot run as nobody.

The runtimes are asked for real (runc's and runsc's checks on this machine, which `scripts/setup` makes root with
both installed); each written config is loaded with the real loader, plugins and all.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from levers9.cli.starter import UP_WORKSPACE, starter_config
from levers9.config.load import load_config


def _load(tmp_path: Path, text: str) -> dict[str, object]:
    path = tmp_path / "levers9.yaml"
    path.write_text(text.format(cpu=2, memory=2048))
    loaded = load_config(path)
    try:
        pool = loaded.config.pools["local"]
        settings = loaded.runtime_settings["local"]
        return {"runtime": pool.runtime, "workspace": pool.workspace, "settings": settings, "builds": pool.builds}
    finally:
        loaded.hooks.close()


def test_auto_takes_runc_where_it_runs_and_its_pool_builds_images(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.fail("this test needs root and runc: run scripts/setup as root")
    text, why = starter_config("auto")
    assert why == "runtime runc: it runs here"
    loaded = _load(tmp_path, text)
    assert (loaded["runtime"], loaded["workspace"]) == ("runc", None), "a pool that isolates calls may be shared"
    assert loaded["builds"] is True


def test_a_gvisor_pool_builds_images_and_a_process_pool_does_not(tmp_path: Path) -> None:
    gvisor, _ = starter_config("gvisor")
    assert _load(tmp_path, gvisor)["builds"] is True
    process, _ = starter_config("process")
    assert _load(tmp_path, process)["builds"] is False


def test_a_process_pool_serves_ups_workspace_and_runs_calls_as_nobody(tmp_path: Path) -> None:
    text, why = starter_config("process")
    assert why == "runtime process: chosen with --runtime"
    loaded = _load(tmp_path, text)
    assert (loaded["runtime"], loaded["workspace"]) == ("process", UP_WORKSPACE)
    assert not getattr(loaded["settings"], "allow_calls_as_worker_user", False), "nobody can run this Python"
    assert "allow_calls_as_worker_user" not in text


def test_where_calls_cannot_run_as_nobody_the_process_pool_allows_them_as_this_user_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    (hidden / "python3").symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(hidden / "python3"))
    text, _ = starter_config("process")
    assert "single-user machine" in text
    loaded = _load(tmp_path, text)
    assert getattr(loaded["settings"], "allow_calls_as_worker_user", False) is True
