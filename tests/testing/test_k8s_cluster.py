"""The fake Kubernetes cluster, driven only through the real ``kubernetes`` client configured from its kubeconfig.

Each test starts its own :class:`~tests.fakes.k8s_cluster.FakeCluster` (the
GPU and CPU nodes of ``tests/data/k8s/``), talks to it with ``CoreV1Api``,
``BatchV1Api`` and ``AuthorizationV1Api`` exactly as a plugin would, and looks
at the fake's own bookkeeping only for what no API shows (processes, leftovers).
Waits poll the API until a state is reached or a generous deadline passes; no
test asserts how long anything took.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.fakes.k8s_cluster import CPU_NODE, GPU_NODE, FakeCluster, load_recorded_nodes
from tests.fixtures.wait import wait_for

DATA = Path(__file__).resolve().parents[1] / "data" / "k8s"
NS = "levers9"


# --------------------------------------------------------------------------- harness


class Kube:
    """The real client's APIs, configured from the kubeconfig the fake wrote."""

    def __init__(self, kubeconfig: Path) -> None:
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.auth = client.AuthorizationV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster(NS, max_grace_s=2.0) as fake:
        yield load_recorded_nodes(fake)
        assert fake.errors == []


@pytest.fixture
def kube(cluster: FakeCluster, tmp_path: Path) -> Iterator[Kube]:
    apis = Kube(cluster.kubeconfig(tmp_path / "kubeconfig"))
    yield apis
    apis.close()


def body(error: ApiException) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(error.body)
    return parsed


def gpu_toleration() -> client.V1Toleration:
    return client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


def job(
    name: str,
    command: list[str],
    *,
    gpus: int = 0,
    tolerate_gpu: bool = True,
    env: list[client.V1EnvVar] | None = None,
    labels: dict[str, str] | None = None,
    grace: int | None = None,
) -> client.V1Job:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else None
    container = client.V1Container(
        name="worker",
        image="ghcr.io/levers9/worker:test",
        command=command,
        env=env,
        resources=client.V1ResourceRequirements(limits=limits, requests={"cpu": "500m", "memory": "512Mi"}),
    )
    pod = client.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        tolerations=[gpu_toleration()] if tolerate_gpu else None,
        termination_grace_period_seconds=grace,
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {"levers9/pool": "gpu"}),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
        ),
    )


def job_pods(kube: Kube, name: str) -> list[client.V1Pod]:
    pods: list[client.V1Pod] = kube.core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items
    return pods


def one_pod(kube: Kube, name: str, phase: str | None = None) -> client.V1Pod | None:
    pods = job_pods(kube, name)
    if len(pods) == 1 and (phase is None or pods[0].status.phase == phase):
        return pods[0]
    return None


def job_condition(kube: Kube, name: str, kind: str) -> client.V1JobCondition | None:
    conditions = kube.batch.read_namespaced_job(name, NS).status.conditions or []
    return next((c for c in conditions if c.type == kind and c.status == "True"), None)


def gone(call: Callable[[], Any]) -> bool:
    try:
        call()
    except ApiException as error:
        return error.status == 404
    return False


def own_secret(kube: Kube, name: str, owner: client.V1Job, data: dict[str, str]) -> client.V1Secret:
    reference = client.V1OwnerReference(
        api_version="batch/v1", kind="Job", name=owner.metadata.name, uid=owner.metadata.uid
    )
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=name, owner_references=[reference]), string_data=data)
    created: client.V1Secret = kube.core.create_namespaced_secret(NS, secret)
    return created


def hold_until_released() -> list[str]:
    """A command that notes SIGTERM, and runs until the test creates ``release`` in its boot root."""
    script = (
        "trap 'touch \"$LEVERS9_BOOT_ROOT/got-term\"' TERM; "
        'touch "$LEVERS9_BOOT_ROOT/started"; '
        'while [ ! -e "$LEVERS9_BOOT_ROOT/release" ]; do sleep 0.05; done'
    )
    return ["sh", "-c", script]


# --------------------------------------------------------------------------- discovery, auth, errors


def test_discovery_and_nodes_answer_as_the_api_does(kube: Kube) -> None:
    assert client.VersionApi(kube.api_client).get_code().git_version == "v1.31.0"
    assert client.CoreApi(kube.api_client).get_api_versions().versions == ["v1"]
    groups = {g.name for g in client.ApisApi(kube.api_client).get_api_versions().groups}
    assert {"batch", "authorization.k8s.io"} <= groups
    nodes = kube.core.list_node().items
    assert [n.metadata.name for n in nodes] == [CPU_NODE, GPU_NODE]
    gpu = kube.core.read_node(GPU_NODE)
    assert gpu.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert gpu.status.allocatable["nvidia.com/gpu"] == "1"
    assert [(t.key, t.value, t.effect) for t in gpu.spec.taints] == [("nvidia.com/gpu", "present", "NoSchedule")]
    assert [c.type for c in gpu.status.conditions if c.status == "True"] == ["Ready"]
    assert gpu.metadata.uid
    assert int(gpu.metadata.resource_version) > 0


