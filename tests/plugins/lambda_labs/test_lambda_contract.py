"""The levers9 provider contract, run against the installed ``lambda_labs`` plugin and the fake Lambda Cloud API.

The plugin is loaded from its entry point and called through the typed facade,
as the controlplane calls it; its real httpx client talks to
:mod:`tests.fakes.lambda_cloud` over HTTP on 127.0.0.1.

* pools ask for one A10 in ``us-east-1``: the recorded instance types hold
  ``gpu_1x_a10`` with capacity there;
* failing settings: an SSH key the account does not have (the API's 404
  ``global/object-does-not-exist``, an ``InvalidRequest``);
* no capacity: ``gpu_1x_a10`` keeps capacity only in ``us-west-2``, outside
  the pool's region, so the launch is refused with
  ``instance-operations/launch/insufficient-capacity``;
* "the bootstrap boots": the user data is read back from the fake (the API
  never returns it: it is write-only), and the kit boots it.

The kit launches several times in a row, so both the fake's launch limit and
the plugin's own pacing are switched off here; :mod:`test_lambda_provider`
tests the documented pacing.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import levers9_lambda_labs
from levers9.hooks.types import Machine
from levers9.testing import ProviderContract
from tests.fakes.lambda_cloud import LambdaCloud
from tests.plugins.lambda_labs.conftest import settings_for


class TestLambdaContract(ProviderContract):
    provider = "lambda_labs"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "A10", "gpu_count": 1, "region": "us-east-1"}
    settle_timeout = 20.0
    boot_timeout = 120.0

    @pytest.fixture(autouse=True)
    def _cloud(self, lambda_cloud: LambdaCloud, lambda_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cloud = lambda_cloud
        monkeypatch.setattr(levers9_lambda_labs.plugin.pacer, "interval_s", 0.0)

    @pytest.fixture
    def pool_settings(self, lambda_cloud: LambdaCloud) -> dict[str, Any]:
        return settings_for(lambda_cloud)

    @pytest.fixture
    def failing_pool_settings(self, lambda_cloud: LambdaCloud) -> dict[str, Any]:
        return settings_for(lambda_cloud, ssh_key_names=["no-such-key"])

    @pytest.fixture
    def capacity_pool_settings(self, lambda_cloud: LambdaCloud) -> dict[str, Any] | None:
        lambda_cloud.set_capacity("gpu_1x_a10", ["us-west-2"])
        return settings_for(lambda_cloud)

    # the launch names and tags the instance in one call: nothing is created when it fails
    one_step_start = True
    zonal = False  # Lambda places by region only: its offers name no zone

    def user_data(self, machine: Machine) -> str:
        return self.cloud.instance(machine.provider_id).user_data

    def cloud_instances(self) -> dict[str, str | None]:
        return {i.id: i.tags.get("levers9:machine-id") for i in self.cloud.instances() if not i.gone}

    def preempt(self, machine: Machine) -> None:
        self.cloud.set_status(machine.provider_id, "preempted")

    def fail(self, machine: Machine) -> None:
        self.cloud.set_status(machine.provider_id, "unhealthy")
