"""The levers9 provider contract, run against the installed ``ec2`` plugin and the fake EC2 (moto + fault proxy).

* working settings: the fake's endpoint, made-up keys in two environment
  variables the settings name, an AMI moto knows; the pool asks for 8 H100 in
  us-east-1, which moto's catalog sells as p5.48xlarge in every zone;
* "the bootstrap boots": the user data is read back from the fake
  (``DescribeInstanceAttribute userData``, as a machine's metadata service
  would serve it) and booted by the kit's emulated boot, with the fake
  metadata service (:mod:`tests.fakes.imds`) the worker fetches the instance's
  signed identity document from; the pool verifies it with that fake's
  certificate, and the kit checks the binding;
* failing settings: an AMI moto does not have (``InvalidAMIID.NotFound``,
  :class:`InvalidRequest`);
* no capacity: the pool is limited to us-east-1b, where the fake answers every
  RunInstances with ``InsufficientInstanceCapacity`` (HTTP 500).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from levers9.hooks.types import Machine
from levers9.testing import BootPlatform, ProviderContract
from tests.fakes.ec2_cloud import FakeEc2
from tests.fakes.imds import FakeImds

FULL_ZONE = "us-east-1b"


class TestEc2Contract(ProviderContract):
    provider = "ec2"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "H100", "gpu_count": 8, "region": "us-east-1"}
    settle_timeout = 30.0

    @pytest.fixture(autouse=True)
    def _fake(self, fake_ec2: FakeEc2) -> None:
        self.fake = fake_ec2

    @pytest.fixture
    def pool_settings(self, ec2_settings: dict[str, Any]) -> dict[str, Any]:
        return ec2_settings

    @pytest.fixture
    def failing_pool_settings(self, ec2_settings: dict[str, Any]) -> dict[str, Any]:
        return {**ec2_settings, "ami": "ami-0badbadbadbadbad0"}

    @pytest.fixture
    def capacity_pool_settings(self, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> Iterator[dict[str, Any]]:
        fake_ec2.fail_run_instances("InsufficientInstanceCapacity", zone=FULL_ZONE)
        yield {**ec2_settings, "availability_zones": [FULL_ZONE]}
        fake_ec2.clear_faults()

    @pytest.fixture(autouse=True)
    def _imds(self, tmp_path: Path) -> Iterator[None]:
        self.imds = FakeImds(tmp_path)
        yield
        self.imds.close()

    @pytest.fixture
    def boot_pool_settings(self, ec2_settings: dict[str, Any]) -> dict[str, Any]:
        return {**ec2_settings, "identity_certificate_file": str(self.imds.certificate_file)}

    # RunInstances starts and tags the instance (TagSpecifications) in one call: nothing is created when it fails
    one_step_start = True

    def user_data(self, machine: Machine) -> str:
        return self.fake.user_data(machine.provider_id, machine.region or "us-east-1")

    def cloud_instances(self) -> dict[str, str | None]:
        return {i.id: i.tags.get("levers9:machine-id") for i in self.fake.instances() if not i.gone}

    def preempt(self, machine: Machine) -> None:
        pytest.skip(
            "the pool's instances are on-demand, and the fake EC2 (moto) cannot interrupt a spot instance "
            "(no Server.SpotInstanceTermination state reason); tests/plugins/ec2 checks the mapping of EC2's answers"
        )

    def fail(self, machine: Machine) -> None:
        self.fake.stop_instance(machine.provider_id, machine.region or "us-east-1")  # stopped: it will not run

    def boot_platform(self, machine: Machine) -> BootPlatform:
        """The instance's metadata service, for the identity document its worker shows at Register."""
        [instance] = [i for i in self.fake.instances() if i.id == machine.provider_id]
        return BootPlatform(environment=self.imds.platform(instance), ports=(self.imds.port,))