def test_namespaces_are_created_listed_and_read(kube: Kube) -> None:
    names = {n.metadata.name for n in kube.core.list_namespace().items}
    assert {"default", "kube-system", NS} <= names
    created = kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
    assert created.status.phase == "Active"
    assert kube.core.read_namespace("team-a").metadata.labels == {"kubernetes.io/metadata.name": "team-a"}
    with pytest.raises(ApiException) as duplicate:
        kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
    assert duplicate.value.status == 409
    assert body(duplicate.value)["reason"] == "AlreadyExists"


def test_a_wrong_token_is_401_with_a_status_body(cluster: FakeCluster, tmp_path: Path) -> None:
    wrong = Kube(cluster.kubeconfig(tmp_path / "wrong", token="not-the-token"))
    try:
        with pytest.raises(ApiException) as refused:
            wrong.core.list_namespaced_pod(NS)
    finally:
        wrong.close()
    assert refused.value.status == 401
    assert body(refused.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    assert cluster.calls[-1] == ("GET", f"/api/v1/namespaces/{NS}/pods", 401)


def test_duplicate_job_409_missing_job_404_invalid_job_422(kube: Kube) -> None:
    kube.batch.create_namespaced_job(NS, job("dup", ["true"]))
    with pytest.raises(ApiException) as duplicate:
        kube.batch.create_namespaced_job(NS, job("dup", ["true"]))
    assert (duplicate.value.status, duplicate.value.reason) == (409, "Conflict")
    assert body(duplicate.value)["reason"] == "AlreadyExists"
    assert body(duplicate.value)["message"] == 'jobs.batch "dup" already exists'
    assert body(duplicate.value)["details"] == {"name": "dup", "group": "batch", "kind": "jobs"}

    with pytest.raises(ApiException) as missing:
        kube.batch.delete_namespaced_job("no-such-job", NS, propagation_policy="Background")
    assert missing.value.status == 404
    assert body(missing.value)["reason"] == "NotFound"
    assert body(missing.value)["message"] == 'jobs.batch "no-such-job" not found'

    with pytest.raises(ApiException) as no_namespace:
        kube.batch.create_namespaced_job("nowhere", job("x", ["true"]))
    assert no_namespace.value.status == 404
    assert body(no_namespace.value)["message"] == 'namespaces "nowhere" not found'

    bad = job("Bad_Name", ["true"])
    with pytest.raises(ApiException) as invalid:
        kube.batch.create_namespaced_job(NS, bad)
    assert invalid.value.status == 422
    status = body(invalid.value)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith('Job.batch "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"')
    assert [c["field"] for c in status["details"]["causes"]] == ["metadata.name"]

    no_policy = job("no-policy", ["true"])
    no_policy.spec.template.spec.restart_policy = None
    with pytest.raises(ApiException) as unset:
        kube.batch.create_namespaced_job(NS, no_policy)
    assert unset.value.status == 422
    assert body(unset.value)["details"]["causes"][0]["field"] == "spec.template.spec.restartPolicy"
    assert [j.metadata.name for j in kube.batch.list_namespaced_job(NS).items] == ["dup"]


# --------------------------------------------------------------------------- running a Job


def test_a_gpu_job_runs_on_the_gfd_node_with_its_secret_and_completes(cluster: FakeCluster, kube: Kube) -> None:
    kube.core.create_namespaced_secret(
        NS, client.V1Secret(metadata=client.V1ObjectMeta(name="worker-token"), string_data={"token": "t0ken-42"})
    )
    script = (
        'env > "$LEVERS9_BOOT_ROOT/env"; '
        'nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits > "$LEVERS9_BOOT_ROOT/gpus"; '
        "echo worker says hello; "
        'while [ ! -e "$LEVERS9_BOOT_ROOT/go" ]; do sleep 0.05; done'
    )
    env = [
        client.V1EnvVar(name="LEVERS9_POOL", value="gpu"),
        client.V1EnvVar(name="GREETING", value="pool=$(LEVERS9_POOL)"),
        client.V1EnvVar(
            name="LEVERS9_TOKEN",
            value_from=client.V1EnvVarSource(
                secret_key_ref=client.V1SecretKeySelector(name="worker-token", key="token")
            ),
        ),
        client.V1EnvVar(
            name="POD_NAME",
            value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path="metadata.name")),
        ),
        client.V1EnvVar(
            name="NODE_NAME",
            value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path="spec.nodeName")),
        ),
    ]
    created = kube.batch.create_namespaced_job(NS, job("gpu-run", ["sh", "-c", script], gpus=1, env=env))
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": created.metadata.uid}

    pod = wait_for(lambda: one_pod(kube, "gpu-run", "Running"), "the Job's pod running")
    name = pod.metadata.name
    assert name.startswith("gpu-run-")
    assert len(name) == len("gpu-run-") + 5
    assert pod.spec.node_name == GPU_NODE
    assert pod.metadata.labels["job-name"] == pod.metadata.labels["batch.kubernetes.io/job-name"] == "gpu-run"
    uid = created.metadata.uid
    assert pod.metadata.labels["controller-uid"] == pod.metadata.labels["batch.kubernetes.io/controller-uid"] == uid
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Job", "gpu-run", uid, True)
    assert pod.status.container_statuses[0].state.running is not None
    assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"  # limits imply requests
    assert kube.batch.read_namespaced_job("gpu-run", NS).status.active == 1

    root = wait_for(lambda: cluster.pod_root(NS, name), "the pod's boot root")
    wait_for(lambda: (root / "gpus").exists() and (root / "gpus").read_text(), "the pod's nvidia-smi output")
    seen = dict(line.split("=", 1) for line in (root / "env").read_text().splitlines() if "=" in line)
    assert seen["LEVERS9_TOKEN"] == "t0ken-42"
    assert seen["GREETING"] == "pool=gpu"
    assert (seen["POD_NAME"], seen["NODE_NAME"], seen["HOSTNAME"]) == (name, GPU_NODE, name)
    gpu_line = (root / "gpus").read_text()
    assert gpu_line == (DATA.parent / "gpu" / "nvidia_smi" / "l4_1x.csv").read_text()
    assert seen["NVIDIA_VISIBLE_DEVICES"] == gpu_line.split(", ")[1]
    assert cluster.running_processes()

    (root / "go").touch()
    wait_for(lambda: one_pod(kube, "gpu-run", "Succeeded"), "the pod succeeded")
    wait_for(lambda: job_condition(kube, "gpu-run", "Complete"), "the Job complete")
    finished = kube.batch.read_namespaced_job("gpu-run", NS)
    assert (finished.status.succeeded, finished.status.active, finished.status.failed) == (1, None, None)
    assert finished.status.completion_time is not None
    assert finished.status.start_time is not None
    terminated = one_pod(kube, "gpu-run").status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert kube.core.read_namespaced_pod_log(name, NS) == "worker says hello\n"
    reasons = [
        e.reason for e in kube.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
    ]
    assert reasons == ["Scheduled", "Created", "Started"]
    job_events = kube.core.list_namespaced_event(
        NS, field_selector="involvedObject.kind=Job,involvedObject.name=gpu-run"
    )
    assert [e.reason for e in job_events.items] == ["SuccessfulCreate", "Completed"]
    wait_for(lambda: not cluster.running_processes(), "the finished pod's processes gone")


