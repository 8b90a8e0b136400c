"""GPUs handed to a container, on recorded device lists (there is no GPU here).

The devices come from real ``nvidia-smi`` output (tests/data/gpu) through the
same parser the discovery plugin uses; the device nodes are real character
devices made in a temporary /dev, with the major and minor numbers NVIDIA's
driver uses.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.engine.spec import gpu_env, oci_config
from levers9.hooks.types import ContainerSpec, GpuDevice

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "nvidia_smi"
NVIDIA_MAJOR = 195


def recorded(name: str) -> list[GpuDevice]:
    devices = parse_query_gpu((DATA / name).read_text())
    assert devices, f"no GPUs parsed from {name}"
    return devices


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    """A /dev with the nodes of an 8-GPU machine: nvidia0..7 (195, N), nvidiactl (195, 255), nvidia-uvm."""
    root = tmp_path / "dev"
    root.mkdir()
    for index in range(8):
        os.mknod(root / f"nvidia{index}", stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, index))
    os.mknod(root / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, 255))
    os.mknod(root / "nvidia-uvm", stat.S_IFCHR | 0o666, os.makedev(510, 0))
    return root


def test_the_given_gpus_by_uuid_and_only_their_device_nodes(dev: Path) -> None:
    files = sorted(p.name for p in DATA.iterdir() if p.suffix == ".csv")
    assert files, f"no recorded nvidia-smi output in {DATA}"
    devices = recorded(files[0])
    given = devices[1:3] if len(devices) >= 3 else devices[:1]
    spec = ContainerSpec(container_id="g1", image="host", command=["nvidia-smi"], gpus=given)
    config = oci_config(spec, rootfs="/tmp/rootfs", dev=dev)

    env = dict(item.split("=", 1) for item in config["process"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in given)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(len(given)))
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"

    nodes = {d["path"]: (d["major"], d["minor"]) for d in config["linux"]["devices"]}
    expected = {f"/dev/nvidia{g.index}": (NVIDIA_MAJOR, g.index) for g in given}
    expected.update({"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-uvm": (510, 0)})
    assert nodes == expected, "exactly the given GPUs' nodes plus the shared control nodes"
    allowed = {(r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"] if r["allow"]}
    assert allowed == set(expected.values())
    denied = config["linux"]["resources"]["devices"][0]
    assert denied == {"allow": False, "access": "rwm"}, "everything else is denied first"


def test_a_container_without_gpus_sees_none(dev: Path) -> None:
    spec = ContainerSpec(container_id="c1", image="host", command=["true"])
    config = oci_config(spec, rootfs="/tmp/rootfs", dev=dev)
    env = dict(item.split("=", 1) for item in config["process"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert config["linux"]["devices"] == []
    assert gpu_env([]) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_every_recorded_machine_maps_each_gpu_to_its_node(dev: Path) -> None:
    for path in sorted(DATA.glob("*.csv")):
        devices = recorded(path.name)[:8]
        spec = ContainerSpec(container_id="all", image="host", command=["true"], gpus=devices)
        config = oci_config(spec, rootfs="/tmp/rootfs", dev=dev)
        paths = {d["path"] for d in config["linux"]["devices"]}
        assert {f"/dev/nvidia{g.index}" for g in devices} <= paths, path.name


CDI = DATA.parent / "cdi"


def test_a_cdi_spec_is_applied_exactly(tmp_path: Path) -> None:
    from levers9.engine.cdi import apply_edits, load_specs

    root = tmp_path / "host"
    (root / "dev" / "dri").mkdir(parents=True)
    nodes = {
        "nvidia0": (195, 0),
        "nvidiactl": (195, 255),
        "nvidia-uvm": (510, 0),
        "nvidia-uvm-tools": (510, 1),
        "nvidia-modeset": (195, 254),
        "dri/card1": (226, 1),
        "dri/renderD128": (226, 128),
    }
    for name, (major, minor) in nodes.items():
        os.mknod(root / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    specs = load_specs([CDI])
    assert specs is not None
    assert set(specs.devices) == {"0", "GPU-520e01f2-cf30-6396-abef-e8e9a5233b0e", "all"}

    gpu = GpuDevice(
        index=0, uuid="GPU-520e01f2-cf30-6396-abef-e8e9a5233b0e", model="NVIDIA RTX A6000", memory_mib=49140
    )
    spec = ContainerSpec(container_id="cdi", image="host", command=["nvidia-smi"], gpus=[gpu])
    config = oci_config(spec, rootfs="/tmp/rootfs", dev=tmp_path / "no-dev")  # no legacy nodes found
    apply_edits(config, specs.edits_for([gpu]), root=root)

    env = dict(item.split("=", 1) for item in config["process"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", "the CDI spec turns the legacy hook off"
    got = {d["path"]: (d["major"], d["minor"]) for d in config["linux"]["devices"]}
    assert got == {f"/dev/{name}": numbers for name, numbers in nodes.items()}
    allowed = {(r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"] if r["allow"]}
    assert allowed == set(nodes.values())
    mounts = {m["destination"]: m["source"] for m in config["mounts"] if m["type"] == "bind"}
    assert mounts["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.575.64.03"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.575.64.03"
    create = config["hooks"]["createContainer"]
    assert [h["args"][1] for h in create] == ["create-symlinks", "update-ldcache", "chmod"]
    assert all(h["path"] == "/usr/bin/nvidia-cdi-hook" for h in create)


def test_a_gpu_the_cdi_spec_does_not_know_is_refused() -> None:
    from levers9.engine.cdi import load_specs
    from levers9.hooks.errors import InvalidRequest

    specs = load_specs([CDI])
    assert specs is not None
    stranger = GpuDevice(
        index=3, uuid="GPU-00000000-0000-0000-0000-000000000000", model="NVIDIA H100", memory_mib=81559
    )
    with pytest.raises(InvalidRequest, match="has no device GPU-00000000"):
        specs.edits_for([stranger])


def test_no_cdi_directories_means_no_specs(tmp_path: Path) -> None:
    from levers9.engine.cdi import load_specs

    assert load_specs([tmp_path / "missing"]) is None
