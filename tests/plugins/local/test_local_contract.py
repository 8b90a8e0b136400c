"""The levers9 provider contract, run against the installed ``local`` plugin through the real plugin manager.

Once for a CPU pool, and once for a T4 pool on a host whose ``nvidia-smi`` is a
script reporting two T4s (``LEVERS9_NVIDIA_SMI``, the core discovery's own
override), so the GPU path runs exactly as on a GPU host. Most checks start the
fake worker; "the bootstrap boots" starts this installation's real ``levers9
worker``, which must register with the kit's stand-in controlplane using the
bootstrap's token.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from levers9.hooks.types import Machine
from levers9.testing import ProviderContract
from tests.plugins.local.conftest import FAKE_WORKER, processes_mentioning


@pytest.fixture(autouse=True)
def no_leaks(tmp_path: Path) -> Iterator[None]:
    """Fail a test that leaves a fake worker running (after the contract's own clean-up has run)."""
    yield
    leaked = processes_mentioning(str(tmp_path))
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not leaked, f"processes left running: {leaked}"


def _settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return {
        "state_dir": str(tmp_path / "state"),
        "worker_command": [sys.executable, str(FAKE_WORKER), str(out)],
        "stop_grace_s": 2,
        **extra,
    }


def _boot_settings(tmp_path: Path) -> dict[str, Any]:
    """The real ``levers9 worker`` of this installation (worker_command left out), against the kit's controlplane."""
    return {"state_dir": str(tmp_path / "boot-state"), "stop_grace_s": 5}


def _workers(root: Path) -> dict[str, str | None]:
    """The worker sessions this host runs for state directories under ``root``, by pid, each with the machine id
    in its environment: the local provider's "cloud", read from /proc rather than through the plugin."""
    found: dict[str, str | None] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat[0] in (b"Z", b"X") or stat[2] != entry.encode():  # a live process group's leader only
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        state_dir = variables.get(b"LEVERS9_WORKER_STATE_DIR", b"").decode()
        if state_dir.startswith(f"{root}/"):
            found[entry] = variables.get(b"LEVERS9_MACHINE_ID", b"").decode() or None
    return found


class _OnThisHost(ProviderContract):
    """What the kit's checks of the platform's own doings mean for workers that are processes of this host."""

    provider = "local"
    preemptible = False  # a worker process of this host: nothing takes it back
    zonal = False  # a host has no zones, and the local provider's offers name none
    # Starting is one launch; the record written after it fails only when the disk does (the plugin then stops
    # the worker it launched), which this test cannot cause without patching the plugin itself.
    one_step_start = True

    @pytest.fixture(autouse=True)
    def _host(self, tmp_path: Path) -> None:
        self.root = tmp_path

    def cloud_instances(self) -> dict[str, str | None]:
        return _workers(self.root)

    def fail(self, machine: Machine) -> None:
        """The worker dies by itself (SIGKILL to its process group): the provider lists it failed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(machine.labels["pid"]), signal.SIGKILL)


class TestLocalContract(_OnThisHost):
    settle_timeout = 10.0
    boots_itself = True
    boot_timeout = 60.0

    @pytest.fixture
    def pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _settings(tmp_path)

    @pytest.fixture
    def failing_pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _settings(tmp_path, worker_command=[str(tmp_path / "no-such-levers9")])

    # A CPU worker is a process: this host never runs out of them in the provider's terms, so the capacity
    # check is not collected here; TestLocalGpuContract runs it, with more GPUs asked for than the host has.
    test_no_capacity_is_insufficient_capacity = None  # type: ignore[assignment]

    @pytest.fixture
    def boot_pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _boot_settings(tmp_path)


class TestLocalGpuContract(_OnThisHost):
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "T4", "gpu_count": 1}
    settle_timeout = 10.0
    boots_itself = True
    boot_timeout = 60.0

    @pytest.fixture(autouse=True)
    def two_t4s(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        smi = tmp_path / "nvidia-smi"
        smi.write_text("#!/bin/sh\nprintf '0, GPU-a, Tesla T4, 15360\\n1, GPU-b, Tesla T4, 15360\\n'\n")
        smi.chmod(0o755)
        monkeypatch.setenv("LEVERS9_NVIDIA_SMI", str(smi))

    @pytest.fixture
    def pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _settings(tmp_path)

    @pytest.fixture
    def failing_pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _settings(tmp_path, worker_command=[str(tmp_path / "no-such-levers9")])

    @pytest.fixture
    def capacity_pool_settings(self, tmp_path: Path) -> dict[str, Any] | None:
        return _settings(tmp_path, visible_gpus=[5])  # the host has GPUs 0 and 1: none of the pool's is there

    @pytest.fixture
    def boot_pool_settings(self, tmp_path: Path) -> dict[str, Any]:
        return _boot_settings(tmp_path)