def test_a_failing_pod_fails_the_job_with_backoff_limit_zero(kube: Kube) -> None:
    kube.batch.create_namespaced_job(NS, job("fails", ["sh", "-c", "echo boom >&2; exit 3"]))
    pod = wait_for(lambda: one_pod(kube, "fails", "Failed"), "the pod failed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    condition = wait_for(lambda: job_condition(kube, "fails", "Failed"), "the Job failed")
    assert condition.reason == "BackoffLimitExceeded"
    status = kube.batch.read_namespaced_job("fails", NS).status
    assert (status.failed, status.succeeded, status.active) == (1, None, None)
    assert [p.metadata.name for p in job_pods(kube, "fails")] == [pod.metadata.name]  # not replaced
    assert kube.core.read_namespaced_pod_log(pod.metadata.name, NS) == "boom\n"


def test_a_missing_secret_holds_the_container_until_it_exists(cluster: FakeCluster, kube: Kube) -> None:
    env = [
        client.V1EnvVar(
            name="TOKEN",
            value_from=client.V1EnvVarSource(secret_key_ref=client.V1SecretKeySelector(name="late", key="token")),
        )
    ]
    kube.batch.create_namespaced_job(NS, job("waits", ["sh", "-c", 'test "$TOKEN" = here'], env=env))

    def config_error() -> client.V1Pod | None:
        pod = one_pod(kube, "waits", "Pending")
        statuses = pod.status.container_statuses if pod is not None else None
        waiting = statuses[0].state.waiting if statuses else None
        return pod if waiting is not None and waiting.reason == "CreateContainerConfigError" else None

    pod = wait_for(config_error, "CreateContainerConfigError")
    assert pod.status.container_statuses[0].state.waiting.message == 'secret "late" not found'
    assert not cluster.running_processes()
    kube.core.create_namespaced_secret(
        NS, client.V1Secret(metadata=client.V1ObjectMeta(name="late"), string_data={"token": "here"})
    )
    wait_for(lambda: job_condition(kube, "waits", "Complete"), "the Job complete once the Secret exists")


def test_pods_reach_the_api_server_and_the_reachable_ports_only(cluster: FakeCluster, kube: Kube) -> None:
    with socket.create_server(("127.0.0.1", 0)) as allowed, socket.create_server(("127.0.0.1", 0)) as other:
        ports = {"api": cluster.port, "allowed": allowed.getsockname()[1], "other": other.getsockname()[1]}
        cluster.set_reachable_ports([ports["allowed"]])
        probe = (
            "import socket, sys\n"
            "for name, port in zip(sys.argv[1::2], sys.argv[2::2]):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', int(port)), timeout=5).close()\n"
            "        print(name, 'connected')\n"
            "    except OSError:\n"
            "        print(name, 'refused')\n"
        )
        argv = [str(v) for item in ports.items() for v in item]
        kube.batch.create_namespaced_job(NS, job("probe", ["python", "-c", probe, *argv]))
        pod = wait_for(lambda: one_pod(kube, "probe", "Succeeded"), "the probe finished")
        seen = kube.core.read_namespaced_pod_log(pod.metadata.name, NS).splitlines()
    isolation = cluster.pod_isolation(NS, pod.metadata.name) or ""
    if not isolation.startswith("network namespace"):
        pytest.skip(f"pods here run without a network namespace of their own ({isolation}): nothing to check")
    assert seen == ["api connected", "allowed connected", "other refused"]


# --------------------------------------------------------------------------- scheduling


def test_a_pod_that_fits_nowhere_stays_pending_with_one_failed_scheduling_event(tmp_path: Path) -> None:
    with FakeCluster(NS, event_repeat_s=0.0) as fake:  # every retry bumps the event: the test can count retries
        fake.load_nodes(DATA / "node_gpu_l4.json", gpus_csv={GPU_NODE: "l4_1x.csv"})
        fake.load_nodes(DATA / "node_cpu.json")
        kube = Kube(fake.kubeconfig(tmp_path / "kubeconfig"))
        try:
            kube.batch.create_namespaced_job(NS, job("no-fit", ["true"], gpus=1, tolerate_gpu=False))
            pod = wait_for(lambda: one_pod(kube, "no-fit"), "the Job's pod")
            selector = f"involvedObject.name={pod.metadata.name},reason=FailedScheduling"

            def retried() -> list[client.CoreV1Event] | None:
                events = kube.core.list_namespaced_event(NS, field_selector=selector).items
                return events if events and events[0].count >= 3 else None

            (event,) = wait_for(retried, "three scheduling attempts")
            recorded = json.loads((DATA / "event_failed_scheduling.json").read_text())
            assert event.message == recorded["message"]
            assert (event.type, event.source.component, event.involved_object.kind) == (
                "Warning",
                "default-scheduler",
                "Pod",
            )
            assert event.involved_object.uid == pod.metadata.uid
            still = kube.core.read_namespaced_pod(pod.metadata.name, NS)
            assert still.status.phase == "Pending"
            assert still.spec.node_name is None
            (scheduled,) = [c for c in still.status.conditions if c.type == "PodScheduled"]
            assert (scheduled.status, scheduled.reason, scheduled.message) == (
                "False",
                "Unschedulable",
                recorded["message"],
            )
            everywhere = kube.core.list_event_for_all_namespaces(field_selector="reason=FailedScheduling").items
            assert [e.metadata.name for e in everywhere] == [event.metadata.name]
            assert not fake.running_processes()
        finally:
            kube.close()


def test_the_scheduler_respects_selectors_unschedulable_nodes_and_free_gpus(cluster: FakeCluster, kube: Kube) -> None:
    cluster.add_node("cordoned", labels={"pool": "x"}, allocatable={"cpu": "8", "memory": "32Gi"}, unschedulable=True)
    hold = hold_until_released()
    first = kube.batch.create_namespaced_job(NS, job("holds-gpu", hold, gpus=1))
    wait_for(lambda: one_pod(kube, "holds-gpu", "Running"), "the first GPU pod running")
    kube.batch.create_namespaced_job(NS, job("second-gpu", ["true"], gpus=1))
    pending = wait_for(lambda: one_pod(kube, "second-gpu"), "the second GPU pod")
    events = wait_for(
        lambda: (
            kube.core.list_namespaced_event(
                NS, field_selector=f"involvedObject.name={pending.metadata.name},reason=FailedScheduling"
            ).items
        ),
        "the second pod unschedulable",
    )
    assert events[0].message == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu. "
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod."
    )
    selected = job("wants-pool-y", ["true"])
    selected.spec.template.spec.node_selector = {"pool": "y"}
    kube.batch.create_namespaced_job(NS, selected)
    other = wait_for(lambda: one_pod(kube, "wants-pool-y"), "the selector pod")
    message = wait_for(
        lambda: kube.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={other.metadata.name}").items,
        "the selector pod unschedulable",
    )[0].message
    assert message.startswith(
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector."
    )
    # the first Job goes: its GPU frees, and the waiting pod lands on the GPU node
    kube.batch.delete_namespaced_job("holds-gpu", NS, propagation_policy="Background")
    wait_for(lambda: job_pods(kube, "holds-gpu") == [], "the first pod gone")
    landed = wait_for(lambda: one_pod(kube, "second-gpu", "Succeeded"), "the second pod ran once the GPU was free")
    assert landed.spec.node_name == GPU_NODE
    assert first.metadata.uid not in {r.uid for p in job_pods(kube, "second-gpu") for r in p.metadata.owner_references}


