"""The ``lambda_labs`` provider: each worker is a Lambda Cloud on-demand GPU instance.

Lambda's Cloud API is small and plain JSON over HTTPS: ``GET /instance-types``
lists types with the regions that have capacity right now,
``POST /instance-operations/launch`` starts one instance with a cloud-init
``user_data`` and tags, ``POST /instance-operations/terminate`` ends it, and
``GET /instances`` lists them. Capacity is scarce and changes by the minute,
which is exactly why levers9 treats a refused launch as a reason to try the next
candidate at once.

The settings follow the launch request: instance types, the one SSH key the API
insists on, an optional filesystem, and the name of the environment variable
holding the API key (never the key). The regions are the pool's own ``region``
(or ``regions``), never a setting: one source for every provider. No SDK is
needed: the hooks talk to the API with httpx (:mod:`levers9_lambda_labs.api`,
which imports it only when a hook runs).

The hooks here only delegate to one :class:`~levers9_lambda_labs.provider.LambdaLabsProvider`
(its module says what each does); :mod:`levers9_lambda_labs.errors` maps the API's
failures to levers9's typed errors and :mod:`levers9_lambda_labs.ratelimit` paces
launches per API key.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, Pool, ProviderCheck, ProvisionRequest
from levers9_lambda_labs.provider import LambdaLabsProvider
from levers9_lambda_labs.settings import LambdaLabsSettings

__all__ = [
    "LambdaLabsProvider",
    "LambdaLabsSettings",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_shutdown",
    "levers9_startup",
    "levers9_terminate",
    "provider_state",
]

#: the hooks' state: HTTP clients per (API URL, key variable), the launch pacer, the plugin context
provider_state = LambdaLabsProvider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``lambda_labs`` a provider whose pools are validated with :class:`LambdaLabsSettings`."""
    return LambdaLabsSettings


@hookimpl
def levers9_startup(ctx: PluginContext) -> None:
    provider_state.startup(ctx)


@hookimpl
def levers9_shutdown(ctx: PluginContext) -> None:
    provider_state.shutdown()


@hookimpl
def levers9_check(pool: Pool) -> ProviderCheck:
    return provider_state.check(pool)


@hookimpl
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    return provider_state.gpu_offers(pool)


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    return provider_state.provision(request)


@hookimpl
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    provider_state.terminate(pool, machine)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return provider_state.list_machines(pool)


#: the plugin object the entry point names; for now this module itself (its functions are the hooks)
plugin = sys.modules[__name__]
