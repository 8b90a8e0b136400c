"""Every GPU instance type EC2 sells, as the AWS API describes it, maps to the right canonical type.

The data is the ``GpuInfo`` of every GPU instance type in the DescribeInstanceTypes
dump moto ships (taken from the AWS API), kept in tests/data/gpu. A new instance
family fails this test until someone decides what it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers9.gpu.catalog import CATALOG
from levers9.gpu.normalize import from_ec2_gpu_info, normalize

DATA = json.loads((Path(__file__).parents[1] / "data" / "gpu" / "ec2_gpu_instance_types_aws.json").read_text())
TYPES = {item["InstanceType"]: item["GpuInfo"] for item in DATA["InstanceTypes"]}

EXPECTED_BY_FAMILY: dict[str, str | None] = {
    "g4dn": "T4",
    "g5": "A10G",
    "g5g": None,  # T4g: a T4 beside Graviton CPUs; arm64 images only, so not offered as a T4
    "g6": "L4",
    "gr6": "L4",
    "g6e": "L40S",
    "g6f": None,  # fractions of an L4 (an eighth to a half): not the GPU a job asked for
    "gr6f": None,
    "g7": None,  # RTX PRO 4500: not in the catalog
    "g7e": "RTXPRO6000",
    "p3dn": "V100-32",
    "p4d": "A100-40",
    "p4de": "A100-80",
    "p5": "H100",
    "p5e": "H200",
    "p5en": "H200",
    "p6-b200": "B200",
    "p6-b300": "B300",
}


def test_every_family_in_the_data_has_an_expectation() -> None:
    families = {name.split(".")[0] for name in TYPES}
    assert families <= set(EXPECTED_BY_FAMILY), f"decide what these are: {sorted(families - set(EXPECTED_BY_FAMILY))}"


@pytest.mark.parametrize("instance_type", sorted(TYPES))
def test_instance_type_maps_to_its_canonical_gpu(instance_type: str) -> None:
    gpu_info = TYPES[instance_type]
    gpu, count = from_ec2_gpu_info(gpu_info)
    assert gpu == EXPECTED_BY_FAMILY[instance_type.split(".")[0]]
    assert count == sum(g["Count"] for g in gpu_info["Gpus"])
    if gpu is not None:
        reported = gpu_info["Gpus"][0]["MemoryInfo"]["SizeInMiB"]
        assert (
            abs(reported - CATALOG[gpu].memory_mib) <= CATALOG[gpu].memory_mib * 0.1
        ), (  # GDDR cards with ECC on report ~7% less
            f"{instance_type}: EC2 reports {reported} MiB per {gpu}, the catalog says {CATALOG[gpu].memory_mib}"
        )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000"),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "RTXPRO6000"),
        ("NVIDIA RTX PRO 4500 Blackwell", None),
        ("NVIDIA B300", "B300"),
    ],
)
def test_newer_cards_by_name(name: str, expected: str | None) -> None:
    assert normalize(name) == expected