# --------------------------------------------------------------------------- quota


def test_a_job_count_quota_refuses_the_job_with_403(kube: Kube) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="jobs-quota"), spec=client.V1ResourceQuotaSpec(hard={"count/jobs.batch": "1"})
    )
    kube.core.create_namespaced_resource_quota(NS, quota)
    kube.batch.create_namespaced_job(NS, job("first", ["true"]))
    with pytest.raises(ApiException) as refused:
        kube.batch.create_namespaced_job(NS, job("second", ["true"]))
    assert (refused.value.status, refused.value.reason) == (403, "Forbidden")
    status = body(refused.value)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        'jobs.batch "second" is forbidden: exceeded quota: jobs-quota, requested: count/jobs.batch=1, '
        "used: count/jobs.batch=1, limited: count/jobs.batch=1"
    )
    assert "exceeded quota" in status["message"]
    (listed,) = kube.core.list_namespaced_resource_quota(NS).items
    assert (listed.status.hard, listed.status.used) == ({"count/jobs.batch": "1"}, {"count/jobs.batch": "1"})
    assert [j.metadata.name for j in kube.batch.list_namespaced_job(NS).items] == ["first"]


def test_a_gpu_quota_refuses_the_pod_with_a_failed_create_event(cluster: FakeCluster, kube: Kube) -> None:
    recorded = json.loads((DATA / "resourcequota_gpu.json").read_text())
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="levers9-gpu"),
        spec=client.V1ResourceQuotaSpec(hard={**recorded["spec"]["hard"], "requests.nvidia.com/gpu": "0"}),
    )
    kube.core.create_namespaced_resource_quota(NS, quota)
    kube.batch.create_namespaced_job(NS, job("over-quota", ["true"], gpus=1))
    selector = "involvedObject.kind=Job,involvedObject.name=over-quota,reason=FailedCreate"
    (event,) = wait_for(lambda: kube.core.list_namespaced_event(NS, field_selector=selector).items, "FailedCreate")
    assert event.type == "Warning"
    assert event.source.component == "job-controller"
    assert event.message.startswith('Error creating: pods "over-quota-')
    assert event.message.endswith(
        '" is forbidden: exceeded quota: levers9-gpu, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0"
    )
    assert job_pods(kube, "over-quota") == []
    assert kube.batch.read_namespaced_job("over-quota", NS).status.active is None
    (listed,) = kube.core.list_namespaced_resource_quota(NS).items
    assert listed.status.used == {"count/jobs.batch": "1", "requests.nvidia.com/gpu": "0"}
    assert set(listed.status.hard) == set(recorded["status"]["hard"])
    assert not cluster.running_processes()


