"""A volume on a Kubernetes worker: a privileged local_k8s pod of a runc pool mounts it over the controlplane.

`levers9 up`'s only pool that can take work is ``k8s``: provider ``local_k8s``, runtime ``runc``,
``privileged: true``, no ``volume_access`` set (so the default off the ``local`` provider: through the
controlplane), on :class:`tests.fakes.k8s_cluster.FakeCluster`, whose kubelet runs the worker pod's
container as a host process in a network namespace of its own reaching only the controlplane's gRPC and
HTTP ports (tests/e2e/test_k8s_blueprints.py). The pod's worker mounts the volume with rclone from the
controlplane's WebDAV and binds it into the call's runc container.

The call reads a file `levers9 cp` put in and writes one `levers9 cp` takes out; inside the call the
volume is rclone's FUSE mount. Once the idle worker is released nothing of levers9 is left in the
cluster, no process of it runs and nothing is FUSE-mounted below the test's directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.levers9_up import Up
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(900)

NS = "levers9"

APP = """\
import hashlib
import json
import os

import levers9

models = levers9.Volume(name="models", mount_path="/models")


@levers9.function(volumes=[models], memory=256)
def in_a_pod(text: str) -> dict:
    with open("/models/in/up.bin", "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    os.makedirs("/models/out", exist_ok=True)
    with open("/models/out/from-pod.txt", "w") as f:
        f.write(text)
    with open("/proc/self/mountinfo") as f:
        fstypes = [line.split(" - ")[1].split()[0] for line in f if line.split()[4] == "/models"]
    return {"sha256": digest, "listing": sorted(os.listdir("/models")), "fstypes": fstypes}


def main() -> None:
    print(json.dumps(in_a_pod.remote("written in a pod")))
"""


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster(NS, max_grace_s=10.0) as fake:
        fake.add_node("node-a", allocatable={"cpu": "4", "memory": "16Gi", "pods": "110"})
        yield fake
        assert fake.errors == []


def _pod_logs(cluster: FakeCluster) -> str:
    shown = []
    for pod in cluster.pods(NS):
        root = cluster.pod_root(NS, pod["metadata"]["name"])
        log = root / "boot.log" if root is not None else None
        text = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
        shown.append(f"--- pod {pod['metadata']['name']} ({pod.get('status', {}).get('phase')}):\n{text}")
    return "\n".join(shown)


def test_a_privileged_worker_pod_reads_and_writes_a_volume_over_the_controlplane(
    levers9_up: Up, cluster: FakeCluster, tmp_path: Path
) -> None:
    up = levers9_up
    up.use_runtime("runc")
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    up.home.mkdir(parents=True, exist_ok=True)
    pool = (
        "  k8s:\n    provider: local_k8s\n    runtime: runc\n    workspace: default\n    cpu: 1\n    memory: 2048\n"
        "    min_workers: 0\n    max_workers: 1\n    idle_timeout_s: 5\n    settings:\n"
        f"      kubeconfig: {kubeconfig}\n      namespace: {NS}\n"
        "      worker_image: registry.example.com/levers9/worker:test\n      privileged: true\n"
    )
    # the local pool gets no worker: every call goes to the pod
    (up.home / "levers9.yaml").write_text(up.config_text(min_workers=0, max_workers=0) + pool)
    cluster.set_reachable_ports([up.grpc_port, up.http_port])
    up.start(wait_workers=0)
    made = up.levers9("volume", "create", "models")
    assert made.returncode == 0, made.stderr
    upload = tmp_path / "up.bin"
    upload.write_bytes(os.urandom(2 * 1024 * 1024 + 5))
    copied = up.levers9("cp", str(upload), "models:in/up.bin")
    assert copied.returncode == 0, copied.stderr
    app = up.root / "k8s_volume_app.py"
    app.write_text(APP)

    done = up.levers9("run", f"{app.name}::main", timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{_pod_logs(cluster)}\n{up.log()[-6000:]}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["sha256"] == hashlib.sha256(upload.read_bytes()).hexdigest(), answer
    assert answer["listing"] == ["in", "out"], answer
    assert answer["fstypes"] == ["fuse.rclone"], answer  # the controlplane's WebDAV, the only way the pod has
    assert [job["metadata"]["labels"]["levers9/pool"] for job in cluster.created("jobs")] == ["k8s"]
    back = tmp_path / "back"
    back.mkdir()
    out = up.levers9("cp", "models:out/from-pod.txt", str(back))
    assert out.returncode == 0, out.stderr
    assert (back / "from-pod.txt").read_text() == "written in a pod"

    wait_for(lambda: cluster.leftovers() == [], "no Job, pod or Secret left", 180,
             lambda: f"{cluster.leftovers()}\n{up.log()[-3000:]}")  # fmt: skip
    assert cluster.running_processes() == []
    up.stop()
    assert fuse_mounts_below(tmp_path) == []
