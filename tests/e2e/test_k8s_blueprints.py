"""A blueprint function run on a Kubernetes worker: a local_k8s pool of runtime runc, its worker pod privileged.

Every part is real but the cluster: `levers9 up` with a local runc build pool (``local``, ``builds: true``,
the run's shared Debian base cache, tests/fixtures/debian_base.py) and a ``local_k8s`` pool ``k8s`` of
runtime ``runc`` (``privileged: true``) on :class:`tests.fakes.k8s_cluster.FakeCluster`, whose kubelet
runs the worker pod's container as a host process in a network namespace of its own reaching only the
controlplane's gRPC and HTTP ports (the latter for the /v2/ registry relay), with the bounding set the
pod's ``securityContext`` gives it and its ``emptyDir`` state volume at /var/lib/levers9. The function
asks for more memory than the build pool has, so only the k8s pool can take it: the image is built on
``local``, pushed through the relay, pulled by the pod's worker through it and run under runc.

A second test: the same pool without ``privileged`` is refused by ``levers9 check`` and at provision,
the message naming the pool, the runtime and the setting; no Job is ever made.

At the end nothing of levers9 is left in the cluster (Job, pod, Secret) and no process of it runs; the
fake's own stop checks its mount points and roots are gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from levers9.builder.base import BaseLayer
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.blueprint_probe import probe_app
from tests.fixtures.k8s_pool import cluster, k8s_pool, pod_logs
from tests.fixtures.levers9_up import Up
from tests.fixtures.wait import wait_for

__all__ = ["cluster"]

pytestmark = pytest.mark.timeout(1200)

APP = probe_app("blueprint built", memory=5000)


def _up(levers9_up: Up, cluster: FakeCluster, tmp_path: Path, *, privileged: bool, runtime: str = "runc") -> Up:
    levers9_up.use_runtime("runc")
    levers9_up.builds, levers9_up.min_workers, levers9_up.max_workers = True, 0, 1
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    levers9_up.home.mkdir(parents=True, exist_ok=True)
    text = levers9_up.config_text() + k8s_pool(kubeconfig, privileged=privileged, runtime=runtime)
    (levers9_up.home / "levers9.yaml").write_text(text)
    # the worker reaches the gRPC port (its stream) and the HTTP port (the /v2/ registry relay)
    cluster.set_reachable_ports([levers9_up.grpc_port, levers9_up.http_port])
    return levers9_up


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_blueprint_function_runs_on_a_privileged_worker_pod(
    levers9_up: Up, cluster: FakeCluster, debian_base: BaseLayer, tmp_path: Path, runtime: str
) -> None:
    state_mount_there = Path("/var/lib/levers9").exists()  # the fake binds the pod's emptyDir at this path
    up = _up(levers9_up, cluster, tmp_path, privileged=True, runtime=runtime)
    up.start(wait_workers=0)
    app = up.root / "k8s_app.py"
    app.write_text(APP)
    done = up.levers9("run", f"{app.name}::main", timeout=900)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{pod_logs(cluster)}\n{up.log()[-6000:]}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["jq"].startswith("jq-1.6"), answer
    assert answer["built"] == "blueprint built"
    assert answer["debian"].startswith("12."), answer
    if runtime == "runc":
        assert answer["uid_map"][:2] == ["0", "1000000000"], answer  # runc in a user namespace
    assert " on local" in up.log(), up.log()[-3000:]  # built on the build pool

    [job] = cluster.created("jobs")
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["securityContext"] == {"privileged": True}
    assert container["volumeMounts"] == [{"name": "worker-state", "mountPath": "/var/lib/levers9"}]
    assert pod["volumes"] == [{"name": "worker-state", "emptyDir": {}}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEVERS9_WORKER_STATE_DIR"] == "/var/lib/levers9/worker"

    wait_for(
        lambda: cluster.leftovers() == [],
        "no Job, pod or Secret left",
        180,
        lambda: f"{cluster.leftovers()}\n{up.log()[-3000:]}",
    )
    assert cluster.running_processes() == []
    assert Path("/var/lib/levers9").exists() == state_mount_there  # a mount point the fake made went with the pod


def test_a_runc_pool_without_privileged_is_refused_naming_the_setting(
    levers9_up: Up, cluster: FakeCluster, tmp_path: Path
) -> None:
    up = _up(levers9_up, cluster, tmp_path, privileged=False)
    up.start(wait_workers=0)
    checked = up.levers9("check", timeout=120)
    said = checked.stdout + checked.stderr
    assert "pool 'k8s' runs runtime 'runc'" in said, said
    assert "settings.privileged: true" in said, said
    app = up.root / "k8s_app.py"
    app.write_text(APP)
    # a call for the pool: its provision is refused in the same words (the call itself waits on; it is ended)
    call = subprocess.Popen(
        [sys.executable, "-m", "levers9", "run", f"{app.name}::main"],
        cwd=up.root,
        env=up.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: "settings.privileged: true" in up.log(),
            "the provision's refusal in the log",
            240,
            lambda: up.log()[-4000:],
        )
    finally:
        call.kill()
        call.wait()
    assert "pool 'k8s' runs runtime 'runc'" in up.log()
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []
