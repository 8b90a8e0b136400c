"""The provider contract: what the scheduler and reconciler rely on every provider to do.

Each test here is one promise the core depends on, and each failure message
says what to fix. A provider that passes can be enabled in a pool and trusted
not to leak machines:

* every hook answers levers9's types (``levers9.hooks.types``), never dicts;
* what it starts shows up in its listing, tagged with levers9's machine id, and
  only in its own pool's listing;
* terminating is idempotent, also for an id it never knew; afterwards the
  machine leaves the listing or is listed ``terminated`` (never alive);
* ``provider_data`` makes the round trip: the kit terminates with the Machine
  ``levers9_provision`` returned, and the listing reports at least the
  provider_data keys provisioning returned (values may be refreshed, keys may
  be added, none dropped), because the reconciler terminates machines levers9
  lost track of from their listing alone;
* no capacity is ``InsufficientCapacity`` (the scheduler moves to the next
  offer at once), other failures are typed errors;
* offers name canonical GPU types with the memory of one GPU as the catalog
  has it (or as the driver shows it), within 1 %
  (:mod:`levers9.testing.contract_promises`), in the pool's regions;
* **the kit never provisions an unavailable offer**, as the planner never
  does: a test that needs a machine from the pool's settings fails, saying
  so, when every offer under them is ``unavailable`` (the capacity and
  failure checks take one as a stale cache would give it);
* **no secret leaves the bootstrap**: the join token is in no
  ``provider_data``, no listed Machine and no log record that reaches the root
  logger, at any level, while the kit provisions and lists;
* **a failed start leaves nothing behind**: when the step after creating the
  instance fails (:meth:`ProviderContract.fail_after_create`), provisioning
  raises a typed error and no instance of that machine id stays alive, in the
  listing or in the cloud itself (:meth:`ProviderContract.cloud_instances`);
* **the offer's zone is the zone started**, for offers in at least two zones
  where the offers have them;
* **provisioning is idempotent per machine id**: the same request twice gives
  the same machine, and one instance of it in the listing and in the cloud;
* **interrupted and broken machines are reported as such**: an instance the
  cloud takes back (:meth:`ProviderContract.preempt`) is listed
  ``preempted``, one that breaks (:meth:`ProviderContract.fail`) ``failed``,
  never alive;
* **the bootstrap boots**: given a :class:`~levers9.hooks.types.WorkerBootstrap`
  pointing at a stand-in controlplane (:mod:`levers9.testing.registrar`), a
  worker registers with exactly its token and machine id. A provider that runs
  the worker itself (``boots_itself = True``, like ``local``) is simply
  provisioned; any other returns the user data it passed from
  :meth:`ProviderContract.user_data`, and the kit boots it in an emulated boot
  (:mod:`levers9.testing.boot`) through the harness end-to-end tests boot a
  fake cloud's instances with (:class:`levers9.testing.cloud_boot.CloudBooter`).
  A container provider (``boots_containers = True``, a marketplace of pods)
  returns the container it started from :meth:`ProviderContract.container_spec`,
  and the kit runs it with real Docker (``levers9_docker_host``) from the worker
  image it gave the bootstrap (``levers9_worker_image``), the join token in
  ``secret_env`` only; a container that exits fails at once with its exit code
  and log tail; the listed machine must then say ``provider_data["reachable"]
  = False`` or list an address where the worker answers
  (:mod:`levers9.testing.container_boot`);
* where the provider binds join tokens to machines (``levers9_verify_identity``),
  the identity the booted worker showed verifies for its machine, and neither
  no identity nor that identity for another machine does
  (:meth:`ProviderContract.boot_platform` gives the boot a fake metadata
  service to fetch it from).

Hooks are called through the real plugin manager and the typed facade, as the
controlplane calls them, after the facade's ``startup`` (so a provider's
``levers9_startup`` runs first, with the agent hub of the ``levers9_agents``
fixture: None unless a subclass provides one) and before its ``shutdown``.

What a result means: a *failure* breaks a promise, names the provider (and the
hook) and says what to fix; an *error* at set-up means the subclass is not
complete (a settings fixture not overridden, the plugin not installed or not
loading) and says which; a *skip* is a check the subclass declared does not
apply (``capacity_pool_settings`` returning None; ``preemptible``,
``machines_can_fail`` or ``zonal`` set to False; ``one_step_start`` set to
True; or an override that skips, saying why its fake cannot do it). A check
that needs an override the subclass did not give fails naming the method to
override. The boot check waits ``boot_timeout`` rather than
``settle_timeout``: starting a worker takes longer than a listing takes to
settle.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

from levers9.bootstrap import BootstrapContainer
from levers9.config.load import resolve
from levers9.config.model import Config
from levers9.config.yaml_source import SourceMap
from levers9.gpu.catalog import CATALOG
from levers9.hooks.context import AgentHub
from levers9.hooks.errors import InsufficientCapacity, PluginError, ProviderError
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import (
    ENDED_STATES,
    Availability,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProvisionRequest,
    Resources,
    WorkerBootstrap,
)
from levers9.images.worker import default_tag
from levers9.testing.container_boot import boot_container, check_reachable, check_spec, worker_image
from levers9.testing.contract_boot import (
    BootPlatform,
    boot_user_data,
    check_identity_binds,
    check_registered,
    run,
)
from levers9.testing.contract_promises import captured_log, formatted, memory_problem
from levers9.testing.registrar import Registrar, Registration

T = TypeVar("T")

#: what each provider hook must return, named as a plugin author imports it
RETURNS = {
    "levers9_gpu_offers": "GpuOffer",
    "levers9_provision": "Machine",
    "levers9_list_machines": "Machine",
    "levers9_check": "ProviderCheck",
}


class ProviderContract:
    """Subclass this in a test module; set ``provider`` and override the settings fixtures.

    Fixtures to override (they may use ``tmp_path`` and servers other fixtures start):

    * ``pool_settings``: the pool's ``settings:`` as they would appear in config;
    * ``failing_pool_settings``: settings under which provisioning fails with a typed error;
    * ``capacity_pool_settings``: settings under which the provider has no capacity
      (return None for a provider that can never run out: the check is then skipped, saying so);
    * ``boot_pool_settings`` (optional, defaults to ``pool_settings``): settings under which a
      provisioned machine really starts ``levers9 worker`` (for ``boots_itself`` providers whose
      test settings run a stand-in worker).

    A provider that does not run the worker itself overrides :meth:`user_data`; one that starts containers
    (no user data) sets ``boots_containers = True`` and overrides :meth:`container_spec`, and may override
    the fixtures ``levers9_docker_host`` and ``levers9_worker_image``. Methods that act on the
    fake cloud from its side (the kit's checks of what happens when the cloud fails, interrupts or keeps
    something): :meth:`cloud_instances`, :meth:`fail_after_create`, :meth:`preempt` and :meth:`fail`;
    a check one of them cannot apply to is declared off with the ClassVar it names.
    """

    #: the provider's entry-point name
    provider: ClassVar[str]
    #: pool fields besides settings: gpu, gpu_count, region, regions, runtime...
    pool_fields: ClassVar[dict[str, Any]] = {}
    #: how long a provider may take for a machine to appear in or leave its listing
    settle_timeout: ClassVar[float] = 60.0
    poll_interval: ClassVar[float] = 0.2
    #: the provider starts the worker itself (a process, a container) rather than passing user data to a machine
    boots_itself: ClassVar[bool] = False
    #: how long a booted worker may take to register with the stand-in controlplane
    boot_timeout: ClassVar[float] = 120.0
    #: the platform takes machines back (spot, interruptible): False skips the preemption check, saying so
    preemptible: ClassVar[bool] = True
    #: the platform can put a machine in a state it never runs from: False skips the failed-machine check
    machines_can_fail: ClassVar[bool] = True
    #: starting a machine is one call that creates nothing when it fails (no tagging, waiting or attaching
    #: after the create): True skips the failed-start check, saying so
    one_step_start: ClassVar[bool] = False
    #: the provider's offers name zones: False skips the zone check, saying so
    zonal: ClassVar[bool] = True
    #: the provider starts containers, not machines with user data (a marketplace pod): the kit runs
    #: :meth:`container_spec` with real Docker (``levers9_docker_host``) and the worker image it gave the bootstrap
    boots_containers: ClassVar[bool] = False

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
    def capacity_pool_settings(self) -> dict[str, Any] | None:
        pytest.fail(
            f"{type(self).__name__} does not override the capacity_pool_settings fixture: return settings "
            "under which the provider has no capacity (a sold-out zone, a capacity of 0), or None if it can "
            "never run out"
        )

    @pytest.fixture
    def boot_pool_settings(self, pool_settings: dict[str, Any]) -> dict[str, Any]:
        return pool_settings

    @pytest.fixture
    def levers9_plugin_set(self) -> PluginSet:
        """The installed plugins, loaded the way the controlplane loads them. Override to add test plugins."""
        plugins = PluginSet(PluginPolicy.from_env())
        plugins.load_entry_points()
        return plugins

    @pytest.fixture
    def levers9_agents(self) -> AgentHub | None:
        """The agent hub the plugins' context carries; override for a provider whose machines are agents."""
        return None

    @pytest.fixture
    def levers9_agents_loop(self) -> asyncio.AbstractEventLoop | None:
        """The running event loop (on another thread) that ``levers9_agents`` lives on; None: no hub.

        The plugins start and stop on it, so their context's ``send_order`` reaches the hub on its own loop.
        """
        return None

    def pool_name(self, role: str) -> str:
        """The name of a pool the kit makes: ``role`` is ``main``, ``other`` (one the provider must not list
        with the main pool's machines), ``fail``, ``full`` or ``boot``. Override for a provider that serves
        only pools it was set up for (agents join one pool by name); keep ``other`` distinct."""
        return f"contract-{role}-{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def levers9_hooks(
        self,
        levers9_plugin_set: PluginSet,
        levers9_agents: AgentHub | None,
        levers9_agents_loop: asyncio.AbstractEventLoop | None,
    ) -> Iterator[Hooks]:
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

        def on_loop(awaitable: Coroutine[Any, Any, None]) -> None:
            if levers9_agents_loop is None:
                run(awaitable)
            else:
                asyncio.run_coroutine_threadsafe(awaitable, levers9_agents_loop).result(60)

        on_loop(hooks.startup(agents=levers9_agents))
        yield hooks
        on_loop(hooks.shutdown())

    @pytest.fixture
    def pool(self, levers9_hooks: Hooks, pool_settings: dict[str, Any]) -> Pool:
        return self._pool(levers9_hooks, pool_settings, self.pool_name("main"))

    @pytest.fixture
    def provisioned(self, levers9_hooks: Hooks, pool: Pool) -> Iterator[Callable[..., Machine]]:
        """``provision(request=None)``: start a machine; whatever a test starts is terminated afterwards."""
        started: list[tuple[Pool, Machine]] = []

        def provision(request: ProvisionRequest | None = None) -> Machine:
            request = request or self.request(levers9_hooks, pool)
            machine = self.call("levers9_provision", levers9_hooks.provision(request))
            started.append((request.pool, machine))
            return machine

        yield provision
        for where, machine in started:
            # best effort: terminate's own promises are checked by their own tests, not in every teardown
            with contextlib.suppress(Exception):
                run(levers9_hooks.terminate(where, machine))

    @pytest.fixture
    def standin_controlplane(self) -> Iterator[Registrar]:
        """A real gRPC server on 127.0.0.1 that answers ``Register`` and records who registered."""
        with Registrar() as registrar:
            yield registrar

    # ------------------------------------------------------------------ helpers a subclass may use or override

    def user_data(self, machine: Machine) -> str:
        """The user data the provider passed to ``machine`` (read back as a cloud's instance metadata would say)."""
        pytest.fail(
            f"{type(self).__name__} neither sets boots_itself = True nor overrides user_data(machine): return "
            "the user data the provider passed for the machine, so the kit can boot it"
        )

    def container_spec(self, machine: Machine) -> BootstrapContainer:
        """The container the provider started for ``machine`` (``boots_containers``): its image, command, env and
        secret_env, read back as the fake cloud reports the container (the secret it stored resolved)."""
        pytest.fail(
            f"{type(self).__name__} sets boots_containers = True but does not override container_spec(machine): "
            "return the levers9.bootstrap.BootstrapContainer the provider started for the machine, so the kit "
            "can run it"
        )

    @pytest.fixture
    def levers9_docker_host(self) -> str:
        """The Docker the container boot runs in (``boots_containers``): $DOCKER_HOST, else the local socket."""
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    @pytest.fixture
    def levers9_worker_image(self, levers9_docker_host: str) -> str:
        """The worker image the container boot's bootstrap names: this installation's, built once per process
        into ``levers9_docker_host`` (levers9 worker-image build). Override to give one already there."""
        return worker_image(levers9_docker_host)

    def cloud_instances(self) -> dict[str, str | None]:
        """The instances the (fake) cloud holds alive right now, read from the cloud itself and not through the
        plugin: the cloud's id of each, with the levers9 machine id it is tagged with (None if untagged).
        "Alive" is anything the cloud still bills or may still run: pending, running, stopping."""
        pytest.fail(
            f"{type(self).__name__} does not override cloud_instances(): return {{instance id: levers9 machine "
            "id tag or None} for every instance the fake cloud holds that is not terminated, read from the fake "
            "itself (not through the plugin), so the kit can see what a failed or repeated start left running"
        )

    @contextlib.contextmanager
    def fail_after_create(self) -> Iterator[None]:
        """While the block runs, the (fake) cloud fails the step of starting a machine that comes after the
        instance is created (tagging, waiting for it, attaching a disk or an address)."""
        pytest.fail(
            f"{type(self).__name__} does not override fail_after_create(): make it a context manager under "
            "which the fake cloud fails the step after creating an instance (tagging, waiting, attaching), or set "
            "one_step_start = True if starting a machine is one call that creates nothing when it fails"
        )
        yield  # pragma: no cover

    def preempt(self, machine: Machine) -> None:
        """Make the (fake) cloud take ``machine`` back, as a spot interruption does."""
        pytest.fail(
            f"{type(self).__name__} does not override preempt(machine): make the fake cloud interrupt the "
            "machine as a spot interruption does, or set preemptible = False if the platform never takes "
            "machines back"
        )

    def fail(self, machine: Machine) -> None:
        """Make the (fake) cloud put ``machine`` in a state it will never run from (a host fault, a failed launch)."""
        pytest.fail(
            f"{type(self).__name__} does not override fail(machine): make the fake cloud break the machine (a "
            "host fault, a launch that failed), or set machines_can_fail = False if the platform has no such state"
        )

    def boot_platform(self, machine: Machine) -> BootPlatform:
        """What the cloud gives a booted machine's processes besides its user data: the address of a (fake)
        metadata service the worker proves the machine's identity with, and its loopback port. Override for a
        provider that binds join tokens to machines (``levers9_verify_identity``); the default gives nothing."""
        return BootPlatform()

    def _pool(self, hooks: Hooks, settings: dict[str, Any], name: str) -> Pool:
        fields = {"runtime": "process", **self.pool_fields, "settings": settings}
        config = Config.model_validate({"pools": {name: {"provider": self.provider, **fields}}})
        pools, _ = resolve(config, SourceMap("<contract>"), hooks)
        return pools[name]

    def bootstrap(
        self, pool: Pool, machine_id: str, controlplane_url: str = "grpc://127.0.0.1:1993"
    ) -> WorkerBootstrap:
        return WorkerBootstrap(
            controlplane_url=controlplane_url,
            token=f"contract-{uuid.uuid4().hex}",
            machine_id=machine_id,
            pool=pool.name,
            levers9_version=importlib.metadata.version("levers9"),
            labels=dict(pool.labels),
            # a container provider runs the worker image (the boot check builds it; elsewhere the name will do)
            worker_image=default_tag() if self.boots_containers else None,
        )

    def offers(self, hooks: Hooks, pool: Pool) -> list[GpuOffer]:
        """The pool's offers the planner would try, in order (none without well-formed offers)."""
        try:
            offers = run(hooks.gpu_offers(pool))
        except (PluginError, ProviderError):
            return []  # test_gpu_offers_are_well_formed says what is wrong
        return offers

    def offer(self, hooks: Hooks, pool: Pool, *, stale: bool = False) -> GpuOffer | None:
        """The offer the planner would choose: the first not unavailable; None for a pool without offers.

        The planner never provisions an offer reported ``unavailable``, and neither does the kit: when every
        offer is, the test fails, asking for settings under which one is available. ``stale=True`` (the
        capacity and failure checks) takes the first offer as a cache from before it ran out would have it.
        """
        offers = self.offers(hooks, pool)
        usable = [o for o in offers if o.availability is not Availability.UNAVAILABLE]
        if usable:
            return usable[0]
        if not offers:
            return None
        if stale:
            return offers[0].model_copy(update={"availability": Availability.UNKNOWN})
        pytest.fail(
            f"provider {self.provider!r}: every offer for pool {pool.name!r} is unavailable "
            f"({', '.join(o.key for o in offers)}), and the planner never provisions an unavailable offer, so "
            "neither does the kit; give pool_settings (boot_pool_settings) under which an offer is available"
        )

    def request(
        self,
        hooks: Hooks,
        pool: Pool,
        *,
        bootstrap: WorkerBootstrap | None = None,
        offer: GpuOffer | None = None,
        stale: bool = False,
    ) -> ProvisionRequest:
        """A request as the planner would make it: for ``offer``, or the offer :meth:`offer` chooses."""
        offer = offer or self.offer(hooks, pool, stale=stale)
        machine_id = bootstrap.machine_id if bootstrap else f"m-{uuid.uuid4().hex[:12]}"
        return ProvisionRequest(
            pool=pool,
            resources=Resources(
                cpu_millicores=1000, memory_mib=1024, gpu=pool.gpu, gpu_count=pool.gpu_count if pool.gpu else 0
            ),
            machine_id=machine_id,
            bootstrap=bootstrap or self.bootstrap(pool, machine_id),
            region=(offer.region if offer else None) or pool.region,
            offer=offer,
        )

    def call(self, hook: str, awaitable: Awaitable[T]) -> T:
        """Await a facade call; a hook returning dicts where levers9's types are expected fails, saying so."""
        try:
            return run(awaitable)
        except PluginError as exc:
            if exc.hook in RETURNS and "dict" in exc.message:
                hint = f"levers9.hooks.types.{RETURNS[exc.hook]}"
                advice = "" if hint in exc.message else f"; return {hint}, not dict"
                pytest.fail(f"provider {self.provider!r}: {exc.hook} {exc.message}{advice}")
            raise

    def wait_until(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (self.settle_timeout if timeout is None else timeout)
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(self.poll_interval)
        return True

    def listing(self, hooks: Hooks, pool: Pool) -> dict[str, Machine]:
        machines = self.call("levers9_list_machines", hooks.list_machines(pool))
        return {m.provider_id: m for m in machines}

    def listed(self, hooks: Hooks, pool: Pool) -> dict[str, Machine]:
        """The machines of the listing that are not ended (terminated, preempted, failed)."""
        return {k: m for k, m in self.listing(hooks, pool).items() if m.state not in ENDED_STATES}

    def wait_listed(self, hooks: Hooks, pool: Pool, machine: Machine) -> Machine:
        if not self.wait_until(lambda: machine.provider_id in self.listed(hooks, pool)):
            pytest.fail(
                f"provider {self.provider!r}: machine {machine.provider_id} did not appear in levers9_list_machines "
                f"within {self.settle_timeout:g} s"
            )
        return self.listed(hooks, pool)[machine.provider_id]

    def alive_since(self, hooks: Hooks, pool: Pool, machine_id: str, before: set[str]) -> tuple[list[str], list[str]]:
        """What is alive of a start: (the listed machines tagged ``machine_id``, the instances of
        :meth:`cloud_instances` not in ``before`` or tagged ``machine_id``, tagged or not)."""
        listed = [m.provider_id for m in self.listed(hooks, pool).values() if m.machine_id == machine_id]
        held = sorted(i for i, tag in self.cloud_instances().items() if i not in before or tag == machine_id)
        return listed, held

    def wait_gone(self, hooks: Hooks, pool: Pool, machine: Machine, how: str) -> None:
        def gone() -> bool:
            found = self.listing(hooks, pool).get(machine.provider_id)
            return found is None or found.state is MachineState.TERMINATED

        if not self.wait_until(gone):
            state = self.listing(hooks, pool)[machine.provider_id].state.value
            pytest.fail(
                f"provider {self.provider!r}: terminated machine {machine.provider_id} is still listed as {state} "
                f"{self.settle_timeout:g} s after levers9_terminate ({how}); leave terminated machines out of "
                "levers9_list_machines or report them 'terminated', never alive"
            )

    # ------------------------------------------------------------------ the contract

    def test_settings_schema_forbids_unknown_keys(self, levers9_hooks: Hooks) -> None:
        model = levers9_hooks.provider_settings_model(self.provider)
        extra = model.model_config.get("extra")
        assert extra == "forbid", (
            f"provider {self.provider!r}: its settings model {model.__name__} must set extra='forbid' "
            f"so a misspelled setting is an error, not ignored (it has extra={extra!r})"
        )

    def test_hooks_return_levers9_types(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """Every provider hook, once: each answer is levers9's type (the facade validates strictly)."""
        self.call("levers9_gpu_offers", levers9_hooks.gpu_offers(pool))
        check = self.call("levers9_check", levers9_hooks.check(pool))
        assert check is None or check.ok, (
            f"provider {self.provider!r}: levers9_check says the working pool_settings do not work: "
            f"{check.message} (hint: {check.hint})"
        )
        machine = provisioned()
        self.listing(levers9_hooks, pool)
        self.call("levers9_terminate", levers9_hooks.terminate(pool, machine))

    def test_provisioned_machine_is_listed_with_its_id(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        machine = provisioned()
        assert machine.pool == pool.name
        assert machine.machine_id is not None, (
            f"provider {self.provider!r}: the machine returned by levers9_provision must carry "
            "request.machine_id (tag the machine with it)"
        )
        listed = self.wait_listed(levers9_hooks, pool, machine)
        assert listed.machine_id == machine.machine_id, (
            f"provider {self.provider!r}: the listing reports machine_id {listed.machine_id!r} for "
            f"{machine.provider_id}, but provisioning tagged it {machine.machine_id!r}"
        )

    def test_terminated_machine_leaves_the_listing(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        machine = provisioned()
        self.wait_listed(levers9_hooks, pool, machine)
        run(levers9_hooks.terminate(pool, machine))
        self.wait_gone(levers9_hooks, pool, machine, "given the Machine levers9_provision returned")

    def test_terminate_is_idempotent(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        machine = provisioned()
        run(levers9_hooks.terminate(pool, machine))
        try:
            run(levers9_hooks.terminate(pool, machine))
        except Exception as exc:
            pytest.fail(f"provider {self.provider!r}: terminating a machine twice must succeed, it raised {exc!r}")

    def test_terminating_an_unknown_machine_succeeds(self, levers9_hooks: Hooks, pool: Pool) -> None:
        unknown = Machine(
            provider_id=f"levers9-contract-unknown-{uuid.uuid4().hex[:12]}",
            machine_id=f"m-{uuid.uuid4().hex[:12]}",
            pool=pool.name,
            state=MachineState.RUNNING,
            region=pool.region,
        )
        try:
            run(levers9_hooks.terminate(pool, unknown))
        except Exception as exc:
            pytest.fail(
                f"provider {self.provider!r}: terminating a machine it does not know ({unknown.provider_id}) must "
                f"succeed, as for one already gone (the reconciler retries terminations); it raised {exc!r}"
            )

    def test_provider_data_round_trip(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """What provisioning returned is what levers9 stores; the reconciler terminates from the listing alone."""
        request = self.request(levers9_hooks, pool)
        machine = provisioned(request)
        listed = self.wait_listed(levers9_hooks, pool, machine)
        dropped = sorted(set(machine.provider_data) - set(listed.provider_data))
        secret = [key for key in dropped if request.bootstrap.token in json.dumps(machine.provider_data[key])]
        assert not secret, (
            f"provider {self.provider!r}: levers9_provision returned provider_data keys {secret} holding the join "
            "token, which levers9_list_machines does not report; do not list them too: the token is a secret "
            "and has no place in provider_data at all (test_no_secret_in_provider_data_listing_or_log)"
        )
        assert not dropped, (
            f"provider {self.provider!r}: levers9_list_machines reports machine {machine.provider_id} without the "
            f"provider_data keys {dropped} that levers9_provision returned; the reconciler terminates machines "
            "from their listing alone, so list the same keys (adding more is fine)"
        )
        run(levers9_hooks.terminate(pool, listed))
        self.wait_gone(levers9_hooks, pool, machine, "given the Machine levers9_list_machines reported")

    def test_listing_is_limited_to_the_pool(
        self,
        levers9_hooks: Hooks,
        pool: Pool,
        provisioned: Callable[..., Machine],
        pool_settings: dict[str, Any],
    ) -> None:
        machine = provisioned()
        self.wait_listed(levers9_hooks, pool, machine)
        other = self._pool(levers9_hooks, pool_settings, self.pool_name("other"))
        assert machine.provider_id not in self.listed(levers9_hooks, other), (
            f"provider {self.provider!r}: a machine of pool {pool.name!r} was listed for pool {other.name!r}; "
            "the reconciler of that pool would terminate it"
        )

    def test_gpu_offers_are_well_formed(self, levers9_hooks: Hooks, pool: Pool) -> None:
        try:
            offers = self.call("levers9_gpu_offers", levers9_hooks.gpu_offers(pool))
        except PluginError as exc:
            pytest.fail(str(exc))
        for offer in offers:
            assert offer.gpu in CATALOG
            problem = memory_problem(offer)
            assert problem is None, f"provider {self.provider!r}: {problem}"
            assert not pool.regions or offer.region is None or offer.region in pool.regions, (
                f"provider {self.provider!r}: offer {offer.key} is in region {offer.region}, not one of the "
                f"pool's regions {pool.regions}; offer only what pool.regions allows"
            )
        if pool.gpu is not None:
            assert offers, f"provider {self.provider!r}: a pool with gpu {pool.gpu} got no GPU offers"
            assert all(o.gpu == pool.gpu for o in offers), (
                f"provider {self.provider!r}: pool asks for {pool.gpu}, offers name {sorted({o.gpu for o in offers})}"
            )

    def test_failures_are_typed_errors(self, levers9_hooks: Hooks, failing_pool_settings: dict[str, Any]) -> None:
        pool = self._pool(levers9_hooks, failing_pool_settings, self.pool_name("fail"))
        error: ProviderError | None = None
        try:
            request = self.request(levers9_hooks, pool, stale=True)
            machine = self.call("levers9_provision", levers9_hooks.provision(request))
        except ProviderError as exc:
            error = exc
        except PluginError as exc:
            pytest.fail(
                f"provider {self.provider!r} failed with an untyped error; raise one of levers9.hooks.errors "
                f"(InsufficientCapacity, QuotaExceeded, AuthenticationFailed, PermissionDenied, Throttled, "
                f"InvalidRequest): {exc}"
            )
        if error is not None:
            assert error.plugin == self.provider
            return
        run(levers9_hooks.terminate(pool, machine))
        pytest.fail(
            f"provider {self.provider!r}: provisioning with failing_pool_settings succeeded "
            f"(machine {machine.provider_id}, now terminated); it must raise a typed provider error"
        )

    def test_no_capacity_is_insufficient_capacity(
        self, levers9_hooks: Hooks, capacity_pool_settings: dict[str, Any] | None
    ) -> None:
        if capacity_pool_settings is None:
            pytest.skip(f"provider {self.provider!r} says it never runs out of capacity (capacity_pool_settings)")
        pool = self._pool(levers9_hooks, capacity_pool_settings, self.pool_name("full"))
        try:
            machine = run(levers9_hooks.provision(self.request(levers9_hooks, pool, stale=True)))
        except InsufficientCapacity:
            return
        except (ProviderError, PluginError) as exc:
            pytest.fail(
                f"provider {self.provider!r}: with no capacity, provisioning raised {type(exc).__name__} ({exc}); "
                "raise levers9.hooks.errors.InsufficientCapacity, so the scheduler tries the next offer and pool "
                "at once (QuotaExceeded means the account's limit, which an operator must raise)"
            )
        run(levers9_hooks.terminate(pool, machine))
        pytest.fail(
            f"provider {self.provider!r}: provisioning with capacity_pool_settings succeeded "
            f"(machine {machine.provider_id}, now terminated); it must raise InsufficientCapacity"
        )

    def test_no_secret_in_provider_data_listing_or_log(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """The join token (``request.bootstrap.token``) stays in what boots the machine, nowhere else."""
        request = self.request(levers9_hooks, pool)
        token = request.bootstrap.token
        with captured_log() as records:
            machine = provisioned(request)
            self.wait_listed(levers9_hooks, pool, machine)
            listing = self.listing(levers9_hooks, pool)
        promise = (
            "the join token of request.bootstrap is a secret: it goes to the machine in what levers9.bootstrap "
            "renders (user data, a container spec's secret_env) and nowhere else"
        )
        assert token not in json.dumps(machine.provider_data, default=str), (
            f"provider {self.provider!r}: levers9_provision returned the join token in provider_data "
            f"{sorted(machine.provider_data)}; {promise}. levers9 stores provider_data with the machine's record "
            "and shows it: keep there only what levers9_terminate needs to find the machine"
        )
        leaked = [m.provider_id for m in listing.values() if token in repr(m) or token in json.dumps(m.provider_data)]
        assert not leaked, (
            f"provider {self.provider!r}: levers9_list_machines reports the join token in machine(s) {leaked}; "
            f"{promise}. List only what identifies and finds the machine"
        )
        logged = [formatted(record) for record in records if token in formatted(record)]
        assert not logged, (
            f"provider {self.provider!r}: the join token was written to the log while provisioning and listing "
            f"({len(logged)} record(s), the first: {logged[0].replace(token, '<token>')!r}); {promise}. Log "
            "the machine id, never the bootstrap, the user data or the token"
        )

    def test_a_failed_start_leaves_nothing_behind(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """A start whose step after the create fails terminates what it created before it raises."""
        if self.one_step_start:
            pytest.skip(
                f"provider {self.provider!r} declares one_step_start = True: starting a machine is one call that leaves nothing when it fails"
            )
        request = self.request(levers9_hooks, pool)
        before = set(self.cloud_instances())
        with self.fail_after_create():
            try:
                machine = self.call("levers9_provision", levers9_hooks.provision(request))
            except ProviderError:
                machine = None
            except PluginError as exc:
                pytest.fail(
                    f"provider {self.provider!r}: when the step after creating the instance failed, provisioning "
                    f"raised an untyped error; raise one of levers9.hooks.errors: {exc}"
                )
        if machine is not None:
            run(levers9_hooks.terminate(pool, machine))
            pytest.fail(
                f"provider {self.provider!r}: provisioning succeeded (machine {machine.provider_id}, now terminated) "
                "although the step after creating the instance failed under fail_after_create(); a start that did "
                "not finish must raise a typed error"
            )

        def nothing_alive() -> bool:
            return self.alive_since(levers9_hooks, pool, request.machine_id, before) == ([], [])

        if not self.wait_until(nothing_alive):
            listed, held = self.alive_since(levers9_hooks, pool, request.machine_id, before)
            for leaked in self.listed(levers9_hooks, pool).values():
                if leaked.provider_id in listed:
                    with contextlib.suppress(Exception):
                        run(levers9_hooks.terminate(pool, leaked))
            pytest.fail(
                f"provider {self.provider!r}: a start that failed after creating the instance left it alive "
                f"{self.settle_timeout:g} s later (listed: {listed or 'none'}; in the cloud, tagged or not: "
                f"{held or 'none'}); a failed start leaves nothing behind: "
                "terminate what the failed levers9_provision created before raising (an untagged instance no "
                "listing finds runs and bills until someone notices)"
            )

    def test_the_offers_zone_is_started(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """Provisioning an offer starts the machine in the offer's zone (two zones, where the offers have them)."""
        if not self.zonal:
            pytest.skip(f"provider {self.provider!r} declares zonal = False: its offers name no zone")
        self.offer(levers9_hooks, pool)  # fails, saying so, when every offer is unavailable
        chosen: dict[str, GpuOffer] = {}
        for offer in self.call("levers9_gpu_offers", levers9_hooks.gpu_offers(pool)):
            if offer.zone is not None and offer.availability is not Availability.UNAVAILABLE:
                chosen.setdefault(offer.zone, offer)
        if not chosen:
            pytest.fail(
                f"provider {self.provider!r}: no available offer of pool {pool.name!r} names a zone, so the kit "
                "cannot check that the offer's zone is the zone started; give pool_settings under which offers "
                "name zones, or set zonal = False if the provider's offers never do"
            )
        for zone, offer in list(chosen.items())[:2]:
            machine = provisioned(self.request(levers9_hooks, pool, offer=offer))
            listed = self.wait_listed(levers9_hooks, pool, machine)
            started = {z for z in (machine.zone, listed.zone) if z is not None}
            assert started == {zone}, (
                f"provider {self.provider!r}: request.offer named zone {zone} (offer {offer.key}), but machine "
                f"{machine.provider_id} was started in {' and '.join(sorted(started)) or 'no zone it reports'}; "
                "start what the offer names, its instance type in its region and zone (the planner marks that "
                "offer, not another, unavailable when it is full), and report the zone in the Machine"
            )

    def test_provisioning_twice_gives_one_machine(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        """A retry of the same request (a timeout's, a restarted replica's) gets the machine already started."""
        request = self.request(levers9_hooks, pool)
        before = set(self.cloud_instances())
        first = provisioned(request)
        second = provisioned(request)
        promise = (
            "provisioning is idempotent per machine_id: a retry returns the machine already started for that id "
            "(pass the id as the API's idempotency key, or look for the levers9:machine-id tag before launching)"
        )
        assert second.provider_id == first.provider_id, (
            f"provider {self.provider!r}: the same ProvisionRequest twice gave two machines, {first.provider_id} "
            f"and {second.provider_id}, for machine id {request.machine_id}; {promise}"
        )
        self.wait_listed(levers9_hooks, pool, first)
        listed, held = self.alive_since(levers9_hooks, pool, request.machine_id, before)
        counts = (
            f"after the same ProvisionRequest twice, machine id {request.machine_id} has {len(listed)} machine(s) "
            f"in the listing ({listed}) and the cloud holds {len(held)} new instance(s) ({held}); {promise}"
        )
        assert len(listed) == 1, f"provider {self.provider!r}: {counts}"
        assert len(held) == 1, f"provider {self.provider!r}: {counts}"

    def _ends_as(self, levers9_hooks: Hooks, pool: Pool, machine: Machine, state: MachineState, what: str) -> None:
        def reported() -> bool:
            found = self.listing(levers9_hooks, pool).get(machine.provider_id)
            return found is not None and found.state is state

        if not self.wait_until(reported):
            found = self.listing(levers9_hooks, pool).get(machine.provider_id)
            shown = "left the listing" if found is None else f"is listed as {found.state.value}"
            pytest.fail(
                f"provider {self.provider!r}: machine {machine.provider_id} {what}, and {self.settle_timeout:g} s "
                f"later it {shown}; report it as {state.value!r} (with a reason), never alive: the reconciler "
                "requeues its calls at once only for a machine listed so"
            )

    def test_a_preempted_machine_is_listed_preempted(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        if not self.preemptible:
            pytest.skip(
                f"provider {self.provider!r} declares preemptible = False: its platform never takes a machine back"
            )
        machine = self.wait_listed(levers9_hooks, pool, provisioned())
        self.preempt(machine)
        self._ends_as(levers9_hooks, pool, machine, MachineState.PREEMPTED, "was taken back by the cloud (preempt)")

    def test_a_failed_machine_is_listed_failed(
        self, levers9_hooks: Hooks, pool: Pool, provisioned: Callable[..., Machine]
    ) -> None:
        if not self.machines_can_fail:
            pytest.skip(
                f"provider {self.provider!r} declares machines_can_fail = False: no machine state of its platform is a failure"
            )
        machine = self.wait_listed(levers9_hooks, pool, provisioned())
        self.fail(machine)
        self._ends_as(levers9_hooks, pool, machine, MachineState.FAILED, "broke in the cloud (fail)")

    def test_the_bootstrap_boots(
        self,
        levers9_hooks: Hooks,
        boot_pool_settings: dict[str, Any],
        standin_controlplane: Registrar,
        provisioned: Callable[..., Machine],
        request: pytest.FixtureRequest,
    ) -> None:
        pool = self._pool(levers9_hooks, boot_pool_settings, self.pool_name("boot"))
        bootstrap = self.bootstrap(pool, f"m-{uuid.uuid4().hex[:12]}", standin_controlplane.url)
        if self.boots_containers:
            docker_host = request.getfixturevalue("levers9_docker_host")
            image = request.getfixturevalue("levers9_worker_image")
            bootstrap = bootstrap.model_copy(update={"worker_image": image})
        machine = provisioned(self.request(levers9_hooks, pool, bootstrap=bootstrap))
        if self.boots_containers:
            spec = check_spec(self.provider, self.container_spec(machine), bootstrap)
            found, output = boot_container(
                self.provider, machine, spec, docker_host, bootstrap, standin_controlplane, self.boot_timeout
            )
            how = "levers9.bootstrap.container_spec"
            check_registered(
                self.provider, bootstrap, found, standin_controlplane.registrations, output, self.boot_timeout, how
            )
            assert found is not None
            check_reachable(self.provider, self.wait_listed(levers9_hooks, pool, machine), found)
            return
        if self.boots_itself:
            found = standin_controlplane.wait_for(bootstrap.token, bootstrap.machine_id, self.boot_timeout)
            self._registered(bootstrap, found, standin_controlplane.registrations, "")
            return
        found, output = boot_user_data(
            self.provider,
            machine,
            self.user_data(machine),
            self.boot_platform(machine),
            bootstrap,
            standin_controlplane,
            self.boot_timeout,
        )
        self._registered(bootstrap, found, standin_controlplane.registrations, output)
        assert found is not None
        check_identity_binds(self.provider, levers9_hooks, pool, machine, found)

    def _registered(
        self, bootstrap: WorkerBootstrap, found: Registration | None, seen: list[Registration], output: str
    ) -> None:
        check_registered(self.provider, bootstrap, found, seen, output, self.boot_timeout)