def test_a_cpu_quota_requires_cpu_requests_and_counts_running_pods(kube: Kube) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="compute"), spec=client.V1ResourceQuotaSpec(hard={"requests.cpu": "1"})
    )
    kube.core.create_namespaced_resource_quota(NS, quota)
    bare = job("no-requests", ["true"])
    bare.spec.template.spec.containers[0].resources = None
    kube.batch.create_namespaced_job(NS, bare)
    selector = "involvedObject.name=no-requests,reason=FailedCreate"
    (event,) = wait_for(lambda: kube.core.list_namespaced_event(NS, field_selector=selector).items, "FailedCreate")
    assert event.message.endswith("is forbidden: failed quota: compute: must specify requests.cpu for: worker")
    kube.batch.create_namespaced_job(NS, job("half-cpu", hold_until_released()))
    wait_for(lambda: one_pod(kube, "half-cpu", "Running"), "the pod within quota running")
    used = kube.core.read_namespaced_resource_quota("compute", NS).status.used
    assert used == {"requests.cpu": "500m"}


# --------------------------------------------------------------------------- deletion and garbage collection


def test_background_delete_stops_the_pod_and_removes_the_owned_secret(cluster: FakeCluster, kube: Kube) -> None:
    created = kube.batch.create_namespaced_job(NS, job("bg", ["sleep", "1000"]))
    own_secret(kube, "bg-token", created, {"token": "x"})
    pod = wait_for(lambda: one_pod(kube, "bg", "Running"), "the pod running")
    pids = cluster.running_processes()
    assert pids
    kube.batch.delete_namespaced_job("bg", NS, propagation_policy="Background")
    assert gone(lambda: kube.batch.read_namespaced_job("bg", NS))
    wait_for(lambda: gone(lambda: kube.core.read_namespaced_pod(pod.metadata.name, NS)), "the pod deleted")
    wait_for(lambda: gone(lambda: kube.core.read_namespaced_secret("bg-token", NS)), "the owned Secret deleted")
    wait_for(lambda: not cluster.running_processes(), "the pod's processes stopped")
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists() and _alive(pid)]
    assert cluster.leftovers() == []


def test_orphan_delete_leaves_pod_and_secret_running(cluster: FakeCluster, kube: Kube) -> None:
    created = kube.batch.create_namespaced_job(NS, job("orphan", ["sleep", "1000"]))
    own_secret(kube, "orphan-token", created, {"token": "x"})
    pod = wait_for(lambda: one_pod(kube, "orphan", "Running"), "the pod running")
    kube.batch.delete_namespaced_job("orphan", NS)  # no policy: batch/v1 orphans
    assert gone(lambda: kube.batch.read_namespaced_job("orphan", NS))
    kept = kube.core.read_namespaced_pod(pod.metadata.name, NS)
    assert kept.status.phase == "Running"
    assert kept.metadata.owner_references is None
    assert kube.core.read_namespaced_secret("orphan-token", NS).metadata.owner_references is None
    assert cluster.running_processes()
    assert sorted(cluster.leftovers()) == [f"Pod {NS}/{pod.metadata.name}", f"Secret {NS}/orphan-token"]
    kube.core.delete_namespaced_pod(pod.metadata.name, NS)
    kube.core.delete_namespaced_secret("orphan-token", NS)
    wait_for(lambda: cluster.leftovers() == [], "the orphans deleted by hand")
    wait_for(lambda: not cluster.running_processes(), "the orphaned pod's processes stopped")


