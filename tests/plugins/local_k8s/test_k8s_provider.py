"""The ``local_k8s`` provider beyond the contract kit: offers from nodes, misses before any Job, listing, check.

Every test runs the real ``kubernetes`` client against the fake cluster
(:mod:`tests.fakes.k8s_cluster`: the API at the wire, a scheduler and a
kubelet); faults are injected at the wire, never by patching the client. What
is checked: offers follow GPU Feature Discovery's labels, the pool's
tolerations and what running pods hold; a full pool and a quota-limited
namespace are refused before a Job or Secret exists; a retried provision
makes one Job; terminate removes the Job, its pod and its Secret; a pod the
scheduler cannot place is listed pending with the scheduler's message; the
API's answers become the typed errors; ``levers9 check`` says what RBAC lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest

from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import Availability, GpuOffer, MachineState
from levers9.kube.jobs import job_manifest, pod_security_level, secret_name
from levers9_local_k8s.provider import K8sProvider
from levers9_local_k8s.settings import LocalK8sSettings
from tests.fakes.k8s_api import pod_security_violations
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.wait import wait_for
from tests.plugins.local_k8s.conftest import CPU_NODE, GPU_NODE, IMAGE, L4_LABEL, NAMESPACE, make_pool
from tests.plugins.provision import provision_request


@pytest.fixture
def kube() -> Iterator[Callable[[dict[str, Any]], Any]]:
    """``kube(settings)``: the real client's CoreV1Api on the pool's kubeconfig, as an operator would use it."""
    made: list[Any] = []

    def core(settings: dict[str, Any]) -> Any:
        api_client = kubernetes.config.new_client_from_config(config_file=settings["kubeconfig"])
        made.append(api_client)
        return kubernetes.client.CoreV1Api(api_client)

    yield core
    for api_client in made:
        api_client.close()


def l4_offer(provider: K8sProvider, settings: dict[str, Any]) -> GpuOffer:
    [offer] = provider.levers9_gpu_offers(make_pool(settings))
    return offer


def test_offers_follow_the_gpu_labels_the_tolerations_and_what_pods_hold(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    offer = l4_offer(provider, k8s_settings)
    assert (offer.gpu, offer.gpu_count, offer.instance_type) == ("L4", 1, L4_LABEL)
    assert offer.availability is Availability.AVAILABLE
    assert offer.price_per_hour is None
    # without the toleration the tainted GPU node is not the pool's, and nothing else has an L4
    assert provider.levers9_gpu_offers(make_pool({**k8s_settings, "tolerations": []})) == []
    assert provider.levers9_gpu_offers(make_pool(k8s_settings, gpu="H100")) == []  # no H100 node
    assert provider.levers9_gpu_offers(make_pool(k8s_settings, gpu_count=2)) == []  # the node has one L4
    assert provider.levers9_gpu_offers(make_pool(k8s_settings, gpu=None)) == []  # a CPU pool has no offers

    machine = provider.levers9_provision(provision_request(make_pool(k8s_settings), offer))
    wait_for(lambda: [p for p in cluster.pods() if p["spec"].get("nodeName") == GPU_NODE], "the worker pod bound")
    assert l4_offer(provider, k8s_settings).availability is Availability.UNAVAILABLE  # its GPU is held
    provider.levers9_terminate(make_pool(k8s_settings), machine)
    wait_for(lambda: l4_offer(provider, k8s_settings).availability is Availability.AVAILABLE, "the GPU freed")


def test_a_full_pool_is_refused_before_any_job_exists(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    pool = make_pool(k8s_settings)
    offer = l4_offer(provider, k8s_settings)
    first = provider.levers9_provision(provision_request(pool, offer))
    wait_for(lambda: [p for p in cluster.pods() if p["spec"].get("nodeName") == GPU_NODE], "the first pod bound")
    with pytest.raises(InsufficientCapacity) as info:
        provider.levers9_provision(provision_request(pool, offer))
    said = str(info.value)
    assert f"{GPU_NODE}: 0 of 1 GPUs free, 1 needed" in said
    assert f"{CPU_NODE}: not a {L4_LABEL} node" in said
    assert info.value.code == "NoNodeFits"
    assert [j["metadata"]["name"] for j in cluster.created("jobs")] == [first.provider_id]
    assert len(cluster.created("secrets")) == 1
    provider.levers9_terminate(pool, first)


def test_a_quota_limited_namespace_is_refused_before_any_job_exists(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster, kube: Callable[..., Any]
) -> None:
    quota = {
        "metadata": {"name": "gpu-budget"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0", "count/jobs.batch": "5"}},
    }
    kube(k8s_settings).create_namespaced_resource_quota(NAMESPACE, quota)
    with pytest.raises(QuotaExceeded) as info:
        provider.levers9_provision(provision_request(make_pool(k8s_settings), l4_offer(provider, k8s_settings)))
    assert "ResourceQuota gpu-budget allows requests.nvidia.com/gpu=0" in str(info.value)
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []


def test_a_retried_provision_makes_one_job_and_terminate_leaves_nothing(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    pool = make_pool(k8s_settings)
    request = provision_request(pool, l4_offer(provider, k8s_settings))
    first = provider.levers9_provision(request)
    again = provider.levers9_provision(request)  # as after a lost answer: the same machine id
    assert again.provider_id == first.provider_id
    assert again.machine_id == request.machine_id
    assert len(cluster.objects("jobs", NAMESPACE)) == 1
    [secret] = cluster.objects("secrets", NAMESPACE)
    assert secret["metadata"]["name"] == secret_name(request.machine_id)
    assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["Job"]
    running = wait_for(
        lambda: [m for m in provider.levers9_list_machines(pool) if m.state is MachineState.RUNNING],
        "the worker pod running",
    )
    assert running[0].provider_data == {"namespace": NAMESPACE, "node": GPU_NODE}
    provider.levers9_terminate(pool, first)
    provider.levers9_terminate(pool, first)  # idempotent
    wait_for(lambda: cluster.leftovers() == [], "the Job, its pod and its Secret to be gone")
    assert cluster.running_processes() == []


def test_a_pod_the_scheduler_cannot_place_is_listed_pending_with_its_message(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster, kube: Callable[..., Any]
) -> None:
    """Another user's pod takes the GPU between the check and the schedule: the listing says why ours waits."""
    pool = make_pool(k8s_settings)
    request = provision_request(pool, l4_offer(provider, k8s_settings))
    # the Job as the provider makes it, but asking two GPUs where the L4 node has one: created straight through
    # the API, as if the room the provider saw was taken before the scheduler placed the pod
    settings = LocalK8sSettings.model_validate(k8s_settings)
    two = request.model_copy(update={"resources": request.resources.model_copy(update={"gpu_count": 2})})
    kubernetes.client.BatchV1Api(kube(k8s_settings).api_client).create_namespaced_job(
        NAMESPACE, job_manifest(two, settings)
    )
    pending = wait_for(
        lambda: [
            m for m in provider.levers9_list_machines(pool) if m.reason and m.reason.startswith("FailedScheduling")
        ],
        "the unschedulable pod's reason",
    )
    assert pending[0].state is MachineState.PENDING
    assert pending[0].machine_id == request.machine_id
    assert "0/2 nodes are available" in (pending[0].reason or "")
    assert "Insufficient nvidia.com/gpu" in (pending[0].reason or "")
    provider.levers9_terminate(pool, pending[0])
    wait_for(lambda: cluster.leftovers() == [], "the Job to be gone")


