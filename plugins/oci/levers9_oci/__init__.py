"""The ``oci`` provider: each worker is an Oracle Cloud Infrastructure compute instance.

OCI sells GPU machines as shapes (``BM.GPU.H100.8``, ``VM.GPU.A10.1``...) per
availability domain, launched into a compartment and subnet from an image. The
plugin lists shapes for offers (one per shape and domain, availability from a
compute capacity report), launches with LaunchInstance carrying levers9's
freeform tags and a cloud-init user_data that starts the worker, and turns
"Out of host capacity" into InsufficientCapacity so the scheduler moves on.

The settings are the identifiers an OCI operator must supply (compartment,
subnet, image OCIDs, availability domains; the region is the pool's own
``region``, never a setting) and how to authenticate, which is always the OCI
SDK's own mechanism: a config file and profile pointing at the signing key, a
session's security token, or instance/resource principals.

This module holds only the hook functions; they delegate to one
:class:`~levers9_oci.provider.OciProvider` (what each hook does is said
there, how errors map in :mod:`levers9_oci.errors`, how clients are made and
shared between threads in :mod:`levers9_oci.clients`). The ``oci`` SDK is
never imported at module level: loading the plugin (``levers9`` starting)
does not import it; the first hook that calls OCI does. Importing the SDK
makes urllib3 warn that SOCKS proxies need PySocks (the SDK's vendored
requests probes for it); levers9 uses no SOCKS proxy, so that one warning is
silenced here rather than printed under every ``levers9 check``.
"""

from __future__ import annotations

import sys
import warnings

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, Pool, ProviderCheck, ProvisionRequest
from levers9_oci.provider import OciProvider
from levers9_oci.settings import OciSettings, ShapeConfig

warnings.filterwarnings("ignore", message="SOCKS support in urllib3 requires")

__all__ = [
    "OciProvider",
    "OciSettings",
    "ShapeConfig",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_shutdown",
    "levers9_startup",
    "levers9_terminate",
]

#: the hooks' state: the SDK clients (per thread, settings and region) and the plugin context
_provider = OciProvider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``oci`` a provider whose pools are validated with :class:`OciSettings`."""
    return OciSettings


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
