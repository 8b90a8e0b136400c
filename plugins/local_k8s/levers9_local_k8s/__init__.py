"""The ``local_k8s`` provider: levers9 workers as Kubernetes Jobs in the controlplane's own cluster.

When the controlplane runs in (or next to) a Kubernetes cluster the operator
owns, a worker "machine" is a one-pod Job: the scheduler's GPU request becomes
the pod's ``nvidia.com/gpu`` limit, the kube-scheduler picks the node, and the
Job's labels (``levers9/machine-id``, ``levers9/pool``) let the reconciler find
it again. The controlplane calls the API server directly with a kubeconfig or
its in-cluster service account; compare ``attached_cluster``, where an agent
inside someone else's cluster does the calling.

The settings mirror what a pod spec needs for GPU nodes (namespace, image,
service account, node selector, tolerations, pull secrets) and are validated
with the API server's own syntax rules, so mistakes surface when config loads.
The ``kubernetes`` client is never imported here. In this version the plugin
declares its settings only; the provisioning hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_local_k8s.settings import LocalK8sSettings, Toleration

__all__ = ["LocalK8sSettings", "Toleration", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``local_k8s`` a provider whose pools are validated with :class:`LocalK8sSettings`."""
    return LocalK8sSettings
