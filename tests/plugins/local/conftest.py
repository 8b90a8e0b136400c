"""Fixtures for the local provider's tests: a fake worker command, pools on a temporary state dir, no leaks.

Every test that starts workers does so through :class:`Workers`, which
terminates them when the test ends and then scans ``/proc`` for any process
whose command line names the test's temporary directory: whatever it finds
was leaked, is killed, and fails the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from levers9.__about__ import __version__
from levers9.hooks.types import (
    GpuDevice,
    Machine,
    MachineState,
    Pool,
    ProvisionRequest,
    Resources,
    WorkerBootstrap,
)
from levers9_local.provider import LocalProvider
from levers9_local.settings import LocalSettings

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
TOKEN_PREFIX = "tok-secret-"


def processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_for(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


@dataclass
class Workers:
    """Pools whose workers are the fake worker, and everything a test provisions, cleaned up afterwards."""

    tmp: Path
    provider: LocalProvider
    out: Path
    state_dir: Path
    started: list[tuple[Pool, str]] = field(default_factory=list)

    def command(self, mode: str = "exit") -> list[str]:
        return [sys.executable, str(FAKE_WORKER), str(self.out), mode]

    def pool(self, name: str = "local-test", *, mode: str = "exit", **fields: Any) -> Pool:
        settings: dict[str, Any] = {"state_dir": self.state_dir, "worker_command": self.command(mode)}
        for key in ("visible_gpus", "stop_grace_s", "worker_command", "state_dir"):
            if key in fields:
                settings[key] = fields.pop(key)
        return Pool(name=name, provider="local", runtime="process", settings=LocalSettings(**settings), **fields)

    def request(
        self,
        pool: Pool,
        *,
        gpu_count: int | None = None,
        machine_id: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ProvisionRequest:
        count = gpu_count if gpu_count is not None else (max(pool.gpu_count, 1) if pool.gpu else 0)
        machine_id = machine_id or f"m-{uuid.uuid4().hex[:12]}"
        return ProvisionRequest(
            pool=pool,
            resources=Resources(cpu_millicores=1500, memory_mib=3072, gpu=pool.gpu, gpu_count=count),
            machine_id=machine_id,
            bootstrap=WorkerBootstrap(
                controlplane_url="grpc://127.0.0.1:1993",
                token=f"{TOKEN_PREFIX}{uuid.uuid4().hex}",
                machine_id=machine_id,
                pool=pool.name,
                levers9_version=__version__,
                environment=environment or {},
            ),
        )

    def provision(self, pool: Pool, *, ready: bool = True, **request: Any) -> Machine:
        machine = self.provider.levers9_provision(self.request(pool, **request))
        self.started.append((pool, machine.provider_id))
        if ready:
            wait_for(f"worker {machine.machine_id} ready", lambda: self.ready(machine).exists())
        return machine

    def ready(self, machine: Machine) -> Path:
        return self.out / f"{machine.machine_id}.ready"

    def events(self, machine: Machine) -> list[str]:
        path = self.out / f"{machine.machine_id}.events"
        return path.read_text().splitlines() if path.exists() else []

    def cleanup(self) -> list[int]:
        for pool, provider_id in self.started:
            self.provider.levers9_terminate(pool, known(pool, provider_id))
        leaked = processes_mentioning(str(self.tmp))
        for pid in leaked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leaked


def known(pool: Pool, provider_id: str) -> Machine:
    """A machine of ``pool`` as levers9 stored it, for ``levers9_terminate``: the provider reads its id."""
    return Machine(provider_id=provider_id, machine_id=provider_id, pool=pool.name, state=MachineState.RUNNING)


def t4s(count: int) -> list[GpuDevice]:
    return [
        GpuDevice(index=i, uuid=f"GPU-{i:08d}-test", model="Tesla T4", gpu="T4", memory_mib=15360) for i in range(count)
    ]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    out = tmp_path / "out"
    out.mkdir()
    harness = Workers(
        tmp=tmp_path, provider=LocalProvider(discover=lambda: t4s(4)), out=out, state_dir=tmp_path / "state"
    )
    yield harness
    leaked = harness.cleanup()
    assert not leaked, f"processes left running after the test (now killed): {leaked}"
