"""Running a host tool to ask it a question, without letting its absence or a hang break the caller.

Capability hooks must report a missing or broken tool as a reason, never as an
exception, and must not hang a worker's start-up on a wedged binary. Plugins of
every kind ask host tools questions (``runc --version``, ``criu check``,
``runsc help platforms``), so this lives in the core for all of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import NamedTuple

#: exit status reported when the program could not be found
NOT_FOUND = 127
#: exit status reported when the program exists but could not be executed
NOT_EXECUTABLE = 126
#: exit status reported when the program did not finish in time
TIMED_OUT = 124

#: seconds to collect what a killed program had printed
_DRAIN_TIMEOUT = 5.0


class ProbeResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def output_lines(self) -> list[str]:
        """The non-blank lines the program printed, stderr first (where tools put their errors)."""
        return [line.strip() for line in (self.stderr + "\n" + self.stdout).splitlines() if line.strip()]


def which(binary: str) -> str | None:
    """The executable ``binary`` names (a bare name looked up on PATH, or a path), or None."""
    return shutil.which(binary)


def run(argv: Sequence[str], timeout: float) -> ProbeResult:
    """Run ``argv`` and return its exit status and output; never raises for a missing or hung program.

    The program runs in a session of its own so that, when it overruns, the
    helpers it forked die with it instead of holding its output open.
    """
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError:
        return ProbeResult(NOT_FOUND, "", f"{argv[0]}: not found")
    except OSError as exc:
        return ProbeResult(NOT_EXECUTABLE, "", f"{argv[0]}: {exc.strerror or exc}")
    with proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                stdout, stderr = proc.communicate(timeout=_DRAIN_TIMEOUT)
            except subprocess.TimeoutExpired:
                # something that left the session still holds the output open; give up on it
                stdout, stderr = b"", b""
            late = f"{argv[0]}: did not finish within {timeout:g} s"
            return ProbeResult(TIMED_OUT, _text(stdout), _text(stderr) + "\n" + late)
    return ProbeResult(proc.returncode, _text(stdout), _text(stderr))


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
