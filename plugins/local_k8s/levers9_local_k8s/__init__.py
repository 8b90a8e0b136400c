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

The hooks are the methods of :class:`K8sProvider`
(:mod:`levers9_local_k8s.provider` says what each does); the entry point names
:data:`plugin`, its one instance, whose API clients, made by
:mod:`levers9_local_k8s.client`, live from ``levers9_startup`` to
``levers9_shutdown``. The Job and Secret a worker is made of, and what each
node can still take, are :mod:`levers9.kube.jobs` and :mod:`levers9.kube.rooms`,
which ``attached_cluster`` uses too. The ``kubernetes`` client is imported only inside the
functions that make a client, never when this package is imported.
"""

from __future__ import annotations

from levers9_local_k8s.provider import K8sProvider
from levers9_local_k8s.settings import LocalK8sSettings, Toleration

__all__ = ["K8sProvider", "LocalK8sSettings", "Toleration", "plugin"]

#: the plugin object the entry point names; its state: the API clients of the pools' clusters
plugin = K8sProvider()