def test_foreground_delete_waits_for_the_pod_to_terminate(tmp_path: Path) -> None:
    with FakeCluster(NS, max_grace_s=60) as fake:
        fake.load_nodes(DATA / "node_cpu.json")
        kube = Kube(fake.kubeconfig(tmp_path / "kubeconfig"))
        try:
            created = kube.batch.create_namespaced_job(NS, job("fg", hold_until_released(), grace=60))
            own_secret(kube, "fg-token", created, {"token": "x"})
            pod = wait_for(lambda: one_pod(kube, "fg", "Running"), "the pod running")
            root = wait_for(lambda: fake.pod_root(NS, pod.metadata.name), "the pod's root")
            options = client.V1DeleteOptions(propagation_policy="Foreground")
            kube.batch.delete_namespaced_job("fg", NS, body=options)
            deleting = kube.batch.read_namespaced_job("fg", NS)
            assert deleting.metadata.deletion_timestamp is not None
            assert "foregroundDeletion" in deleting.metadata.finalizers
            wait_for(lambda: (root / "got-term").exists(), "SIGTERM reaching the pod")
            terminating = kube.core.read_namespaced_pod(pod.metadata.name, NS)
            assert terminating.metadata.deletion_timestamp is not None
            assert terminating.metadata.deletion_grace_period_seconds == 60
            assert kube.batch.read_namespaced_job("fg", NS).metadata.deletion_timestamp is not None  # still there
            (root / "release").touch()
            wait_for(lambda: gone(lambda: kube.batch.read_namespaced_job("fg", NS)), "the Job gone after its pod")
            assert fake.leftovers() == []
            assert not fake.running_processes()
        finally:
            kube.close()


def test_deleting_a_running_pod_counts_as_a_failure_of_its_job(cluster: FakeCluster, kube: Kube) -> None:
    kube.batch.create_namespaced_job(NS, job("lost-pod", ["sleep", "1000"]))
    pod = wait_for(lambda: one_pod(kube, "lost-pod", "Running"), "the pod running")
    deleted = kube.core.delete_namespaced_pod(pod.metadata.name, NS)
    assert deleted.metadata.deletion_timestamp is not None
    condition = wait_for(lambda: job_condition(kube, "lost-pod", "Failed"), "the Job failed")
    assert condition.reason == "BackoffLimitExceeded"
    assert job_pods(kube, "lost-pod") == []
    wait_for(lambda: not cluster.running_processes(), "the pod's processes stopped")


# --------------------------------------------------------------------------- selectors


def test_label_selectors(cluster: FakeCluster, kube: Kube) -> None:
    cluster.add_node(
        "a100-1",
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.present": "true", "rank": "3"},
    )

    def nodes(selector: str) -> list[str]:
        return [n.metadata.name for n in kube.core.list_node(label_selector=selector).items]

    assert nodes("nvidia.com/gpu.present=true") == ["a100-1", GPU_NODE]
    assert nodes("nvidia.com/gpu.present==true") == ["a100-1", GPU_NODE]
    assert nodes("nvidia.com/gpu.product!=NVIDIA-L4") == ["a100-1", CPU_NODE]
    assert nodes("nvidia.com/gpu.product in (NVIDIA-L4, NVIDIA-H100-80GB-HBM3)") == [GPU_NODE]
    assert nodes("nvidia.com/gpu.product notin (NVIDIA-L4)") == ["a100-1", CPU_NODE]
    assert nodes("!nvidia.com/gpu.present") == [CPU_NODE]
    assert nodes("nvidia.com/gpu.product") == ["a100-1", GPU_NODE]
    assert nodes("nvidia.com/gpu.present=true,nvidia.com/gpu.product in (NVIDIA-A100-SXM4-80GB,x)") == ["a100-1"]
    assert nodes("rank>2") == ["a100-1"]
    assert nodes("rank<2") == []
    with pytest.raises(ApiException) as malformed:
        nodes("nvidia.com/gpu.product in ()")
    assert malformed.value.status == 400
    assert body(malformed.value)["reason"] == "BadRequest"

    kube.batch.create_namespaced_job(
        NS, job("labelled", ["true"], labels={"levers9/pool": "a", "levers9/machine-id": "m1"})
    )
    kube.batch.create_namespaced_job(NS, job("other", ["true"], labels={"levers9/pool": "b"}))
    listed = kube.batch.list_namespaced_job(NS, label_selector="levers9/pool=a")
    assert [j.metadata.name for j in listed.items] == ["labelled"]
    assert [j.metadata.name for j in kube.batch.list_namespaced_job(NS, label_selector="levers9/machine-id").items] == [
        "labelled"
    ]
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="s-a", labels={"levers9/pool": "a"}), string_data={"k": "v"}
    )
    kube.core.create_namespaced_secret(NS, secret)
    assert [
        s.metadata.name for s in kube.core.list_namespaced_secret(NS, label_selector="levers9/pool in (a)").items
    ] == ["s-a"]
    assert kube.core.read_namespaced_secret("s-a", NS).data == {"k": "dg=="}


