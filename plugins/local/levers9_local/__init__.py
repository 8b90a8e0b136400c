"""The ``local`` provider: levers9 workers as processes on the controlplane's own machine.

This is the provider of ``levers9 up`` and of development setups: a "machine" is
a ``levers9 worker`` child process, GPUs are the ones discovery finds on this
host, and nothing is rented or tagged anywhere. It exists so that the whole
path from a call to a running container (scheduler, provisioning hook,
registration with a token, runtime plugin) can be exercised on one laptop with
exactly the code production runs; only the provider differs.

Its settings are therefore about sharing one host: which command starts a
worker, which GPUs workers may take, where their pid files and logs live and
how long a worker gets to stop. How many workers and how big each is are the
pool's own ``max_workers``, ``cpu`` and ``memory``. In this version
the plugin declares its settings only; the provisioning hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_local.settings import LocalSettings

__all__ = ["LocalSettings", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``local`` a provider whose pools are validated with :class:`LocalSettings`."""
    return LocalSettings
