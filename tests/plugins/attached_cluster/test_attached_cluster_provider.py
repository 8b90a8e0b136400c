"""The ``attached_cluster`` provider's hooks, driven against a cluster agent played by the agent's real backend.

Every order the provider sends is carried out by
:class:`levers9.agent.k8s_workers.K8sWorkers` on the fake cluster (the real
``kubernetes`` client at the wire), and every inventory it reads is that
agent's ``build_k8s_inventory`` as the controlplane stores it
(:mod:`tests.plugins.attached_cluster.cluster_hub`). What is checked: offers
come from the GPU Feature Discovery labels and the room of the reported
nodes; a full node gets no usable offer and provision is refused, naming each
node's shortfall, before any order or Job; a quota-limited namespace is the
agent's ``quota_exceeded``, :class:`QuotaExceeded`, with no Job; a provision
creates the Job and its token Secret, is listed running once the fake kubelet
runs the pod, is idempotent, and terminate leaves nothing; a pod the
scheduler cannot place is listed pending with the scheduler's message; another
workspace's pool of the same cluster name sees nothing and orders nothing; a
silent agent has every machine failed and serves nothing, and terminating
through it is retryable; a removed agent's machine is terminated as gone; a
re-joined cluster is served by its newest agent; check says what the agent
reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from levers9.gpu.catalog import CATALOG
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest, ProviderError, QuotaExceeded
from levers9.hooks.types import Availability, GpuOffer, Machine, MachineState, Pool
from levers9.kube.jobs import job_name, secret_name
from levers9_attached_cluster.provider import AgentOffline, AttachedClusterProvider
from tests.fakes.k8s_cluster import CPU_NODE, GPU_NODE, FakeCluster
from tests.fixtures.wait import wait_for
from tests.plugins.attached_cluster.cluster_hub import ClusterAgent, ClusterHub
from tests.plugins.attached_cluster.conftest import CLUSTER, IMAGE, L4_LABEL, NAMESPACE, make_pool
from tests.plugins.provision import provision_request

#: the join fixture: join(agent_id=..., workspace=..., cluster=...) -> ClusterAgent
Join = Callable[..., ClusterAgent]


def l4_offer(provider: AttachedClusterProvider, pool: Pool | None = None) -> GpuOffer:
    [offer] = provider.levers9_gpu_offers(pool or make_pool())
    return offer


def bound(cluster: FakeCluster, node: str = GPU_NODE) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(NAMESPACE) if p["spec"].get("nodeName") == node]


def listed(provider: AttachedClusterProvider, pool: Pool, state: MachineState) -> list[Machine]:
    return [m for m in provider.levers9_list_machines(pool) if m.state is state]


# ---------------------------------------------------------------------------------------------- offers


def test_offers_come_from_the_gfd_labels_and_room_of_the_reported_nodes(
    provider: AttachedClusterProvider, join: Join
) -> None:
    # no agent of the cluster yet: no answer, so the planner waits for one rather than start a Job without
    # node affinity (before: [] and the pool's own shape, which put an L4 pool's worker on a T4 node)
    with pytest.raises(InsufficientCapacity, match=f"no agent of cluster {CLUSTER!r} has joined"):
        provider.levers9_gpu_offers(make_pool())
    join()
    offer = l4_offer(provider)
    assert (offer.gpu, offer.gpu_count, offer.instance_type) == ("L4", 1, L4_LABEL)
    assert offer.gpu_memory_mib == CATALOG["L4"].memory_mib
    assert offer.availability is Availability.AVAILABLE
    assert (offer.price_per_hour, offer.zone) == (None, None)
    # the pool's placement is the local_k8s one: untolerated taint, no such GPU, too few, a CPU pool
    assert provider.levers9_gpu_offers(make_pool(tolerations=[])) == []
    assert provider.levers9_gpu_offers(make_pool(gpu="H100")) == []
    assert provider.levers9_gpu_offers(make_pool(gpu_count=2)) == []
    assert provider.levers9_gpu_offers(make_pool(gpu=None)) == []
    assert provider.levers9_gpu_offers(make_pool(node_selector={"levers9.test/pool": "none-has-it"})) == []
    # another cluster's pool of the same workspace: its agent never joined
    with pytest.raises(InsufficientCapacity, match="no agent of cluster 'other' has joined"):
        provider.levers9_gpu_offers(make_pool(cluster="other"))
    # a process without an agent hub (``levers9 offers`` from a config file) offers nothing, and fails nothing
    bare = AttachedClusterProvider()
    bare.levers9_startup(PluginContext.bare("attached_cluster"))
    assert bare.levers9_gpu_offers(make_pool()) == []
    assert bare.levers9_check(make_pool()).ok
    with pytest.raises(ProviderError, match="no agent hub in this process"):
        bare.levers9_provision(provision_request(make_pool(), offer))


def test_a_full_node_has_no_usable_offer_and_provision_is_refused_before_any_order(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    pool = make_pool()
    first = provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    wait_for(lambda: bound(cluster), "the first worker pod bound to the L4 node")
    offer = l4_offer(provider)
    assert offer.availability is Availability.UNAVAILABLE  # the scheduler skips it
    with pytest.raises(InsufficientCapacity) as info:
        provider.levers9_provision(provision_request(pool, offer))
    said = str(info.value)
    assert f"pool {pool.name!r} (cluster {CLUSTER!r})" in said
    assert f"{GPU_NODE}: 0 of 1 GPUs free, 1 needed" in said
    assert f"{CPU_NODE}: not a {L4_LABEL} node" in said
    assert info.value.code == "NoNodeFits"
    assert agent.kinds() == ["provision"]  # the refusal was the provider's own: no order went out
    assert [j["metadata"]["name"] for j in cluster.created("jobs")] == [first.provider_id]
    assert len(cluster.created("secrets")) == 1
    provider.levers9_terminate(pool, first)


@pytest.mark.parametrize("answer_refusals", [False, True], ids=["hub raises", "hub answers the refusal"])
def test_a_quota_limited_namespace_is_the_agents_quota_exceeded_and_no_job(
    provider: AttachedClusterProvider,
    hub: ClusterHub,
    join: Join,
    cluster: FakeCluster,
    kube: Any,
    answer_refusals: bool,
) -> None:
    hub.answer_refusals = answer_refusals
    agent = join()
    quota = {"metadata": {"name": "gpu-budget"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    kube.create_namespaced_resource_quota(NAMESPACE, quota)
    pool = make_pool()
    with pytest.raises(QuotaExceeded) as info:
        provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    said = str(info.value)
    assert f"pool {pool.name!r} (cluster {CLUSTER!r})" in said
    assert "refused the provision order" in said
    assert "ResourceQuota gpu-budget allows requests.nvidia.com/gpu=0 in namespace levers9" in said
    assert agent.kinds() == ["provision"]
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []


# ---------------------------------------------------------------------------------------------- a worker's life


def test_provision_creates_the_job_and_secret_listed_running_and_terminate_leaves_nothing(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    pool = make_pool()
    offer = l4_offer(provider)
    request = provision_request(pool, offer)
    machine = provider.levers9_provision(request)
    name = job_name(request.machine_id)
    assert (machine.provider_id, machine.machine_id, machine.state) == (name, request.machine_id, MachineState.PENDING)
    assert machine.provider_data == {
        "agent_id": agent.agent_id,
        "namespace": NAMESPACE,
        "job": name,
        "reachable": False,
    }
    assert (machine.gpu, machine.gpu_count, machine.instance_type) == ("L4", 1, L4_LABEL)
    [order] = agent.orders
    assert (order.kind, order.order_id, sorted(order.payload)) == (
        "provision",
        f"prov-{request.machine_id}",
        ["job", "machine_id", "secret"],
    )
    [job] = cluster.objects("jobs", NAMESPACE)
    assert job["metadata"]["name"] == name
    pod = job["spec"]["template"]["spec"]
    # the offer's GPU label is required, so the pod lands on a node of that type and no other
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]}
    ]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    [secret] = cluster.objects("secrets", NAMESPACE)
    assert secret["metadata"]["name"] == secret_name(request.machine_id)
    assert request.bootstrap.token not in json.dumps(job)  # the token is in the Secret only

    running = wait_for(lambda: listed(provider, pool, MachineState.RUNNING), "the worker listed running")
    assert [m.machine_id for m in running] == [request.machine_id]
    assert running[0].provider_data == {**machine.provider_data, "node": GPU_NODE}
    assert running[0].reason is None

    # a retry (the first answer lost): the same Job answered, although its GPU is held now
    again = provider.levers9_provision(request)
    assert again.provider_id == name
    assert len(cluster.created("jobs")) == 1

    provider.levers9_terminate(pool, running[0])
    wait_for(
        lambda: cluster.leftovers() == [], "the Job, its pod and its Secret gone", why=lambda: str(cluster.leftovers())
    )
    assert provider.levers9_list_machines(pool) == []
    provider.levers9_terminate(pool, machine)  # again: nothing there is success
    assert agent.kinds() == ["provision", "provision", "terminate", "terminate"]
    assert cluster.running_processes() == []


def test_a_pod_the_scheduler_cannot_place_is_listed_pending_with_its_message(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    """Both provisions see the L4 free (neither pod is bound yet); the scheduler then places only one."""
    join()
    pool = make_pool()
    cluster.pause_scheduling()
    offer = l4_offer(provider)
    machines = [provider.levers9_provision(provision_request(pool, offer)) for _ in range(2)]
    cluster.resume_scheduling()
    [waiting] = wait_for(
        lambda: [
            m for m in provider.levers9_list_machines(pool) if m.reason and m.reason.startswith("FailedScheduling")
        ],
        "the pod the scheduler cannot place",
    )
    assert waiting.state is MachineState.PENDING
    assert "0/2 nodes are available: 1 Insufficient nvidia.com/gpu" in (waiting.reason or "")
    for machine in machines:
        provider.levers9_terminate(pool, machine)


def test_a_worker_whose_image_cannot_be_pulled_is_failed_at_once_with_the_kubelets_words(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    """Before: listed pending ('ErrImagePull: ...') until the registration deadline (600 s) ran out."""
    join()
    cluster.unpullable(IMAGE)
    pool = make_pool()
    machine = provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    [failed] = wait_for(lambda: listed(provider, pool, MachineState.FAILED), "the worker failed for its image")
    assert failed.machine_id == machine.machine_id
    assert (failed.reason or "").startswith("the worker's pod cannot start: ErrImagePull: failed to pull and unpack")
    assert IMAGE in (failed.reason or "")
    provider.levers9_terminate(pool, failed)
    wait_for(lambda: cluster.leftovers() == [], "the Job, its pod and its Secret gone")


# ---------------------------------------------------------------------------------------------- whose cluster


def test_another_workspaces_pool_of_the_same_cluster_name_sees_nothing_and_orders_nothing(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    mine, theirs = make_pool(), make_pool(workspace="ws-other")
    machine = provider.levers9_provision(provision_request(mine, l4_offer(provider)))
    wait_for(lambda: listed(provider, mine, MachineState.RUNNING), "the worker listed running in its own pool")

    with pytest.raises(InsufficientCapacity, match=f"no agent of cluster {CLUSTER!r} has joined"):
        provider.levers9_gpu_offers(theirs)
    with pytest.raises(InsufficientCapacity, match=f"no agent of cluster {CLUSTER!r} has joined"):
        provider.levers9_provision(provision_request(theirs, None))
    assert provider.levers9_list_machines(theirs) == []
    assert not provider.levers9_check(theirs).ok
    # the machine itself, as if the other workspace's reconciler held it: its agent is not theirs to order
    provider.levers9_terminate(theirs, machine)
    assert agent.kinds() == ["provision"]
    assert len(cluster.objects("jobs", NAMESPACE)) == 1
    # nor is the operator's pool of that name (no workspace) served by the workspace's agent
    with pytest.raises(InsufficientCapacity, match=f"no agent of cluster {CLUSTER!r} has joined"):
        provider.levers9_gpu_offers(make_pool(workspace=None))
    provider.levers9_terminate(mine, machine)


# ---------------------------------------------------------------------------------------------- agents coming and going


def test_a_silent_agent_has_every_machine_failed_serves_nothing_and_terminate_waits_for_it(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    pool = make_pool()
    machine = provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    wait_for(lambda: listed(provider, pool, MachineState.RUNNING), "the worker listed running")

    agent.fall_silent(200)
    [failed] = provider.levers9_list_machines(pool)
    assert failed.state is MachineState.FAILED
    assert failed.reason == f"agent {agent.agent_id} of cluster {CLUSTER!r} silent for 200 s"
    with pytest.raises(InsufficientCapacity, match="is not connected"):  # no answer: the planner waits
        provider.levers9_gpu_offers(pool)
    with pytest.raises(InsufficientCapacity) as info:
        provider.levers9_provision(provision_request(pool, None))
    assert f"the agent {agent.agent_id} of cluster {CLUSTER!r} is not connected (last heard from 200 s ago)" in str(
        info.value
    )
    check = provider.levers9_check(pool)
    assert not check.ok
    assert "not connected" in check.message
    with pytest.raises(AgentOffline) as offline:
        provider.levers9_terminate(pool, failed)
    assert offline.value.retryable
    assert agent.kinds() == ["provision"]

    # still connected but silent past the pool's heartbeat_timeout_s: no longer serving either
    agent.fall_silent(120, connected=True)
    with pytest.raises(InsufficientCapacity, match="is silent for 120 s"):
        provider.levers9_gpu_offers(pool)
    with pytest.raises(InsufficientCapacity, match="is silent for 120 s"):
        provider.levers9_provision(provision_request(pool, None))

    agent.reconnect()
    provider.levers9_terminate(pool, machine)
    assert agent.kinds() == ["provision", "terminate"]


def test_a_removed_agents_machine_is_terminated_as_gone(
    provider: AttachedClusterProvider, hub: ClusterHub, join: Join
) -> None:
    agent = join()
    pool = make_pool()
    machine = provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    hub.remove(agent.agent_id)
    provider.levers9_terminate(pool, machine)  # no agent of the cluster is known: nothing of levers9 can run there
    assert agent.kinds() == ["provision"]
    assert provider.levers9_list_machines(pool) == []
    agent.workers.terminate({"machine_id": machine.machine_id})  # the cluster's owner cleans up after levers9


def test_a_rejoined_cluster_is_served_by_its_newest_agent(provider: AttachedClusterProvider, join: Join) -> None:
    old = join("agent-old")
    pool = make_pool()
    machine = provider.levers9_provision(provision_request(pool, l4_offer(provider)))
    assert machine.provider_data["agent_id"] == "agent-old"
    old.fall_silent(30)
    new = join("agent-new")
    [listed_now] = wait_for(lambda: listed(provider, pool, MachineState.RUNNING), "the worker listed running")
    assert listed_now.provider_data["agent_id"] == "agent-new"  # the newest report is the cluster's
    # the machine's own agent is gone, the cluster is not: the order goes to the agent that serves it
    provider.levers9_terminate(pool, machine)
    assert (old.kinds(), new.kinds()) == (["provision"], ["terminate"])


def test_a_pool_whose_namespace_is_not_the_agents_is_refused_and_check_says_so(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    check = provider.levers9_check(make_pool())
    assert check.ok, check
    assert f"agent {agent.agent_id} of cluster {CLUSTER!r} connected" in check.message
    assert "2 of 2 nodes usable by the pool, 1 of 1 L4 GPUs free" in check.message
    elsewhere = make_pool(namespace="ml")
    with pytest.raises(InvalidRequest, match="creates worker Jobs in namespace 'levers9'"):
        provider.levers9_provision(provision_request(elsewhere, l4_offer(provider)))
    check = provider.levers9_check(elsewhere)
    assert not check.ok
    assert check.hint == "set the pool's namespace to 'levers9'"
    assert agent.kinds() == []
    assert cluster.created("jobs") == []


def test_a_runc_pool_without_privileged_is_refused_before_any_order_and_check_says_so(
    provider: AttachedClusterProvider, join: Join, cluster: FakeCluster
) -> None:
    agent = join()
    refused = make_pool().model_copy(update={"runtime": "runc"})
    with pytest.raises(InvalidRequest, match=r"pool '.+' runs runtime 'runc'.*settings\.privileged: true"):
        provider.levers9_provision(provision_request(refused, l4_offer(provider)))
    check = provider.levers9_check(refused)
    assert not check.ok
    assert "settings.privileged" in check.message
    assert check.hint is not None
    assert "allow_privileged" in check.hint
    assert provider.levers9_check(make_pool(privileged=True).model_copy(update={"runtime": "gvisor"})).ok
    assert agent.kinds() == []
    assert cluster.created("jobs") == []
