"""GPU sandboxes through the controlplane's REST API, on a real `levers9 up` whose local pool has two H100s.

This machine has no GPU: `levers9 up` and its worker find two H100 80GB as a real ``nvidia-smi`` printed
them (levers9.testing's recorded output, through an ``nvidia-smi`` first on their PATH), so the pool
offers them, the worker registers them and hands them out; a container gets no device node (there is
none) but exactly its GPUs' uuids in ``NVIDIA_VISIBLE_DEVICES``. The preference is read as a function's:
the first listed type a worker has free, a CPU fallback when the list ends in ``cpu``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from levers9.testing import install_nvidia_smi, nvidia_smi
from tests.e2e.test_sandboxes import _client, _error, _exec, _output
from tests.e2e.test_sandboxes import create_sandbox as _create
from tests.fixtures.levers9_up import Up, _finish

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpu_up(tmp_path: Path) -> Iterator[Up]:
    recorded = nvidia_smi("H100", 2, machine="sandbox-gpus")
    tool = install_nvidia_smi(tmp_path / "gpu-host", recorded)
    up = Up(tmp_path / "up")
    up.use_runtime("runc")
    up.sandboxes, up.min_workers, up.max_workers = 3, 1, 1
    up.gpu, up.gpu_count, up.path_first = "H100", 2, tool.parent
    try:
        up.start(wait_workers=1)
        yield up
    finally:
        _finish(up, tmp_path)


#: each sandbox's CPU and memory: small, so that the worker's GPUs, not its 2 cores, are what runs out
SMALL = {"cpu_millicores": 250, "memory_mib": 256}


def _visible(client: httpx.Client, sid: object) -> str:
    process = _exec(client, sid, argv=["/bin/sh", "-c", 'printf %s "$NVIDIA_VISIBLE_DEVICES"'])
    out, _, code = _output(client, sid, process)
    assert code == 0
    return out


def test_gpu_sandboxes_take_the_workers_gpus_by_preference_and_say_when_none_is_free(gpu_up: Up) -> None:
    uuids = [line.split(",")[1].strip() for line in nvidia_smi("H100", 2, machine="sandbox-gpus").splitlines()]
    with contextlib.closing(_client(gpu_up)) as client:
        first = _create(client, gpu=["A100-80", "H100"], **SMALL)  # no A100 anywhere: the next type
        assert (first["gpu"], first["gpu_count"]) == ("H100", 1)
        second = _create(client, gpu="h100", **SMALL)
        seen = {_visible(client, first["id"]), _visible(client, second["id"])}
        assert seen == set(uuids)  # one each, never the same

        status, kind, message = _error(client.post("/sandboxes", json={"gpu": "H100", **SMALL}))
        assert (status, kind) == (503, "no_sandbox_worker")
        assert "1x H100" in message
        assert "no room for" in message
        assert "and 1 H100" in message
        status, kind, message = _error(client.post("/sandboxes", json={"gpu": "A100-80"}))
        assert (status, kind) == (503, "no_sandbox_worker")
        assert "has 2 H100; the sandbox takes 1x A100-80" in message
        status, kind, message = _error(client.post("/sandboxes", json={"gpu": "H101"}))
        assert (status, kind) == (400, "invalid_request")
        assert "gpu: " in message
        assert "H100" in message  # the closest names
        status, kind, message = _error(client.post("/sandboxes", json={"gpu": "H100", "snapshots": True}))
        assert (status, kind) == (400, "invalid_request")
        assert "snapshots" in message

        fallback = _create(client, gpu=["H100", "cpu"], **SMALL)  # both H100s held: it starts without a GPU
        assert (fallback["gpu"], fallback["gpu_count"]) == (None, 0)
        assert _visible(client, fallback["id"]) == "void"

        assert client.delete(f"/sandboxes/{first['id']}").status_code == 200
        again = _create(client, gpu="H100", gpu_count=1, **SMALL)
        assert _visible(client, again["id"]) in uuids
        assert _visible(client, again["id"]) != _visible(client, second["id"])
