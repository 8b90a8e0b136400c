"""The levers9 provider contract, run against this plugin as installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from levers9.hooks.types import Machine
from levers9.testing import ProviderContract
from levers9_toycloud import cloud, user_data_of


class TestToyCloudContract(ProviderContract):
    provider = "toycloud"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "T4", "gpu_count": 2, "regions": ["toy-1", "toy-2"]}
    settle_timeout = 10.0

    @pytest.fixture(autouse=True)
    def state_dir(self, tmp_path: Path) -> None:
        self.cloud = tmp_path / "cloud"

    @pytest.fixture
    def pool_settings(self) -> dict[str, Any]:
        return {"state_dir": str(self.cloud), "capacity": {"T4": 3}, "zones": ["a", "b"]}

    @pytest.fixture
    def failing_pool_settings(self, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        monkeypatch.setenv("TOYCLOUD_TEST_KEY", "revoked")
        return {"state_dir": str(self.cloud), "capacity": {"T4": 3}, "api_key_env": "TOYCLOUD_TEST_KEY"}

    @pytest.fixture
    def capacity_pool_settings(self) -> dict[str, Any]:
        return {"state_dir": str(self.cloud), "capacity": {"T4": 0}, "zones": ["a", "b"]}

    def user_data(self, machine: Machine) -> str:
        return user_data_of(self.cloud, machine)

    # what the toy cloud's console does, from the cloud's side of its API

    def cloud_instances(self) -> dict[str, str | None]:
        alive = ("pending", "running")
        return {
            r["id"]: r["tags"].get("levers9:machine-id") for r in cloud.instances(self.cloud) if r["state"] in alive
        }

    @contextmanager
    def fail_after_create(self) -> Iterator[None]:
        with cloud.inject_fault(self.cloud, "tag", "tagging is down"):
            yield

    def preempt(self, machine: Machine) -> None:
        cloud.set_state(self.cloud, machine.provider_id, "interrupted")

    def fail(self, machine: Machine) -> None:
        cloud.set_state(self.cloud, machine.provider_id, "error")


class TestToyCloudCpuContract(TestToyCloudContract):
    """A CPU pool: no offers, so provisioning picks the zone itself."""

    pool_fields: ClassVar[dict[str, Any]] = {}
    zonal = False  # a CPU pool has no offers, so none names a zone (the GPU pool above checks the zones)

    @pytest.fixture
    def pool_settings(self) -> dict[str, Any]:
        return {"state_dir": str(self.cloud), "capacity": {"cpu": 2}, "zones": ["a", "b"]}

    @pytest.fixture
    def capacity_pool_settings(self) -> dict[str, Any]:
        return {"state_dir": str(self.cloud), "capacity": {"cpu": 0}}
