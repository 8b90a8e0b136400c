"""The ``oci`` provider: each worker is an Oracle Cloud Infrastructure compute instance.

OCI sells GPU machines as shapes (``BM.GPU.H100.8``, ``VM.GPU.A10.1``...) per
availability domain, launched into a compartment and subnet from an image. The
plugin lists shapes for offers, launches with LaunchInstance carrying levers9's
freeform tags and a cloud-init user_data that starts the worker, and turns
"Out of host capacity" into InsufficientCapacity so the scheduler moves on.

The settings are the identifiers an OCI operator must supply (compartment,
subnet, image OCIDs, availability domains; the region is the pool's own
``region``, never a setting) and how to authenticate, which is always the OCI
SDK's own mechanism: a config file and profile pointing at the signing key, or
instance/resource principals. The ``oci`` SDK is never imported here. In this
version the plugin declares its settings only; the provisioning hooks come
later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_oci.settings import OciSettings, ShapeConfig

__all__ = ["OciSettings", "ShapeConfig", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``oci`` a provider whose pools are validated with :class:`OciSettings`."""
    return OciSettings
