"""`levers9 deploy` refuses, with one clear line, what it cannot deploy; no controlplane is needed to say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _deploy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env["LEVERS9_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "levers9", "deploy", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


def test_an_app_without_functions_is_refused(tmp_path: Path) -> None:
    app = tmp_path / "empty_app.py"
    app.write_text("x = 1\n")
    done = _deploy(tmp_path, str(app))
    assert done.returncode == 1
    assert "declares nothing to deploy: no @levers9.endpoint, queue, job, box or function" in done.stderr


def test_no_context_is_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    app = tmp_path / "one_app.py"
    app.write_text("import levers9\n\n@levers9.endpoint\ndef hello() -> str:\n    return 'hi'\n")
    done = _deploy(tmp_path, str(app))
    assert done.returncode == 1
    assert "no levers9 context" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_file_and_a_broken_app_are_named(tmp_path: Path) -> None:
    missing = _deploy(tmp_path, str(tmp_path / "nope.py"))
    assert missing.returncode == 1
    assert "no such file" in missing.stderr
    broken = tmp_path / "broken_app.py"
    broken.write_text("import levers9\nraise RuntimeError('the app cannot start')\n")
    done = _deploy(tmp_path, str(broken))
    assert done.returncode == 1
    assert "could not be imported: RuntimeError: the app cannot start" in done.stderr
