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
needed. In this version the plugin declares its settings only; the provisioning
hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_lambda_labs.settings import LambdaLabsSettings

__all__ = ["LambdaLabsSettings", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``lambda_labs`` a provider whose pools are validated with :class:`LambdaLabsSettings`."""
    return LambdaLabsSettings
