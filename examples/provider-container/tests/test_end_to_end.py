"""A call runs in a podmarket pod: levers9 up, this plugin, and a fake marketplace that runs its pods in Docker.

What a third party writes with levers9.testing alone: ``Levers9Up`` starts the
real controlplane with one podmarket pool of H100 pods and the worker image
(``scheduler.worker_image``, built from this installation into the session's
private dockerd, as an operator pushes it where the marketplace pulls from); a
user program calls a function that needs an H100; the scheduler provisions a
pod, the marketplace runs ``container_spec``'s container (its token from the
marketplace secret, its GPU shown by an ``nvidia-smi`` that prints the
card's recording); the worker registers, and, the pod declared unreachable,
serves through its tunnel; the call runs in the pod. At the end ``levers9 up``
has terminated the pod through the plugin: no container, no secret, no process
left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.testing import Levers9Up, nvidia_smi
from levers9.testing.container_boot import worker_image

PROGRAM = """
import json
import os
import socket

import levers9


@levers9.function(gpu="H100", cpu=0.25)
def inspect(x: int) -> dict:
    return {"square": x * x, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "host": socket.gethostname()}


print("RESULT", json.dumps(inspect.remote(7)), flush=True)
"""


def test_a_call_runs_in_a_pod_and_the_pod_and_its_secret_go(
    tmp_path: Path, docker_market: Any, docker_host: str
) -> None:
    pool: dict[str, Any] = {
        "provider": "podmarket",
        "runtime": "process",
        "workspace": "default",  # a pool whose runtime isolates nothing serves one workspace
        "gpu": "H100",
        "gpu_count": 1,
        "regions": ["eu"],
        "min_workers": 0,
        "max_workers": 1,
        "settings": {"api_url": docker_market.url},
    }
    up = Levers9Up(
        {"pods-h100": pool},
        tmp_path / "levers9",
        environment={"PODMARKET_API_KEY": docker_market.api_key},
        scheduler={
            "worker_keepalive_s": 3,
            "reconcile_interval_s": 2,
            "register_timeout_s": 120,
            "worker_image": worker_image(docker_host),
        },
    )
    up.start()
    try:
        run = up.python(PROGRAM, timeout=600)
        tasks = json.loads(up.levers9("tasks", "--json").stdout)
        [pod] = docker_market.instances()
    finally:
        left = up.stop()
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{up.log()[-5000:]}"
    [line] = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["square"] == 49
    [task] = tasks
    assert (task["status"], task["pool"], task["gpu"]) == ("complete", "pods-h100", "H100"), task
    # the call ran in the pod: the worker gave it the GPU of the pod's nvidia-smi, whose UUID is the pod's own
    [gpu] = parse_query_gpu(nvidia_smi("H100", 1, machine=pod["id"]))
    assert result["gpus"] == gpu.uuid, result
    assert "serves through a tunnel" in up.log(), "the unreachable pod's worker was not tunnelled"
    # levers9 up terminated the pod on the way out, and the plugin deleted its join token's secret
    assert [p["status"] for p in docker_market.instances()] == ["terminated"]
    assert docker_market.secrets == {}
    assert left == [], left
