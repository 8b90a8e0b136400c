"""The levers9 provider contract, run against the installed ``oci`` plugin and a fake OCI region over HTTP.

The plugin runs the real ``oci`` SDK, signing with the test's key, against
:class:`tests.fakes.oci_cloud.FakeOci` (``service_endpoint``): GPU pools of one
A10 (``VM.GPU.A10.1`` of the recorded shapes) in us-ashburn-1, two
availability domains.

* failing settings: an image the fake does not know; LaunchInstance answers
  400 ``RelatedResourceNotAuthorizedOrNotFound``, which must be a typed error;
* no capacity: the pool may use only AD-2, where the fake's capacity report
  says ``OUT_OF_HOST_CAPACITY`` and launches answer 500 ``InternalError``
  "Out of host capacity.";
* the bootstrap boots: :meth:`TestOciContract.user_data` reads the instance
  back with the SDK's own ``get_instance`` and base64-decodes
  ``metadata["user_data"]``, which the kit boots in an emulated boot.
"""

from __future__ import annotations

import base64
from typing import Any, ClassVar

import pytest

from levers9.hooks.errors import InvalidRequest
from levers9.hooks.facade import Hooks
from levers9.hooks.types import Machine
from levers9.testing import ProviderContract
from levers9.testing.provider_contract import run
from tests.fakes.oci_cloud import FakeOci
from tests.fakes.oci_tenancy import AD2, REGION, UNKNOWN_IMAGE


class TestOciContract(ProviderContract):
    provider = "oci"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "A10", "gpu_count": 1, "region": REGION}
    settle_timeout = 20.0
    boot_timeout = 120.0

    @pytest.fixture(autouse=True)
    def _fake(self, fake_oci: FakeOci, sdk_compute: Any) -> None:
        self.fake = fake_oci
        self.compute = sdk_compute

    @pytest.fixture
    def pool_settings(self, oci_settings: dict[str, Any]) -> dict[str, Any]:
        return oci_settings

    @pytest.fixture
    def failing_pool_settings(self, oci_settings: dict[str, Any]) -> dict[str, Any]:
        return {**oci_settings, "image_id": UNKNOWN_IMAGE}

    @pytest.fixture
    def capacity_pool_settings(self, oci_settings: dict[str, Any], fake_oci: FakeOci) -> dict[str, Any]:
        fake_oci.capacity(None, AD2, "OUT_OF_HOST_CAPACITY")
        return {**oci_settings, "availability_domains": [AD2]}

    # LaunchInstance starts and tags the instance (freeform tags) in one call: nothing is created when it fails
    one_step_start = True

    def user_data(self, machine: Machine) -> str:
        metadata = self.compute.get_instance(machine.provider_id).data.metadata
        return base64.b64decode(metadata["user_data"]).decode()

    def cloud_instances(self) -> dict[str, str | None]:
        return {i.id: i.tags.get("levers9-machine-id") for i in self.fake.instances() if not i.gone}

    def preempt(self, machine: Machine) -> None:
        pytest.skip(
            "the pool's instances are not preemptible, and OCI reports a preempted instance only as TERMINATED, "
            "which the listing cannot tell from a termination"
        )

    def fail(self, machine: Machine) -> None:
        self.fake.set_state(machine.provider_id, "STOPPED")  # stopped without levers9 asking: it will not run

    # ---------------------------------------------------------------------- the set-up's own promises

    def test_failing_settings_fail_for_the_unknown_image(
        self, levers9_hooks: Hooks, failing_pool_settings: dict[str, Any]
    ) -> None:
        pool = self._pool(levers9_hooks, failing_pool_settings, self.pool_name("fail"))
        with pytest.raises(InvalidRequest) as caught:
            run(levers9_hooks.provision(self.request(levers9_hooks, pool)))
        assert caught.value.code == "RelatedResourceNotAuthorizedOrNotFound"
        assert pool.name in str(caught.value)
        assert not self.fake.instances()
