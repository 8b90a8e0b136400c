"""The contract suite must fail, clearly, against providers that break the contract.

Each broken provider below breaks one promise; the suite is run on it in a
separate pytest session and must fail exactly the kit tests that
promise covers (for a defect every listing or provisioning trips on, all of
them), each with a message that says what to fix. A well-behaved in-memory
provider, whose user data is :func:`levers9.bootstrap.shell_script`, passes
every test, the boot check included: a real ``levers9 worker`` registers with
the kit's stand-in controlplane. The same provider with a contract class that
leaves out the overrides of the fake's side fails the checks needing them,
naming the method; one that declares those checks off (``preemptible`` and
the like) has them skipped, naming the declaration.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

import levers9.testing
from tests.testing.kit_session import KIT_TESTS, Outcome, run_session

HEADER = '''
from __future__ import annotations
import contextlib
import uuid
import pytest
from pydantic import BaseModel, ConfigDict
from levers9.bootstrap import shell_script
from levers9.hooks.errors import AuthenticationFailed, InsufficientCapacity, ProviderError, QuotaExceeded
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import GpuOffer, Machine, MachineState
from levers9.testing import ProviderContract

class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fail: bool = False
    full: bool = False

class Cloud:
    """A provider in memory; subclasses break one promise each. It lists terminated machines as terminated."""
    def __init__(self):
        self.machines = {}
        self.user_data = {}
        self.fail_tagging = False  # the kit's fail_after_create: the step after the create fails
    def levers9_provider_settings(self):
        return Settings
    def levers9_gpu_offers(self, pool):
        return [GpuOffer(gpu="T4", gpu_count=1, gpu_memory_mib=15360, zone="z1")]
    def levers9_provision(self, request):
        if request.pool.settings.fail:
            raise AuthenticationFailed("key rejected")
        if request.pool.settings.full:
            raise InsufficientCapacity("none left in z1")
        for known in self.machines.values():
            if known.machine_id == request.machine_id and known.state is not MachineState.TERMINATED:
                return known
        zone = request.offer.zone if request.offer else "z1"
        m = Machine(provider_id=f"i-{uuid.uuid4().hex[:6]}", machine_id=request.machine_id, pool=request.pool.name,
                    state=MachineState.RUNNING, zone=zone, provider_data={"zone": zone})
        if self.fail_tagging:  # created, then the next step failed: nothing may stay
            raise ProviderError("tagging failed; the instance was terminated")
        self.machines[m.provider_id] = m
        self.user_data[m.provider_id] = self.boot(request.bootstrap)
        return m
    def boot(self, bootstrap):
        return shell_script(bootstrap)
    def levers9_terminate(self, pool, machine):
        known = self.machines.get(machine.provider_id)
        if known is not None:
            self.machines[machine.provider_id] = known.model_copy(update={"state": MachineState.TERMINATED})
    def levers9_list_machines(self, pool):
        return [m for m in self.machines.values() if m.pool == pool.name]

def suite(plugin):
    class Suite(ProviderContract):
        provider = "broken"
        settle_timeout = 1.0
        poll_interval = 0.05
        boot_timeout = 60.0
        @pytest.fixture
        def levers9_plugin_set(self):
            plugins = PluginSet(PluginPolicy())
            plugins.load_entry_points()
            plugins.add("broken", plugin)
            return plugins
        @pytest.fixture
        def failing_pool_settings(self):
            return {"fail": True}
        @pytest.fixture
        def capacity_pool_settings(self):
            return {"full": True}
        def user_data(self, machine):
            return plugin.user_data[machine.provider_id]
        def cloud_instances(self):
            ended = (MachineState.TERMINATED, MachineState.PREEMPTED, MachineState.FAILED)
            return {i: m.machine_id for i, m in plugin.machines.items() if m.state not in ended}
        @contextlib.contextmanager
        def fail_after_create(self):
            plugin.fail_tagging = True
            try:
                yield
            finally:
                plugin.fail_tagging = False
        def preempt(self, machine):
            plugin.machines[machine.provider_id] = plugin.machines[machine.provider_id].model_copy(
                update={"state": MachineState.PREEMPTED})
        def fail(self, machine):
            plugin.machines[machine.provider_id] = plugin.machines[machine.provider_id].model_copy(
                update={"state": MachineState.FAILED})
    return Suite
'''

ALL_TESTS = KIT_TESTS
#: the tests that provision a machine successfully and then read the listing
PROVISIONING_AND_LISTING = {
    "test_hooks_return_levers9_types",
    "test_provisioned_machine_is_listed_with_its_id",
    "test_terminated_machine_leaves_the_listing",
    "test_provider_data_round_trip",
    "test_listing_is_limited_to_the_pool",
    "test_no_secret_in_provider_data_listing_or_log",
    "test_the_offers_zone_is_started",
    "test_provisioning_twice_gives_one_machine",
    "test_a_preempted_machine_is_listed_preempted",
    "test_a_failed_machine_is_listed_failed",
}
#: the tests that read a listing with machines in it (the failed start's listing is empty)
LISTING = PROVISIONING_AND_LISTING
#: the tests that provision a machine successfully
PROVISIONING = PROVISIONING_AND_LISTING | {"test_terminate_is_idempotent", "test_the_bootstrap_boots"}
STILL_LISTED = {"test_terminated_machine_leaves_the_listing", "test_provider_data_round_trip"}

#: broken provider -> (its code, the kit tests that must fail, the message each failure shows: '*' separates
#: parts that must each appear)
CASES: dict[str, tuple[str, set[str], str]] = {
    "terminate_not_idempotent": (
        """
