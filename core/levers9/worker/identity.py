"""The machine identity a worker shows at its first registration, made by the plugin its provider named.

A provider that binds join tokens to machines (EC2: the signed instance
identity document) boots the worker with ``LEVERS9_MACHINE_IDENTITY`` naming
its plugin; :func:`machine_identity` asks that plugin's
``levers9_machine_identity`` once, before the worker first registers. A worker
that cannot get it (no metadata service, a plugin that fails) still
registers, without it: where the provider binds tokens the controlplane then
refuses it saying why, which is clearer in both logs than a worker that never
dials. The failure is logged here with the plugin's own message.
"""

from __future__ import annotations

import logging

from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.proto.v1 import worker_pb2

__all__ = ["FETCH_TIMEOUT_S", "machine_identity"]

log = logging.getLogger(__name__)

#: the plugin's own retries of its metadata service fit in this
FETCH_TIMEOUT_S = 60.0


async def machine_identity(hooks: Hooks, plugin: str) -> worker_pb2.MachineIdentity | None:
    """What ``plugin`` proves this machine is, as Register carries it; None when no plugin is named or it failed."""
    if not plugin:
        return None
    try:
        identity = await hooks.machine_identity(plugin, timeout=FETCH_TIMEOUT_S)
    except Levers9Error as exc:
        log.error("could not fetch this machine's identity (%s): %s", plugin, exc)
        return None
    log.info("this machine's identity comes from plugin %s (%d bytes)", plugin, len(identity.document))
    return worker_pb2.MachineIdentity(document=identity.document, signature=identity.signature)