@pytest.mark.parametrize(
    ("status", "reason", "message", "error"),
    [
        (500, "InternalError", "etcdserver: request timed out", Throttled),
        (429, "TooManyRequests", "too many requests", Throttled),
        (
            403,
            "Forbidden",
            'jobs.batch "x" is forbidden: exceeded quota: q, requested: count/jobs.batch=1',
            QuotaExceeded,
        ),
        (403, "Forbidden", 'jobs.batch is forbidden: User "levers9" cannot create resource "jobs"', PermissionDenied),
        (
            422,
            "Invalid",
            'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value',
            InvalidRequest,
        ),
    ],
)
def test_the_apis_answers_are_typed_errors_and_leave_nothing(
    provider: K8sProvider,
    k8s_settings: dict[str, Any],
    cluster: FakeCluster,
    status: int,
    reason: str,
    message: str,
    error: type[Exception],
) -> None:
    cluster.fail("POST", r"/apis/batch/v1/namespaces/[^/]+/jobs$", status, reason, message)
    with pytest.raises(error) as info:
        provider.levers9_provision(provision_request(make_pool(k8s_settings), l4_offer(provider, k8s_settings)))
    assert message in str(info.value)
    assert cluster.leftovers() == []


def test_rejected_credentials_and_a_missing_kubeconfig_are_said_plainly(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster, tmp_path: Any
) -> None:
    wrong = {**k8s_settings, "kubeconfig": str(cluster.kubeconfig(tmp_path / "wrong", token="wrong"))}
    with pytest.raises(AuthenticationFailed):
        provider.levers9_gpu_offers(make_pool(wrong))
    check = provider.levers9_check(make_pool(wrong))
    assert not check.ok
    missing = {**k8s_settings, "kubeconfig": str(tmp_path / "absent")}
    check = provider.levers9_check(make_pool(missing))
    assert not check.ok
    assert "absent" in check.message
    assert check.hint is not None


