"""The contract suite must fail, clearly, against providers that break the contract.

Each broken provider below breaks one promise; the suite is run on it in a
separate pytest session (pytester) and must fail exactly the matching test
with a message that says what is wrong.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

HEADER = '''
from __future__ import annotations
import itertools, uuid
import pytest
from pydantic import BaseModel, ConfigDict
from levers9.hooks.errors import InsufficientCapacity
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import GpuOffer, Machine
from levers9.testing import ProviderContract

class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fail: bool = False

class Cloud:
    """A provider in memory; subclasses break one promise each."""
    def __init__(self):
        self.machines = {}
    def levers9_provider_settings(self):
        return Settings
    def levers9_gpu_offers(self, pool):
        return [GpuOffer(gpu="T4", gpu_count=1, gpu_memory_mib=15360)]
    def levers9_provision(self, request):
        if request.pool.settings.fail:
            raise InsufficientCapacity("none left")
        m = Machine(provider_id=f"i-{uuid.uuid4().hex[:6]}", machine_id=request.machine_id, pool=request.pool.name)
        self.machines[m.provider_id] = m
        return m
    def levers9_terminate(self, pool, provider_id):
        self.machines.pop(provider_id, None)
    def levers9_list_machines(self, pool):
        return [m for m in self.machines.values() if m.pool == pool.name]

def suite(plugin):
    class Suite(ProviderContract):
        provider = "broken"
        settle_timeout = 1.0
        poll_interval = 0.05
        @pytest.fixture
        def levers9_plugin_set(self):
            plugins = PluginSet(PluginPolicy())
            plugins.load_entry_points()
            plugins.add("broken", plugin)
            return plugins
        @pytest.fixture
        def failing_pool_settings(self):
            return {"fail": True}
    return Suite
'''

CASES = {
    "terminate_not_idempotent": (
        """
class Broken(Cloud):
    def levers9_terminate(self, pool, provider_id):
        del self.machines[provider_id]
""",
        "test_terminate_is_idempotent",
        "terminating a machine twice must succeed",
    ),
    "forgets_machine_id": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        return super().levers9_provision(request).model_copy(update={"machine_id": None})
""",
        "test_provisioned_machine_is_listed_with_its_id",
        "must carry request.machine_id",
    ),
    "terminate_does_nothing": (
        """
class Broken(Cloud):
    def levers9_terminate(self, pool, provider_id):
        pass
""",
        "test_terminated_machine_leaves_the_listing",
        "is still listed as alive",
    ),
    "lists_every_pool": (
        """
class Broken(Cloud):
    def levers9_list_machines(self, pool):
        return [m.model_copy(update={"pool": pool.name}) for m in self.machines.values()]
""",
        "test_listing_is_limited_to_the_pool",
        "was listed for pool",
    ),
    "untyped_failure": (
        """
class Broken(Cloud):
    def levers9_provision(self, request):
        if request.pool.settings.fail:
            raise RuntimeError("HTTP 500 from the API")
        return super().levers9_provision(request)
""",
        "test_failures_are_typed_errors",
        "failed with an untyped error",
    ),
    "offers_wrong_memory": (
        """
class Broken(Cloud):
    def levers9_gpu_offers(self, pool):
        return [GpuOffer(gpu="T4", gpu_count=1, gpu_memory_mib=1024)]
""",
        "test_gpu_offers_are_well_formed",
        "the catalog says",
    ),
    "offers_dicts": (
        """
class Broken(Cloud):
    def levers9_gpu_offers(self, pool):
        return [{"gpu": "T4"}]
""",
        "test_gpu_offers_are_well_formed",
        "expected list[GpuOffer]",
    ),
    "permissive_settings": (
        """
class Loose(BaseModel):
    fail: bool = False
class Broken(Cloud):
    def levers9_provider_settings(self):
        return Loose
""",
        "test_settings_schema_forbids_unknown_keys",
        "must set extra='forbid'",
    ),
}


def test_a_correct_provider_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ok=HEADER + "\nTestOk = suite(Cloud())\n")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=7)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_provider_fails_the_matching_test(pytester: pytest.Pytester, case: str) -> None:
    body, failing_test, message = CASES[case]
    pytester.makepyfile(test_broken=HEADER + textwrap.dedent(body) + "\nTestBroken = suite(Broken())\n")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1, result.stdout.str()
    result.stdout.fnmatch_lines([f"FAILED *::TestBroken::{failing_test}*"])
    assert message in result.stdout.str()


def test_missing_provider_is_a_clear_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_missing="""
from levers9.testing import ProviderContract
class TestMissing(ProviderContract):
    provider = "nosuchcloud"
"""
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-k", "schema")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*provider plugin 'nosuchcloud' is not installed*"])
