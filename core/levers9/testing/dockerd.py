"""A private Docker daemon for tests: its own roots and socket, no network of its own, everything removed at the end.

:func:`private_dockerd` starts one ``dockerd`` with its own data root, exec
root, socket and pid file under a temporary directory, so it never touches a
Docker the machine may run, and two test processes never share one. It runs
with ``--bridge=none --iptables=false``: no network is created or changed on
the host, so containers use ``network_mode="host"`` (or none). There is no
registry: images are built offline (``levers9 worker-image build``,
:func:`levers9.images.worker.build_image`) or made with ``docker import``.

The contract kit boots a container provider's machines in one
(:mod:`levers9.testing.container_boot`), and a container provider's own
fake marketplace can run its containers there (examples/provider-container).

Invariants: when :func:`private_dockerd` ends, every container is removed,
the daemon is stopped (SIGKILL to its process group after 30 s), whatever it
left mounted under its roots is unmounted, and the directory is deleted.
Failures are ``pytest.fail``: a machine without ``dockerd`` (naming the
package that provides it), not running as root (a daemon needs it), or a
daemon that exits or does not answer within 60 s (with its log's tail).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import docker

__all__ = ["Dockerd", "private_dockerd", "start_dockerd", "stop_dockerd"]

_START_TIMEOUT_S = 60.0


@dataclass
class Dockerd:
    #: ``unix:///.../docker.sock``: DOCKER_HOST for the CLI, base_url for the SDK
    host: str
    root: Path
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def client(self) -> docker.DockerClient:
        import docker

        return docker.DockerClient(base_url=self.host, timeout=60)

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against this daemon."""
        done = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def containers(self) -> list[dict[str, Any]]:
        """Every container, running or not, as ``docker ps -a`` lists it (name, state, labels).

        One list call, no inspect per container: a container removed between the list and an
        inspect (an agent reaping its workers while a test looks) would otherwise fail the read.
        """
        client = self.client()
        try:
            return [
                {
                    "name": (c.get("Names") or ["/"])[0].lstrip("/"),
                    "id": c["Id"],
                    "state": c.get("State", ""),
                    "labels": dict(c.get("Labels") or {}),
                }
                for c in client.api.containers(all=True)
            ]
        finally:
            client.close()

    def log(self) -> str:
        path = self.root / "dockerd.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _mounts_under(root: Path) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 1 and fields[1].startswith(str(root)):
                found.append(fields[1])
    return sorted(found, key=len, reverse=True)  # the deepest first


def start_dockerd(root: Path) -> Dockerd:
    """Start a private dockerd whose roots, socket and log are under ``root``; answers once it answers."""
    binary = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if binary is None or shutil.which("docker") is None:
        pytest.fail("these tests need Docker: apt-get install -y docker.io (scripts/setup installs it as root)")
    if os.geteuid() != 0:
        pytest.fail("these tests run a private dockerd, which needs root: run them as root")
    sock = root / "docker.sock"
    args = [
        binary,
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--pidfile",
        str(root / "dockerd.pid"),
        "--host",
        f"unix://{sock}",
        "--bridge=none",
        "--iptables=false",
        "--ip-masq=false",
        "--userland-proxy=false",
        "--log-level",
        "warn",
    ]
    with (root / "dockerd.log").open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    daemon = Dockerd(f"unix://{sock}", root, process)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"dockerd exited with {process.returncode}:\n{daemon.log()[-3000:]}")
        if sock.exists() and daemon.cli("version", check=False, timeout=10).returncode == 0:
            return daemon
        if time.monotonic() > deadline:
            stop_dockerd(daemon)
            pytest.fail(f"dockerd did not answer within {_START_TIMEOUT_S:.0f} s:\n{daemon.log()[-3000:]}")
        time.sleep(0.2)


def stop_dockerd(daemon: Dockerd) -> None:
    """Remove every container, stop the daemon and unmount what it left under its root (the root stays)."""
    if daemon.process.poll() is None:
        with contextlib.suppress(Exception):
            ids = daemon.cli("ps", "-aq", check=False, timeout=30).stdout.split()
            if ids:
                daemon.cli("rm", "-f", *ids, check=False, timeout=60)
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(daemon.process.pid, signal.SIGKILL)
            daemon.process.wait(10)
    for mount in _mounts_under(daemon.root):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


@contextlib.contextmanager
def private_dockerd() -> Iterator[Dockerd]:
    """A private dockerd for the ``with`` block, its temporary directory removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="l9-dockerd-"))
    try:
        daemon = start_dockerd(root)
        try:
            yield daemon
        finally:
            stop_dockerd(daemon)
    finally:
        shutil.rmtree(root, ignore_errors=True)
