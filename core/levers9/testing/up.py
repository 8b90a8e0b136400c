"""``levers9 up`` for a provider's end-to-end test: the real controlplane, in a subprocess, with your pools.

:class:`Levers9Up` writes a config holding the pools it is given (your
provider's, pointed at your fake cloud) under a directory of its own, starts
``levers9 up`` there on free loopback ports, and waits until it serves. A
test then runs a user program against it (:meth:`Levers9Up.python`: a file
run with this interpreter, whose ``levers9`` finds the controlplane through
the context ``up`` wrote), reads its log, and stops it. Machines your plugin
provisions are booted by :class:`levers9.testing.cloud_boot.CloudBooter`
given :attr:`Levers9Up.ports` (what a booted worker may reach: the gRPC port
it registers on, the HTTP port it may fetch levers9's wheel from).

Invariants: everything it writes is under ``root`` (the config, levers9's
home and state, the log); nothing of the caller's ``LEVERS9_*`` environment
reaches the controlplane; :meth:`Levers9Up.stop` sends SIGTERM (``up`` then
terminates the machines of its pools through your plugin, as at Ctrl-C), waits
for it, then finds every process still mentioning ``root`` (a worker left
running, a program's child), kills it and returns what it found, so a test
can assert nothing was left behind.

Failures: ``levers9 up`` exiting before it serves, or not serving within the
start timeout, raises :class:`Levers9UpFailed` with the end of its log; the
config is written as YAML from the mappings given, and levers9 refuses a bad
one at start with a message naming the field.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Levers9Up", "Levers9UpFailed", "Program"]

#: what ``levers9 up`` logs once it serves
READY = "levers9 is up"
#: scheduler settings for a test: a lost worker noticed in seconds, reconcile passes often, a boot given 2 minutes
TEST_SCHEDULER: dict[str, Any] = {"worker_keepalive_s": 3, "reconcile_interval_s": 2, "register_timeout_s": 120}


class Levers9UpFailed(RuntimeError):
    """``levers9 up`` exited, or did not serve in time; the message ends with its log."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append((int(entry), cmdline.strip()))
    return found


class Levers9Up:
    """One ``levers9 up`` with ``pools`` (the config's ``pools:`` mapping), under ``root`` (a new temporary
    directory when None, removed by :meth:`stop`); ``environment``: more variables for the controlplane (your
    plugin's credentials); ``scheduler``: the config's ``scheduler:`` (default :data:`TEST_SCHEDULER`)."""

    def __init__(
        self,
        pools: Mapping[str, Mapping[str, Any]],
        root: Path | str | None = None,
        *,
        environment: Mapping[str, str] | None = None,
        scheduler: Mapping[str, Any] | None = None,
    ) -> None:
        self._own_root = root is None
        # short: the workers of local pools keep unix sockets below it
        self.root = Path(tempfile.mkdtemp(prefix="l9up-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.config: dict[str, Any] = {
            "version": 1,
            "scheduler": dict(TEST_SCHEDULER if scheduler is None else scheduler),
            "pools": {name: dict(pool) for name, pool in pools.items()},
        }
        self.environment = dict(environment or {})
        self.grpc_port = _free_port()
        self.http_port = _free_port()
        self.metrics_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.root / "levers9-up.log"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def ports(self) -> list[int]:
        """The loopback ports a booted machine needs: gRPC (registering) and HTTP (levers9's wheel)."""
        return [self.grpc_port, self.http_port]

    @property
    def env(self) -> dict[str, str]:
        """The environment of the controlplane and of the programs run against it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
        env.update(LEVERS9_HOME=str(self.home), XDG_STATE_HOME=str(self.root / "state"), PYTHONUNBUFFERED="1")
        env.update(self.environment)
        return env

    def start(self, timeout: float = 90) -> Levers9Up:
        """Write the config, start ``levers9 up`` and wait until it serves."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "levers9.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        command = [sys.executable, "-m", "levers9", "up", "--log-level", "info"]
        command += ["--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port)]
        command += ["--metrics-port", str(self.metrics_port)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while READY not in self.log():
            if self.process.poll() is not None:
                raise Levers9UpFailed(f"levers9 up exited with {self.process.returncode}:\n{self.log()[-5000:]}")
            if time.monotonic() > deadline:
                raise Levers9UpFailed(f"levers9 up did not serve within {timeout:g} s:\n{self.log()[-5000:]}")
            time.sleep(0.1)
        return self

    def log(self) -> str:
        """What ``levers9 up`` printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def python(self, code: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``code`` as a user program (a file, so its functions travel by value) against this levers9."""
        return self.program(code).result(timeout)

    def program(self, code: str) -> Program:
        """Start ``code`` as a user program and return at once (wait on it with a booter's ``wait_for``)."""
        path = self.root / f"program_{time.time_ns()}.py"
        path.write_text(textwrap.dedent(code))
        with open(path.with_suffix(".out"), "wb") as out, open(path.with_suffix(".err"), "wb") as err:
            process = subprocess.Popen(
                [sys.executable, str(path)], env=self.env, cwd=self.root, stdout=out, stderr=err, start_new_session=True
            )
        return Program(process, path)

    def levers9(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the ``levers9`` command line against this levers9 (``levers9 tasks``, ``levers9 pools``)."""
        return subprocess.run(
            [sys.executable, "-m", "levers9", *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop(self, timeout: float = 60) -> list[str]:
        """SIGTERM ``levers9 up`` (it terminates its pools' machines), SIGKILL after ``timeout``; then kill what
        still mentions ``root`` and return it (empty when nothing was left); remove ``root`` if it made it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        deadline = time.monotonic() + 15
        while (left := _mentioning(str(self.root))) and time.monotonic() < deadline:
            time.sleep(0.25)
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        return [f"process {pid}: {command[:200]}" for pid, command in left]

    def __enter__(self) -> Levers9Up:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Program:
    """A user program started by :meth:`Levers9Up.program`; its output goes to files beside it."""

    def __init__(self, process: subprocess.Popen[bytes], path: Path) -> None:
        self.process = process
        self.path = path

    def done(self) -> bool:
        return self.process.poll() is not None

    def result(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Wait for it (killing its session after ``timeout``) and return what it printed and its status."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        out = self.path.with_suffix(".out").read_text(errors="replace")
        err = self.path.with_suffix(".err").read_text(errors="replace")
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
