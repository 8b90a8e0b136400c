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

The hooks below are thin: :mod:`levers9_local_k8s.provider` says what each
does, and holds the one provider object they share (its API clients, made by
:mod:`levers9_local_k8s.client`, live from ``levers9_startup`` to
``levers9_shutdown``). The ``kubernetes`` client is imported only inside the
functions that make a client, never when this package is imported.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, Pool, ProviderCheck, ProvisionRequest
from levers9_local_k8s.provider import K8sProvider
from levers9_local_k8s.settings import LocalK8sSettings, Toleration

__all__ = [
    "K8sProvider",
    "LocalK8sSettings",
    "Toleration",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_shutdown",
    "levers9_startup",
    "levers9_terminate",
]

#: the hooks' shared state: the API clients of the pools' clusters
_provider = K8sProvider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``local_k8s`` a provider whose pools are validated with :class:`LocalK8sSettings`."""
    return LocalK8sSettings


@hookimpl
def levers9_startup(ctx: PluginContext) -> None:
    _provider.startup(ctx)


@hookimpl
def levers9_shutdown(ctx: PluginContext) -> None:
    _provider.shutdown()


@hookimpl
def levers9_check(pool: Pool) -> ProviderCheck:
    return _provider.check(pool)


@hookimpl
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    return _provider.gpu_offers(pool)


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    return _provider.provision(request)


@hookimpl
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    _provider.terminate(pool, machine)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return _provider.list_machines(pool)

#: the plugin object the entry point names; for now this module itself (its functions are the hooks)
plugin = sys.modules[__name__]
