"""Fixtures of the ``attached_cluster`` tests: a fake customer cluster, its agent on a test hub, and pools.

The cluster is :class:`tests.fakes.k8s_cluster.FakeCluster` (the Kubernetes API
at the wire, a scheduler and a kubelet that runs pods as local processes) with
the recorded nodes of ``tests/data/k8s``: an EKS g6.xlarge with one NVIDIA L4,
labelled by GPU Feature Discovery and tainted ``nvidia.com/gpu=present:NoSchedule``,
and an m6i.xlarge without GPUs. Its agent is the agent's real Kubernetes
backend (:class:`levers9.agent.k8s_workers.K8sWorkers`) joined to a
:class:`~tests.plugins.attached_cluster.cluster_hub.ClusterHub`, which lives on
an event loop of its own thread, as the controlplane's hub lives on the
server's loop: the provider's hooks run on the test's thread and reach it
through ``PluginContext.send_order``.

After each test no Job, pod or Secret may be left in the cluster (the pods'
background deletion waited for), and the fake met no error of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from levers9.agent.k8s_workers import K8sWorkers
from levers9.hooks.context import PluginContext
from levers9.hooks.types import Pool
from levers9_attached_cluster.provider import AttachedClusterProvider
from levers9_attached_cluster.settings import AttachedClusterSettings
from tests.fakes.k8s_cluster import FakeCluster, recorded_cluster
from tests.fixtures.agent_hub import HubLoop
from tests.plugins.attached_cluster.cluster_hub import ClusterAgent, ClusterHub

__all__ = ["CLUSTER", "IMAGE", "L4_LABEL", "NAMESPACE", "POOL", "TOLERATE_GPU", "WORKSPACE", "cluster_settings"]

NAMESPACE = "levers9"
IMAGE = "registry.example.com/levers9/worker:test"
L4_LABEL = "nvidia.com/gpu.product=NVIDIA-L4"
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CLUSTER = "lab"
#: the pool ``levers9 cluster join lab`` made: ``<cluster>.<8 hex>``, owned by the workspace
POOL = "lab.0a1b2c3d"
WORKSPACE = "ws-acme"


def cluster_settings(**changes: Any) -> dict[str, Any]:
    """Working pool settings: the cluster, its agent's namespace, the worker image, the GPU taint tolerated."""
    return {
        "cluster": CLUSTER,
        "namespace": NAMESPACE,
        "worker_image": IMAGE,
        "tolerations": [TOLERATE_GPU],
        **changes,
    }


def api_client(kubeconfig: Path) -> Any:
    """A ``kubernetes.client.ApiClient`` on ``kubeconfig``, as the cluster's owner (or the agent) would make one."""
    new_client: Callable[..., Any] = kubernetes.config.new_client_from_config
    return new_client(config_file=str(kubeconfig))


def make_pool(
    *,
    name: str = POOL,
    workspace: str | None = WORKSPACE,
    gpu: str | None = "L4",
    gpu_count: int = 1,
    **settings: Any,
) -> Pool:
    return Pool(
        name=name,
        provider="attached_cluster",
        runtime="process",
        gpu=gpu,
        gpu_count=gpu_count if gpu else 0,
        workspace=workspace,
        settings=AttachedClusterSettings.model_validate(cluster_settings(**settings)),
    )


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """The two recorded nodes; afterwards no Job, pod or Secret may be left (background deletion waited for)."""
    with recorded_cluster(NAMESPACE) as fake:
        yield fake


@pytest.fixture
def kubeconfig(cluster: FakeCluster, tmp_path: Path) -> Path:
    return cluster.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def hub_loop() -> Iterator[HubLoop]:
    loop = HubLoop("attached cluster hub")
    yield loop
    loop.close()


@pytest.fixture
def hub() -> ClusterHub:
    return ClusterHub()


@pytest.fixture
def join(hub: ClusterHub, kubeconfig: Path) -> Iterator[Callable[..., ClusterAgent]]:
    """``join(agent_id="agent-lab", workspace=WORKSPACE, cluster=CLUSTER)``: an agent of the fake cluster joined."""
    made: list[K8sWorkers] = []

    def joined(
        agent_id: str = "agent-lab", *, workspace: str | None = WORKSPACE, cluster: str = CLUSTER, pool: str = POOL
    ) -> ClusterAgent:
        # insecure: the workers' controlplane URL in these tests is plain text (grpc://127.0.0.1)
        workers = K8sWorkers(
            NAMESPACE,
            agent_id=agent_id,
            api_client_factory=lambda: api_client(kubeconfig),
            insecure=True,
            owner=pool,  # as the daemon gives it: its credential's pool label
        )
        made.append(workers)
        return hub.join(agent_id, workers, workspace=workspace, cluster=cluster, pool=pool)

    yield joined
    for workers in made:
        workers.close()


@pytest.fixture
def provider(hub: ClusterHub, hub_loop: HubLoop) -> AttachedClusterProvider:
    made = AttachedClusterProvider()
    ctx = PluginContext(name="attached_cluster", log=logging.getLogger("test.attached_cluster"), agents=hub)
    ctx.loop = hub_loop.loop
    made.levers9_startup(ctx)
    return made


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[Any]:
    """The real client's CoreV1Api on the cluster, as the cluster's owner would use it."""
    client = api_client(kubeconfig)
    yield kubernetes.client.CoreV1Api(client)
    client.close()
