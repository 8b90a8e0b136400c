"""The agent's Kubernetes backend (:mod:`levers9.agent.k8s_workers` and its ``k8s_*`` parts) against a fake cluster.

The real ``kubernetes`` client talks to :class:`tests.fakes.k8s_cluster.FakeCluster`
(the API server, a scheduler, a kubelet that runs each pod as a local
process) loaded with the recorded nodes of ``tests/data/k8s``: an EKS
g6.xlarge with one L4, labelled by GPU Feature Discovery and tainted
``nvidia.com/gpu=present:NoSchedule``, and an m6i.xlarge without GPUs. The
orders carry the very Job and Secret the controlplane will build, made here
with ``levers9.kube.jobs`` from a provision request; the worker's command
is replaced by ``sleep`` so a pod stays Running for as long as a test needs it
(the agent does not care what the container runs). Faults are injected at the
wire (``fail``, ``deny``), never by patching the client.

What is checked: a valid order creates the Job and its owned Secret and is
idempotent, also when the first answer was lost; every forbidden shape is
refused before any API call, naming what is wrong; a full cluster and a full
quota are refused before a Job exists; a Secret that cannot be created takes
its Job with it; the API's answers become the kinds the controlplane maps;
terminate removes the Job, its pod and its Secret, and again is a no-op; the
listing shows a pod the scheduler cannot place with the scheduler's message
(from the pod's condition, or else from its ``FailedScheduling`` event);
the inventory details and message are right for the two nodes with one pod
bound; ``remove_mine`` leaves nothing of levers9 and nothing else is touched.
Every test ends with no Job, pod or Secret left in the cluster.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from levers9.agent.docker_workers import OrderRefused
from levers9.agent.k8s_objects import MACHINE_LABEL, OWNER_LABEL, check_provision
from levers9.agent.k8s_workers import K8sWorkers, build_k8s_inventory
from levers9.gpu import from_k8s_labels
from levers9.hooks.types import Availability, GpuOffer, MachineState, Pool
from levers9.kube import format_quantity, parse_quantity
from levers9.kube.jobs import job_manifest, job_name, secret_manifest, secret_name
from levers9_local_k8s.settings import LocalK8sSettings
from tests.fakes.k8s_cluster import CPU_NODE, GPU_NODE, RECORDED, FakeCluster, recorded_cluster
from tests.fixtures.wait import wait_for
from tests.plugins.provision import provision_request

NAMESPACE = "levers9"
IMAGE = "registry.example.com/levers9/worker:test"
L4_LABEL = "nvidia.com/gpu.product=NVIDIA-L4"
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AGENT = "agent-k8s-test"
Order = dict[str, Any]


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """The two recorded nodes; afterwards no Job, pod or Secret may be left (background deletion waited for)."""
    with recorded_cluster(NAMESPACE) as fake:
        yield fake


@pytest.fixture
def kubeconfig(cluster: FakeCluster, tmp_path: Path) -> Path:
    return cluster.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def make_workers(kubeconfig: Path) -> Iterator[Callable[..., K8sWorkers]]:
    """``make_workers(**options)``: a K8sWorkers on the fake's kubeconfig (insecure: the orders' URL is plain)."""
    made: list[K8sWorkers] = []

    def make(path: Path = kubeconfig, **options: Any) -> K8sWorkers:
        options.setdefault("insecure", True)
        workers = K8sWorkers(
            NAMESPACE,
            agent_id=AGENT,
            api_client_factory=lambda: kubernetes.config.new_client_from_config(config_file=str(path)),
            **options,
        )
        made.append(workers)
        return workers

    yield make
    for workers in made:
        workers.close()


@pytest.fixture
def workers(make_workers: Callable[..., K8sWorkers]) -> K8sWorkers:
    return make_workers()


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[Any]:
    """The real client's CoreV1Api on the same cluster, as the cluster's owner would use it."""
    api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    yield kubernetes.client.CoreV1Api(api_client)
    api_client.close()


# ---------------------------------------------------------------------------------------------- orders


def _settings(gpu: bool) -> LocalK8sSettings:
    return LocalK8sSettings.model_validate(
        {"namespace": NAMESPACE, "worker_image": IMAGE, "tolerations": [TOLERATE_GPU] if gpu else []}
    )


def make_order(*, gpu: bool = True, machine_id: str | None = None, **bootstrap: Any) -> Order:
    """A provision order as the controlplane's attached_cluster side will send it: local_k8s's Job and Secret."""
    settings = _settings(gpu)
    pool = Pool(
        name="l4" if gpu else "cpu",
        provider="attached_cluster",
        runtime="process",
        gpu="L4" if gpu else None,
        gpu_count=1 if gpu else 0,
        settings=settings,
    )
    offer = (
        GpuOffer(
            gpu="L4", gpu_count=1, gpu_memory_mib=23034, instance_type=L4_LABEL, availability=Availability.AVAILABLE
        )
        if gpu
        else None
    )
    request = provision_request(pool, offer, machine_id, **bootstrap)
    job = job_manifest(request, settings)
    job["spec"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "300"]
    return {"machine_id": request.machine_id, "job": job, "secret": secret_manifest(request, settings)}


def pod_of(order: Order) -> dict[str, Any]:
    pod: dict[str, Any] = order["job"]["spec"]["template"]["spec"]
    return pod


def refused(call: Callable[[], Any]) -> OrderRefused:
    with pytest.raises(OrderRefused) as info:
        call()
    return info.value


def bound_pods(cluster: FakeCluster, node: str | None = None) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.pods(NAMESPACE)
        if p["spec"].get("nodeName") and (node is None or p["spec"]["nodeName"] == node)
    ]


def running(workers: K8sWorkers, machine_id: str) -> bool:
    return any(w.machine_id == machine_id and w.phase == "Running" for w in workers.workers())


# ---------------------------------------------------------------------------------------------- provision


def test_a_valid_order_creates_the_job_and_its_owned_secret_and_is_idempotent(
    workers: K8sWorkers, cluster: FakeCluster
) -> None:
    order = make_order()
    machine_id = order["machine_id"]
    answer = workers.provision(order)
    [job] = cluster.objects("jobs", NAMESPACE)
    assert answer == {
        "machine_id": machine_id,
        "job": job_name(machine_id),
        "namespace": NAMESPACE,
        "uid": job["metadata"]["uid"],
    }
    assert job["metadata"]["labels"][MACHINE_LABEL] == machine_id
    [secret] = cluster.objects("secrets", NAMESPACE)
    assert secret["metadata"]["name"] == secret_name(machine_id)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name(machine_id),
            "uid": job["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    # the token is in the Secret, and in nothing the agent answers
    [token_key] = order["secret"]["stringData"]
    token = order["secret"]["stringData"][token_key]
    assert token not in json.dumps(answer)
    assert token not in json.dumps(workers.list_containers())

    assert workers.provision(order) == answer  # a retried order: the Job that exists
    # and one whose first answer was lost: the Job looks absent, its create answers 409, the Secret 409 too;
    # by then its pod holds the only GPU, which must not count against the order itself
    wait_for(lambda: any(p["spec"].get("nodeName") for p in cluster.pods(NAMESPACE)), "the worker pod bound")
    cluster.fail("GET", rf"/jobs/{job_name(machine_id)}$", 404, "NotFound", "lost on the way", times=1)
    assert workers.provision(order) == answer
    assert len(cluster.created("jobs")) == 1
    assert len(cluster.created("secrets")) == 1
    assert [(m, p.split("?")[0].rsplit("/", 1)[-1], s) for m, p, s in cluster.calls if m == "POST"][-2:] == [
        ("POST", "jobs", 409),
        ("POST", "secrets", 409),
    ]
    wait_for(lambda: running(workers, machine_id), "the worker pod running")
    workers.terminate({"machine_id": machine_id})


def test_a_job_of_that_name_for_another_machine_is_refused(workers: K8sWorkers, cluster: FakeCluster) -> None:
    first = make_order(machine_id="m_1")
    workers.provision(first)
    second = make_order(machine_id="M-1")  # another machine whose Job name sanitises to the same levers9-m-1
    error = refused(lambda: workers.provision(second))
    assert error.kind == "invalid_request"
    assert "a Job of that name exists for machine 'm_1'" in str(error)
    assert len(cluster.created("secrets")) == 1
    workers.terminate({"machine_id": "m_1"})


def _set(path: str, value: Any) -> Callable[[Order], None]:
    def change(order: Order) -> None:
        where: Any = order
        *parents, last = path.split(".")
        for key in parents:
            where = where[int(key)] if isinstance(where, list) else where.setdefault(key, {})
        where[last] = value

    return change


def _drop(path: str) -> Callable[[Order], None]:
    def change(order: Order) -> None:
        where: Any = order
        *parents, last = path.split(".")
        for key in parents:
            where = where[int(key)] if isinstance(where, list) else where[key]
        del where[last]

    return change


def _env(entry: dict[str, Any]) -> Callable[[Order], None]:
    return lambda order: pod_of(order)["containers"][0]["env"].append(entry)


POD = "job.spec.template.spec"
FORBIDDEN: list[tuple[str, Callable[[Order], None], str]] = [
    ("a Deployment", _set("job.apiVersion", "apps/v1"), "'job' must be apiVersion batch/v1 kind Job"),
    ("a ConfigMap", _set("secret.kind", "ConfigMap"), "'secret' must be apiVersion v1 kind Secret"),
    ("no Job name", _drop("job.metadata.name"), "'job' needs metadata.name"),
    ("another namespace", _set("job.metadata.namespace", "kube-system"), "is for namespace 'kube-system'"),
    ("the Secret elsewhere", _set("secret.metadata.namespace", "default"), "'secret' is for namespace 'default'"),
    ("an unlabelled Job", _drop(f"job.metadata.labels.{MACHINE_LABEL}"), "'job' must be labelled levers9/machine-id="),
    ("another machine's Secret", _set(f"secret.metadata.labels.{MACHINE_LABEL}", "m-other"), "got 'm-other'"),
    (
        "another machine's pod",
        _set(f"job.spec.template.metadata.labels.{MACHINE_LABEL}", "m-other"),
        "pod template is labelled levers9/machine-id=m-other",
    ),
    ("no pod", _drop("job.spec.template"), "'job' has no spec.template.spec"),
    ("a spec that is no object", _set("job.spec", "run it"), "'job' has no spec.template.spec"),
    (
        "a malformed quantity",
        _set(f"{POD}.containers.0.resources.requests.cpu", "lots"),
        "container 'worker': resources.requests.cpu: 'lots' is not a Kubernetes quantity",
    ),
    ("hostNetwork", _set(f"{POD}.hostNetwork", True), "may not set hostNetwork (it would share the node's network)"),
    ("hostPID", _set(f"{POD}.hostPID", True), "may not set hostPID"),
    ("hostIPC", _set(f"{POD}.hostIPC", True), "may not set hostIPC"),
    (
        "a hostPath volume",
        _set(f"{POD}.volumes", [{"name": "root", "hostPath": {"path": "/"}}]),
        "may not mount hostPath volume 'root'",
    ),
    (
        "another Secret's volume",
        _set(f"{POD}.volumes", [{"name": "cred", "secret": {"secretName": "agent"}}]),
        "volume 'cred' is Secret 'agent'",
    ),
    (
        "a ConfigMap volume",
        _set(f"{POD}.volumes", [{"name": "c", "configMap": {"name": "x"}}]),
        "volume 'c' is configMap",
    ),
    ("a mounted token", _drop(f"{POD}.automountServiceAccountToken"), "must set automountServiceAccountToken: false"),
    (
        "privileged",
        _set(f"{POD}.containers.0.securityContext", {"privileged": True}),
        "container 'worker' may not be privileged",
    ),
    (
        "added capabilities",
        _set(f"{POD}.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
        "may not add capabilities ['SYS_ADMIN']",
    ),
    (
        "a host port",
        _set(f"{POD}.containers.0.ports", [{"containerPort": 80, "hostPort": 80}]),
        "may not use hostPort 80",
    ),
    (
        "another Secret in env",
        _env({"name": "X", "valueFrom": {"secretKeyRef": {"name": "agent-token", "key": "t"}}}),
        "env 'X' may read Secret",
    ),
    (
        "another Secret in envFrom",
        _set(f"{POD}.containers.0.envFrom", [{"secretRef": {"name": "agent-token"}}]),
        "envFrom may read Secret",
    ),
    (
        "a ConfigMap in env",
        _env({"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
        "env 'Y' may not read a ConfigMap",
    ),
    (
        "a privileged init container",
        _set(f"{POD}.initContainers", [{"name": "init", "image": IMAGE, "securityContext": {"privileged": True}}]),
        "container 'init' may not be privileged",
    ),
    ("a bad machine id", _set("machine_id", "not a label!"), "'machine_id' must be a label value"),
]


@pytest.mark.parametrize(("change", "said"), [(c, s) for _, c, s in FORBIDDEN], ids=[n for n, _, _ in FORBIDDEN])
def test_each_forbidden_shape_is_refused_before_any_api_call(
    workers: K8sWorkers, cluster: FakeCluster, change: Callable[[Order], None], said: str
) -> None:
    order = make_order()
    change(order)
    error = refused(lambda: workers.provision(order))
    assert error.kind == "invalid_request"
    assert said in str(error)
    assert cluster.calls == []  # nothing created, nothing even asked


def test_every_problem_is_named_in_one_refusal_and_privileged_needs_allow_privileged() -> None:
    order = make_order()
    pod = pod_of(order)
    pod["hostNetwork"] = True
    pod["containers"][0]["securityContext"] = {"privileged": True}
    said = str(refused(lambda: check_provision(order, NAMESPACE, owner=AGENT, insecure=True)))
    assert "hostNetwork" in said
    assert "may not be privileged" in said

    del pod["hostNetwork"]
    checked = check_provision(order, NAMESPACE, owner=AGENT, insecure=True, allow_privileged=True)
    assert checked.job["spec"]["template"]["spec"]["containers"][0]["securityContext"] == {"privileged": True}


def test_the_namespace_is_set_when_left_out_and_the_order_is_not_changed() -> None:
    order = make_order()
    del order["job"]["metadata"]["namespace"]
    order["secret"]["metadata"]["namespace"] = None
    before = copy.deepcopy(order)
    checked = check_provision(order, NAMESPACE, owner=AGENT, insecure=True)
    assert (checked.job["metadata"]["namespace"], checked.secret["metadata"]["namespace"]) == (NAMESPACE, NAMESPACE)
    assert order == before


def test_a_plain_text_controlplane_is_refused_unless_the_agent_is_insecure() -> None:
    plain = make_order(controlplane_url="grpc://10.0.0.5:1993")
    said = str(refused(lambda: check_provision(plain, NAMESPACE, owner=AGENT)))
    assert "would reach the controlplane in plain text (grpc://10.0.0.5:1993)" in said
    assert check_provision(plain, NAMESPACE, owner=AGENT, insecure=True).machine_id == plain["machine_id"]
    assert check_provision(make_order(controlplane_url="grpcs://cp.example.com"), NAMESPACE, owner=AGENT).job


def test_a_full_cluster_is_refused_before_a_job_exists(workers: K8sWorkers, cluster: FakeCluster) -> None:
    first = make_order()
    workers.provision(first)
    wait_for(lambda: bound_pods(cluster, GPU_NODE), "the first worker pod bound to the L4 node")
    error = refused(lambda: workers.provision(make_order()))
    assert error.kind == "insufficient_capacity"
    said = str(error)
    assert f"{GPU_NODE}: 0 of 1 nvidia.com/gpu free, 1 needed" in said
    assert f"{CPU_NODE}: does not match the pod's required node affinity" in said
    assert "cpu=1, memory=1073741824, nvidia.com/gpu=1" in said
    assert len(cluster.created("jobs")) == 1
    assert len(cluster.created("secrets")) == 1
    # without the toleration the GPU node's taint is what is named
    untolerated = make_order()
    pod_of(untolerated).pop("tolerations")
    said = str(refused(lambda: workers.provision(untolerated)))
    assert f"{GPU_NODE}: has the taint nvidia.com/gpu=present:NoSchedule, which the pod does not tolerate" in said
    workers.terminate({"machine_id": first["machine_id"]})


def test_a_full_quota_is_refused_before_a_job_exists(workers: K8sWorkers, cluster: FakeCluster, kube: Any) -> None:
    quota = {"metadata": {"name": "gpu-budget"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    kube.create_namespaced_resource_quota(NAMESPACE, quota)
    error = refused(lambda: workers.provision(make_order()))
    assert error.kind == "quota_exceeded"
    assert "ResourceQuota gpu-budget allows requests.nvidia.com/gpu=0 in namespace levers9" in str(error)
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []


@pytest.mark.parametrize(
    ("fault", "kind", "said"),
    [
        ((500, "InternalError", "etcdserver: leader changed"), "throttled", "etcdserver: leader changed"),
        (None, "permission_denied", 'cannot create resource "secrets"'),
    ],
    ids=["a 500", "RBAC"],
)
def test_a_secret_that_cannot_be_created_takes_its_job_with_it(
    workers: K8sWorkers, cluster: FakeCluster, fault: tuple[int, str, str] | None, kind: str, said: str
) -> None:
    if fault is None:
        cluster.deny("create", "secrets", NAMESPACE)
    else:
        cluster.fail("POST", r"/secrets$", *fault)
    order = make_order()
    error = refused(lambda: workers.provision(order))
    assert error.kind == kind
    assert f"creating its Secret {secret_name(order['machine_id'])} (the Job was deleted again)" in str(error)
    assert said in str(error)
    assert len(cluster.created("jobs")) == 1
    assert cluster.created("secrets") == []
    wait_for(lambda: not cluster.leftovers(), "the Job and its pod gone", why=lambda: "\n".join(cluster.leftovers()))


@pytest.mark.parametrize(
    ("status", "reason", "message", "kind"),
    [
        (
            403,
            "Forbidden",
            'jobs.batch "x" is forbidden: exceeded quota: q, requested: count/jobs.batch=1',
            "quota_exceeded",
        ),
        (403, "Forbidden", 'User "u" cannot create resource "jobs" in API group "batch"', "permission_denied"),
        (
            422,
            "Invalid",
            'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value',
            "invalid_request",
        ),
        (400, "BadRequest", "the body of the request was in an unknown format", "invalid_request"),
        (404, "NotFound", 'namespaces "levers9" not found', "invalid_request"),
        (429, "TooManyRequests", "the server has received too many requests", "throttled"),
        (503, "ServiceUnavailable", "the server is currently unable to handle the request", "throttled"),
    ],
    ids=["quota", "rbac", "invalid", "bad-request", "no-namespace", "too-many", "unavailable"],
)
def test_api_errors_on_create_become_the_kinds_the_controlplane_maps(
    workers: K8sWorkers, cluster: FakeCluster, status: int, reason: str, message: str, kind: str
) -> None:
    cluster.fail("POST", r"/jobs$", status, reason, message)
    order = make_order()
    error = refused(lambda: workers.provision(order))
    assert error.kind == kind
    assert f"machine {order['machine_id']}: Job {job_name(order['machine_id'])} in namespace levers9" in str(error)
    assert message in str(error)
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []


def test_a_rejected_token_and_an_unreachable_api_are_refused_with_their_kinds(
    make_workers: Callable[..., K8sWorkers], cluster: FakeCluster, tmp_path: Path
) -> None:
    wrong = make_workers(cluster.kubeconfig(tmp_path / "wrong", token="not-the-token"))
    error = refused(lambda: wrong.provision(make_order()))
    assert error.kind == "authentication_failed"
    assert "the agent's service-account token was rejected" in str(error)

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = (tmp_path / "wrong").read_text().replace(cluster.url, f"http://127.0.0.1:{port}")
    (tmp_path / "closed").write_text(config)
    error = refused(make_workers(tmp_path / "closed").workers)
    assert error.kind == "throttled"
    assert "the Kubernetes API did not answer" in str(error)
    assert cluster.created("jobs") == []


def test_outside_a_pod_the_default_client_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    workers = K8sWorkers(NAMESPACE, agent_id=AGENT)
    try:
        error = refused(workers.workers)
    finally:
        workers.close()
    assert error.kind == ""
    assert "cannot make a Kubernetes API client" in str(error)
    assert "runs in a pod with a service account" in str(error)


# ---------------------------------------------------------------------------------------------- terminate, list


def test_terminate_removes_the_job_its_pod_and_its_secret_and_again_is_a_no_op(
    workers: K8sWorkers, cluster: FakeCluster
) -> None:
    order = make_order()
    machine_id = order["machine_id"]
    workers.provision(order)
    wait_for(lambda: running(workers, machine_id), "the worker pod running")
    answer = workers.terminate({"machine_id": machine_id})
    assert answer == {
        "machine_id": machine_id,
        "deleted": [f"Job {NAMESPACE}/{job_name(machine_id)}", f"Secret {NAMESPACE}/{secret_name(machine_id)}"],
    }
    wait_for(
        lambda: not cluster.leftovers(), "the Job, pod and Secret gone", why=lambda: "\n".join(cluster.leftovers())
    )
    assert workers.terminate({"machine_id": machine_id}) == {"machine_id": machine_id, "deleted": []}
    assert workers.workers() == []
    assert refused(lambda: workers.terminate({"machine_id": ""})).kind == "invalid_request"


def test_the_listing_shows_a_pod_the_scheduler_cannot_place_with_its_message(
    workers: K8sWorkers, cluster: FakeCluster
) -> None:
    # staged race: both orders see the L4 free (neither pod is bound yet); the scheduler then places one
    cluster.pause_scheduling()
    first, second = make_order(), make_order()
    workers.provision(first)
    workers.provision(second)
    cluster.resume_scheduling()

    def stuck() -> list[Any]:
        return [w for w in workers.workers() if w.unschedulable]

    [waiting] = wait_for(stuck, "one worker pod the scheduler cannot place")
    assert waiting.phase == "Pending"
    assert waiting.node is None
    assert waiting.unschedulable == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling."
    )
    placed = next(w for w in workers.workers() if w.machine_id != waiting.machine_id)
    assert placed.node == GPU_NODE
    assert placed.unschedulable is None
    listed = workers.list_containers()["workers"]
    assert sorted(w["machine_id"] for w in listed) == sorted([first["machine_id"], second["machine_id"]])
    assert {w["pool"] for w in listed} == {"l4"}
    for order in (first, second):
        workers.terminate({"machine_id": order["machine_id"]})


def test_without_the_pod_condition_the_listing_takes_the_failedscheduling_event(
    workers: K8sWorkers, cluster: FakeCluster, kube: Any
) -> None:
    # a scheduler that only wrote its event (the condition not yet there): the recorded event, about this pod
    cluster.pause_scheduling()
    order = make_order()
    workers.provision(order)
    [pod] = wait_for(lambda: cluster.pods(NAMESPACE), "the Job's pod created")
    assert [w.unschedulable for w in workers.workers()] == [None]  # no condition, no event: nothing to say
    event = json.loads((RECORDED / "event_failed_scheduling.json").read_text())
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        del event["metadata"][key]
    event["metadata"]["name"] = f"{pod['metadata']['name']}.182bd1f3a5c6e8f0"
    event["involvedObject"].update(name=pod["metadata"]["name"], uid=pod["metadata"]["uid"])
    kube.create_namespaced_event(NAMESPACE, event)
    [worker] = workers.workers()
    assert (worker.phase, worker.unschedulable) == ("Pending", event["message"])
    cluster.resume_scheduling()
    wait_for(lambda: running(workers, order["machine_id"]), "the worker pod running once scheduled")
    assert [w.unschedulable for w in workers.workers()] == [None]
    workers.terminate({"machine_id": order["machine_id"]})


# ---------------------------------------------------------------------------------------------- inventory


def test_inventory_details_of_the_recorded_nodes_with_one_pod_bound(workers: K8sWorkers, cluster: FakeCluster) -> None:
    order = make_order()
    machine_id = order["machine_id"]
    workers.provision(order)
    wait_for(lambda: running(workers, machine_id), "the worker pod running")
    details = workers.inventory_details()

    stored = {n["metadata"]["name"]: n for n in cluster.objects("nodes")}
    assert [n["metadata"]["name"] for n in details["nodes"]] == [CPU_NODE, GPU_NODE]
    for node in details["nodes"]:
        original = stored[node["metadata"]["name"]]
        labels = {k: v for k, v in original["metadata"]["labels"].items() if k != "nvidia.com/gfd.timestamp"}
        assert node["metadata"] == {"name": original["metadata"]["name"], "labels": labels}
        assert node["status"] == {
            "allocatable": original["status"]["allocatable"],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    gpu_node = details["nodes"][1]
    assert gpu_node["spec"] == {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    assert gpu_node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert "nvidia.com/gfd.timestamp" in stored[GPU_NODE]["metadata"]["labels"]  # left out: it changes every run
    assert details["nodes"][0]["spec"] == {}
    assert details["requested"] == {
        GPU_NODE: {"cpu": "1", "memory": "1073741824", "nvidia.com/gpu": "1", "pods": "1"},
    }
    [worker] = details["workers"]
    assert (worker["machine_id"], worker["phase"], worker["node"]) == (machine_id, "Running", GPU_NODE)
    assert details["namespace"] == NAMESPACE
    assert workers.inventory_details() == details  # nothing changed: the same details (no heartbeat times)
    assert len(json.dumps(details, separators=(",", ":"))) < 8 * 1024  # 3.3 KiB for this cluster

    inventory = build_k8s_inventory(AGENT, details, gpu_type=from_k8s_labels)
    # 3920m and 14880156Ki allocatable on each node; the worker requests 1 CPU, 1 GiB and the L4
    assert (inventory.cpu_millicores, inventory.free_cpu_millicores) == (7840, 6840)
    assert (inventory.memory_mib, inventory.free_memory_mib) == (29062, 28038)
    assert [(g.gpu, g.count, g.free) for g in inventory.gpus] == [("L4", 1, 0)]
    assert list(inventory.machines) == [machine_id]
    assert json.loads(inventory.details_json) == details
    untyped = build_k8s_inventory(AGENT, details)  # the agent's layer alone: GPUs typed by the controlplane
    assert list(untyped.gpus) == []
    assert untyped.cpu_millicores == 7840

    workers.terminate({"machine_id": machine_id})
    wait_for(lambda: not cluster.leftovers(), "the worker gone")
    freed = build_k8s_inventory(AGENT, workers.inventory_details(), gpu_type=from_k8s_labels)
    assert [(g.gpu, g.count, g.free) for g in freed.gpus] == [("L4", 1, 1)]
    assert (freed.free_cpu_millicores, list(freed.machines)) == (7840, [])


def test_a_cordoned_node_and_a_gpu_of_no_known_type_count_no_free_room(
    workers: K8sWorkers, cluster: FakeCluster
) -> None:
    cluster.add_node("cordoned", allocatable={"cpu": "2", "memory": "4Gi"}, unschedulable=True)
    cluster.add_node(
        "mystery",
        labels={"nvidia.com/gpu.product": "Some-Future-GPU"},
        allocatable={"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"},
    )
    details = workers.inventory_details()
    inventory = build_k8s_inventory(AGENT, details, gpu_type=from_k8s_labels)
    assert inventory.cpu_millicores == 7840 + 4000
    assert inventory.free_cpu_millicores == 7840 + 2000  # the cordoned node's CPUs are not free
    assert [(g.gpu, g.count, g.free) for g in inventory.gpus] == [("L4", 1, 1)]
    assert json.loads(inventory.details_json)["unsupported_gpus"] == ["mystery"]


def test_quantities_read_back_as_the_api_writes_them() -> None:
    assert parse_quantity("3920m") * 1000 == 3920
    assert parse_quantity("14880156Ki") == 14880156 * 1024
    assert parse_quantity("4G") == 4 * 10**9
    assert parse_quantity("1e3") == 1000
    assert format_quantity(parse_quantity("1500m")) == "1500m"
    assert format_quantity(parse_quantity("0.1")) == "100m"
    assert format_quantity(parse_quantity("2Gi")) == str(2 * 2**30)
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity("lots")


# ---------------------------------------------------------------------------------------------- remove_mine


def test_remove_mine_leaves_nothing_of_levers9_and_touches_nothing_else(
    workers: K8sWorkers, cluster: FakeCluster, kube: Any
) -> None:
    kube.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "someone-elses"}, "stringData": {"k": "v"}})
    orders = [make_order(), make_order(gpu=False)]
    for order in orders:
        workers.provision(order)
    wait_for(lambda: len(bound_pods(cluster)) == 2, "both worker pods bound")
    assert {p["spec"]["nodeName"] for p in bound_pods(cluster)} == {GPU_NODE, CPU_NODE}
    assert workers.remove_mine() == sorted(o["machine_id"] for o in orders)
    wait_for(
        lambda: cluster.leftovers() == [f"Secret {NAMESPACE}/someone-elses"],
        "only the other Secret left",
        why=lambda: "\n".join(cluster.leftovers()),
    )
    assert workers.remove_mine() == []
    kube.delete_namespaced_secret("someone-elses", NAMESPACE)


# ---------------------------------------------------------------------------------------------- only its own


def test_another_owners_jobs_are_not_listed_adopted_nor_deleted(
    make_workers: Callable[..., K8sWorkers], cluster: FakeCluster
) -> None:
    """Two owners in one namespace (a local_k8s pool's Jobs beside an agent's): each sees, adopts and removes its
    own only. Before: every Job labelled levers9/machine-id was the agent's, and remove_mine deleted them all."""
    mine, local = make_workers(owner="lab.0a1b2c3d"), make_workers(owner="cpu")
    order, theirs = make_order(gpu=False), make_order(gpu=False)
    mine.provision(order)
    local.provision(theirs)
    [job] = [j for j in cluster.objects("jobs", NAMESPACE) if j["metadata"]["name"] == job_name(order["machine_id"])]
    labels = [job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]]
    [secret] = [
        s for s in cluster.objects("secrets", NAMESPACE) if s["metadata"]["name"] == secret_name(order["machine_id"])
    ]
    assert {lab[OWNER_LABEL] for lab in [*labels, secret["metadata"]["labels"]]} == {"lab.0a1b2c3d"}
    assert [w.machine_id for w in mine.workers()] == [order["machine_id"]]
    assert mine.others() == [f"Job {job_name(theirs['machine_id'])} of levers9 pool 'cpu'"]
    # an order naming the other owner's Job is refused, not adopted
    error = refused(lambda: mine.provision(theirs))
    assert error.kind == "invalid_request"
    assert "is not this agent's: it belongs to levers9 pool 'cpu'; it is left alone" in str(error)
    assert mine.terminate({"machine_id": theirs["machine_id"]})["deleted"] == []
    assert mine.remove_mine() == [order["machine_id"]]
    wait_for(
        lambda: (
            [w.machine_id for w in local.workers()] == [theirs["machine_id"]]
            and len(cluster.objects("jobs", NAMESPACE)) == 1
        ),
        "only the other owner's Job left",
    )
    assert local.others() == []
    assert local.remove_mine() == [theirs["machine_id"]]


