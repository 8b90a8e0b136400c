"""The agent_machine provider driven through the real agent hub, with agents played in-process.

Each agent here joins with a real join token (SQL) and talks to a real
:class:`AgentHub` (Redis) through :class:`AgentSession`, as the gRPC transport
does; the test plays the agent's side of the order protocol of issue 17's
design (provision / terminate payloads, acknowledgements, inventories with
``details.containers``). The provider's hooks run on a worker thread, as the
core runs them, and reach the hub on the test's event loop through
``PluginContext.send_order``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from levers9.__about__ import __version__
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest, ProviderError
from levers9.hooks.types import (
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProvisionRequest,
    Resources,
    WorkerBootstrap,
)
from levers9.services import agent_join
from levers9.services.agents import AgentHub, InventoryReport
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9_agent_machine.provider import AgentMachineProvider, AgentOffline
from levers9_agent_machine.settings import AgentMachineSettings
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services
from tests.services.test_agent_hub import Agent, Clock, operator, workspace_user

CONFIG = ONE_POOL_CONFIG

IMAGE = "levers9/worker:test"


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, CONFIG, database_url) as opened:
        yield opened


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def hub(services: Services, clock: Clock) -> AsyncIterator[AgentHub]:
    started = AgentHub(services.redis, name="replica-a", heartbeat_s=5.0, clock=clock)
    await started.start()
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def provider(hub: AgentHub, clock: Clock) -> AgentMachineProvider:
    made = AgentMachineProvider(clock=clock)
    ctx = PluginContext(name="agent_machine", log=logging.getLogger("test.agent_machine"), agents=hub)
    ctx.loop = asyncio.get_running_loop()
    made.levers9_startup(ctx)
    return made


def gpu_pool(workspace: str | None, name: str = "gpus", **settings: Any) -> Pool:
    return Pool(
        name=name,
        provider="agent_machine",
        runtime="runc",
        gpu="H100",
        gpu_count=1,
        workspace=workspace,
        settings=AgentMachineSettings.model_validate(
            {"worker_image": IMAGE, "heartbeat_timeout_s": 5, "docker_network_mode": "host"} | settings
        ),
    )


def cpu_pool(workspace: str | None, name: str = "cpus", runtime: str = "runc", **settings: Any) -> Pool:
    made = AgentMachineSettings.model_validate(
        {"worker_image": IMAGE, "heartbeat_timeout_s": 5, "gpu_runtime": None, "docker_network_mode": "host"} | settings
    )
    return Pool(name=name, provider="agent_machine", runtime=runtime, workspace=workspace, settings=made)


def request(pool: Pool, machine_id: str, offer: GpuOffer | None) -> ProvisionRequest:
    gpu = 1 if pool.gpu else 0
    return ProvisionRequest(
        pool=pool,
        resources=Resources(cpu_millicores=2000, memory_mib=4096, gpu=pool.gpu, gpu_count=gpu),
        machine_id=machine_id,
        bootstrap=WorkerBootstrap(
            controlplane_url="grpcs://cp.example:50051",
            token="l9_machine_secret",
            machine_id=machine_id,
            levers9_version=__version__,
            pool=pool.name,
        ),
        offer=offer,
    )


async def box(
    services: Services,
    hub: AgentHub,
    principal: Principal,
    pool: str,
    name: str,
    *,
    free_gpus: int = 2,
    containers: list[dict[str, Any]] | None = None,
    free_cpu: int = 16000,
) -> Agent:
    """A joined, connected agent for ``pool`` that reported its inventory."""
    issued = await agent_join.issue_join_token(services, principal, "agent_machine", {"pool": pool, "name": name})
    joined = await agent_join.join(services, issued.token, version="test", hostname=name)
    agent = Agent(hub, await agent_join.authenticate_agent(services, joined.token))
    await agent.connect()
    await report(agent, free_gpus=free_gpus, containers=containers or [], free_cpu=free_cpu)
    return agent


async def report(agent: Agent, *, free_gpus: int = 2, containers: list[dict[str, Any]], free_cpu: int = 16000) -> None:
    assert agent.session is not None
    await agent.session.inventory(
        InventoryReport(
            cpu_millicores=16000,
            memory_mib=65536,
            free_cpu_millicores=free_cpu,
            free_memory_mib=60000,
            gpus=(("H100", 2, free_gpus),),
            machines=tuple(c["machine_id"] for c in containers if c["state"] == "running"),
            details={
                "docker": {"version": "27", "runtimes": ["runc", "nvidia"], "nvidia": True},
                "arch": "x86_64",
                "disk_free_gib": 100.0,
                "containers": containers,
            },
        )
    )


def container(machine_id: str, pool: str, state: str = "running", exit_code: int | None = None) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "pool": pool,
        "container_id": f"c-{machine_id}",
        "state": state,
        "exit_code": exit_code,
        "gpus": ["GPU-1"],
    }


# ---------------------------------------------------------------------------------------------- offers


async def test_offers_come_from_the_pools_own_live_agents_with_room(
    services: Services, hub: AgentHub, provider: AgentMachineProvider, clock: Clock
) -> None:
    team = await workspace_user(services, "team")
    other = await workspace_user(services, "other")
    silent = await box(services, hub, team, "gpus", "silent-box")
    clock.now += 10  # past heartbeat_timeout_s (5 s) but within the hub's three heartbeats: connected, silent
    fitting = await box(services, hub, team, "gpus", "box-1")
    await box(services, hub, team, "gpus", "full-box", free_gpus=0)
    await box(services, hub, team, "other-pool", "elsewhere")
    await box(services, hub, other, "gpus", "other-team")
    await box(services, hub, team, "gpus", "busy", containers=[container("mach_1", "gpus")])  # 1 per machine

    offers = await asyncio.to_thread(provider.levers9_gpu_offers, gpu_pool(team.workspace_id))
    assert [(o.zone, o.instance_type, o.gpu, o.gpu_count) for o in offers] == [
        (fitting.identity.agent_id, "box-1", "H100", 1)
    ]
    assert offers[0].availability == "available"
    assert offers[0].gpu_memory_mib > 1
    assert silent.identity.agent_id not in {o.zone for o in offers}
    # the other workspace's pool of the same name sees only its own agent
    theirs = await asyncio.to_thread(provider.levers9_gpu_offers, gpu_pool(other.workspace_id))
    assert [o.instance_type for o in theirs] == ["other-team"]
    # the operator's shared pool of that name sees none of the workspaces' agents
    assert await asyncio.to_thread(provider.levers9_gpu_offers, gpu_pool(None)) == []
    # a CPU pool gets no offers: provision picks the agent
    assert await asyncio.to_thread(provider.levers9_gpu_offers, cpu_pool(team.workspace_id)) == []


# ---------------------------------------------------------------------------------------------- provision


async def test_provision_sends_the_order_the_design_names_and_returns_the_container_machine(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    team = await workspace_user(services, "team")
    agent = await box(services, hub, team, "gpus", "box-1")
    pool = gpu_pool(team.workspace_id, docker_network_mode="host")
    [offer] = await asyncio.to_thread(provider.levers9_gpu_offers, pool)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_a1", offer)))
    order = await agent.order()
    assert order.kind == "provision"
    payload = order.payload
    assert {
        k: payload[k]
        for k in (
            "machine_id",
            "pool",
            "workspace",
            "image",
            "cpu_millicores",
            "memory_mib",
            "gpu",
            "gpu_count",
            "network_mode",
            "gpu_runtime",
        )
    } == {
        "machine_id": "mach_a1",
        "pool": "gpus",
        "workspace": team.workspace_id,
        "image": IMAGE,
        "cpu_millicores": 2000,
        "memory_mib": 4096,
        "gpu": "H100",
        "gpu_count": 1,
        "network_mode": "host",
        "gpu_runtime": "nvidia",
    }
    assert payload["secret_env"] == {"LEVERS9_TOKEN": "l9_machine_secret"}
    assert "l9_machine_secret" not in str(payload["env"])  # the token only in secret_env
    assert payload["env"]["LEVERS9_MACHINE_ID"] == "mach_a1"
    assert payload["command"]
    assert all(isinstance(part, str) for part in payload["command"])
    assert payload["runtime"] == "runc"
    assert set(payload) == {
        "machine_id",
        "pool",
        "workspace",
        "image",
        "command",
        "env",
        "secret_env",
        "cpu_millicores",
        "memory_mib",
        "gpu",
        "gpu_count",
        "network_mode",
        "gpu_runtime",
        "runtime",
    }
    await agent.ack(
        order, result={"container_id": "c0ffee", "name": "l9w-mach_a1", "machine_id": "mach_a1", "gpus": ["GPU-1"]}
    )
    machine = await started
    assert machine == Machine(
        provider_id="l9w-mach_a1",
        machine_id="mach_a1",
        pool="gpus",
        state=MachineState.PENDING,
        gpu="H100",
        gpu_count=1,
        zone=agent.identity.agent_id,
        instance_type="box-1",
        labels={"agent": agent.identity.agent_id},
        provider_data={"agent_id": agent.identity.agent_id, "container_id": "c0ffee"},
    )


async def test_a_cpu_pool_provisions_on_the_agent_with_the_most_free_cpu(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    root = await operator(services)
    await box(services, hub, root, "cpus", "small", free_cpu=3000)
    big = await box(services, hub, root, "cpus", "big", free_cpu=12000)
    await box(services, hub, root, "cpus", "tiny", free_cpu=1000)  # cannot fit 2000 millicores
    pool = cpu_pool(None)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_c1", None)))
    order = await big.order()
    assert (order.payload["gpu"], order.payload["gpu_count"], order.payload["gpu_runtime"]) == (None, 0, None)
    await big.ack(order, result={"container_id": "c1", "name": "l9w-mach_c1", "machine_id": "mach_c1", "gpus": []})
    assert (await started).zone == big.identity.agent_id


async def test_the_order_names_the_runtime_and_a_runc_pool_needs_the_hosts_network(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    root = await operator(services)
    agent = await box(services, hub, root, "cpus", "box-1")
    # the agent gives a runc (or gvisor) worker's container what runc needs, and a process worker's nothing more
    pool = cpu_pool(None)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_r1", None)))
    order = await agent.order()
    assert (order.payload["runtime"], order.payload["network_mode"]) == ("runc", "host")
    await agent.ack(order, result={"container_id": "c1", "name": "l9w-mach_r1", "machine_id": "mach_r1", "gpus": []})
    await started
    pool = cpu_pool(None, runtime="process", docker_network_mode="bridge")
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_r2", None)))
    order = await agent.order()
    assert (order.payload["runtime"], order.payload["network_mode"]) == ("process", "bridge")
    await agent.ack(order, result={"container_id": "c2", "name": "l9w-mach_r2", "machine_id": "mach_r2", "gpus": []})
    await started
    # runc or gvisor on a Docker network of its own: refused before any order goes out
    for runtime in ("runc", "gvisor"):
        pool = cpu_pool(None, runtime=runtime, docker_network_mode="bridge")
        with pytest.raises(InvalidRequest, match="needs docker_network_mode: host"):
            await asyncio.to_thread(provider.levers9_provision, request(pool, "mach_r3", None))
    assert agent.received.empty()


async def test_a_capacity_refusal_is_insufficient_capacity_and_a_bad_image_invalid_request(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    team = await workspace_user(services, "team")
    agent = await box(services, hub, team, "gpus", "box-1")
    pool = gpu_pool(team.workspace_id)
    [offer] = await asyncio.to_thread(provider.levers9_gpu_offers, pool)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_b1", offer)))
    order = await agent.order()
    await agent.ack(order, ok=False, error="only 0 of 1 H100 free", error_kind="insufficient_capacity")
    with pytest.raises(InsufficientCapacity, match="only 0 of 1 H100 free"):
        await started
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_b2", offer)))
    order = await agent.order()
    await agent.ack(order, ok=False, error=f"image {IMAGE} is missing", error_kind="invalid_request")
    with pytest.raises(InvalidRequest, match="is missing"):
        await started


async def test_another_workspaces_agent_is_never_ordered_even_when_an_offer_names_it(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    team = await workspace_user(services, "team")
    other = await workspace_user(services, "other")
    theirs = await box(services, hub, other, "gpus", "their-box")
    forged = GpuOffer(gpu="H100", gpu_count=1, gpu_memory_mib=81920, zone=theirs.identity.agent_id)
    with pytest.raises(InsufficientCapacity, match="no longer serves pool 'gpus'"):
        await asyncio.to_thread(provider.levers9_provision, request(gpu_pool(team.workspace_id), "mach_x", forged))
    assert theirs.received.empty()


# ---------------------------------------------------------------------------------------------- terminate


async def test_terminate_orders_the_agent_and_an_offline_agent_is_retryable(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    team = await workspace_user(services, "team")
    agent = await box(services, hub, team, "gpus", "box-1", containers=[container("mach_t1", "gpus")])
    pool = gpu_pool(team.workspace_id)
    machine = Machine(
        provider_id="l9w-mach_t1",
        machine_id="mach_t1",
        pool="gpus",
        provider_data={"agent_id": agent.identity.agent_id},
    )
    stopping = asyncio.create_task(asyncio.to_thread(provider.levers9_terminate, pool, machine))
    order = await agent.order()
    assert (order.kind, order.payload) == ("terminate", {"machine_id": "mach_t1"})
    await agent.ack(order)
    await stopping

    await agent.hang_up()
    with pytest.raises(AgentOffline, match="not connected") as caught:
        await asyncio.to_thread(provider.levers9_terminate, pool, machine)
    assert isinstance(caught.value, ProviderError)
    assert caught.value.retryable


async def test_terminate_on_an_agent_no_longer_known_has_nothing_to_do(provider: AgentMachineProvider) -> None:
    machine = Machine(provider_id="l9w-m", machine_id="m", pool="gpus", provider_data={"agent_id": "agt_gone"})
    await asyncio.to_thread(provider.levers9_terminate, gpu_pool(None), machine)


# ---------------------------------------------------------------------------------------------- list


async def test_list_maps_container_states_and_fails_a_silent_agents_machines(
    services: Services, hub: AgentHub, provider: AgentMachineProvider, clock: Clock
) -> None:
    team = await workspace_user(services, "team")
    containers = [
        container("mach_r", "gpus"),
        container("mach_p", "gpus", "created"),
        container("mach_x", "gpus", "exited", 137),
        container("mach_o", "other-pool"),
    ]
    agent = await box(services, hub, team, "gpus", "box-1", containers=containers)
    pool = gpu_pool(team.workspace_id)
    listed = {m.machine_id: m for m in await asyncio.to_thread(provider.levers9_list_machines, pool)}
    assert {k: (m.state, m.reason) for k, m in listed.items()} == {
        "mach_r": (MachineState.RUNNING, None),
        "mach_p": (MachineState.PENDING, None),
        "mach_x": (MachineState.FAILED, "worker container exited with code 137"),
    }
    assert listed["mach_r"].provider_id == "l9w-mach_r"
    assert listed["mach_r"].provider_data == {"agent_id": agent.identity.agent_id, "container_id": "c-mach_r"}

    clock.now += 12  # silent past heartbeat_timeout_s (5 s)
    listed = {m.machine_id: m for m in await asyncio.to_thread(provider.levers9_list_machines, pool)}
    assert {m.state for m in listed.values()} == {MachineState.FAILED}
    assert listed["mach_r"].reason == "agent box-1 silent for 12 s"
    # and it no longer gets offers
    assert await asyncio.to_thread(provider.levers9_gpu_offers, pool) == []
    # another workspace's pool of that name lists nothing of it
    other = await workspace_user(services, "other")
    assert await asyncio.to_thread(provider.levers9_list_machines, gpu_pool(other.workspace_id)) == []


async def test_check_says_how_many_agents_serve(
    services: Services, hub: AgentHub, provider: AgentMachineProvider
) -> None:
    team = await workspace_user(services, "team")
    pool = gpu_pool(team.workspace_id)
    empty = await asyncio.to_thread(provider.levers9_check, pool)
    assert not empty.ok
    assert "levers9 machine create --pool gpus" in (empty.hint or "")
    await box(services, hub, team, "gpus", "box-1")
    found = await asyncio.to_thread(provider.levers9_check, pool)
    assert found.ok
    assert found.message == "1 of 1 joined machines connected, 2 free H100"


def test_without_a_hub_the_hooks_say_where_they_work() -> None:
    bare = AgentMachineProvider()
    bare.levers9_startup(PluginContext.bare("agent_machine"))
    # ``levers9 offers`` from a config file: no agent connects there, so nothing to offer and no failure
    assert bare.levers9_gpu_offers(gpu_pool(None)) == []
    with pytest.raises(ProviderError, match="running controlplane"):
        bare.levers9_list_machines(gpu_pool(None))


async def test_a_cpu_pool_asks_the_next_box_when_one_refuses_and_tries_the_refuser_last(
    services: Services, hub: AgentHub, provider: AgentMachineProvider, clock: Clock
) -> None:
    # The trial: one box refused, the pool (no offers, so no zone to mark) was refused whole and the
    # scheduler skipped it for unavailable_ttl_s: a CPU pool stalled three minutes with another box idle.
    root = await operator(services)
    big = await box(services, hub, root, "cpus", "big", free_cpu=12000)
    small = await box(services, hub, root, "cpus", "small", free_cpu=4000)
    pool = cpu_pool(None)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_n1", None)))
    order = await big.order()
    await big.ack(order, ok=False, error="docker: cannot start container", error_kind="provider_error")
    order = await small.order()
    assert order.payload["machine_id"] == "mach_n1"
    await small.ack(order, result={"container_id": "c1", "name": "l9w-mach_n1", "machine_id": "mach_n1", "gpus": []})
    assert (await started).zone == small.identity.agent_id, "the same call went on to the next box"

    # the box that refused is tried last for a while, then first again (most free CPU)
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_n2", None)))
    order = await small.order()
    await small.ack(order, result={"container_id": "c2", "name": "l9w-mach_n2", "machine_id": "mach_n2", "gpus": []})
    await started
    assert big.received.empty()
    clock.now += 61
    await report(big, containers=[], free_cpu=12000)
    await report(small, containers=[], free_cpu=4000)

    # every box refuses: one error naming each, of their kind when they agree
    started = asyncio.create_task(asyncio.to_thread(provider.levers9_provision, request(pool, "mach_n3", None)))
    order = await big.order()
    await big.ack(order, ok=False, error="no room left", error_kind="insufficient_capacity")
    order = await small.order()
    await small.ack(order, ok=False, error="no room here either", error_kind="insufficient_capacity")
    with pytest.raises(
        InsufficientCapacity,
        match=r"every joined machine of pool 'cpus' that fits refused the "
        r"worker \(big \(agent .* no room left\); small \(agent .* no room here either\)\)",
    ):
        await started