def test_field_selectors_and_all_namespace_lists(cluster: FakeCluster, kube: Kube) -> None:
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-b")))
    kube.batch.create_namespaced_job(NS, job("runs", hold_until_released()))
    kube.batch.create_namespaced_job("team-b", job("done", ["true"]))
    running = wait_for(lambda: one_pod(kube, "runs", "Running"), "a running pod")

    def done() -> client.V1Pod | None:
        pods = kube.core.list_namespaced_pod("team-b", field_selector="status.phase=Succeeded").items
        return pods[0] if pods else None

    finished = wait_for(done, "a succeeded pod in team-b")

    def names(**kwargs: str) -> list[str]:
        return sorted(p.metadata.name for p in kube.core.list_pod_for_all_namespaces(**kwargs).items)

    assert names() == sorted([running.metadata.name, finished.metadata.name])
    assert names(field_selector="status.phase=Running") == [running.metadata.name]
    assert names(field_selector="status.phase!=Running") == [finished.metadata.name]
    assert names(field_selector=f"spec.nodeName={CPU_NODE}") == sorted([running.metadata.name, finished.metadata.name])
    assert names(field_selector=f"spec.nodeName={GPU_NODE}") == []
    assert names(field_selector=f"metadata.name={running.metadata.name}") == [running.metadata.name]
    assert names(field_selector=f"metadata.namespace=team-b,spec.nodeName={CPU_NODE}") == [finished.metadata.name]
    assert names(label_selector="job-name=done", field_selector="status.phase=Succeeded") == [finished.metadata.name]
    assert [p.metadata.name for p in kube.core.list_namespaced_pod("team-b").items] == [finished.metadata.name]
    assert kube.core.list_namespaced_pod("no-such-namespace").items == []
    with pytest.raises(ApiException) as unsupported:
        kube.core.list_namespaced_pod(NS, field_selector="spec.priority=1")
    assert unsupported.value.status == 400
    assert body(unsupported.value)["message"] == "field label not supported: spec.priority"

    page = kube.core.list_pod_for_all_namespaces(limit=1)
    assert len(page.items) == 1
    assert page.metadata.remaining_item_count == 1
    rest = kube.core.list_pod_for_all_namespaces(limit=1, _continue=page.metadata._continue)
    assert {page.items[0].metadata.name, rest.items[0].metadata.name} == {running.metadata.name, finished.metadata.name}
    assert rest.metadata._continue is None

    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="manual.1"),
        involved_object=client.V1ObjectReference(kind="Pod", name=running.metadata.name, namespace=NS),
        reason="Custom",
        message="written by a test",
        type="Normal",
    )
    kube.core.create_namespaced_event(NS, event)
    by_reason = kube.core.list_event_for_all_namespaces(field_selector="reason=Custom").items
    assert [(e.metadata.name, e.involved_object.name) for e in by_reason] == [("manual.1", running.metadata.name)]


# --------------------------------------------------------------------------- access reviews, faults


def test_self_subject_access_reviews_and_denied_requests(cluster: FakeCluster, kube: Kube) -> None:
    def review(verb: str, resource: str, namespace: str, group: str) -> client.V1SubjectAccessReviewStatus:
        attributes = client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace, group=group)
        spec = client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
        answer = kube.auth.create_self_subject_access_review(client.V1SelfSubjectAccessReview(spec=spec))
        assert answer.spec.resource_attributes.verb == verb
        return answer.status

    assert review("create", "jobs", NS, "batch").allowed is True
    cluster.deny("create", "jobs", namespace=NS)
    assert review("create", "jobs", NS, "batch").allowed is False
    assert review("create", "jobs", "default", "batch").allowed is True
    assert review("list", "jobs", NS, "batch").allowed is True
    with pytest.raises(ApiException) as refused:
        kube.batch.create_namespaced_job(NS, job("denied", ["true"]))
    assert refused.value.status == 403
    message = body(refused.value)["message"]
    assert message == (
        'jobs.batch "denied" is forbidden: User "levers9-test" cannot create resource "jobs" in API group "batch" '
        f'in the namespace "{NS}"'
    )
    assert "exceeded quota" not in message
    kube.batch.create_namespaced_job("default", job("allowed-elsewhere", ["true"]))
    cluster.allow("create", "jobs", namespace=NS)
    assert review("create", "jobs", NS, "batch").allowed is True


def test_injected_faults_answer_that_status_that_many_times(cluster: FakeCluster, kube: Kube) -> None:
    cluster.fail("POST", r"/jobs$", 500, "InternalError", "etcdserver: request timed out", times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as failed:
            kube.batch.create_namespaced_job(NS, job("flaky", ["true"]))
        assert failed.value.status == 500
        assert (body(failed.value)["reason"], body(failed.value)["message"]) == (
            "InternalError",
            "etcdserver: request timed out",
        )
    kube.batch.create_namespaced_job(NS, job("flaky", ["true"]))
    path = f"/apis/batch/v1/namespaces/{NS}/jobs"
    assert [c.status for c in cluster.calls if c.method == "POST" and c.path == path] == [500, 500, 201]
    cluster.fail("GET", r"/nodes", 429, "TooManyRequests", "slow down", times=None)
    for _ in range(3):
        with pytest.raises(ApiException) as throttled:
            kube.core.list_node()
        assert throttled.value.status == 429
    cluster.clear_faults()
    assert len(kube.core.list_node().items) == 2


# --------------------------------------------------------------------------- nothing left behind


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _children() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)):
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == os.getpid():
                found.add(int(entry))
    return found


