"""The process runtime's settings and report, and its warning that it isolates nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

import levers9_process
from levers9.hooks.types import Isolation, RuntimeContext

Context = Callable[..., RuntimeContext]


def test_available_where_calls_can_run_as_nobody_and_isolates_nothing(context: Context) -> None:
    """Root, and nobody can execute this Python and read levers9 (scripts/setup's .venv is built so)."""
    report = levers9_process.plugin.levers9_runtime_capabilities(context("process"))
    assert report.available, report.unavailable_reason
    assert report.unavailable_reason is None
    assert report.notes == []
    assert report.isolation is Isolation.NONE
    assert report.gpu is True
    assert report.checkpoint is False
    assert report.checkpoint_reason == "the process runtime isolates nothing and cannot checkpoint"


def test_warns_once(context: Context, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levers9_process, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="levers9.runtime.process"):
        for _ in range(3):
            levers9_process.plugin.levers9_runtime_capabilities(context("process"))
    warnings = [record for record in caplog.records if record.name == "levers9.runtime.process"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "isolates nothing" in warnings[0].getMessage()


def test_settings_accept_nothing_unknown() -> None:
    assert levers9_process.plugin.levers9_runtime_settings() is levers9_process.ProcessSettings
    levers9_process.ProcessSettings.model_validate({})
    assert levers9_process.ProcessSettings.model_validate({"allow_calls_as_worker_user": True})
    with pytest.raises(ValidationError):
        levers9_process.ProcessSettings.model_validate({"isolation": "namespaces"})


def test_unavailable_where_nobody_cannot_run_the_workers_python_unless_the_pool_allows_it(
    context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: with a Python under a directory only root may enter, no worker of the pool starts."""
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    python = hidden / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(python))
    report = levers9_process.plugin.levers9_runtime_capabilities(context("process"))
    assert not report.available
    assert report.unavailable_reason is not None
    assert f"nobody cannot reach the worker's Python at {python} (blocked at /" in report.unavailable_reason
    assert levers9_process.FIX in report.unavailable_reason
    allowed = context("process", settings=levers9_process.ProcessSettings(allow_calls_as_worker_user=True))
    report = levers9_process.plugin.levers9_runtime_capabilities(allowed)
    assert report.available
    assert report.notes == [levers9_process.WORKER_USER_NOTE]


def test_unavailable_to_a_worker_that_is_not_root(tmp_path: Path) -> None:
    """A worker that is not root cannot switch users: its calls would run as it, so the runtime says no."""
    script = (
        "import json, levers9_process; from levers9.hooks.types import RuntimeContext as C; "
        f"r = levers9_process.plugin.levers9_runtime_capabilities(C(name='process', state_dir={str(tmp_path)!r})); "
        "print(json.dumps([r.available, r.unavailable_reason]))"
    )
    os.chmod(tmp_path, 0o755)
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    available, reason = json.loads(done.stdout.strip().splitlines()[-1])
    assert available is False
    assert "not root, so it cannot run calls as another user" in reason
