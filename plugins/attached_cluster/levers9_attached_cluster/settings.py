"""Pool settings of the ``attached_cluster`` provider.

The Kubernetes shapes (tolerations, label and name syntax) are those of
:mod:`levers9.kube.shapes`, which ``local_k8s`` uses too, so the two providers
validate pod placement identically; :mod:`levers9.config.fields` supplies the
image syntax.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from levers9.config.fields import ImageRef, UniqueList
from levers9.kube.shapes import DnsLabel, DnsSubdomain, NodeSelector, ResourceName, SecretName, Toleration


class AttachedClusterSettings(BaseModel):
    """Settings of a pool served by a customer's cluster through the levers9 agent running inside it.

    There is no credential here: the agent authenticates with the token the
    controlplane issued when the cluster was attached, and the controlplane never
    holds credentials for the cluster's API server.
    """

    model_config = ConfigDict(extra="forbid")

    cluster: DnsLabel = Field(
        description="Name the cluster was attached under ('levers9 cluster attach NAME'); orders for this "
        "pool go to that cluster's agent."
    )
    namespace: DnsLabel = Field(
        "levers9", description="Namespace in the attached cluster where the agent creates worker Jobs."
    )
    worker_image: ImageRef = Field(
        description="Worker image the agent's Jobs run; it must be pullable from inside the attached cluster."
    )
    service_account: DnsSubdomain | None = Field(
        None, description="ServiceAccount of the worker pods; left out, the namespace's 'default'."
    )
    node_selector: NodeSelector = Field(
        default_factory=dict, description="Node labels a worker pod requires in the attached cluster."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations for the attached cluster's tainted GPU nodes."
    )
    gpu_resource_name: ResourceName = Field(
        "nvidia.com/gpu", description="Extended resource the attached cluster's device plugin advertises."
    )
    image_pull_secrets: UniqueList[SecretName] = Field(
        default_factory=list,
        description="Names of docker-registry Secrets that already exist in the namespace (names only).",
    )
    privileged: bool = Field(
        False, description="Run the worker privileged; needed only for the runc and gvisor runtimes."
    )
    order_timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description="How long the controlplane waits for the agent to acknowledge a create or delete order.",
    )
    heartbeat_timeout_s: float = Field(
        90.0,
        ge=5,
        le=3600,
        description="A cluster's agent silent this long no longer serves the pool: no offers, no new workers, "
        "and its workers are reported failed. Agents heartbeat every 30 s, so keep this at 60 or more.",
    )
