"""Pool settings of the ``local_k8s`` provider.

Everything here validates with the rules the Kubernetes API server applies
(label syntax, toleration rules, DNS names: the shapes of
:mod:`levers9.kube.shapes`, which ``attached_cluster`` uses too), so a typo
fails when the config is loaded rather than as a 422 at provisioning time.
Only pydantic and levers9's config fields and Kubernetes shapes are imported:
the ``kubernetes`` client is imported by the hooks that call the API.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# ImageRef is re-exported: it has been importable from here, and pod specs are where images are named
from levers9.config.fields import ImageRef as ImageRef
from levers9.config.fields import UniqueList
from levers9.kube.jobs import FINISHED_JOB_TTL_S
from levers9.kube.shapes import DnsLabel, DnsSubdomain, NodeSelector, ResourceName, SecretName, Toleration

__all__ = ["ImageRef", "LocalK8sSettings", "Toleration"]


def _check_kubeconfig(value: str | None) -> str | None:
    if value is None or value == "in-cluster":
        return value
    if not value.strip():
        raise ValueError("kubeconfig must be a file path, 'in-cluster', or left out")
    return value


class LocalK8sSettings(BaseModel):
    """Settings of a pool whose workers run as Kubernetes Jobs in the controlplane's own cluster."""

    model_config = ConfigDict(extra="forbid")

    namespace: DnsLabel = Field(
        "levers9",
        description="Namespace the worker Jobs (and the Secrets holding their tokens) are created in.",
    )
    kubeconfig: Annotated[str | None, AfterValidator(_check_kubeconfig)] = Field(
        None,
        description="Path to a kubeconfig file, or 'in-cluster' to use the pod's service-account token. "
        "Left out: $KUBECONFIG or ~/.kube/config, else in-cluster. The file is read, never copied into "
        "config.",
    )
    context: str | None = Field(
        None, min_length=1, description="kubeconfig context to use; left out, the file's current context."
    )
    worker_image: ImageRef = Field(
        description="Image of the levers9 worker each Job runs, for example "
        "'registry.example.com/levers9/worker:0.1.0'. Pin a tag or digest in production."
    )
    service_account: DnsSubdomain | None = Field(
        None, description="ServiceAccount the worker pods run as; left out, the namespace's 'default'."
    )
    node_selector: NodeSelector = Field(
        default_factory=dict,
        description="Node labels a worker pod requires, for example "
        "{'nvidia.com/gpu.product': 'NVIDIA-H100-80GB-HBM3'}.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Tolerations for tainted GPU nodes, e.g. key 'nvidia.com/gpu', Exists.",
    )
    gpu_resource_name: ResourceName = Field(
        "nvidia.com/gpu",
        description="Extended resource the device plugin advertises; requested as the pod's GPU limit.",
    )
    image_pull_secrets: UniqueList[SecretName] = Field(
        default_factory=list,
        description="Names of existing docker-registry Secrets in the namespace (names only, never credentials).",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None, description="PriorityClass of the worker pods, so GPU workers can preempt batch work."
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        description="Hard limit on a worker Job's lifetime (spec.activeDeadlineSeconds); left out, "
        "a worker lives until levers9 releases it.",
    )
    ttl_seconds_after_finished: int | None = Field(
        FINISHED_JOB_TTL_S,
        ge=0,
        description="Seconds a finished Job is kept for inspection before Kubernetes deletes it; "
        "null keeps it until levers9 terminates it.",
    )
    privileged: bool = Field(
        False,
        description="Run the worker container privileged. Needed only when the pool's runtime (runc, gvisor) "
        "creates containers inside the pod; leave off for the 'process' runtime.",
    )