class Broken(Cloud):
    def levers9_terminate(self, pool, machine):
        del self.machines[machine.provider_id]
""",
        {"test_terminate_is_idempotent", "test_terminating_an_unknown_machine_succeeds"},
        "must succeed",
    ),
    "terminate_unknown_raises": (
        """
class Broken(Cloud):
    def levers9_terminate(self, pool, machine):
        if machine.provider_id not in self.machines:
            raise RuntimeError(f"InvalidInstanceID.NotFound: {machine.provider_id}")
        super().levers9_terminate(pool, machine)
""",
        {"test_terminating_an_unknown_machine_succeeds"},
        "terminating a machine it does not know",
    ),
    "forgets_machine_id": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        return super().levers9_provision(request).model_copy(update={"machine_id": None})
""",
        {"test_provisioned_machine_is_listed_with_its_id"},
        "must carry request.machine_id",
    ),
    "terminate_does_nothing": (
        """
class Broken(Cloud):
    def levers9_terminate(self, pool, machine):
        pass
""",
        STILL_LISTED,
        "is still listed as running",
    ),
    "lists_terminated_as_running": (
        """
class Broken(Cloud):
    def levers9_list_machines(self, pool):
        return [
            m.model_copy(update={"state": MachineState.RUNNING}) if m.state is MachineState.TERMINATED else m
            for m in super().levers9_list_machines(pool)
        ]
""",
        STILL_LISTED,
        "leave terminated machines out of levers9_list_machines or report them 'terminated'",
    ),
    "lists_every_pool": (
        """
class Broken(Cloud):
    def levers9_list_machines(self, pool):
        return [m.model_copy(update={"pool": pool.name}) for m in self.machines.values()]
""",
        {"test_listing_is_limited_to_the_pool"},
        "was listed for pool",
    ),
    "drops_provider_data": (
        """
class Broken(Cloud):
    def levers9_list_machines(self, pool):
        return [m.model_copy(update={"provider_data": {}}) for m in super().levers9_list_machines(pool)]
""",
        {"test_provider_data_round_trip"},
        "without the provider_data keys ['zone']",
    ),
    "untyped_failure": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        if request.pool.settings.fail:
            raise RuntimeError("HTTP 500 from the API")
        return super().levers9_provision(request)
""",
        {"test_failures_are_typed_errors"},
        "failed with an untyped error",
    ),
    "no_capacity_as_quota": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        if request.pool.settings.full:
            raise QuotaExceeded("no T4 left")
        return super().levers9_provision(request)
""",
        {"test_no_capacity_is_insufficient_capacity"},
        "raised QuotaExceeded ([broken] no T4 left); raise levers9.hooks.errors.InsufficientCapacity",
    ),
    "no_capacity_as_provider_error": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        if request.pool.settings.full:
            raise ProviderError("no T4 left")
        return super().levers9_provision(request)
