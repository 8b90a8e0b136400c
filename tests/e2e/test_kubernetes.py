"""levers9's own Kubernetes cluster behind one ``levers9 server``: calls run in Jobs, misses fail over, nothing is left.

The cluster is :class:`tests.fakes.k8s_cluster.FakeCluster`: the Kubernetes
API at the wire (the real ``kubernetes`` client in the server subprocess talks
to it through a kubeconfig), a scheduler, and a kubelet that runs each bound
pod's container as a local process in a network namespace reaching only the
controlplane's gRPC port, with the node's GPUs (recorded ``nvidia-smi``
output). Its nodes are the Node objects of ``tests/data/k8s``: an EKS
g6.xlarge with one NVIDIA L4 labelled by GPU Feature Discovery and tainted
``nvidia.com/gpu=present:NoSchedule``, and a CPU node. So the worker that runs
a call is a real ``levers9 worker`` started from the Job the plugin created,
registering with the token from the Secret it made.

Pools: ``k8s-l4-budget`` (an L4 pool, tried first, in a namespace whose
ResourceQuota allows no GPU), ``k8s-l4`` (the L4 pool that works) and
``k8s-cpu`` (CPU only); the calls ask ``gpu=["L4", "cpu"]``. What is checked,
in one server's life:

1. the call runs on the L4 node, in a Job of ``k8s-l4``; the budget pool was
   refused by its quota before any Job existed there, named in the history;
2. with the L4 held by another tenant's pod, the next call fails over to the
   CPU pool at once, the L4 pool's miss naming the node's shortfall;
3. when another pod wins the GPU between the plugin's look and the
   scheduler's decision, the worker's pod waits with ``FailedScheduling``; at
   the registration deadline its Job is deleted and the miss, with the
   scheduler's message, sends the call to the CPU pool;
4. at the end (idle workers released) no Job, pod or Secret is left.

No time is asserted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.fakes.k8s_cluster import GPU_NODE, FakeCluster, load_recorded_nodes
from tests.fixtures.replicas import Replicas
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(900)

NS, BUDGET_NS = "levers9", "budget"
#: a miss is remembered this long: shorter than the pauses between the test's steps, so each step starts clean
UNAVAILABLE_TTL_S = 6


def _pool(name: str, namespace: str, *, gpu: bool, extra: str = "") -> str:
    """One local_k8s pool of the test: one L4 (tolerating the GPU node's taint) or CPU only, 1 CPU, 2 GiB."""
    shape = "    gpu: L4\n    gpu_count: 1\n" if gpu else ""
    tolerate = "      tolerations: [{{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}]\n" if gpu else ""
    return (
        f"  {name}:\n    provider: local_k8s\n    runtime: process\n    workspace: default\n{shape}    cpu: 1\n"
        "    memory: 2048\n"
        f"    max_workers: 1\n{extra}    settings:\n      kubeconfig: {{kubeconfig}}\n      namespace: {namespace}\n"
        f"      worker_image: registry.example.com/levers9/worker:test\n{tolerate}"
    )


POOLS = (
    _pool("k8s-l4-budget", BUDGET_NS, gpu=True, extra="    priority: 10\n")
    + _pool("k8s-l4", NS, gpu=True, extra="    idle_timeout_s: 2\n")
    + _pool("k8s-cpu", NS, gpu=False, extra="    idle_timeout_s: 2\n")
)

PROGRAM = """
import levers9

@levers9.function(gpu=["L4", "cpu"], cpu=0.25)
def answer() -> int:
    return 42

print("RESULT", answer.remote(), flush=True)
"""


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster(NS, max_grace_s=3.0) as fake:
        yield load_recorded_nodes(fake)
        assert fake.errors == []


def _history(replicas: Replicas) -> list[dict[str, Any]]:
    """The placement history of the newest task."""
    tasks = replicas.api("/tasks")
    items = tasks["tasks"] if isinstance(tasks, dict) else tasks
    newest = max(items, key=lambda t: t.get("created_at") or "")
    history = replicas.api(f"/tasks/{newest['id']}/history")
    events: list[dict[str, Any]] = history["events"] if isinstance(history, dict) else history
    return events


def _call(replicas: Replicas, expect_pool: str) -> list[dict[str, Any]]:
    run = replicas.python(PROGRAM, timeout=300)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{replicas.logs()}"
    events = _history(replicas)
    shown = json.dumps(events, indent=1)
    assert [e["pool"] for e in events if e["outcome"] == "placed"] == [expect_pool], shown
    assert "RESULT 42" in run.stdout
    return events


def _holder(batch: Any, name: str) -> None:
    """Another tenant's Job holding the L4 (a pod that sleeps)."""
    container = {
        "name": "main",
        "image": "busybox",
        "command": ["sleep", "600"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    pod = {
        "restartPolicy": "Never",
        "containers": [container],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    body = {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod}}}
    batch.create_namespaced_job("default", body)


def test_calls_run_in_jobs_fail_over_at_once_or_at_the_deadline_and_leave_nothing(
    replicas: Replicas, cluster: FakeCluster, tmp_path: Path
) -> None:
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    core, batch = kubernetes.client.CoreV1Api(api_client), kubernetes.client.BatchV1Api(api_client)
    core.create_namespace({"metadata": {"name": BUDGET_NS}})
    quota = {"metadata": {"name": "no-gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    core.create_namespaced_resource_quota(BUDGET_NS, quota)

    replicas.count = 1
    replicas.min_workers = 0
    replicas.pools = POOLS.format(kubeconfig=kubeconfig)
    replicas.scheduler = f"  unavailable_ttl_s: {UNAVAILABLE_TTL_S}\n  offers_ttl_s: 1\n"
    replicas.write_config()
    config = (replicas.home / "levers9.yaml").read_text().replace("register_timeout_s: 60", "register_timeout_s: 15")
    (replicas.home / "levers9.yaml").write_text(config)
    cluster.set_reachable_ports([replicas.replicas[0].grpc_port])
    try:
        replicas.start(0)
        issued = replicas.levers9("token", "create")
        assert issued.returncode == 0, issued.stderr
        replicas.token = issued.stdout.strip()

        # 1. the L4 node runs it; the budget namespace's quota refused its pool before any Job was made there
        events = _call(replicas, "k8s-l4")
        shown = json.dumps(events, indent=1)
        budget = [e for e in events if e["pool"] == "k8s-l4-budget" and e["outcome"] == "unavailable"]
        assert budget, shown
        assert "ResourceQuota no-gpus allows requests.nvidia.com/gpu=0" in budget[0]["reason"], shown
        assert [j["metadata"]["namespace"] for j in cluster.created("jobs")] == [NS]
        [pod] = [p for p in cluster.pods(NS) if p["metadata"]["labels"].get("levers9/pool") == "k8s-l4"]
        assert pod["spec"]["nodeName"] == GPU_NODE
        wait_for(lambda: not cluster.objects("jobs", NS), "the idle L4 worker to be released", 120, replicas.logs)
        time.sleep(UNAVAILABLE_TTL_S)

        # 2. another tenant holds the L4: the call goes to the CPU pool at once, saying why
        _holder(batch, "tenant-a")
        wait_for(
            lambda: any(p["spec"].get("nodeName") == GPU_NODE for p in cluster.pods("default")),
            "the tenant's pod on the GPU node",
            30,
        )
        events = _call(replicas, "k8s-cpu")
        shown = json.dumps(events, indent=1)
        l4 = [e for e in events if e["pool"] == "k8s-l4" and e["outcome"] == "unavailable"]
        assert l4, shown
        # the planner's offers already said the L4 is taken, or the plugin's look before creating anything did
        said = ("0 of 1 GPUs free", "reports every offer of the pool unavailable")
        assert any(w in (e["reason"] or "") for e in l4 for w in said), shown
        batch.delete_namespaced_job("tenant-a", "default", propagation_policy="Background")
        wait_for(lambda: not cluster.objects("jobs", NS) and not cluster.pods("default"), "a clean cluster", 120)
        time.sleep(UNAVAILABLE_TTL_S)

        # 3. another pod wins the GPU after the plugin looked: the worker's pod never schedules; at the deadline
        #    its Job goes and the miss, in the scheduler's words, sends the call to the CPU pool
        cluster.pause_scheduling()
        _holder(batch, "tenant-b")
        running = replicas.popen(PROGRAM)
        try:
            wait_for(lambda: [j for j in cluster.objects("jobs", NS)], "the L4 worker's Job", 120, replicas.logs)
            cluster.resume_scheduling()
            out, err = running.communicate(timeout=300)
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
        assert running.returncode == 0, f"{out!r}\n{err!r}\n{replicas.logs()}"
        events = _history(replicas)
        shown = json.dumps(events, indent=1) + "\n" + replicas.logs()
        assert [e["pool"] for e in events if e["outcome"] == "placed"] == ["k8s-cpu"], shown
        missed = [e["reason"] or "" for e in events if e["pool"] == "k8s-l4" and e["outcome"] == "unavailable"]
        # the miss in the scheduler's words (beside the provider's offers, which by then say the L4 is taken)
        assert any(
            "never started within its registration deadline: FailedScheduling: 0/2 nodes are available" in r
            and "Insufficient nvidia.com/gpu" in r
            for r in missed
        ), shown
        batch.delete_namespaced_job("tenant-b", "default", propagation_policy="Background")

        # 4. idle workers released, the tenants gone: nothing of levers9's is left in the cluster
        wait_for(
            lambda: cluster.leftovers() == [],
            "no Job, pod or Secret left",
            120,
            lambda: f"{cluster.leftovers()}\n{replicas.logs()}",
        )
        assert cluster.running_processes() == []
    finally:
        replicas.stop_all()
        api_client.close()
