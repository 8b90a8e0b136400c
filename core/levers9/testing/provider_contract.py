"""The provider contract: what the scheduler and reconciler rely on every provider to do.

Each test here is one promise the core depends on. A provider that passes can
be enabled in a pool and trusted not to leak machines: what it starts shows up
in its listing, terminating is idempotent, failures are the typed errors the
scheduler fails over on, and offers name canonical GPU types.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

from levers9.config.load import resolve
from levers9.config.model import Config
from levers9.config.yaml_source import SourceMap
from levers9.gpu.catalog import CATALOG
from levers9.hooks.errors import PluginError, ProviderError
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import GpuOffer, Machine, MachineState, Pool, ProvisionRequest, Resources

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    async def _wrap() -> T:
        return await awaitable

    return asyncio.run(_wrap())


class ProviderContract:
    """Subclass this in a test module; set ``provider`` and override the two settings fixtures.

    ``pool_settings`` returns the pool's ``settings:`` as they would appear in
    config; ``failing_pool_settings`` returns settings under which provisioning
    must fail with a typed provider error (bad credentials, no capacity).
    Both are fixtures so they can use ``tmp_path``, servers started by other
    fixtures, and so on.
    """

    #: the provider's entry-point name
    provider: ClassVar[str]
    #: pool fields besides settings: gpu, gpu_count, region, runtime...
    pool_fields: ClassVar[dict[str, Any]] = {}
    #: how long a provider may take for a machine to appear in or leave its listing
    settle_timeout: ClassVar[float] = 60.0
    poll_interval: ClassVar[float] = 0.2

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def pool_settings(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def failing_pool_settings(self) -> dict[str, Any]:
        pytest.fail(
            f"{type(self).__name__} does not override the failing_pool_settings fixture: return settings "
            "under which provisioning fails (bad credentials, no capacity), so the suite can check the error type"
        )

    @pytest.fixture
    def levers9_plugin_set(self) -> PluginSet:
        """The installed plugins, loaded the way the controlplane loads them. Override to add test plugins."""
        plugins = PluginSet(PluginPolicy.from_env())
        plugins.load_entry_points()
        return plugins

    @pytest.fixture
    def levers9_hooks(self, levers9_plugin_set: PluginSet) -> Iterator[Hooks]:
        record = levers9_plugin_set.records.get(self.provider)
        if record is None:
            installed = ", ".join(sorted(levers9_plugin_set.records)) or "none"
            pytest.fail(
                f"provider plugin {self.provider!r} is not installed (no entry point named {self.provider!r} "
                f"in group 'levers9'); installed: {installed}"
            )
        if record.status != "loaded":
            pytest.fail(f"provider plugin {self.provider!r} did not load: {record.error or record.status}")
        hooks = Hooks(levers9_plugin_set)
        yield hooks
        hooks.close()

    def _pool(self, hooks: Hooks, settings: dict[str, Any], name: str) -> Pool:
        config = Config.model_validate(
            {
                "pools": {
                    name: {"provider": self.provider, "runtime": "process", **self.pool_fields, "settings": settings}
                }
            }
        )
        pools, _ = resolve(config, SourceMap("<contract>"), hooks)
        return pools[name]

    @pytest.fixture
    def pool(self, levers9_hooks: Hooks, pool_settings: dict[str, Any]) -> Pool:
        return self._pool(levers9_hooks, pool_settings, f"contract-{uuid.uuid4().hex[:8]}")

    @pytest.fixture
    def provisioned(self, levers9_hooks: Hooks, pool: Pool) -> Iterator[Callable[[], Machine]]:
        """Provision machines for a test; whatever a test starts is terminated afterwards, even on failure."""
        started: list[str] = []

        def provision() -> Machine:
            machine = run(levers9_hooks.provision(self.request(pool)))
            started.append(machine.provider_id)
            return machine

        yield provision
        for provider_id in started:
            run(levers9_hooks.terminate(pool, provider_id))

    def request(self, pool: Pool) -> ProvisionRequest:
        return ProvisionRequest(
            pool=pool,
            resources=Resources(
                cpu_millicores=1000, memory_mib=1024, gpu=pool.gpu, gpu_count=pool.gpu_count if pool.gpu else 0
            ),
            machine_id=f"m-{uuid.uuid4().hex[:12]}",
            token=f"contract-{uuid.uuid4().hex}",
            controlplane_url="grpc://127.0.0.1:1993",
            region=pool.region,
        )

    def wait_until(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.settle_timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"provider {self.provider!r}: {what} within {self.settle_timeout:g} s")
            time.sleep(self.poll_interval)

    def listed(self, hooks: Hooks, pool: Pool) -> dict[str, Machine]:
        return {m.provider_id: m for m in run(hooks.list_machines(pool)) if m.state is not MachineState.TERMINATED}

    # ------------------------------------------------------------------ the contract

    def test_settings_schema_forbids_unknown_keys(self, levers9_hooks: Hooks) -> None:
        model = levers9_hooks.provider_settings_model(self.provider)
        extra = model.model_config.get("extra")
        assert extra == "forbid", (
            f"provider {self.provider!r}: its settings model {model.__name__} must set extra='forbid' "
            f"so a misspelled setting is an error, not ignored (it has extra={extra!r})"
        )

    def test_provisioned_machine_is_listed_with_its_id(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[[], Machine]
    ) -> None:
        machine = provisioned()
        assert machine.pool == pool.name
        assert machine.machine_id is not None, (
            f"provider {self.provider!r}: the machine returned by levers9_provision must carry "
            "request.machine_id (tag the machine with it)"
        )
        self.wait_until(
            f"machine {machine.provider_id} did not appear in levers9_list_machines",
            lambda: machine.provider_id in self.listed(levers9_hooks, pool),
        )
        listed = self.listed(levers9_hooks, pool)[machine.provider_id]
        assert listed.machine_id == machine.machine_id, (
            f"provider {self.provider!r}: the listing reports machine_id {listed.machine_id!r} for "
            f"{machine.provider_id}, but provisioning tagged it {machine.machine_id!r}"
        )

    def test_terminated_machine_leaves_the_listing(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[[], Machine]
    ) -> None:
        machine = provisioned()
        run(levers9_hooks.terminate(pool, machine.provider_id))
        self.wait_until(
            f"terminated machine {machine.provider_id} is still listed as alive",
            lambda: machine.provider_id not in self.listed(levers9_hooks, pool),
        )

    def test_terminate_is_idempotent(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[[], Machine]
    ) -> None:
        machine = provisioned()
        run(levers9_hooks.terminate(pool, machine.provider_id))
        try:
            run(levers9_hooks.terminate(pool, machine.provider_id))
        except Exception as exc:
            pytest.fail(f"provider {self.provider!r}: terminating a machine twice must succeed, it raised {exc!r}")

    def test_listing_is_limited_to_the_pool(
        self,
        levers9_hooks: Hooks,
        pool: Pool,
        provisioned: Callable[[], Machine],
        pool_settings: dict[str, Any],
    ) -> None:
        machine = provisioned()
        other = self._pool(levers9_hooks, pool_settings, f"contract-other-{uuid.uuid4().hex[:6]}")
        assert machine.provider_id not in self.listed(levers9_hooks, other), (
            f"provider {self.provider!r}: a machine of pool {pool.name!r} was listed for pool {other.name!r}; "
            "the reconciler of that pool would terminate it"
        )

    def test_gpu_offers_are_well_formed(self, levers9_hooks: Hooks, pool: Pool) -> None:
        try:
            offers = run(levers9_hooks.gpu_offers(pool))
        except PluginError as exc:
            pytest.fail(str(exc))
        for offer in offers:
            assert isinstance(offer, GpuOffer)
            assert offer.gpu in CATALOG
            expected = CATALOG[offer.gpu].memory_mib
            assert abs(offer.gpu_memory_mib - expected) <= expected * 0.1, (
                f"provider {self.provider!r}: offer {offer.instance_type or offer.gpu} says {offer.gpu} has "
                f"{offer.gpu_memory_mib} MiB per GPU; the catalog says {expected}"
            )
        if pool.gpu is not None:
            assert offers, f"provider {self.provider!r}: a pool with gpu {pool.gpu} got no GPU offers"
            assert all(o.gpu == pool.gpu for o in offers), (
                f"provider {self.provider!r}: pool asks for {pool.gpu}, offers name {sorted({o.gpu for o in offers})}"
            )

    def test_failures_are_typed_errors(self, levers9_hooks: Hooks, failing_pool_settings: dict[str, Any]) -> None:
        pool = self._pool(levers9_hooks, failing_pool_settings, f"contract-fail-{uuid.uuid4().hex[:6]}")
        error: ProviderError | None = None
        try:
            machine = run(levers9_hooks.provision(self.request(pool)))
        except ProviderError as exc:
            error = exc
        except PluginError as exc:
            pytest.fail(
                f"provider {self.provider!r} failed with an untyped error; raise one of levers9.hooks.errors "
                f"(InsufficientCapacity, QuotaExceeded, AuthenticationFailed, Throttled, InvalidRequest): {exc}"
            )
        if error is not None:
            assert error.plugin == self.provider
            return
        run(levers9_hooks.terminate(pool, machine.provider_id))
        pytest.fail(
            f"provider {self.provider!r}: provisioning with failing_pool_settings succeeded "
            f"(machine {machine.provider_id}, now terminated); it must raise a typed provider error"
        )
