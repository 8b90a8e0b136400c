"""Attached clusters on real stores and the real agent hub: join, the pool on every replica, list; REST and gRPC.

The controlplane is the services of ``tests.services.test_joined_machines``
(SQLite and PostgreSQL, Redis, the plugins started with an agent hub, a gRPC
server and the REST app). A cluster's agent is played in-process
(:class:`~tests.services.test_agent_hub.Agent`); the agent that really runs
against a Kubernetes API is in ``tests/e2e/test_kubernetes.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest

from levers9.proto.v1 import agent_pb2, controlplane_pb2
from levers9.services import agent_join
from levers9.services.agent_pools import clusters
from levers9.services.agents import AgentCut, InventoryReport
from levers9.services.auth import PermissionDenied, Unauthenticated
from levers9.state.errors import AlreadyExists, NotFound
from levers9.state.sql.clusters import ClusterStore
from tests.services import test_joined_machines
from tests.services.test_agent_hub import Agent, workspace_user
from tests.services.test_joined_machines import Plant, auth

IMAGE = "registry.example.com/levers9/worker:1.0"
#: the controlplane of the joined machines' tests, fixtures and all
services = test_joined_machines.services
plant = test_joined_machines.plant


def options(name: str = "lab", **given: Any) -> clusters.ClusterOptions:
    return clusters.ClusterOptions(name=name, **({"gpu": "L4", "worker_image": IMAGE} | given))


async def test_a_workspace_joins_a_cluster_as_its_own_pool_with_a_single_use_token(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options(cpu=2, memory="8GiB", max_workers=3))
    pool = made.pool
    assert pool.name == clusters.pool_name("lab", team.workspace_id or "")
    assert pool.name.startswith("lab.")
    assert (pool.workspace, pool.pool.workspace, pool.pool.provider) == (team.workspace_id,) * 2 + ("attached_cluster",)
    assert (pool.gpu, pool.gpu_count, pool.cpu_millicores, pool.memory_mib, pool.max_workers) == (
        "L4",
        1,
        2000,
        8192,
        3,
    )
    assert pool.pool.settings.cluster == "lab"
    assert pool.pool.settings.worker_image == IMAGE
    # GPU nodes' usual taints are tolerated unless the settings name tolerations
    assert [(t.key, t.operator, t.effect) for t in pool.pool.settings.tolerations] == [
        ("nvidia.com/gpu", "Exists", "NoSchedule"),
        ("amd.com/gpu", "Exists", "NoSchedule"),
    ]
    cpu = await clusters.join(services, team, options("cpu-lab", gpu=None, idle_timeout_s=5))
    assert (cpu.pool.gpu, cpu.pool.pool.settings.tolerations, cpu.pool.idle_timeout_s) == (None, [], 5)
    assert services.pools[pool.name] == pool
    # the token joins once, as an attached_cluster agent of the workspace labelled with its cluster and pool
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    assert joined.agent_id == made.join.agent_id
    assert dict(joined.labels).items() >= {"cluster": "lab", "pool": pool.name}.items()
    with pytest.raises(Exception, match=r"(?i)token"):
        await agent_join.join(services, made.join.token, hostname="agent-pod")
    # its record keeps its pool and the agent's id, sealed
    store = ClusterStore(services.db, services.box)
    record = await store.by_name(team.workspace_id or "", "lab")
    assert record is not None
    assert (record.kind, record.pool) == ("attached", pool.name)
    sealed = await store.settings(record.id)
    assert sealed is not None
    assert sealed["agent_id"] == made.join.agent_id


async def test_who_may_join_and_bad_options_are_refused_naming_the_field_and_writing_nothing(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    with pytest.raises(PermissionDenied, match="workspace"):
        await clusters.join(services, plant.root, options())
    with pytest.raises(ValueError, match=r"cluster name 'Lab_1'.*lowercase"):
        await clusters.join(services, team, options("Lab_1"))
    with pytest.raises(ValueError, match=r"gpu.*Z9000"):
        await clusters.join(services, team, options(gpu="Z9000"))
    with pytest.raises(ValueError, match=r"settings\.worker_image"):
        await clusters.join(services, team, options(worker_image=""))
    with pytest.raises(ValueError, match="runtime 'nope' is not installed"):
        await clusters.join(services, team, options(runtime="nope"))
    with pytest.raises(ValueError, match=r"settings\.bogus"):
        await clusters.join(services, team, options(settings={"bogus": 1}))
    assert await ClusterStore(services.db, services.box).list(team.workspace_id or "") == []
    assert not [p for p in services.pools.values() if p.pool.provider == "attached_cluster"]
    await clusters.join(services, team, options())
    with pytest.raises(AlreadyExists, match="'lab'"):
        await clusters.join(services, team, options())
    # another workspace may use the same name: its own pool
    other = await workspace_user(services, "other")
    theirs = await clusters.join(services, other, options())
    assert theirs.pool.name != clusters.pool_name("lab", team.workspace_id or "")
    assert theirs.pool.workspace == other.workspace_id


async def test_every_replica_holds_exactly_the_clusters_pools(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    name = made.pool.name
    # another replica (or this one restarted) reads it from SQL
    del services.pools[name]
    assert await clusters.sync_pools(services) == [name]
    assert services.pools[name] == made.pool
    assert await clusters.sync_pools(services) == []
    # a cluster gone from SQL takes its pool with it; the config's pools stay
    await ClusterStore(services.db, services.box).delete(made.cluster.id)
    assert await clusters.sync_pools(services) == [name]
    assert name not in services.pools
    assert {"shared-gpus", "cpu"} <= set(services.pools)


async def test_a_cluster_whose_pool_name_a_config_pool_holds_is_skipped(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    shared = services.pools["shared-gpus"]
    services.pools[made.pool.name] = dataclasses.replace(shared, pool=shared.pool.model_copy(update={"name": "x"}))
    await clusters.sync_pools(services)
    assert services.pools[made.pool.name].pool.provider == "agent_machine"


async def test_list_shows_the_workspaces_clusters_connected_or_not_with_the_agents_report(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    [pending] = await clusters.list_clusters(services, team)
    assert (pending.cluster.name, pending.pool, pending.connected, pending.last_seen, pending.gpu) == (
        "lab",
        made.pool.name,
        False,
        0.0,
        "L4",
    )
    assert pending.agent_id == made.join.agent_id  # issued, not joined yet
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    agent = Agent(plant.hub, await agent_join.authenticate_agent(services, joined.token))
    await agent.connect(provider="attached_cluster")
    assert agent.session is not None
    await agent.session.inventory(
        InventoryReport(
            cpu_millicores=8000,
            memory_mib=32768,
            free_cpu_millicores=6000,
            free_memory_mib=30000,
            gpus=(("L4", 2, 1),),
            machines=("mach_1",),
            details={"namespace": "levers9", "nodes": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}]},
        )
    )
    [view] = await clusters.list_clusters(services, team)
    assert (view.connected, view.agent_id, view.nodes, view.gpus, view.free_gpus, view.workers) == (
        True,
        joined.agent_id,
        2,
        {"L4": 2},
        {"L4": 1},
        ["mach_1"],
    )
    assert view.namespace == "levers9"
    # another workspace sees none of it; an operator has no attached clusters
    other = await workspace_user(services, "other")
    assert await clusters.list_clusters(services, other) == []
    assert await clusters.list_clusters(services, plant.root) == []
    await agent.hang_up()
    [view] = await clusters.list_clusters(services, team)
    assert not view.connected


async def test_rest_and_grpc_join_and_list(plant: Plant) -> None:
    services = plant.services
    team = await services.workspaces.get_or_create("team")
    _, token = await services.tokens.issue("user", workspace_id=team.id, subject="someone@team")
    headers = dict(auth(token))
    response = await plant.rest.post(
        "/api/v1/clusters",
        json={"name": "lab", "gpu": "l4", "worker_image": IMAGE, "max_workers": 2},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["cluster"]["pool"] == clusters.pool_name("lab", team.id)
    assert (body["cluster"]["gpu"], body["cluster"]["connected"]) == ("L4", False)
    assert body["join_token"].startswith("l9_agent_")
    assert body["controlplane_url"].startswith("grpc://")
    again = await plant.rest.post("/api/v1/clusters", json={"name": "lab", "worker_image": IMAGE}, headers=headers)
    assert again.status_code == 409, again.text
    bad = await plant.rest.post(
        "/api/v1/clusters", json={"name": "x", "gpu": "Z9000", "worker_image": IMAGE}, headers=headers
    )
    assert bad.status_code in (400, 422), bad.text
    assert "Z9000" in bad.text
    listed = (await plant.rest.get("/api/v1/clusters", headers=headers)).json()
    assert [(c["name"], c["pool"]) for c in listed] == [("lab", body["cluster"]["pool"])]

    made = await plant.api.JoinCluster(
        controlplane_pb2.JoinClusterRequest(name="cpu-lab", worker_image=IMAGE, max_workers=0, cpu=0.5),
        metadata=auth(token),
    )
    pool = services.pools[made.cluster.pool]
    assert (pool.gpu, pool.max_workers, pool.cpu_millicores) == (None, 0, 500)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plant.api.JoinCluster(
            controlplane_pb2.JoinClusterRequest(name="x", worker_image=IMAGE, settings_json="[1]"), metadata=auth(token)
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "settings_json" in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as operator:
        await plant.api.JoinCluster(
            controlplane_pb2.JoinClusterRequest(name="y", worker_image=IMAGE), metadata=auth(plant.root_token)
        )
    assert operator.value.code() is grpc.StatusCode.PERMISSION_DENIED
    over_grpc = await plant.api.ListClusters(controlplane_pb2.ListClustersRequest(), metadata=auth(token))
    assert sorted(c.name for c in over_grpc.clusters) == ["cpu-lab", "lab"]
    # the agent joins over gRPC with the token the answer carried
    joined = await plant.agent_api.Join(agent_pb2.JoinRequest(join_token=made.join_token, hostname="agent-pod"))
    assert dict(joined.labels)["cluster"] == "cpu-lab"


async def test_remove_revokes_the_agent_cuts_its_stream_with_the_removal_words_and_drops_the_pool(
    plant: Plant,
) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    agent = Agent(plant.hub, await agent_join.authenticate_agent(services, joined.token))
    await agent.connect(provider="attached_cluster")
    other = await workspace_user(services, "other")
    with pytest.raises(NotFound):
        await clusters.remove(services, other, "lab")  # another workspace's cluster is not there for it
    removed = await clusters.remove(services, team, "lab")
    assert removed.agents == [joined.agent_id]
    assert (removed.terminated, removed.not_terminated) == ([], [])
    with pytest.raises(AgentCut, match="this machine was removed: attached cluster lab was removed"):
        await agent.hang_up()  # cut at once, with the words the agent deletes its Jobs on
    with pytest.raises(Unauthenticated):
        await agent_join.authenticate_agent(services, joined.token)
    assert made.pool.name not in services.pools
    assert await clusters.list_clusters(services, team) == []
    with pytest.raises(NotFound):
        await clusters.remove(services, team, "lab")
    # the name is free again: a new cluster, a new pool of the same name, a new token
    again = await clusters.join(services, team, options())
    assert again.pool.name == made.pool.name
    assert again.join.agent_id != joined.agent_id


async def test_an_agent_redis_forgot_is_registered_again_from_its_clusters_record(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    await services.redis.delete(services.agents._key(joined.agent_id))  # Redis lost it (an embedded one, killed)
    assert await services.agents.get(joined.agent_id) is None
    identity = await agent_join.authenticate_agent(services, joined.token)
    assert identity.agent_id == joined.agent_id
    record = await services.agents.get(joined.agent_id)
    assert record is not None
    assert (record.provider, record.workspace) == ("attached_cluster", team.workspace_id)
    assert record.labels.items() >= {"cluster": "lab", "pool": made.pool.name}.items()
    # over the transports: REST and gRPC remove the same way
    again = await clusters.join(services, team, options("lab2"))
    _, token = await services.tokens.issue("user", workspace_id=team.workspace_id, subject="someone@team")
    gone = await plant.rest.delete("/api/v1/clusters/lab", headers=dict(auth(token)))
    assert gone.status_code == 200, gone.text
    assert gone.json()["agents"] == [joined.agent_id]
    missing = await plant.rest.delete("/api/v1/clusters/lab", headers=dict(auth(token)))
    assert missing.status_code == 404
    over_grpc = await plant.api.RemoveCluster(controlplane_pb2.RemoveClusterRequest(name="lab2"), metadata=auth(token))
    assert list(over_grpc.agents) == [again.join.agent_id]


def shared_pool(services: Any, name: str = "shared-lab", cluster: str = "research") -> str:
    """An operator's shared cluster, as the config file declares one (provider attached_cluster, no workspace)."""
    spec = clusters.build_pool(services, name, "", clusters._pool_config(options(cluster)))
    services.pools[name] = dataclasses.replace(
        spec, pool=spec.pool.model_copy(update={"workspace": None}), workspace=None, configured=True
    )
    return name