def test_without_the_right_to_list_every_pod_room_counts_the_namespaces_pods(
    workers: K8sWorkers, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The manifest's ClusterRole lists nodes only: the agent then reads its own namespace's pods for room (before:
    every inventory and provision was refused, permission_denied)."""
    cluster.fail(
        "GET",
        r"^/api/v1/pods$",
        403,
        "Forbidden",
        'pods is forbidden: User "system:serviceaccount:'
        'levers9:levers9-agent" cannot list resource "pods" in API group "" at the cluster scope',
        times=None,
    )
    details = workers.inventory_details()
    assert [n["metadata"]["name"] for n in details["nodes"]] == sorted([CPU_NODE, GPU_NODE])
    order = make_order()
    workers.provision(order)
    wait_for(lambda: len(bound_pods(cluster, GPU_NODE)) == 1, "the worker pod bound to the L4 node")
    # the namespace's own pod holds the only L4: a second one has no room
    assert refused(lambda: workers.provision(make_order())).kind == "insufficient_capacity"
    assert workers.inventory_details()["requested"][GPU_NODE]["nvidia.com/gpu"] == "1"
    said = [r.getMessage() for r in caplog.records if "may not list the pods of every namespace" in r.getMessage()]
    assert len(said) == 1, said
    workers.terminate({"machine_id": order["machine_id"]})


# ---------------------------------------------------------------------------------------------- pods that never start


def test_a_worker_that_can_never_start_is_listed_with_why_and_reported_failed(
    make_workers: Callable[..., K8sWorkers], cluster: FakeCluster
) -> None:
    """Pod Security refusing the pod (only the Job's FailedCreate event says it) and an image that cannot be
    pulled: ``cannot_start`` names each, and the controlplane's side reads the worker as FAILED at once."""
    from levers9_attached_cluster.inventory import machine_of

    workers = make_workers(allow_privileged=True)
    cluster.label_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    privileged = make_order(gpu=False)
    pod_of(privileged)["containers"][0]["securityContext"] = {"privileged": True}
    workers.provision(privileged)
    cluster.unpullable("registry.example.com/levers9/worker:gone")
    unpullable = make_order(gpu=False)
    pod_of(unpullable)["containers"][0]["image"] = "registry.example.com/levers9/worker:gone"
    workers.provision(unpullable)

    def reasons() -> dict[str, str | None] | None:
        said = {w.machine_id: w.cannot_start for w in workers.workers()}
        return said if all(said.values()) else None

    said = wait_for(reasons, "both workers said to be unable to start, and why")
    refusal = str(said[privileged["machine_id"]])
    assert refusal.startswith(f'FailedCreate: Error creating: pods "{job_name(privileged["machine_id"])}-')
    assert 'is forbidden: violates PodSecurity "baseline:latest": privileged (container "worker" must not' in refusal
    assert str(said[unpullable["machine_id"]]).startswith("ErrImagePull: failed to pull and unpack image")
    pool = Pool(name="l4", provider="attached_cluster", runtime="process")
    for worker in workers.list_containers()["workers"]:
        machine = machine_of(pool, worker, AGENT)
        assert machine.state is MachineState.FAILED
        assert machine.reason == f"the worker's pod cannot start: {worker['cannot_start']}"
    for order in (privileged, unpullable):
        workers.terminate({"machine_id": order["machine_id"]})
