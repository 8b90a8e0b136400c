"""What the ``local_k8s`` provider reads off a cluster before it creates anything: quantities, nodes' room, Jobs.

Pure functions over the API's JSON, so each rule is checked on its own: the
Kubernetes quantity grammar, a node's GPU type from its labels and the label a
Job then requires, taints against tolerations, free GPUs, CPU and memory after
the pods bound to the node, and the Job and Secret one worker is made of
(the token only in the Secret, the GPUs as the pod's limit).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from levers9.hooks.types import GpuOffer, Pool
from levers9.kube import parse_quantity, pod_asks
from levers9.kube.jobs import (
    MACHINE_LABEL,
    POOL_LABEL,
    job_manifest,
    job_name,
    owner_reference,
    secret_manifest,
    secret_name,
)
from levers9.kube.rooms import describe_misses, gpu_label, rooms, tolerates
from levers9.kube.shapes import Toleration
from levers9_local_k8s.settings import LocalK8sSettings
from tests.plugins.provision import provision_request

IMAGE = "registry.example.com/levers9/worker:1.0"


def node(
    name: str,
    labels: dict[str, str],
    allocatable: dict[str, str],
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(node_name: str, requests: dict[str, str], limits: dict[str, str] | None = None, phase: str = "Running") -> Any:
    return {
        "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": requests, "limits": limits or {}}}]},
        "status": {"phase": phase},
    }


L4_LABELS = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "23034"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]


def test_kubernetes_quantities_are_read_exactly() -> None:
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("4Gi") == 4 * 1024**3
    assert parse_quantity("4G") == 4 * 10**9  # decimal, as Kubernetes reads it
    assert parse_quantity("1.5") == Fraction(3, 2)
    assert parse_quantity("2e3") == 2000
    assert parse_quantity("128974848") == 128974848
    assert parse_quantity(8) == 8
    for bad in ("", "4GB", "one", "1.2.3", "4 Gi"):
        with pytest.raises(ValueError, match="not a Kubernetes quantity"):
            parse_quantity(bad)


def test_a_nodes_gpu_type_comes_from_its_labels_and_names_the_label_a_job_requires() -> None:
    assert gpu_label(L4_LABELS) == "nvidia.com/gpu.product=NVIDIA-L4"
    assert gpu_label({"cloud.google.com/gke-accelerator": "nvidia-l4"}) == "cloud.google.com/gke-accelerator=nvidia-l4"
    assert gpu_label({"kubernetes.io/os": "linux"}) is None
    found = rooms(
        [node("gke-l4", {"cloud.google.com/gke-accelerator": "nvidia-l4"}, {"nvidia.com/gpu": "1", "cpu": "4"})],
        [],
        gpu_resource="nvidia.com/gpu",
        node_selector={},
        tolerations=[],
    )
    assert [(r.gpu, r.gpus_total, r.type_label) for r in found] == [
        ("L4", 1, "cloud.google.com/gke-accelerator=nvidia-l4")
    ]


def test_taints_are_matched_as_the_api_server_matches_them() -> None:
    assert tolerates(TOLERATE_GPU, GPU_TAINT)
    assert tolerates([Toleration(key="nvidia.com/gpu", value="present")], GPU_TAINT)
    assert not tolerates([Toleration(key="nvidia.com/gpu", value="absent")], GPU_TAINT)
    assert not tolerates([Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoExecute")], GPU_TAINT)
    assert tolerates([Toleration(operator="Exists")], GPU_TAINT)  # an empty key with Exists tolerates everything
    assert not tolerates([], GPU_TAINT)


def test_free_room_is_allocatable_minus_what_live_pods_hold() -> None:
    nodes = [
        node("gpu-a", L4_LABELS, {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}, [GPU_TAINT]),
        node("gpu-b", L4_LABELS, {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}, [GPU_TAINT]),
        node("cpu-a", {}, {"cpu": "16", "memory": "64Gi"}),
        node("gpu-cordoned", L4_LABELS, {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}, unschedulable=True),
        node("gpu-down", L4_LABELS, {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}, ready=False),
    ]
    pods = [
        # the GPU is asked through its limit only: the API server makes that the request too
        pod("gpu-a", {"cpu": "2", "memory": "8Gi"}, {"nvidia.com/gpu": "2"}),
        pod("gpu-b", {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}),
        pod("gpu-b", {"cpu": "4", "memory": "4Gi", "nvidia.com/gpu": "1"}, phase="Succeeded"),  # ended: holds nothing
    ]
    found = {
        r.name: r for r in rooms(nodes, pods, gpu_resource="nvidia.com/gpu", node_selector={}, tolerations=TOLERATE_GPU)
    }
    assert (found["gpu-a"].gpus_free, found["gpu-a"].cpu_free_millicores, found["gpu-a"].memory_free_mib) == (
        0,
        6000,
        24 * 1024,
    )
    assert (found["gpu-b"].gpus_free, found["gpu-b"].cpu_free_millicores) == (1, 7500)
    assert found["gpu-a"].shortfall(1, 1000, 1024) == "0 of 2 GPUs free, 1 needed"
    assert found["gpu-b"].shortfall(1, 1000, 1024) is None
    assert found["gpu-b"].shortfall(1, 8000, 1024) == "7500m CPU free, 8000m needed"
    assert found["cpu-a"].gpu is None
    assert found["gpu-cordoned"].excluded == "is cordoned (unschedulable)"
    assert found["gpu-down"].excluded == "is not Ready"

    untolerating = {
        r.name: r for r in rooms(nodes, pods, gpu_resource="nvidia.com/gpu", node_selector={}, tolerations=[])
    }
    assert "taint nvidia.com/gpu=present:NoSchedule" in (untolerating["gpu-a"].excluded or "")
    selected = {
        r.name: r
        for r in rooms(
            nodes, pods, gpu_resource="nvidia.com/gpu", node_selector={"pool": "train"}, tolerations=TOLERATE_GPU
        )
    }
    assert selected["gpu-b"].excluded == "does not match the pool's node_selector (pool=train)"
    assert pod_asks(pods[0]["spec"])[0] == {"cpu": 2, "memory": 8 * 1024**3, "nvidia.com/gpu": 2}
    misses = [(f"n{i}", "full") for i in range(6)]
    assert describe_misses(misses) == "n0: full; n1: full; n2: full; n3: full; and 2 more nodes"


def test_a_worker_is_a_job_whose_token_is_only_in_its_secret() -> None:
    settings = LocalK8sSettings(
        worker_image=IMAGE,
        namespace="gpu-workers",
        tolerations=TOLERATE_GPU,
        node_selector={"pool": "train"},
        service_account="levers9-worker",
        image_pull_secrets=["registry"],
    )
    pool = Pool(name="l4", provider="local_k8s", runtime="process", gpu="L4", gpu_count=1, settings=settings)
    offer = GpuOffer(gpu="L4", gpu_count=1, gpu_memory_mib=23034, instance_type="nvidia.com/gpu.product=NVIDIA-L4")
    request = provision_request(pool, offer, machine_id="mach_AB12cd")
    job = job_manifest(request, settings)
    secret = secret_manifest(request, settings)
    token = request.bootstrap.token

    assert job_name("mach_AB12cd") == "levers9-mach-ab12cd" == job["metadata"]["name"]
    assert secret["metadata"]["name"] == secret_name("mach_AB12cd") == "levers9-mach-ab12cd-token"
    assert secret["stringData"] == {"LEVERS9_TOKEN": token}
    assert token not in str(job), "the token must be in the Secret only"
    labels = {MACHINE_LABEL: "mach_AB12cd", POOL_LABEL: "l4"}
    assert labels.items() <= job["metadata"]["labels"].items()
    assert labels.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert job["spec"]["backoffLimit"] == 0
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["automountServiceAccountToken"] is False
    [container] = pod_spec["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["levers9", "worker"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["cpu"] == f"{request.resources.cpu_millicores}m"
    env = {e["name"]: e for e in container["env"]}
    assert env["LEVERS9_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "LEVERS9_TOKEN",
    }
    assert env["LEVERS9_MACHINE_ID"]["value"] == "mach_AB12cd"
    assert env["LEVERS9_STOP_GRACE_S"]["value"] == str(pod_spec["terminationGracePeriodSeconds"])
    assert pod_spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod_spec["nodeSelector"] == {"pool": "train"}
    assert pod_spec["serviceAccountName"] == "levers9-worker"
    assert pod_spec["imagePullSecrets"] == [{"name": "registry"}]
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]}
    ]
    owned = owner_reference({"metadata": {"name": "levers9-mach-ab12cd", "uid": "u-1"}})
    assert (owned["kind"], owned["name"], owned["uid"]) == ("Job", "levers9-mach-ab12cd", "u-1")

    cpu_pool = Pool(name="cpu", provider="local_k8s", runtime="process", settings=settings)
    cpu_job = job_manifest(provision_request(cpu_pool, None), settings)
    assert "affinity" not in cpu_job["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