async def test_an_operators_shared_cluster_is_a_config_pool_whose_agent_joins_with_pool(plant: Plant) -> None:
    services = plant.services
    pool = shared_pool(services)
    with pytest.raises(PermissionDenied, match=r"--pool POOL"):
        await clusters.join(services, plant.root, options("research"))
    with pytest.raises(ValueError, match=r"served by cluster 'research', not 'lab'"):
        await clusters.join(services, plant.root, options("lab", pool=pool))
    with pytest.raises(ValueError, match=r"'nope' is not a configured attached_cluster pool; configured: shared-lab"):
        await clusters.join(services, plant.root, options("research", pool="nope"))
    team = await workspace_user(services, "team")
    with pytest.raises(ValueError, match="only for an operator's shared cluster"):
        await clusters.join(services, team, options("research", pool=pool))
    made = await clusters.join(services, plant.root, options("research", pool=pool))
    assert (made.cluster.kind, made.pool.name, made.join.workspace) == ("configured", pool, None)
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    assert dict(joined.labels).items() >= {"cluster": "research", "pool": pool}.items()
    [view] = await clusters.list_clusters(services, plant.root)
    assert (view.cluster.name, view.pool, view.agent_id) == ("research", pool, joined.agent_id)
    assert await clusters.list_clusters(services, team) == []  # not the workspace's to list
    assert await ClusterStore(services.db, services.box).list_kind(clusters.KIND) == []  # nothing recorded
    removed = await clusters.remove(services, plant.root, "research")
    assert removed.agents == [joined.agent_id]
    with pytest.raises(Unauthenticated):
        await agent_join.authenticate_agent(services, joined.token)
    assert pool in services.pools  # the configured pool stays
    with pytest.raises(NotFound):
        await clusters.remove(services, plant.root, "lab")


async def test_a_removed_clusters_agent_is_refused_in_words_that_say_what_to_do(plant: Plant) -> None:
    services = plant.services
    team = await workspace_user(services, "team")
    made = await clusters.join(services, team, options())
    joined = await agent_join.join(services, made.join.token, hostname="agent-pod")
    await clusters.remove(services, team, "lab")
    with pytest.raises(Unauthenticated) as refused:
        await agent_join.authenticate_agent(services, joined.token)
    said = str(refused.value)
    assert said.startswith("this machine was removed: its attached cluster was removed")  # the agent's REMOVED
    assert "levers9 cluster join NAME" in said
    assert "levers9-agent-credential" in said
