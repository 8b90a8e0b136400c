"""Starting a task's container: from its stub's latest checkpoint when there is one, else cold.

A checkpoint is an optimisation, never a reason for a task to fail: when the
restore does not come up, the checkpoint is marked ``restore_failed`` (so the
next start does not try it again), the container is prepared afresh and
started cold, and the caller is told why, for the task's log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from levers9.hooks.errors import Levers9Error, PluginError, RestoreFailed
from levers9.hooks.facade import Hooks
from levers9.hooks.types import CheckpointImage, ContainerSpec, ContainerState, RuntimeContext
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.records import CheckpointRecord

__all__ = ["RESTORE_TIMEOUT_S", "Started", "start_container"]

log = logging.getLogger(__name__)

RESTORE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Started:
    state: ContainerState
    #: the checkpoint the container was restored from, None for a cold start
    restored_from: str | None = None
    #: why the checkpoint could not be used, when it was tried and failed
    restore_error: str | None = None


async def start_container(
    hooks: Hooks,
    runtime: RuntimeContext,
    spec: ContainerSpec,
    *,
    checkpoint: CheckpointRecord | None = None,
    checkpoints: CheckpointStore | None = None,
) -> Started:
    prepared = await hooks.container_prepare(runtime, spec)
    if checkpoint is None or checkpoint.path is None:
        return Started(await hooks.container_start(runtime, prepared))
    image = CheckpointImage(
        checkpoint_id=checkpoint.id,
        runtime=checkpoint.runtime,
        path=checkpoint.path,
        size_bytes=checkpoint.size_bytes or 0,
        created_at=checkpoint.created_at,
    )
    try:
        state = await hooks.restore(runtime, prepared, image, timeout=RESTORE_TIMEOUT_S)
        return Started(state, restored_from=checkpoint.id)
    except (RestoreFailed, PluginError, Levers9Error) as exc:
        reason = str(exc)
    log.warning("restoring %s from checkpoint %s failed, starting cold: %s", spec.container_id, checkpoint.id, reason)
    if checkpoints is not None:
        await checkpoints.set_status(checkpoint.id, "restore_failed", error=reason[:2000])
    # the failed restore cleaned up after itself (the hook's contract); remove again in case a plugin did not
    await hooks.container_remove(runtime, spec.container_id)
    prepared = await hooks.container_prepare(runtime, spec)
    return Started(await hooks.container_start(runtime, prepared), restore_error=reason)
