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

The plugin is one object, :data:`plugin`, a
:class:`~levers9_lambda_labs.provider.LambdaLabsProvider` whose ``levers9_*``
methods are the hooks (its module says what each does); :mod:`levers9_lambda_labs.errors` maps the API's
failures to levers9's typed errors and :mod:`levers9_lambda_labs.ratelimit` paces
launches per API key.
"""

from __future__ import annotations

from levers9_lambda_labs.provider import LambdaLabsProvider
from levers9_lambda_labs.settings import LambdaLabsSettings

__all__ = ["LambdaLabsProvider", "LambdaLabsSettings", "plugin"]

#: the plugin the entry point names: its hooks, HTTP clients per (API URL, key variable), the launch pacer
plugin = LambdaLabsProvider()
