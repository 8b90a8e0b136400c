"""The README's snippets run as written, against a real `levers9 up` (issue 41).

Every fenced ``python`` and ``sh`` block of README.md is run, in order, in one directory that holds the repository's
``examples`` and ``.venv`` (as the README's commands expect), with the levers9 home of the test's `up`:

* a ``python`` block whose first line is ``# NAME.py`` is written to that file (a later block deploys it); any
  other is run as a program and must exit 0;
* a ``sh`` block is run with ``bash -euo pipefail`` and must exit 0 (line by line when it names an id a line
  before it makes, such as ``TASK_ID``, so the id is filled in once it exists); under ``<!-- snippet: lines (...) -->`` each
  command line is run on its own and must exit 0 or 1 (a command that reports a problem, such as a pool not usable
  here) without a traceback;
* ``<!-- snippet: not run (why) -->`` skips a block, and must say why; the test counts them, so a new one is seen.

The only changes made to a snippet before it runs are :data:`SUBSTITUTIONS` (the test's own port, and ids the
README leaves for the reader to fill in), and the comment's output (``# {"greeting": ...}``) under a curl is
checked against what curl printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: the blocks the README says are not run, each with its reason: a new one must be looked at, not slip by
NOT_RUN = 3
_FENCE = re.compile(
    r"(?:<!-- snippet: (?P<mode>[a-z ]+?)(?: \((?P<why>[^)]*)\))? -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S
)


@dataclass
class Snippet:
    lang: str
    body: str
    mode: str  # "run", "lines" or "not run"
    why: str
    line: int


def snippets() -> list[Snippet]:
    text = README.read_text()
    found = []
    for match in _FENCE.finditer(text):
        if match["lang"] not in ("python", "sh"):
            continue
        found.append(
            Snippet(
                match["lang"],
                match["body"],
                match["mode"] or "run",
                match["why"] or "",
                text[: match.start()].count("\n") + 1,
            )
        )
    return found


def _json_values(text: str) -> list[object]:
    """Every JSON object in ``text``: curl ends its answer without a newline, so the next output follows on."""
    decoder, values = json.JSONDecoder(), []
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            values.append(decoder.raw_decode(text, start)[0])
        except ValueError:
            continue
    return values


def _newest_task(run: Callable[[str], subprocess.CompletedProcess[str]]) -> str:
    tasks = json.loads(run(".venv/bin/levers9 tasks --json").stdout)
    return str(tasks[0]["id"])


def _team_b_token(run: Callable[[str], subprocess.CompletedProcess[str]]) -> str:
    tokens = json.loads(run(".venv/bin/levers9 token list --workspace team-b --json").stdout)
    return str(tokens[-1]["id"])


def test_the_readmes_snippets_run_as_written(levers9_up: Up) -> None:
    up = levers9_up
    up.start()
    work = up.root / "readme"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (work / ".venv").symlink_to(ROOT / ".venv")
    (work / "key.txt").write_text("sk-readme-not-a-real-key\n")  # `secret create ... < key.txt` reads it

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            env=up.env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=work,
        )

    #: what the README leaves the reader to fill in, and the test's own port for the default one
    substitutions: dict[str, Callable[[], str]] = {
        "127.0.0.1:1994": lambda: f"127.0.0.1:{up.http_port}",
        "TASK_ID": lambda: _newest_task(run),
        "TOKEN_ID": lambda: _team_b_token(run),
    }

    def filled(text: str) -> str:
        for placeholder, value in substitutions.items():
            if placeholder in text:
                text = text.replace(placeholder, value())
        return text

    found = snippets()
    assert sum(s.mode == "not run" for s in found) == NOT_RUN, [(s.line, s.why) for s in found if s.mode == "not run"]
    assert all(s.why for s in found if s.mode == "not run")
    ran = 0
    for snippet in found:
        where = f"README.md:{snippet.line}"
        if snippet.mode == "not run":
            continue
        ran += 1
        if snippet.lang == "python":
            first = snippet.body.splitlines()[0]
            if re.fullmatch(r"# [\w.-]+\.py", first):
                (work / first[2:]).write_text(snippet.body)
                continue
            (work / "snippet.py").write_text(snippet.body)
            done = run(f"{sys.executable} snippet.py")
            assert done.returncode == 0, (where, done.stdout, done.stderr)
            continue
        if snippet.mode == "lines":
            for line in snippet.body.splitlines():
                command = line.split("  #")[0].strip()
                if not command:
                    continue
                done = run(filled(command))
                assert done.returncode in (0, 1), (where, command, done.stdout, done.stderr)
                assert "Traceback" not in done.stderr, (where, command, done.stderr)
            continue
        if any(placeholder in snippet.body for placeholder in ("TASK_ID", "TOKEN_ID")):
            # ids of what the lines before make: each line on its own, its ids filled when it is reached
            for line in snippet.body.splitlines():
                command = filled(line.split("  #")[0].strip())
                if command:
                    done = run(command)
                    assert done.returncode == 0, (where, command, done.stdout, done.stderr)
            continue
        body = filled(snippet.body)
        done = run(body)
        assert done.returncode == 0, (where, body, done.stdout, done.stderr)
        # a comment line that is a JSON value after a curl is the answer the README promises
        for promised in re.findall(r"^# (\{.*\})$", snippet.body, re.M):
            assert json.loads(promised) in _json_values(done.stdout), (where, promised, done.stdout)
    assert ran >= 5, ran