def _with_marker(marker: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes() and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_nothing_is_left_after_stop(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    children_before = _children()
    fake = FakeCluster(NS).start()
    try:
        fake.load_nodes(DATA / "node_gpu_l4.json", gpus_csv={GPU_NODE: "l4_1x.csv"})
        fake.load_nodes(DATA / "node_cpu.json")
        kube = Kube(fake.kubeconfig(tmp_path / "kubeconfig"))
        try:
            kube.batch.create_namespaced_job(NS, job("forever", ["sh", "-c", "trap '' TERM; sleep 1000 & wait"]))
            kube.batch.create_namespaced_job(NS, job("gpu-forever", ["sleep", "1000"], gpus=1))
            kube.batch.create_namespaced_job(NS, job("never-fits", ["true"], gpus=4))
            wait_for(
                lambda: one_pod(kube, "forever", "Running") and one_pod(kube, "gpu-forever", "Running"),
                "two pods running",
            )
        finally:
            kube.close()
        port = fake.port
        root = fake.root
        assert root is not None
        marker = f"LEVERS9_BOOT_ROOT={root}/".encode()
        assert len({p for p in _with_marker(marker)}) >= 2
    finally:
        fake.stop()
    assert _with_marker(marker) == []
    assert _children() <= children_before
    assert not root.exists()
    leftover_threads = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert not [n for n in leftover_threads if n.startswith(("fake-k8s", "levers9-boot"))]
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    fake.stop()  # idempotent
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_paused_scheduling_binds_pods_in_creation_order_once_resumed(cluster: FakeCluster, kube: Kube) -> None:
    """The race a provider cannot see: two pods want the one GPU; the first created gets it when scheduling resumes."""
    cluster.pause_scheduling()
    kube.batch.create_namespaced_job(NS, job("first", ["sleep", "30"], gpus=1))
    kube.batch.create_namespaced_job(NS, job("second", ["sleep", "30"], gpus=1))
    time.sleep(0.5)  # several controller passes: nothing is bound while paused
    assert all(not p["spec"].get("nodeName") for p in cluster.pods(NS))
    cluster.resume_scheduling()

    def bound() -> dict[str, str] | None:
        pods = {p["metadata"]["labels"]["job-name"]: p["spec"].get("nodeName") or "" for p in cluster.pods(NS)}
        return pods if pods.get("first") else None

    placed = wait_for(bound, "the first pod to be bound")
    assert placed == {"first": GPU_NODE, "second": ""}
    message = wait_for(
        lambda: next((e["message"] for e in cluster.events(NS) if e["reason"] == "FailedScheduling"), None),
        "the second pod's FailedScheduling event",
    )
    assert "Insufficient nvidia.com/gpu" in message
    for name in ("first", "second"):
        kube.batch.delete_namespaced_job(name, NS, propagation_policy="Background")
    wait_for(lambda: cluster.leftovers() == [], "nothing left")


def _capability_job(name: str, context: client.V1SecurityContext, mount: str) -> client.V1Job:
    """A Job printing its bounding set and what its emptyDir holds at ``mount`` (written from the pod's root)."""
    made = job(name, ["sh", "-c", f'grep CapBnd /proc/self/status; touch "$LEVERS9_BOOT_ROOT{mount}/seen"; ls {mount}'])
    spec = made.spec.template.spec
    spec.containers[0].security_context = context
    spec.containers[0].volume_mounts = [client.V1VolumeMount(name="state", mount_path=mount)]
    spec.volumes = [client.V1Volume(name="state", empty_dir=client.V1EmptyDirVolumeSource())]
    return made


def test_the_kubelet_gives_the_default_bounding_set_unless_privileged_and_binds_empty_dirs(kube: Kube) -> None:
    mount = "/var/lib/levers9-fake-test"
    defaults = client.V1SecurityContext(capabilities=client.V1Capabilities(add=["SYS_PTRACE"], drop=["NET_RAW"]))
    kube.batch.create_namespaced_job(NS, _capability_job("confined", defaults, mount))
    kube.batch.create_namespaced_job(
        NS, _capability_job("privileged", client.V1SecurityContext(privileged=True), mount)
    )
    masks = {}
    for name in ("confined", "privileged"):
        pod = wait_for(lambda n=name: one_pod(kube, n, "Succeeded"), f"the {name} pod done")  # type: ignore[misc]
        log = kube.core.read_namespaced_pod_log(pod.metadata.name, NS)
        masks[name] = int(log.split()[1], 16)
        assert log.split()[2:] == ["seen"], log  # the emptyDir, at its mount path
    # containerd's default set + SYS_PTRACE - NET_RAW: chown 0, dac_override 1, fowner 3, fsetid 4, kill 5,
    # setgid 6, setuid 7, setpcap 8, net_bind_service 10, sys_chroot 18, sys_ptrace 19, mknod 27,
    # audit_write 29, setfcap 31
    bits = (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 19, 27, 29, 31)
    assert masks["confined"] == sum(1 << b for b in bits), hex(masks["confined"])
    own = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapBnd"))
    assert masks["privileged"] == int(own.split()[1], 16), hex(masks["privileged"])  # all the kubelet has
    wait_for(lambda: not Path(mount).exists(), "the mount point made for the pods removed")
