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
from pathlib import Path

import pytest

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.k8s_pool import cluster, k8s_pool, pod_logs
from tests.fixtures.levers9_up import Up
from tests.fixtures.volume_apps import round_trip_app
from tests.fixtures.wait import wait_for

__all__ = ["cluster"]

pytestmark = pytest.mark.timeout(900)


def test_a_privileged_worker_pod_reads_and_writes_a_volume_over_the_controlplane(
    levers9_up: Up, cluster: FakeCluster, tmp_path: Path
) -> None:
    up = levers9_up
    up.use_runtime("runc")
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    up.home.mkdir(parents=True, exist_ok=True)
    pool = k8s_pool(kubeconfig, privileged=True, memory=2048)
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
    app.write_text(round_trip_app("models", "/models", "written in a pod"))

    done = up.levers9("run", f"{app.name}::main", timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{pod_logs(cluster)}\n{up.log()[-6000:]}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["sha256"] == hashlib.sha256(upload.read_bytes()).hexdigest(), answer
    assert answer["listing"] == ["in", "out"], answer
    assert answer["fstypes"] == ["fuse.rclone"], answer  # the controlplane's WebDAV, the only way the pod has
    assert [job["metadata"]["labels"]["levers9/pool"] for job in cluster.created("jobs")] == ["k8s"]
    back = tmp_path / "back"
    back.mkdir()
    out = up.levers9("cp", "models:out/written.txt", str(back))
    assert out.returncode == 0, out.stderr
    assert (back / "written.txt").read_text() == "written in a pod"

    wait_for(
        lambda: cluster.leftovers() == [],
        "no Job, pod or Secret left",
        180,
        lambda: f"{cluster.leftovers()}\n{up.log()[-3000:]}",
    )
    assert cluster.running_processes() == []
    up.stop()
    assert fuse_mounts_below(tmp_path) == []
