"""Joined machines on real stores and the real agent hub: create, join, list, remove; over REST and gRPC too.

The controlplane here is its services (SQLite and PostgreSQL, Redis), an
:class:`AgentHub`, the plugins started with that hub (so the agent_machine
provider's terminate really orders the agent), and a gRPC server with the
ControlPlane and Agent services, plus the REST app. Agents are played
in-process through :class:`AgentSession` (``tests.services.test_agent_hub``)
or over the Agent gRPC service.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from levers9.controlplane.grpc_agent import AgentService
from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.http import create_http_app
from levers9.controlplane.wheels import OwnWheels
from levers9.images.wheel import wheel_name
from levers9.proto.v1 import agent_pb2, agent_pb2_grpc, controlplane_pb2, controlplane_pb2_grpc
from levers9.services import agent_join
from levers9.services.agent_join import JoinToken
from levers9.services.agent_pools import joined_machines
from levers9.services.agent_pools.registry import AgentPools
from levers9.services.agents import AgentCut, AgentHub, InventoryReport
from levers9.services.auth import PermissionDenied, Principal, Unauthenticated
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.state.errors import AlreadyExists, NotFound
from tests.fixtures.services import opened_services
from tests.services.test_agent_hub import Agent, operator, workspace_user

CONFIG = """\
version: 1
data_dir: {data_dir}
state:
  database_url: {database_url}
pools:
  shared-gpus:
    provider: agent_machine
    runtime: runc
    gpu: H100
    cpu: 4
    memory: 16GiB
    max_workers: 2
    settings:
      worker_image: levers9/worker:test
      ssh: {{user: ops, port: 2222}}
  cpu:
    provider: local
    runtime: runc
    cpu: 2
    memory: 4GiB
    max_workers: 1
"""


@dataclass
class Plant:
    services: Services
    hub: AgentHub
    rest: httpx.AsyncClient
    api: Any
    agent_api: Any
    root: Principal
    root_token: str


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, CONFIG, database_url) as opened:
        yield opened


def issued(made: joined_machines.CreatedMachine) -> JoinToken:
    """The join token of a machine just created (not one answered as existing)."""
    assert made.join is not None, f"machine {made.machine.name} existed: no token was issued"
    return made.join


def team_pool(services: Services, workspace: str, name: str = "team-gpus") -> None:
    """A pool of ``workspace`` (as an attached pool is): the shared pool's shape under another name."""
    shared = services.pools["shared-gpus"]
    pool = shared.pool.model_copy(update={"name": name, "workspace": workspace})
    services.pools[name] = dataclasses.replace(shared, pool=pool, workspace=workspace, configured=False)


@pytest.fixture
async def plant(services: Services) -> AsyncIterator[Plant]:
    hub = AgentHub(services.redis, name="replica-a", heartbeat_s=5.0)
    await hub.start()
    await services.hooks.startup(agents=hub)
    dataplane = DataPlane(services, Hub(services.redis, name=services.scheduler.name))
    server = grpc.aio.server()
    add_api: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
    add_agent: Any = agent_pb2_grpc.add_AgentServicer_to_server
    add_api(ControlPlaneService(dataplane, wheels=OwnWheels("https://cp.example:8443")), server)
    add_agent(AgentService(services, hub), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _record, token = await services.tokens.issue("user", subject="root")
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_http_app(services, dataplane=dataplane)),
                base_url="http://levers9.test",
            ) as client,
        ):
            yield Plant(
                services,
                hub,
                client,
                controlplane_pb2_grpc.ControlPlaneStub(channel),  # type: ignore[no-untyped-call]
                agent_pb2_grpc.AgentStub(channel),  # type: ignore[no-untyped-call]
                await operator(services),
                token,
            )
    finally:
        await server.stop(None)
        await dataplane.close()
        await hub.close()


