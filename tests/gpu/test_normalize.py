"""Every source's GPU spellings, recorded in tests/data/gpu, come out as canonical types (or None)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.gpu import CATALOG, normalize
from levers9.gpu.normalize import (
    from_ec2_gpu_info,
    from_k8s_labels,
    from_lambda_instance_type,
    from_nvidia_smi,
    from_oci_shape,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- nvidia-smi names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("Tesla T4", "T4"),
        ("NVIDIA A100-SXM4-40GB", "A100-40"),
        ("NVIDIA A100-SXM4-80GB", "A100-80"),
        ("NVIDIA A100 80GB PCIe", "A100-80"),
        ("NVIDIA A100-PCIE-40GB", "A100-40"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA GeForce RTX 5090", "RTX5090"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA RTX A6000", "A6000"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla V100-SXM2-32GB", "V100-32"),
        ("Tesla V100-PCIE-16GB", "V100"),
        ("Tesla V100S-PCIE-32GB", "V100-32"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada"),
        ("RTX 6000Ada", "RTX6000-Ada"),  # Vast.ai's spelling
        # not in the catalog
        ("Quadro RTX 6000", None),
        ("NVIDIA RTX 6000", None),  # the Turing Quadro too, not the Ada card
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA A30", None),
        ("NVIDIA H800", None),
        ("NVIDIA A800 80GB PCIe", None),
        ("NVIDIA GB200", None),
        ("NVIDIA RTX PRO 4000 Blackwell", None),
        ("Tesla K80", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("", None),
        # a bare A100 is not guessed
        ("A100", None),
        ("NVIDIA A100-SXM4", None),
    ],
)
def test_from_nvidia_smi(name: str, expected: str | None) -> None:
    assert from_nvidia_smi(name) == expected


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("NVIDIA A100-SXM4", 40960, "A100-40"),
        ("NVIDIA A100-SXM4", 81920, "A100-80"),
        ("A100", 40536, "A100-40"),
        ("A100", 80994, "A100-80"),
        ("A100", 0, None),
        ("Tesla V100-SXM2", 32510, "V100-32"),
        ("Tesla V100-SXM2", 16160, "V100"),
        # the memory written in the name beats the figure passed in
        ("NVIDIA A100-SXM4-40GB", 81920, "A100-40"),
        # the NVL is its own type (94 GB): a type means its memory; the figure passed in does not move an H100
        ("NVIDIA H100 NVL", 95830, "H100-NVL"),
        ("NVIDIA H100 PCIe", 95830, "H100"),
    ],
)
def test_from_nvidia_smi_uses_memory_to_disambiguate(name: str, memory_mib: int, expected: str | None) -> None:
    assert from_nvidia_smi(name, memory_mib) == expected


def test_from_nvidia_smi_ignores_a_mig_device_name() -> None:
    assert from_nvidia_smi("NVIDIA A100-SXM4-40GB MIG 1g.5gb") is None


NVIDIA_SMI_FILES = {
    "h100_sxm_8x.csv": ["H100"] * 8,
    "a100_sxm4_40gb_8x.csv": ["A100-40"] * 8,
    "t4_1x.csv": ["T4"],
    "l4_1x.csv": ["L4"],
    "workstation_rtx4090_rtx3090.csv": ["RTX4090", "RTX3090"],
    "h100_nvl_2x.csv": ["H100-NVL", "H100-NVL"],
    "gh200_1x.csv": ["GH200"],
}


def test_every_recorded_nvidia_smi_file_has_an_expectation() -> None:
    assert {p.name for p in (DATA / "nvidia_smi").glob("*.csv")} == set(NVIDIA_SMI_FILES)


@pytest.mark.parametrize(("filename", "expected"), sorted(NVIDIA_SMI_FILES.items()))
def test_recorded_nvidia_smi_names(filename: str, expected: list[str | None]) -> None:
    lines = (DATA / "nvidia_smi" / filename).read_text().splitlines()
    got = []
    for line in lines:
        _index, _uuid, name, memory = (field.strip() for field in line.split(","))
        got.append(from_nvidia_smi(name, int(memory)))
    assert got == expected


# --------------------------------------------------------------------------- Kubernetes labels

K8S_NODES: dict[str, tuple[str | None, int]] = {
    "ip-10-0-37-112.ec2.internal": ("H100", 8),  # GFD on a p5, MIG capable but disabled
    "dgx-a100-07": ("A100-40", 8),
    "t4-timesliced-01": ("T4", 1),  # "-SHARED": time-sliced, still a whole T4
    "dgx-a100-03-mig": (None, 0),  # MIG single strategy: 56 slices, no whole GPU
    "h100-mixed-mig-02": (None, 0),  # MIG mixed strategy
    "gke-inference-g2-pool-6f1c2a9e-x7kq": ("L4", 0),
    "gke-train-a2-pool-1b2d3c4e-m2pz": ("A100-40", 0),  # nvidia-tesla-a100 is the 40 GB card
    "gke-train-a3-mega-9a8b7c6d-q4rt": ("H100", 0),
    "gke-shared-a2-mig-4e5f6a7b-z9wx": (None, 0),  # GKE MIG partitions
    "ip-192-168-81-4.us-west-2.compute.internal": ("A10G", 1),
    "ip-192-168-12-77.us-west-2.compute.internal": ("A100-40", 8),
    "ip-192-168-140-9.us-west-2.compute.internal": ("L40S", 4),
    "ip-192-168-7-201.us-west-2.compute.internal": ("H100", 8),
    "mi300x-node-03": ("MI300X", 0),
    "ws-4090-lab": ("RTX4090", 1),
    "ip-10-0-4-18.ec2.internal": (None, 0),  # a CPU node
}


def _k8s_nodes() -> dict[str, dict[str, str]]:
    return {node["metadata"]["name"]: node["metadata"]["labels"] for node in _load("k8s_nodes.json")["items"]}


def test_every_recorded_node_has_an_expectation() -> None:
    assert set(_k8s_nodes()) == set(K8S_NODES)


@pytest.mark.parametrize(("node", "expected"), sorted(K8S_NODES.items()))
def test_from_k8s_labels_recorded(node: str, expected: tuple[str | None, int]) -> None:
    assert from_k8s_labels(_k8s_nodes()[node]) == expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}, ("H100", 8)),
        ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1"}, ("T4", 1)),
        ({"nvidia.com/gpu.product": "NVIDIA-L4"}, ("L4", 0)),
        ({"nvidia.com/gpu.product": "NVIDIA-A10G", "nvidia.com/gpu.count": "4"}, ("A10G", 4)),
        (
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED", "nvidia.com/gpu.count": "8"},
            ("A100-80", 8),
        ),
        # an old GFD without the vendor prefix, MIG single strategy
        ({"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.count": "56"}, (None, 0)),
        (
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", "nvidia.com/gpu.count": "16"},
            (None, 0),
        ),
        # a product without its size, settled by gpu.memory
        ({"nvidia.com/gpu.product": "NVIDIA-A100-PCIE", "nvidia.com/gpu.memory": "81920"}, ("A100-80", 0)),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-PCIE"}, (None, 0)),
        # an unknown GPU still has a count
        ({"nvidia.com/gpu.product": "NVIDIA-A30", "nvidia.com/gpu.count": "4"}, (None, 4)),
        # GKE names
        ({"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}, ("T4", 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}, ("A100-80", 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, ("H100", 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}, ("H200", 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-b200"}, ("B200", 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-tesla-p100"}, (None, 0)),
        ({"cloud.google.com/gke-accelerator": "nvidia-tesla-v100"}, ("V100", 0)),
        # Karpenter
        (
            {"karpenter.k8s.aws/instance-gpu-name": "t4", "karpenter.k8s.aws/instance-gpu-count": "1"},
            ("T4", 1),
        ),
        (
            {
                "karpenter.k8s.aws/instance-gpu-name": "a100",
                "karpenter.k8s.aws/instance-gpu-memory": "81920",
                "karpenter.k8s.aws/instance-gpu-count": "8",
            },
            ("A100-80", 8),
        ),
        (
            {"karpenter.k8s.aws/instance-gpu-name": "a100", "karpenter.k8s.aws/instance-gpu-count": "8"},
            (None, 8),
        ),
        (
            {"karpenter.k8s.aws/instance-gpu-name": "t4g", "karpenter.k8s.aws/instance-gpu-count": "1"},
            (None, 1),
        ),
        # GFD's count wins over Karpenter's when both are there
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-A10G",
                "nvidia.com/gpu.count": "1",
                "karpenter.k8s.aws/instance-gpu-name": "a10g",
                "karpenter.k8s.aws/instance-gpu-count": "4",
            },
            ("A10G", 1),
        ),
        ({"amd.com/gpu.product-name": "AMD_Instinct_MI300X"}, ("MI300X", 0)),
        ({"nvidia.com/gpu.product": "", "nvidia.com/gpu.count": "bogus"}, (None, 0)),
        ({}, (None, 0)),
    ],
)
def test_from_k8s_labels(labels: dict[str, str], expected: tuple[str | None, int]) -> None:
    assert from_k8s_labels(labels) == expected


def test_from_k8s_labels_mig_manager_layout_means_slices() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.config": "all-3g.40gb",
        "nvidia.com/mig.config.state": "success",
    }
    assert from_k8s_labels(labels) == (None, 0)
    # a layout still being applied has not cut anything yet
    assert from_k8s_labels({**labels, "nvidia.com/mig.config.state": "pending"}) == ("A100-80", 8)


# --------------------------------------------------------------------------- EC2

EC2: dict[str, tuple[str | None, int]] = {
    "p5.48xlarge": ("H100", 8),
    "p5e.48xlarge": ("H200", 8),
    "p4d.24xlarge": ("A100-40", 8),
    "p4de.24xlarge": ("A100-80", 8),
    "p6-b200.48xlarge": ("B200", 8),
    "p3.2xlarge": ("V100", 1),
    "p3dn.24xlarge": ("V100-32", 8),
    "g5.xlarge": ("A10G", 1),
    "g5.48xlarge": ("A10G", 8),
    "g4dn.xlarge": ("T4", 1),
    "g6.xlarge": ("L4", 1),
    "g6e.xlarge": ("L40S", 1),
    "g5g.xlarge": (None, 1),  # T4g
    "g3.4xlarge": (None, 1),  # M60
    "g4ad.xlarge": (None, 1),  # AMD Radeon Pro V520
    "inf2.xlarge": (None, 0),  # Inferentia, no GpuInfo
    "m7i.large": (None, 0),
}


def _ec2_types() -> dict[str, dict[str, Any]]:
    return {entry["InstanceType"]: entry for entry in _load("ec2_describe_instance_types.json")["InstanceTypes"]}


def test_every_recorded_instance_type_has_an_expectation() -> None:
    assert set(_ec2_types()) == set(EC2)


@pytest.mark.parametrize(("instance_type", "expected"), sorted(EC2.items()))
def test_from_ec2_gpu_info_recorded(instance_type: str, expected: tuple[str | None, int]) -> None:
    entry = _ec2_types()[instance_type]
    assert from_ec2_gpu_info(entry.get("GpuInfo", {})) == expected
    # the whole instance-type entry works too
    assert from_ec2_gpu_info(entry) == expected


def test_from_ec2_gpu_info_edge_cases() -> None:
    assert from_ec2_gpu_info({}) == (None, 0)
    assert from_ec2_gpu_info({"Gpus": []}) == (None, 0)
    assert from_ec2_gpu_info({"Gpus": "nonsense"}) == (None, 0)
    assert from_ec2_gpu_info({"Gpus": [{"Name": "A100", "Count": 8}]}) == (None, 8)
    two_kinds = {
        "Gpus": [
            {"Name": "H100", "Count": 4, "MemoryInfo": {"SizeInMiB": 81920}},
            {"Name": "L4", "Count": 4, "MemoryInfo": {"SizeInMiB": 22888}},
        ]
    }
    assert from_ec2_gpu_info(two_kinds) == (None, 8)


# --------------------------------------------------------------------------- OCI

OCI: dict[str, tuple[str | None, int]] = {
    "BM.GPU.H100.8": ("H100", 8),
    "BM.GPU.H200.8": ("H200", 8),
    "BM.GPU.A100-v2.8": ("A100-80", 8),
    "BM.GPU4.8": ("A100-40", 8),
    "BM.GPU.L40S.4": ("L40S", 4),
    "BM.GPU.MI300X.8": ("MI300X", 8),
    "VM.GPU.A10.1": ("A10", 1),
    "VM.GPU.A10.2": ("A10", 2),
    "VM.GPU3.1": ("V100", 1),
    "VM.GPU2.1": (None, 1),  # P100
    "VM.Standard.E4.Flex": (None, 0),
}


def _oci_shapes() -> dict[str, dict[str, Any]]:
    return {shape["shape"]: shape for shape in _load("oci_list_shapes.json")}


def test_every_recorded_shape_has_an_expectation() -> None:
    assert set(_oci_shapes()) == set(OCI)


@pytest.mark.parametrize(("shape", "expected"), sorted(OCI.items()))
def test_from_oci_shape_recorded(shape: str, expected: tuple[str | None, int]) -> None:
    assert from_oci_shape(_oci_shapes()[shape]) == expected


@pytest.mark.parametrize(("shape", "expected"), sorted(OCI.items()))
def test_from_oci_shape_cli_kebab_case(shape: str, expected: tuple[str | None, int]) -> None:
    entry = _oci_shapes()[shape]
    kebab = {
        "shape": entry["shape"],
        "gpus": entry.get("gpus"),
        "gpu-description": entry.get("gpuDescription"),
    }
    assert from_oci_shape(kebab) == expected


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("BM.GPU.H100.8", ("H100", 8)),
        ("BM.GPU.H200.8", ("H200", 8)),
        ("BM.GPU.A100-v2.8", ("A100-80", 8)),
        ("BM.GPU4.8", ("A100-40", 8)),
        ("VM.GPU3.4", ("V100", 4)),
        ("VM.GPU2.1", (None, 1)),
        ("BM.GPU.MI300X.8", ("MI300X", 8)),
        ("BM.GPU.L40S.4", ("L40S", 4)),
        ("BM.GPU.B200.8", ("B200", 8)),
        ("VM.Standard.E5.Flex", (None, 0)),
    ],
)
def test_from_oci_shape_name_alone(shape: str, expected: tuple[str | None, int]) -> None:
    assert from_oci_shape({"shape": shape}) == expected


def test_from_oci_shape_memory_total_settles_an_a100() -> None:
    shape = {"shape": "BM.GPU.Custom.8", "gpus": 8, "gpuDescription": "NVIDIA® A100", "gpuMemoryInGBs": 640}
    assert from_oci_shape(shape) == ("A100-80", 8)
    assert from_oci_shape({**shape, "gpuMemoryInGBs": 320}) == ("A100-40", 8)
    assert from_oci_shape({**shape, "gpuMemoryInGBs": None}) == (None, 8)
    assert from_oci_shape({**shape, "gpuMemoryInGBs": float("inf")}) == (None, 8)
    assert from_oci_shape({**shape, "gpuMemoryInGBs": "640"}) == (None, 8)


# --------------------------------------------------------------------------- Lambda

LAMBDA: dict[str, tuple[str | None, int]] = {
    "gpu_1x_a10": ("A10", 1),
    "gpu_1x_a100": ("A100-40", 1),
    "gpu_1x_a100_sxm4": ("A100-40", 1),
    "gpu_8x_a100_80gb_sxm4": ("A100-80", 8),
    "gpu_1x_h100_pcie": ("H100", 1),
    "gpu_8x_h100_sxm5": ("H100", 8),
    "gpu_1x_gh200": ("GH200", 1),
    "gpu_8x_v100": ("V100", 8),
    "gpu_1x_a6000": ("A6000", 1),
    "gpu_1x_rtx6000": (None, 1),  # Quadro RTX 6000
    "gpu_8x_b200_sxm6": ("B200", 8),
}


def _lambda_items() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = _load("lambda_instance_types.json")["data"]
    return data


def test_every_recorded_lambda_type_has_an_expectation() -> None:
    assert set(_lambda_items()) == set(LAMBDA)


@pytest.mark.parametrize(("name", "expected"), sorted(LAMBDA.items()))
def test_from_lambda_instance_type_recorded(name: str, expected: tuple[str | None, int]) -> None:
    item = _lambda_items()[name]
    assert from_lambda_instance_type(item) == expected
    assert from_lambda_instance_type(item["instance_type"]) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu_8x_a100_80gb_sxm4", ("A100-80", 8)),
        ("gpu_1x_a100", (None, 1)),  # no size anywhere: not guessed
        ("gpu_8x_h100_sxm5", ("H100", 8)),
        ("gpu_2x_a6000", ("A6000", 2)),
        ("gpu_1x_rtx6000", (None, 1)),
        ("cpu_4x_general", (None, 4)),
    ],
)
def test_from_lambda_instance_type_name_alone(name: str, expected: tuple[str | None, int]) -> None:
    assert from_lambda_instance_type({"name": name}) == expected


# --------------------------------------------------------------------------- anything


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("H100", "H100"),
        ("h100", "H100"),
        ("a100-80gb", "A100-80"),
        ("A100_80", "A100-80"),
        ("rtx 4090", "RTX4090"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA-A100-SXM4-40GB-SHARED", "A100-40"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None),
        ("nvidia-tesla-a100", "A100-40"),
        ("nvidia-h100-mega-80gb", "H100"),
        ("nvidia-tesla-k80", None),
        ("NVIDIA® H100 80GB Tensor Core", "H100"),
        ("8x H100 (80 GB SXM5)", "H100"),
        ("AMD_Instinct_MI300X_OAM", "MI300X"),
        ("A100", None),
        ("a toaster", None),
        ("", None),
    ],
)
def test_normalize(text: str, expected: str | None) -> None:
    assert normalize(text) == expected


@given(st.text(max_size=60))
def test_normalize_never_raises(text: str) -> None:
    result = normalize(text)
    assert result is None or result in CATALOG
    smi = from_nvidia_smi(text)
    assert smi is None or smi in CATALOG


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "nvidia.com/gpu.product",
                "nvidia.com/gpu.memory",
                "nvidia.com/gpu.count",
                "nvidia.com/mig.config",
                "nvidia.com/mig.config.state",
                "nvidia.com/mig-1g.10gb.count",
                "cloud.google.com/gke-accelerator",
                "cloud.google.com/gke-gpu-partition-size",
                "karpenter.k8s.aws/instance-gpu-name",
                "karpenter.k8s.aws/instance-gpu-memory",
                "karpenter.k8s.aws/instance-gpu-count",
                "amd.com/gpu.product-name",
            ]
        )
        | st.text(max_size=20),
        st.text(max_size=30),
        max_size=6,
    )
)
def test_from_k8s_labels_never_raises(labels: dict[str, str]) -> None:
    gpu, count = from_k8s_labels(labels)
    assert gpu is None or gpu in CATALOG
    assert count >= 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "Gpus",
                "GpuInfo",
                "shape",
                "gpus",
                "gpuDescription",
                "gpuMemoryInGBs",
                "instance_type",
                "name",
                "description",
                "gpu_description",
                "specs",
            ]
        )
        | st.text(max_size=10),
        json_values,
        max_size=5,
    )
)
def test_cloud_readers_never_raise(payload: dict[str, Any]) -> None:
    for reader in (from_ec2_gpu_info, from_oci_shape, from_lambda_instance_type):
        gpu, count = reader(payload)
        assert gpu is None or gpu in CATALOG
        assert count >= 0