""",
        {"test_no_capacity_is_insufficient_capacity"},
        "raised ProviderError ([broken] no T4 left); raise levers9.hooks.errors.InsufficientCapacity",
    ),
    "offers_wrong_memory": (
        """
class Broken(Cloud):
    def levers9_gpu_offers(self, pool):
        return [GpuOffer(gpu="T4", gpu_count=1, gpu_memory_mib=1024, zone="z1")]
""",
        {"test_gpu_offers_are_well_formed"},
        "the catalog says",
    ),
    "offers_dicts": (
        """
class Broken(Cloud):
    def levers9_gpu_offers(self, pool):
        return [{"gpu": "T4", "gpu_count": 1, "gpu_memory_mib": 15360}]
""",
        {"test_gpu_offers_are_well_formed", "test_hooks_return_levers9_types", "test_the_offers_zone_is_started"},
        "levers9_gpu_offers returned list[dict]*return levers9.hooks.types.GpuOffer",
    ),
    "machines_dicts": (
        """
class Broken(Cloud):
    def levers9_list_machines(self, pool):
        return [m.model_dump() for m in super().levers9_list_machines(pool)]
""",
        LISTING,
        "levers9_list_machines returned list[dict]*return levers9.hooks.types.Machine",
    ),
    "provision_dict": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        return super().levers9_provision(request).model_dump()
""",
        PROVISIONING,
        "levers9_provision returned dict*return levers9.hooks.types.Machine",
    ),
    "permissive_settings": (
        """
class Loose(BaseModel):
    fail: bool = False
    full: bool = False
class Broken(Cloud):
    def levers9_provider_settings(self):
        return Loose
""",
        {"test_settings_schema_forbids_unknown_keys"},
        "must set extra='forbid'",
    ),
    "user_data_starts_nothing": (
        """
class Broken(Cloud):
    def boot(self, bootstrap):
        return "#!/bin/sh\\necho booted, but no worker\\n"
""",
        {"test_the_bootstrap_boots"},
        "no worker registered with the controlplane of request.bootstrap",
    ),
    "user_data_wrong_token": (
        """
class Broken(Cloud):
    def boot(self, bootstrap):
        return shell_script(bootstrap.model_copy(update={"token": "a-token-of-another-machine"}))
""",
        {"test_the_bootstrap_boots"},
        "a worker registered, but not with the bootstrap's machine id",
    ),
}

#: a correct provider whose contract class leaves the kit's overrides of the fake's side out
NO_OVERRIDES = """
class TestNoOverrides(suite(Cloud())):
    cloud_instances = ProviderContract.cloud_instances
    fail_after_create = ProviderContract.fail_after_create
    preempt = ProviderContract.preempt
    fail = ProviderContract.fail
"""
#: the checks each override serves, and the method each failure must name
NEEDS_OVERRIDE = {
    "test_a_failed_start_leaves_nothing_behind": "does not override cloud_instances()",
    "test_provisioning_twice_gives_one_machine": "does not override cloud_instances()",
    "test_a_preempted_machine_is_listed_preempted": "does not override preempt(machine)",
    "test_a_failed_machine_is_listed_failed": "does not override fail(machine)",
}
#: a correct provider whose contract class declares the platform's checks off
DECLARED = """
class TestDeclared(suite(Cloud())):
    preemptible = False
    machines_can_fail = False
    one_step_start = True
    zonal = False
"""
#: the checks the declarations skip, and what each skip must say
DECLARED_OFF = {
    "test_a_failed_start_leaves_nothing_behind": "declares one_step_start = True",
    "test_the_offers_zone_is_started": "declares zonal = False",
    "test_a_preempted_machine_is_listed_preempted": "declares preemptible = False",
    "test_a_failed_machine_is_listed_failed": "declares machines_can_fail = False",
}


