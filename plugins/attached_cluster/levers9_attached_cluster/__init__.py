"""The ``attached_cluster`` provider: workers in a customer's Kubernetes cluster, created by an agent.

An attached cluster runs ``levers9 agent`` in-cluster. The agent dials out to
the controlplane and keeps a stream open; the controlplane never holds
credentials for that cluster's API server and needs no inbound path to it.
Provisioning is an order sent down the stream ("create this worker Job and
its token Secret for machine M"); the agent creates them with its own service
account and reports nodes, GPUs and Jobs back up the same stream.

So the settings describe the pod the agent should create (the same shapes as
``local_k8s``, both from :mod:`levers9.kube.shapes`) plus which attached cluster serves the
pool and how soon a silent agent is given up on. There is no token field: the
controlplane issues the agent's token when the cluster is attached.

The hooks are the methods of :class:`AttachedClusterProvider`
(:mod:`levers9_attached_cluster.provider` says what each does); the entry
point names :data:`plugin`, its one instance. They keep the plugin context
``levers9_startup`` gives them: its agent hub is how they read the cluster
agent's inventory and send it orders.
"""

from __future__ import annotations

from levers9_attached_cluster.provider import AttachedClusterProvider
from levers9_attached_cluster.settings import AttachedClusterSettings

__all__ = ["AttachedClusterProvider", "AttachedClusterSettings", "plugin"]

#: the plugin object the entry point names; its state: the context (with its agent hub) from levers9_startup,
#: the agents' reports are the rest
plugin = AttachedClusterProvider()
