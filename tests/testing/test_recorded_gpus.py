"""levers9.testing.nvidia_smi gives every NVIDIA catalog type's nvidia-smi lines, which the worker reads as that type."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.gpu.catalog import CATALOG, UnknownGpuType
from levers9.testing import emulated_boot, nvidia_smi, recorded_card
from levers9.testing.recorded_gpus import _cards

NVIDIA = [name for name, gpu in CATALOG.items() if gpu.vendor == "nvidia"]
PROJECT_DATA = Path(__file__).parents[1] / "data" / "gpu" / "nvidia_smi"


@pytest.mark.parametrize("gpu", NVIDIA)
def test_every_nvidia_type_has_lines_the_worker_reads_as_that_type(gpu: str) -> None:
    lines = nvidia_smi(gpu, 3, machine="i-0abc")
    devices = parse_query_gpu(lines)
    assert [d.index for d in devices] == [0, 1, 2]
    assert {d.gpu for d in devices} == {gpu}
    card = recorded_card(gpu)
    assert {d.model for d in devices} == {card.name}
    # what the driver reports: at most the catalog's nominal figure, and not far under it
    assert all(0.9 * CATALOG[gpu].memory_mib <= d.memory_mib <= CATALOG[gpu].memory_mib for d in devices), (
        card,
        CATALOG[gpu],
    )
    assert card.source in ("published", "derived")


def test_uuids_are_the_machines_own_and_stable() -> None:
    first = parse_query_gpu(nvidia_smi("H100", 8, machine="i-1"))
    again = parse_query_gpu(nvidia_smi("h100", 8, machine="i-1"))
    other = parse_query_gpu(nvidia_smi("H100", 8, machine="i-2"))
    assert [d.uuid for d in first] == [d.uuid for d in again]
    assert len({d.uuid for d in first} | {d.uuid for d in other}) == 16
    assert all(d.uuid.startswith("GPU-") and len(d.uuid) == 40 for d in first)


def test_the_lines_have_nvidia_smis_own_format() -> None:
    """The same shape as the project's hand-checked recordings: ``index, GPU-uuid, name, MiB``, one a line."""
    recorded = (PROJECT_DATA / "h100_sxm_8x.csv").read_text().splitlines()[0]
    made = nvidia_smi("H100", 1).splitlines()[0]
    assert [part.strip() for part in made.split(",")][::2] == [part.strip() for part in recorded.split(",")][::2]
    assert made.split(", ")[3] == recorded.split(", ")[3] == "81559"


def test_the_project_recordings_agree_with_the_published_cards() -> None:
    """Where tests/data/gpu/nvidia_smi has the card too, name and memory are the same."""
    cards = {card.name: card.memory_mib for card in _cards()}
    for path in sorted(PROJECT_DATA.glob("*.csv")):
        for device in parse_query_gpu(path.read_text()):
            if device.model in cards:
                assert cards[device.model] == device.memory_mib, (path.name, device)


@pytest.mark.parametrize(
    ("gpu", "count", "message"),
    [
        ("MI300X", 1, "MI300X is not an NVIDIA GPU (AMD's): nvidia-smi does not see it"),
        ("H100", 0, "count must be 1 or more GPUs, got 0"),
        ("A100", 1, "GPU type 'A100' is ambiguous: pick A100-40 or A100-80"),
        ("H1OO", 1, "unknown GPU type 'H1OO'"),
    ],
)
def test_what_cannot_be_recorded_says_why(gpu: str, count: int, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)) as error:
        nvidia_smi(gpu, count)
    if gpu.startswith("H1O"):
        assert isinstance(error.value, UnknownGpuType)


def test_a_booted_machine_shows_its_gpus_to_the_workers_discovery(tmp_path: Path) -> None:
    """The worker's own discovery (levers9.discovery.nvidia_smi), run inside an emulated boot given the lines."""
    script = (
        "#!/bin/sh\n"
        'python -c "import json, levers9.discovery.nvidia_smi as d; '
        'print(json.dumps([g.model_dump() for g in d.levers9_gpu_devices()]))" > "$LEVERS9_BOOT_ROOT/found"\n'
    )
    boot = emulated_boot(script, tmp_path / "boot", gpus=nvidia_smi("L40S", 2, machine="m-1"), isolate=False)
    try:
        boot.process.wait(60)
        found = json.loads((boot.root / "found").read_text())
    finally:
        boot.stop()
    assert [(g["index"], g["gpu"], g["memory_mib"]) for g in found] == [(0, "L40S", 46068), (1, "L40S", 46068)]