@pytest.fixture(scope="module")
def kit_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Outcome]]:
    """Run the suite once, in one separate pytest session, on every provider below; outcomes by module and test.

    One session for all (rather than a pytester run per case) because starting pytest with this
    environment's plugins costs far more than the suite itself.
    """
    where = tmp_path_factory.mktemp("kit")
    (where / "test_ok.py").write_text(HEADER + "\nTestOk = suite(Cloud())\n")
    for case, (body, _, _) in CASES.items():
        (where / f"test_{case}.py").write_text(HEADER + textwrap.dedent(body) + "\nTestBroken = suite(Broken())\n")
    (where / "test_no_overrides.py").write_text(HEADER + NO_OVERRIDES)
    (where / "test_declared.py").write_text(HEADER + DECLARED)
    (where / "test_missing.py").write_text(
        "from levers9.testing import ProviderContract\n"
        "class TestMissing(ProviderContract):\n"
        "    provider = 'nosuchcloud'\n"
    )
    if importlib.util.find_spec("levers9_toycloud") is not None:
        (where / "test_documented.py").write_text(documented_example())
    return run_session(where, spread="auto", timeout=1800)


def documented_example() -> str:
    """The code block of ``levers9.testing``'s docstring, as it is written there."""
    doc = levers9.testing.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith(" "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def test_a_correct_provider_passes(kit_run: dict[str, dict[str, Outcome]]) -> None:
    outcomes = kit_run["test_ok"]
    assert set(outcomes) == ALL_TESTS
    failed = {test: text for test, (outcome, text) in outcomes.items() if outcome != "passed"}
    assert not failed, failed


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_provider_fails_the_matching_tests(kit_run: dict[str, dict[str, Outcome]], case: str) -> None:
    _, failing, message = CASES[case]
    outcomes = kit_run[f"test_{case}"]
    assert set(outcomes) == ALL_TESTS
    assert {test for test, (outcome, _) in outcomes.items() if outcome != "passed"} == failing, outcomes
    for test in failing:  # each failure says what to fix
        outcome, text = outcomes[test]
        assert outcome == "failed", f"{test}: {outcome}, not a failure:\n{text}"
        missing = [part for part in message.split("*") if part not in text]
        assert not missing, f"{test}: {missing} not in\n{text}"


def test_a_missing_override_fails_naming_the_method(kit_run: dict[str, dict[str, Outcome]]) -> None:
    outcomes = kit_run["test_no_overrides"]
    assert set(outcomes) == ALL_TESTS
    assert {test for test, (outcome, _) in outcomes.items() if outcome != "passed"} == set(NEEDS_OVERRIDE), outcomes
    for test, named in NEEDS_OVERRIDE.items():
        outcome, text = outcomes[test]
        assert (outcome, named in text) == ("failed", True), (test, text)


def test_a_declared_off_check_is_skipped_naming_the_declaration(kit_run: dict[str, dict[str, Outcome]]) -> None:
    outcomes = kit_run["test_declared"]
    assert set(outcomes) == ALL_TESTS
    assert {test for test, (outcome, _) in outcomes.items() if outcome != "passed"} == set(DECLARED_OFF), outcomes
    for test, declared in DECLARED_OFF.items():
        outcome, text = outcomes[test]
        assert (outcome, declared in text) == ("skipped", True), (test, text)


def test_missing_provider_is_a_clear_failure(kit_run: dict[str, dict[str, Outcome]]) -> None:
    outcomes = kit_run["test_missing"]
    assert set(outcomes) == ALL_TESTS
    for test, (outcome, text) in outcomes.items():
        assert outcome == "error", (test, text)
        assert "provider plugin 'nosuchcloud' is not installed" in text, (test, text)


def test_the_documented_example_works_as_written(kit_run: dict[str, dict[str, Outcome]]) -> None:
    """The example in ``levers9.testing``'s docstring, copied as it is, passes against the example provider."""
    if "test_documented" not in kit_run:
        pytest.skip("examples/provider-example (levers9_toycloud) is not installed")
    outcomes = kit_run["test_documented"]
    assert set(outcomes) == ALL_TESTS
    failed = {test: text for test, (outcome, text) in outcomes.items() if outcome != "passed"}
    assert not failed, failed
