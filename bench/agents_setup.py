"""What ``bench/agents.py`` runs against: a real ``levers9 up`` over TLS with an agent_machine pool, a private dockerd.

:class:`Controlplane` is ``python -m levers9 up`` in a temporary home: its own
config (TLS from a throw-away CA, the pool ``box`` of provider
``agent_machine``), SQLite and the embedded redis-server in its data dir, free
ports, and an operator token (``levers9 token create --operator``: only an
operator may join machines to a shared pool) in :attr:`Controlplane.env`.
:func:`private_dockerd` is the tests' dockerd (``tests/fixtures/dockerd.py``)
under a temporary directory, with the tests' tiny image imported.

Everything started here is stopped, and every directory removed, when the
``with`` block ends, also on an exception or Ctrl-C: the controlplane gets
SIGTERM (SIGKILL after 60 s), then whatever process still mentions its
directory is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from levers9.__about__ import __version__
from tests.fixtures.dockerd import _TINY_TOOLS, Dockerd, _libraries, _start, _stop
from tests.fixtures.levers9_up import _processes_mentioning
from tests.fixtures.ports import free_port
from tests.fixtures.tls import TestCA

__all__ = ["TINY", "Controlplane", "private_dockerd"]

TINY = "levers9-bench/tiny:1"

CONFIG = """\
version: 1
listen:
  tls:
    cert_file: {cert}
    key_file: {key}
    ca_file: {ca}
pools:
  box:
    provider: agent_machine
    cpu: 1
    memory: 1GiB
    min_workers: 0
    max_workers: {max_workers}
    settings:
      worker_image: levers9/worker:{version}
      docker_network_mode: host
      gpu_runtime: none
"""


def python_env() -> dict[str, str]:
    """This process's environment, less any levers9 context or join token that would leak into a child."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_") and k != "DOCKER_HOST"}


class Controlplane:
    """``levers9 up`` over TLS in a temporary home; see the module docstring."""

    def __init__(self, *, max_workers: int = 2, extra_pools: str = "") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="l9-bench-agents-"))
        self.home = self.root / "home"
        self.home.mkdir()
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        ca = TestCA("levers9 bench CA")
        self.ca_file = ca.write(self.root / "ca.pem")
        ca.issue().write(self.root / "cert.pem", self.root / "key.pem")
        config = (
            CONFIG.format(
                cert=self.root / "cert.pem",
                key=self.root / "key.pem",
                ca=self.ca_file,
                max_workers=max_workers,
                version=__version__,
            )
            + extra_pools
        )
        (self.home / "levers9.yaml").write_text(config)
        self.env = python_env() | {
            "LEVERS9_HOME": str(self.home),
            "XDG_STATE_HOME": str(self.root / "state"),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_file = self.root / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"grpcs://127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def redis_pid(self) -> int:
        """The embedded redis-server, a child of the controlplane."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                stat = (entry / "stat").read_text()
                if stat[stat.rindex(")") + 2 :].split()[1] == str(self.pid) and "redis-server" in stat:
                    return int(entry.name)
        raise RuntimeError(f"no embedded redis-server under the controlplane (pid {self.pid}):\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "levers9",
            "up",
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
        ]
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while "levers9 is up" not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"levers9 up did not start (exit {self.process.poll()}):\n{self.log()[-3000:]}")
            time.sleep(0.2)
        token = self.levers9("token", "create", "--operator").stdout.strip().splitlines()[-1]
        self.env["LEVERS9_TOKEN"] = token

    def levers9(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "levers9", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"levers9 {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def machines(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.levers9("machines", "--json").stdout or "[]")
        return found

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        for pid, _ in _processes_mentioning(str(self.root)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Controlplane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _import_tiny(daemon: Dockerd) -> None:
    with tempfile.TemporaryDirectory(prefix="l9-bench-tiny-") as scratch:
        tarball = Path(scratch) / "rootfs.tar"
        with tarfile.open(tarball, "w") as tar:
            added: set[str] = set()
            for tool in _TINY_TOOLS:
                for path in (tool, *_libraries(tool)):
                    if path not in added:
                        added.add(path)
                        tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
            for directory in ("tmp", "proc", "sys", "dev", "etc"):
                info = tarfile.TarInfo(directory)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
        daemon.cli("import", str(tarball), TINY)


@contextlib.contextmanager
def private_dockerd() -> Iterator[Dockerd]:
    """The tests' private dockerd (no bridge, no iptables) with :data:`TINY` in it; stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="l9-bench-dockerd-"))
    daemon: Dockerd | None = None
    try:
        daemon = _start(root)
        _import_tiny(daemon)
        yield daemon
    finally:
        if daemon is not None:
            _stop(daemon)
        shutil.rmtree(root, ignore_errors=True)
