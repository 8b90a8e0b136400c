"""Fixtures of the ``local_k8s`` plugin's tests: a fake cluster of one L4 node and one CPU node, and pool settings.

The cluster is :class:`tests.fakes.k8s_cluster.FakeCluster` (the Kubernetes API
at the wire, a scheduler and a kubelet that runs pods as local processes),
loaded with the Node objects of ``tests/data/k8s``: an EKS g6.xlarge with one
NVIDIA L4 labelled by GPU Feature Discovery and tainted
``nvidia.com/gpu=present:NoSchedule``, and an m6i.xlarge without GPUs. The
plugin reads it through the kubeconfig the fake writes, as an operator's pool
would name one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from levers9.hooks.context import PluginContext
from levers9.hooks.types import Pool
from levers9_local_k8s.provider import K8sProvider
from levers9_local_k8s.settings import LocalK8sSettings
from tests.fakes.k8s_cluster import CPU_NODE, GPU_NODE, FakeCluster, load_recorded_nodes

__all__ = ["CPU_NODE", "GPU_NODE", "IMAGE", "L4_LABEL", "NAMESPACE", "TOLERATE_GPU", "make_pool"]

NAMESPACE = "levers9"
IMAGE = "registry.example.com/levers9/worker:test"
L4_LABEL = "nvidia.com/gpu.product=NVIDIA-L4"
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster(NAMESPACE, max_grace_s=2.0) as fake:
        yield load_recorded_nodes(fake)
        assert fake.errors == []


@pytest.fixture
def k8s_settings(cluster: FakeCluster, tmp_path: Path) -> dict[str, Any]:
    """Working pool settings: the fake's kubeconfig, the worker image, the GPU taint tolerated."""
    return {
        "kubeconfig": str(cluster.kubeconfig(tmp_path / "kubeconfig")),
        "namespace": NAMESPACE,
        "worker_image": IMAGE,
        "tolerations": [TOLERATE_GPU],
    }


@pytest.fixture
def provider() -> Iterator[K8sProvider]:
    made = K8sProvider()
    yield made
    made.levers9_shutdown(PluginContext.bare("local_k8s"))


def make_pool(settings: dict[str, Any], *, name: str = "l4", gpu: str | None = "L4", gpu_count: int = 1) -> Pool:
    return Pool(
        name=name,
        provider="local_k8s",
        runtime="process",
        gpu=gpu,
        gpu_count=gpu_count if gpu else 0,
        settings=LocalK8sSettings.model_validate(settings),
    )