def test_check_says_what_the_credentials_may_not_do(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    check = provider.levers9_check(make_pool(k8s_settings))
    assert check.ok, check
    cluster.deny("create", "jobs", namespace=NAMESPACE, group="batch")
    check = provider.levers9_check(make_pool(k8s_settings))
    assert not check.ok
    assert "may not create jobs in levers9" in check.message
    assert check.hint is not None
    check = provider.levers9_check(make_pool({**k8s_settings, "namespace": "elsewhere"}))
    assert not check.ok
    assert check.hint == "create the namespace: kubectl create namespace elsewhere"


def test_a_runc_pool_runs_privileged_with_a_state_volume_only_with_the_operators_consent(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    refused = make_pool(k8s_settings, name="nested", gpu=None).model_copy(update={"runtime": "runc"})
    check = provider.levers9_check(refused)
    assert not check.ok
    for said in ("pool 'nested'", "runtime 'runc'", "settings.privileged: true"):
        assert said in check.message, check.message
    with pytest.raises(InvalidRequest, match=r"pool 'nested' runs runtime 'runc'.*settings\.privileged: true"):
        provider.levers9_provision(provision_request(refused, None))
    assert cluster.created("jobs") == []
    assert cluster.created("secrets") == []

    consented = {**k8s_settings, "privileged": True}
    for runtime in ("runc", "gvisor"):
        pool = make_pool(consented, name="nested", gpu=None).model_copy(update={"runtime": runtime})
        assert provider.levers9_check(pool).ok
        job = job_manifest(provision_request(pool, None), LocalK8sSettings.model_validate(consented))
        pod = job["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["securityContext"] == {"privileged": True}
        assert pod["volumes"] == [{"name": "worker-state", "emptyDir": {}}]
        assert container["volumeMounts"] == [{"name": "worker-state", "mountPath": "/var/lib/levers9"}]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["LEVERS9_WORKER_STATE_DIR"] == "/var/lib/levers9/worker"

    # a process pool's Job passes Pod Security's baseline level, confined as far as a worker that runs its calls
    # as nobody allows: root (to switch users), no escalation, no NET_RAW, the runtime's seccomp profile; no volume
    plain = job_manifest(
        provision_request(make_pool(k8s_settings, gpu=None), None), LocalK8sSettings.model_validate(k8s_settings)
    )
    pod = plain["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["NET_RAW"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "volumes" not in pod
    assert "volumeMounts" not in container
    assert "LEVERS9_WORKER_STATE_DIR" not in {e["name"] for e in container["env"]}
    assert pod_security_violations(plain["spec"]["template"], "baseline") == []
    assert pod_security_level(privileged=False) == "baseline"
    assert pod_security_level(privileged=True) == "privileged"
    nested = job_manifest(
        provision_request(make_pool(consented, gpu=None).model_copy(update={"runtime": "runc"}), None),
        LocalK8sSettings.model_validate(consented),
    )
    assert pod_security_violations(nested["spec"]["template"], "baseline") == [
        'privileged (container "worker" must not set securityContext.privileged=true)'
    ]


# ---------------------------------------------------------------------------------------------- pods that never start


def failed(provider: K8sProvider, pool: Any) -> list[Any]:
    return [m for m in provider.levers9_list_machines(pool) if m.state is MachineState.FAILED]


def test_an_image_that_cannot_be_pulled_fails_the_machine_at_once_with_the_kubelets_words(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    """Before: listed pending ('ErrImagePull: ...') until the registration deadline (600 s) ran out."""
    cluster.unpullable(IMAGE)
    pool = make_pool(k8s_settings, gpu=None)
    machine = provider.levers9_provision(provision_request(pool, None))
    [listed] = wait_for(lambda: failed(provider, pool), "the machine failed for its image")
    assert listed.machine_id == machine.machine_id
    assert listed.reason is not None
    assert listed.reason.startswith("the worker's pod cannot start: ErrImagePull: failed to pull and unpack image")
    assert IMAGE in listed.reason
    provider.levers9_terminate(pool, listed)
    wait_for(lambda: cluster.leftovers() == [], "the Job, its pod and its Secret to be gone")


def test_a_pod_pod_security_refuses_fails_the_machine_at_once_and_a_process_pod_passes_baseline(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster
) -> None:
    """A runc pool's privileged pod in a namespace enforcing ``baseline``: the API refuses the pod, which only
    the Job's FailedCreate event says. Before: listed pending with no reason until the registration deadline."""
    cluster.label_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    nested = make_pool({**k8s_settings, "privileged": True}, name="nested", gpu=None)
    nested = nested.model_copy(update={"runtime": "runc"})
    provider.levers9_provision(provision_request(nested, None))
    [listed] = wait_for(lambda: failed(provider, nested), "the machine failed for Pod Security")
    assert listed.reason is not None
    assert listed.reason.startswith("the worker's pod cannot start: FailedCreate: Error creating: pods ")
    assert 'violates PodSecurity "baseline:latest": privileged (container "worker" must not set' in listed.reason
    provider.levers9_terminate(nested, listed)
    # a process pool's pod passes the same namespace's level and runs
    plain = make_pool(k8s_settings, gpu=None)
    provider.levers9_provision(provision_request(plain, None))
    wait_for(
        lambda: [m for m in provider.levers9_list_machines(plain) if m.state is MachineState.RUNNING], "it running"
    )
    for machine in provider.levers9_list_machines(plain):
        provider.levers9_terminate(plain, machine)
    assert provider.levers9_list_machines(nested) == []
    wait_for(lambda: cluster.leftovers() == [], "the Jobs, their pods and Secrets to be gone")


def test_a_container_the_kubelet_cannot_configure_fails_at_once_but_a_secret_not_there_yet_is_waited_for(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster, kube: Callable[..., Any]
) -> None:
    """CreateContainerConfigError: the token Secret without its key fails the machine; before the Secret exists
    (it is created just after the Job) the machine stays pending."""
    pool = make_pool(k8s_settings, gpu=None)
    request = provision_request(pool, None)
    settings = LocalK8sSettings.model_validate(k8s_settings)
    core = kube(k8s_settings)
    kubernetes.client.BatchV1Api(core.api_client).create_namespaced_job(NAMESPACE, job_manifest(request, settings))
    waiting = wait_for(
        lambda: [
            m for m in provider.levers9_list_machines(pool) if (m.reason or "").startswith("CreateContainerConfigError")
        ],
        "the pod waiting for its Secret",
    )
    assert waiting[0].state is MachineState.PENDING
    assert f'secret "{secret_name(request.machine_id)}" not found' in (waiting[0].reason or "")
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": secret_name(request.machine_id)}, "stringData": {"NOT_THE_TOKEN": "x"}}
    )
    [listed] = wait_for(lambda: failed(provider, pool), "the machine failed for its configuration")
    assert listed.reason == (
        "the worker's pod cannot start: CreateContainerConfigError: couldn't find key LEVERS9_TOKEN in Secret "
        f"{NAMESPACE}/{secret_name(request.machine_id)}"
    )
    provider.levers9_terminate(pool, listed)
    wait_for(lambda: cluster.leftovers() == [], "the Job, its pod and its Secret to be gone")


def test_the_pool_lists_only_its_own_jobs_not_an_agents_in_the_same_namespace(
    provider: K8sProvider, k8s_settings: dict[str, Any], cluster: FakeCluster, kube: Callable[..., Any]
) -> None:
    """A Job labelled with the pool's name but owned by another (an attached cluster's agent) is not its own."""
    pool = make_pool(k8s_settings, gpu=None)
    mine = provider.levers9_provision(provision_request(pool, None))
    theirs = job_manifest(provision_request(pool, None), LocalK8sSettings.model_validate(k8s_settings))
    theirs["metadata"]["labels"]["levers9/owner"] = "lab.0a1b2c3d"
    kubernetes.client.BatchV1Api(kube(k8s_settings).api_client).create_namespaced_job(NAMESPACE, theirs)
    assert [m.machine_id for m in provider.levers9_list_machines(pool)] == [mine.machine_id]
    [job] = [j for j in cluster.objects("jobs", NAMESPACE) if j["metadata"]["name"] == mine.provider_id]
    assert job["metadata"]["labels"]["levers9/owner"] == pool.name
    assert job["spec"]["template"]["metadata"]["labels"]["levers9/owner"] == pool.name
    provider.levers9_terminate(pool, mine)
    kubernetes.client.BatchV1Api(kube(k8s_settings).api_client).delete_namespaced_job(
        theirs["metadata"]["name"], NAMESPACE, propagation_policy="Background"
    )
    wait_for(lambda: cluster.leftovers() == [], "both Jobs and their pods gone")