def auth(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def connected(plant: Plant, token: str) -> Agent:
    """The agent of the credential ``token``, connected in-process, with one inventory reported."""
    agent = Agent(plant.hub, await agent_join.authenticate_agent(plant.services, token))
    await agent.connect()
    assert agent.session is not None
    await agent.session.inventory(
        InventoryReport(
            cpu_millicores=16000,
            memory_mib=65536,
            free_cpu_millicores=12000,
            free_memory_mib=60000,
            gpus=(("H100", 2, 1),),
            machines=("mach_w1",),
            details={
                "containers": [
                    {
                        "machine_id": "mach_w1",
                        "pool": "team-gpus",
                        "container_id": "c1",
                        "state": "running",
                        "exit_code": None,
                        "gpus": ["GPU-1"],
                    }
                ]
            },
        )
    )
    return agent


# ---------------------------------------------------------------------------------------------- create


async def test_a_machines_token_joins_once_for_its_pool_and_workspace(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    team_pool(services, team.workspace_id or "")
    made = await joined_machines.create(services, team, "team-gpus", "box-1", ttl_s=600)
    assert (made.machine.name, made.machine.pool, made.machine.state) == ("box-1", "team-gpus", "pending")
    assert made.machine.id == issued(made).agent_id
    assert made.machine.workspace_id == team.workspace_id
    assert made.ssh["user"] == "ops"
    assert made.ssh["port"] == 2222

    joined = await agent_join.join(services, issued(made).token, version="t", hostname="gpu-box-1.lab")
    assert (joined.agent_id, joined.workspace, joined.labels) == (
        made.machine.id,
        team.workspace_id,
        {"pool": "team-gpus", "name": "box-1"},
    )
    [view] = await joined_machines.list_machines(services, team)
    assert (view.machine.state, view.machine.hostname) == ("joined", "gpu-box-1.lab")
    assert view.machine.joined_at is not None
    with pytest.raises(Unauthenticated, match="already used"):
        await agent_join.join(services, issued(made).token)
    # the operator's listing is the operator's machines, not the workspace's
    assert await joined_machines.list_machines(services, plant.root) == []


async def test_a_machine_redis_forgot_is_registered_again_from_its_row_and_only_once(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    team_pool(services, team.workspace_id or "")
    made = await joined_machines.create(services, team, "team-gpus", "box-1")
    joined = await agent_join.join(services, issued(made).token, hostname="box-1.lab")
    await services.redis.delete(services.agents._key(joined.agent_id))  # Redis lost it (an embedded one, killed)
    # the registry asks each kind in turn: the cluster kind does not know it, the machine kind does
    assert [kind.provider for kind in services.agent_pools.kinds] == ["agent_machine", "attached_cluster"]
    identity = await agent_join.authenticate_agent(services, joined.token)
    assert identity.agent_id == joined.agent_id
    record = await services.agents.get(joined.agent_id)
    assert record is not None
    assert (record.provider, record.workspace) == ("agent_machine", team.workspace_id)
    assert record.labels == {"pool": "team-gpus", "name": "box-1"}
    # a registration that exists is never written over
    assert await services.agent_pools.restore(services, joined.agent_id) is False
    # a machine that never joined has nothing to restore
    pending = await joined_machines.create(services, team, "team-gpus", "box-2")
    await services.redis.delete(services.agents._key(pending.machine.id))
    assert await services.agent_pools.restore(services, pending.machine.id) is False
    assert await services.agents.get(pending.machine.id) is None


def test_agent_pool_kinds_must_serve_distinct_providers() -> None:
    kind = joined_machines.JOINED_MACHINES
    with pytest.raises(ValueError, match="distinct providers, got \\['agent_machine', 'agent_machine'\\]"):
        AgentPools([kind, kind])


async def test_who_may_create_for_which_pool_is_refused_clearly(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    other = await workspace_user(services, "other")
    team_pool(services, team.workspace_id or "")
    with pytest.raises(
        PermissionDenied,
        match=r"pool 'shared-gpus' is the operator's.*pools you may join machines to: "
        r"team-gpus",
    ):
        await joined_machines.create(services, team, "shared-gpus")
    with pytest.raises(PermissionDenied, match=r"pool 'team-gpus' is another workspace's.*shared-gpus"):
        await joined_machines.create(services, plant.root, "team-gpus")
    with pytest.raises(PermissionDenied, match=r"pool 'team-gpus' is another workspace's.*no pool"):
        await joined_machines.create(services, other, "team-gpus")
    with pytest.raises(ValueError, match=r"pool 'nope' is not configured.*team-gpus"):
        await joined_machines.create(services, team, "nope")
    with pytest.raises(ValueError, match="pool 'cpu' uses provider 'local'"):
        await joined_machines.create(services, plant.root, "cpu")
    with pytest.raises(ValueError, match="machine name 'bad name' is not valid"):
        await joined_machines.create(services, team, "team-gpus", "bad name")
    made = await joined_machines.create(services, plant.root, "shared-gpus", "box")
    assert made.machine.workspace_id is None
    with pytest.raises(AlreadyExists, match="named 'box' exists already"):
        await joined_machines.create(services, plant.root, "shared-gpus", "box")
    # the name is per workspace: the team may have its own 'box'
    assert (await joined_machines.create(services, team, "team-gpus", "box")).machine.name == "box"
    unnamed = await joined_machines.create(services, team, "team-gpus")
    assert unnamed.machine.name == unnamed.machine.id


async def test_create_again_of_a_joined_name_answers_it_and_a_pending_one_is_made_anew(plant: Plant) -> None:
    """``machine create --ssh NAME`` twice (issue 35 item 14): ``existing_ok`` answers the joined machine as it is,
    with no token; one that never joined is removed (its token revoked) and made again; another pool's is refused."""
    services = plant.services
    first = await joined_machines.create(services, plant.root, "shared-gpus", "box", existing_ok=True)
    # never joined: made again, its first token refused from now on
    again = await joined_machines.create(services, plant.root, "shared-gpus", "box", existing_ok=True)
    assert again.machine.id != first.machine.id
    assert again.machine.state == "pending"
    with pytest.raises(Unauthenticated, match="this machine was removed"):
        await agent_join.join(services, issued(first).token)
    assert [v.machine.id for v in await joined_machines.list_machines(services, plant.root)] == [again.machine.id]

    joined = await agent_join.join(services, issued(again).token, hostname="box")
    answered = await joined_machines.create(services, plant.root, "shared-gpus", "box", existing_ok=True)
    assert answered.join is None
    assert (answered.machine.id, answered.machine.state) == (joined.agent_id, "joined")
    assert answered.ssh["user"] == "ops"
    with pytest.raises(AlreadyExists, match="named 'box' exists already"):  # without existing_ok: refused as before
        await joined_machines.create(services, plant.root, "shared-gpus", "box")
    plant.services.pools["more-gpus"] = plant.services.pools["shared-gpus"]
    with pytest.raises(AlreadyExists, match="'box' exists already in pool 'shared-gpus'"):
        await joined_machines.create(services, plant.root, "more-gpus", "box", existing_ok=True)
    assert len(await joined_machines.list_machines(services, plant.root)) == 1


async def test_list_merges_the_agents_live_inventory(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    team_pool(services, team.workspace_id or "")
    made = await joined_machines.create(services, team, "team-gpus", "box-1")
    [pending] = await joined_machines.list_machines(services, team)
    assert (pending.machine.state, pending.connected, pending.last_seen) == ("pending", False, 0.0)
    joined = await agent_join.join(services, issued(made).token, hostname="box-1")
    agent = await connected(plant, joined.token)
    [view] = await joined_machines.list_machines(services, team)
    assert view.connected
    assert view.last_seen > 0
    assert view.version == "test"
    assert (view.gpus, view.free_gpus) == ({"H100": 2}, {"H100": 1})
    assert (view.cpu_millicores, view.free_cpu_millicores, view.memory_mib, view.free_memory_mib) == (
        16000,
        12000,
        65536,
        60000,
    )
    assert view.workers == ["mach_w1"]
    await agent.hang_up()
    [view] = await joined_machines.list_machines(services, team)
    assert not view.connected


# ---------------------------------------------------------------------------------------------- remove


async def test_remove_stops_its_workers_revokes_it_and_cuts_its_stream(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    team_pool(services, team.workspace_id or "")
    made = await joined_machines.create(services, team, "team-gpus", "box-1")
    joined = await agent_join.join(services, issued(made).token, hostname="box-1")
    agent = await connected(plant, joined.token)
    agent_id = made.machine.id
    # the scheduler's worker container on it, and another machine's that must stay
    record = await services.machines.create("team-gpus", "agent_machine", machine_id="mach_w1")
    await services.machines.set_provider_id(record.id, "l9w-mach_w1")
    await services.machines.set_placement(record.id, zone=agent_id, provider_data={"agent_id": agent_id})
    await services.machines.set_state(record.id, "running")
    kept = await services.machines.create("team-gpus", "agent_machine", machine_id="mach_other")
    await services.machines.set_provider_id(kept.id, "l9w-mach_other")
    await services.machines.set_placement(kept.id, provider_data={"agent_id": "agt_someone_else"})
    await services.machines.set_state(kept.id, "running")

    removing = asyncio.create_task(joined_machines.remove(services, team, "box-1"))
    order = await agent.order()
    assert (order.kind, order.payload) == ("terminate", {"machine_id": "mach_w1"})
    await agent.ack(order)
    removed = await removing
    assert (removed.terminated, removed.not_terminated) == (["mach_w1"], [])
    assert removed.machine.state == "removed"
    assert removed.machine.removed_at is not None
    stopped = await services.machines.get("mach_w1")
    assert stopped is not None
    assert stopped.state == "terminated"
    other = await services.machines.get("mach_other")
    assert other is not None
    assert other.state == "running"

    # its stream was cut at once, saying why
    assert agent._pump is not None
    with pytest.raises(AgentCut, match="this machine was removed"):
        await asyncio.wait_for(agent._pump, 10)
    # its credential is revoked, and the refusal says it was removed
    with pytest.raises(Unauthenticated, match=r"this machine was removed \(levers9 machine remove\)"):
        await agent_join.authenticate_agent(services, joined.token)
    # a Hello on a stream opened before the removal is refused too
    late = Agent(plant.hub, agent.identity)
    with pytest.raises(Unauthenticated, match="this machine was removed"):
        await late.connect()
    assert await joined_machines.list_machines(services, team) == []
    assert agent_id not in {a.agent_id for a in plant.hub.inventories()}
    # the name is free again; removing twice is NotFound
    with pytest.raises(NotFound):
        await joined_machines.remove(services, team, "box-1")
    assert (await joined_machines.create(services, team, "team-gpus", "box-1")).machine.id != agent_id


async def test_a_removed_machines_unused_token_is_refused_saying_so(plant: Plant) -> None:
    services = plant.services
    made = await joined_machines.create(services, plant.root, "shared-gpus", "never-joined")
    removed = await joined_machines.remove(services, plant.root, "never-joined")
    assert removed.terminated == []
    with pytest.raises(Unauthenticated, match="this machine was removed"):
        await agent_join.join(services, issued(made).token)
    # a workspace cannot remove the operator's machine (nor see it)
    team = await workspace_user(services, "team")
    await joined_machines.create(services, plant.root, "shared-gpus", "ops-box")
    with pytest.raises(NotFound, match="'ops-box'"):
        await joined_machines.remove(services, team, "ops-box")


# ---------------------------------------------------------------------------------------------- transports


async def test_rest_and_grpc_create_list_and_remove_and_a_removed_agent_is_refused_at_join_and_connect(
    plant: Plant,
) -> None:
    services = plant.services
    team = await services.workspaces.get_or_create("team")
    _, team_token = await services.tokens.issue("user", workspace_id=team.id, subject="someone@team")
    team_pool(services, team.id)

    # REST: create (the token once, with the join command), list, errors
    response = await plant.rest.post(
        "/api/v1/joined-machines", json={"pool": "team-gpus", "name": "box-1"}, headers=dict(auth(team_token))
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["machine"]["name"] == "box-1"
    assert body["machine"]["state"] == "pending"
    assert body["join_token"].startswith("l9_agent_")
    # levers9 from the controlplane's own wheel (here at the request's URL), its hash checked; never by name
    assert "levers9==" not in body["join_command"]
    assert body["wheel_url"] == f"http://levers9.test/api/v1/wheels/{wheel_name()}"
    assert body["join_command"].startswith(
        f'd=$(mktemp -d) && curl -fsSL -o "$d"/{wheel_name()} {body["wheel_url"]} && '
    )
    assert f'echo "{body["wheel_sha256"]}  $d/{wheel_name()}" | sha256sum -c -' in body["join_command"]
    assert f"LEVERS9_JOIN_TOKEN={body['join_token']} levers9 agent join --controlplane grpc://" in body["join_command"]
    assert body["join_command"].endswith("--insecure")
    assert body["ssh"]["user"] == "ops"
    refused = await plant.rest.post(
        "/api/v1/joined-machines", json={"pool": "shared-gpus"}, headers=dict(auth(team_token))
    )
    assert refused.status_code == 403
    assert "team-gpus" in refused.text
    taken = await plant.rest.post(
        "/api/v1/joined-machines", json={"pool": "team-gpus", "name": "box-1"}, headers=dict(auth(team_token))
    )
    assert taken.status_code == 409, taken.text
    bad = await plant.rest.post(
        "/api/v1/joined-machines", json={"pool": "team-gpus", "ttl_s": -1}, headers=dict(auth(team_token))
    )
    assert bad.status_code == 422

    # the agent joins over gRPC with it; both transports list it the same
    joined = await plant.agent_api.Join(agent_pb2.JoinRequest(join_token=body["join_token"], hostname="gpu-1"))
    assert joined.agent_id == body["machine"]["id"]
    assert dict(joined.labels)["pool"] == "team-gpus"
    listed = (await plant.rest.get("/api/v1/joined-machines", headers=dict(auth(team_token)))).json()
    assert [(m["name"], m["state"], m["hostname"]) for m in listed] == [("box-1", "joined", "gpu-1")]
    over_grpc = await plant.api.ListJoinedMachines(
        controlplane_pb2.ListJoinedMachinesRequest(), metadata=auth(team_token)
    )
    assert [(m.name, m.state, m.hostname, m.id) for m in over_grpc.machines] == [
        ("box-1", "joined", "gpu-1", joined.agent_id)
    ]
    # the operator sees none of the team's machines
    assert (await plant.rest.get("/api/v1/joined-machines", headers=dict(auth(plant.root_token)))).json() == []

    # gRPC create, for the operator's shared pool, and its refusals
    made = await plant.api.CreateJoinedMachine(
        controlplane_pb2.CreateJoinedMachineRequest(pool="shared-gpus", name="ops-1"), metadata=auth(plant.root_token)
    )
    assert made.machine.name == "ops-1"
    assert made.join_token
    assert "--insecure" in made.join_command
    assert made.wheel_url == f"https://cp.example:8443/api/v1/wheels/{wheel_name()}"
    assert made.wheel_sha256 == body["wheel_sha256"]  # the same wheel over both transports
    assert f'curl -fsSL -o "$d"/{wheel_name()} {made.wheel_url} && ' in made.join_command
    assert not made.existing
    assert made.expires_at > 0
    assert made.controlplane_url.startswith("grpc://")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plant.api.CreateJoinedMachine(
            controlplane_pb2.CreateJoinedMachineRequest(pool="team-gpus"), metadata=auth(plant.root_token)
        )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "pool 'team-gpus' is another workspace's" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plant.api.RemoveJoinedMachine(
            controlplane_pb2.RemoveJoinedMachineRequest(name="nope"), metadata=auth(team_token)
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    # remove over REST; the agent is refused at Connect, and ops-1's unused token at Join (removed over gRPC)
    gone = await plant.rest.delete("/api/v1/joined-machines/box-1", headers=dict(auth(team_token)))
    assert gone.status_code == 200, gone.text
    assert gone.json()["machine"]["state"] == "removed"
    assert (await plant.rest.delete("/api/v1/joined-machines/box-1", headers=dict(auth(team_token)))).status_code == 404
    stream = plant.agent_api.Connect(metadata=auth(joined.agent_token))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(stream.read(), 10)  # refused before any message: at Connect
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "this machine was removed (levers9 machine remove)" in (caught.value.details() or "")

    removed = await plant.api.RemoveJoinedMachine(
        controlplane_pb2.RemoveJoinedMachineRequest(name="ops-1"), metadata=auth(plant.root_token)
    )
    assert removed.machine.state == "removed"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plant.agent_api.Join(agent_pb2.JoinRequest(join_token=made.join_token))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "this machine was removed" in (caught.value.details() or "")
