"""`levers9 run` as a newcomer meets it (issue 41): a remote function from the command line, and one clear line
for every way it can fail.

Against a real `levers9 up`: `run FILE::FUNCTION 7` calls the levers9 function remotely with 7 (an int), so a
task exists afterwards; a bad token, no context, and no controlplane each fail on one `error:` line within
seconds, with no traceback unless `--debug` asks for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)
HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.py"


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("levers9: connecting")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in done.stderr
    return lines[0]


def test_run_calls_a_levers9_function_remotely_and_fails_on_one_line(levers9_up: Up) -> None:
    up = levers9_up
    up.start()
    app = up.root / "hello.py"
    shutil.copy(HELLO, app)

    done = up.levers9("run", f"{app}::square", "7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "49"
    tasks = json.loads(up.levers9("tasks", "--json").stdout)
    assert [t["function"] for t in tasks] == ["square"]  # it ran remotely, as a task
    assert tasks[0]["status"] == "complete"

    # a revoked or wrong token: one line naming the token, and --debug adds the traceback
    bad = {"LEVERS9_TOKEN": "l9_user_not-a-real-token"}
    line = _one_error_line(up.levers9("run", str(app), env=bad))
    assert "token" in line
    debug = up.levers9("run", "--debug", str(app), env=bad)
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr

    # no context at all
    line = _one_error_line(up.levers9("run", str(app), env={"LEVERS9_HOME": str(up.root / "empty-home")}))
    assert "no levers9 context" in line

    # no controlplane there: refused at once, not after the context's reconnect window (an hour here, which
    # _run's own bound would cut short: the answer comes from every address refusing, not from waiting)
    up.stop()
    done = up.levers9("run", f"{app}::square", "7", env={"LEVERS9_RECONNECT_S": "3600"})
    line = _one_error_line(done)
    assert "no levers9 controlplane" in line
    assert "connecting to" in done.stderr  # it said what it was waiting for
