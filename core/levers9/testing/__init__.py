"""Test helpers for plugin authors: the provider contract suite, its stand-in controlplane and emulated boot.

Usage, in a provider distribution's tests: settings are pytest fixtures (so
they can use ``tmp_path``, or a fake API server another fixture starts), not
class attributes. This is ``examples/provider-example``'s, as it runs::

    from collections.abc import Iterator
    from contextlib import contextmanager
    from pathlib import Path
    from typing import Any, ClassVar

    import pytest

    from levers9.hooks.types import Machine
    from levers9.testing import ProviderContract
    from levers9_toycloud import cloud, user_data_of


    class TestToyCloud(ProviderContract):
        provider = "toycloud"  # the entry-point name
        pool_fields: ClassVar[dict[str, Any]] = {"gpu": "T4"}  # pool fields besides settings

        @pytest.fixture(autouse=True)
        def toy_cloud(self, tmp_path: Path) -> None:
            self.state_dir = tmp_path / "cloud"  # this toy cloud's API is a directory

        @pytest.fixture
        def pool_settings(self) -> dict[str, Any]:
            # settings under which provisioning works: two T4 machines in each of two zones
            return {"state_dir": str(self.state_dir), "capacity": {"T4": 2}, "zones": ["a", "b"]}

        @pytest.fixture
        def failing_pool_settings(self, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
            # settings under which provisioning fails with a typed error (a rejected API key)
            monkeypatch.setenv("TOYCLOUD_KEY", "revoked")
            return {"state_dir": str(self.state_dir), "capacity": {"T4": 2}, "api_key_env": "TOYCLOUD_KEY"}

        @pytest.fixture
        def capacity_pool_settings(self) -> dict[str, Any] | None:
            # settings under which there is no capacity: InsufficientCapacity (None: it never runs out)
            return {"state_dir": str(self.state_dir), "capacity": {"T4": 0}}

        def user_data(self, machine: Machine) -> str:
            # the user data the plugin passed to the machine, as the cloud reports it
            return user_data_of(self.state_dir, machine)

        # what the fake cloud does from its own side, for the checks of failures and interruptions

        def cloud_instances(self) -> dict[str, str | None]:
            # every instance the cloud holds alive, read from the cloud (not the plugin), with its machine-id tag
            alive = ("pending", "running")
            records = cloud.instances(self.state_dir)
            return {r["id"]: r["tags"].get("levers9:machine-id") for r in records if r["state"] in alive}

        @contextmanager
        def fail_after_create(self) -> Iterator[None]:
            # the cloud fails the step after creating an instance (here: tagging it)
            with cloud.inject_fault(self.state_dir, "tag"):
                yield

        def preempt(self, machine: Machine) -> None:
            cloud.set_state(self.state_dir, machine.provider_id, "interrupted")  # a spot interruption

        def fail(self, machine: Machine) -> None:
            cloud.set_state(self.state_dir, machine.provider_id, "error")  # a host fault

A provider that runs the worker itself sets ``boots_itself = True`` instead of
overriding ``user_data``; one whose platform never interrupts machines, has no
failed state, starts a machine in one call or has no zones says so with
``preemptible = False``, ``machines_can_fail = False``, ``one_step_start =
True`` or ``zonal = False`` instead of the matching override. Every test of the suite then runs against the
installed plugin, loaded through the real plugin manager exactly as the
controlplane loads it; see :mod:`levers9.testing.provider_contract` for the
promises it checks, :mod:`levers9.testing.registrar`,
:mod:`levers9.testing.contract_boot` and :mod:`levers9.testing.boot` for how
the bootstrap is booted and judged, and
:mod:`levers9.testing.cloud_boot` for booting every instance a fake cloud
API runs (an end-to-end test's stand-in for the cloud's hypervisor). A
provider that binds join tokens to machines also overrides ``boot_platform``
to give the boot what its worker proves the machine with (a fake metadata
service's address and port).

For a whole end-to-end test (your plugin inside a real ``levers9 up``, its
machines booted, a call run on one): :class:`~levers9.testing.up.Levers9Up`
starts levers9; :class:`~levers9.testing.cloud_boot.CloudBooter` boots your
fake cloud's instances (its ``wait_for`` raises
:class:`~levers9.testing.cloud_boot.BootFailed` the moment a boot fails);
:func:`~levers9.testing.recorded_gpus.nvidia_smi` gives a machine's GPUs as
``nvidia-smi`` prints them, for every NVIDIA type of the catalog (and
:func:`~levers9.testing.boot.install_nvidia_smi` an ``nvidia-smi`` that prints
them, for a process of your own test); and
:class:`~levers9.testing.fake_cloud.FakeCloud` keeps the instances and faults
your wire fake serves. docs/plugins.md §11, "Booting your machines end to
end", has a complete example.
"""

from levers9.testing.boot import BootError, EmulatedBoot, emulated_boot, install_nvidia_smi
from levers9.testing.cloud_boot import BootFailed, CloudBooter
from levers9.testing.contract_boot import BootPlatform
from levers9.testing.fake_cloud import FakeCloud, FakeCloudError, FakeInstance
from levers9.testing.provider_contract import ProviderContract
from levers9.testing.recorded_gpus import nvidia_smi, recorded_card
from levers9.testing.registrar import Registrar, Registration
from levers9.testing.up import Levers9Up, Levers9UpFailed

__all__ = [
    "BootError",
    "BootFailed",
    "BootPlatform",
    "CloudBooter",
    "EmulatedBoot",
    "FakeCloud",
    "FakeCloudError",
    "FakeInstance",
    "Levers9Up",
    "Levers9UpFailed",
    "ProviderContract",
    "Registrar",
    "Registration",
    "emulated_boot",
    "install_nvidia_smi",
    "nvidia_smi",
    "recorded_card",
]
