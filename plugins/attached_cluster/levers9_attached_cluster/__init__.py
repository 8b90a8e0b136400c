"""The ``attached_cluster`` provider: workers in a customer's Kubernetes cluster, created by an agent.

An attached cluster runs ``levers9 agent`` in-cluster. The agent dials out to
the controlplane and keeps a stream open; the controlplane never holds
credentials for that cluster's API server and needs no inbound path to it.
Provisioning is an order sent down the stream ("create this worker Job and
its token Secret for machine M"); the agent creates them with its own service
account and reports nodes, GPUs and Jobs back up the same stream.

So the settings describe the pod the agent should create (the same shapes as
``local_k8s``, imported from there) plus which attached cluster serves the
pool and how soon a silent agent is given up on. There is no token field: the
controlplane issues the agent's token when the cluster is attached.

The hooks (:mod:`levers9_attached_cluster.provider` says what each does) keep
the plugin context ``levers9_startup`` gives them: its agent hub is how they
read the cluster agent's inventory and send it orders.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, Pool, ProviderCheck, ProvisionRequest
from levers9_attached_cluster.provider import AttachedClusterProvider
from levers9_attached_cluster.settings import AttachedClusterSettings

__all__ = [
    "AttachedClusterProvider",
    "AttachedClusterSettings",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_startup",
    "levers9_terminate",
]

#: the hooks' state: the context (with its agent hub) from levers9_startup; the agents' reports are the rest
_provider = AttachedClusterProvider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``attached_cluster`` a provider; its pools validate with :class:`AttachedClusterSettings`."""
    return AttachedClusterSettings


@hookimpl
def levers9_startup(ctx: PluginContext) -> None:
    _provider.startup(ctx)


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
def levers9_check(pool: Pool) -> ProviderCheck:
    return _provider.check(pool)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return _provider.list_machines(pool)

#: the plugin object the entry point names; for now this module itself (its functions are the hooks)
plugin = sys.modules[__name__]
