"""The ``attached_cluster`` provider: workers in a customer's Kubernetes cluster, created by an agent.

An attached cluster runs ``levers9 agent`` in-cluster. The agent dials out to
the controlplane and keeps a stream open; the controlplane never holds
credentials for that cluster's API server and needs no inbound path to it.
Provisioning is an order sent down the stream ("create a worker Job for machine
M with token T"); the agent creates the Job with its own service account and
reports nodes, GPUs and Jobs back up the same stream.

So the settings describe the pod the agent should create (the same shapes as
``local_k8s``, imported from there) plus which attached cluster serves the
pool. There is no token field: the controlplane issues the agent's token when
the cluster is attached. In this version the plugin declares its settings
only; the provisioning hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_attached_cluster.settings import AttachedClusterSettings

__all__ = ["AttachedClusterSettings", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``attached_cluster`` a provider; its pools validate with :class:`AttachedClusterSettings`."""
    return AttachedClusterSettings
