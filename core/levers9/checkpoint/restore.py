"""Starting a task's container: from its stub's latest checkpoint when there is one, else cold; and
checkpointing it once its start-up code says it is ready.

A checkpoint is an optimisation, never a reason for a task to fail: when the
restore does not come up, the checkpoint is marked ``restore_failed`` (so the
next start does not try it again), the container is prepared afresh and
started cold, and the caller is told why, for the task's log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.publish import dump_fits, fetch_for_start
from levers9.checkpoint.record import CheckpointRecord
from levers9.checkpoint.storage import CheckpointRecorder, CheckpointStorage
from levers9.hooks.errors import Levers9Error, PluginError, RestoreFailed
from levers9.hooks.facade import Hooks
from levers9.hooks.types import (
    CheckpointImage,
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    Mount,
    RuntimeContext,
)
from levers9.runner import main as runner

__all__ = [
    "READY_DIR",
    "READY_ENV",
    "RESTORE_TIMEOUT_S",
    "Started",
    "checkpoint_when_ready",
    "memory_in_use",
    "start_container",
    "with_ready_signal",
]

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
    checkpoints: CheckpointRecorder | None = None,
    storage: CheckpointStorage | None = None,
    cache: NodeCache | None = None,
) -> Started:
    """Start ``spec``'s container, restoring ``checkpoint`` (fetched from the node cache or ``storage``) if given.

    A checkpoint that cannot be fetched or restored is marked ``restore_failed`` and the container starts cold.
    """
    prepared = await hooks.container_prepare(runtime, spec)
    if checkpoint is None:
        return Started(await hooks.container_start(runtime, prepared))
    if storage is None or cache is None:
        raise ValueError("restoring a checkpoint needs the workspace's storage and the node cache")
    try:
        image = await fetch_for_start(checkpoint, storage=storage, cache=cache)
        with cache.hold(checkpoint.id):
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


# --------------------------------------------------------------------------- checkpoint once ready

#: where a container finds its signal directory, and the variable naming the file to create when ready
READY_DIR = "/run/levers9"
READY_ENV = runner.ENV_READY


def with_ready_signal(spec: ContainerSpec, host_dir: Path, *, mounts: bool = True) -> ContainerSpec:
    """``spec`` with a way to say "start-up is done": ``$LEVERS9_READY_FILE``, created by the application.

    The spec is marked ``checkpointable``, so the runtime leaves out what it could not checkpoint.

    The file lives in ``host_dir`` on the worker, bind-mounted writable at :data:`READY_DIR` (or named
    directly when the runtime has no mounts, like the process runtime).
    """
    host_dir.mkdir(parents=True, exist_ok=True)
    if mounts:
        extra = [Mount(source=str(host_dir), target=READY_DIR, read_only=False)]
        env = {**spec.env, READY_ENV: f"{READY_DIR}/ready"}
        return spec.model_copy(update={"mounts": [*spec.mounts, *extra], "env": env, "checkpointable": True})
    return spec.model_copy(update={"env": {**spec.env, READY_ENV: str(host_dir / "ready")}, "checkpointable": True})


def memory_in_use(container_id: str, cgroup_parent: str | None, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the container's memory cgroup holds now (v1 or v2), or None when unknown.

    ``cgroup_parent`` is where the runtime puts containers' cgroups (its ``RuntimeCapabilities.cgroup_parent``);
    None, for a runtime that gives containers no cgroup of their own, means unknown.
    """
    if cgroup_parent is None:
        return None
    rel = f"{cgroup_parent.strip('/')}/{container_id}".lstrip("/")
    for path in (root / "memory" / rel / "memory.usage_in_bytes", root / rel / "memory.current"):
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


async def checkpoint_when_ready(
    hooks: Hooks,
    runtime: RuntimeContext,
    spec: ContainerSpec,
    *,
    host_dir: Path,
    image_dir: Path,
    free_bytes: int,
    cgroup_parent: str | None = None,
    timeout_s: float = 600.0,
) -> CheckpointImage | None:
    """Wait for the container's ready signal, then checkpoint it (it keeps running).

    ``cgroup_parent`` (the runtime's capability) says where to read the memory the container uses; without
    it the dump is taken without the size check.

    Returns None, with the reason logged, when the container ended or never said it was ready, or when
    the dump would not fit (see :func:`levers9.checkpoint.publish.dump_fits`): a checkpoint is an
    optimisation and never holds up or fails the task.
    """
    ready = host_dir / "ready"
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not ready.exists():
        state = await hooks.container_state(runtime, spec.container_id)
        if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
            log.info("%s ended before it was ready; no checkpoint", spec.container_id)
            return None
        if asyncio.get_running_loop().time() > deadline:
            log.warning("%s did not signal ready within %g s; no checkpoint", spec.container_id, timeout_s)
            return None
        await asyncio.sleep(0.05)
    usage = memory_in_use(spec.container_id, cgroup_parent)
    if usage is not None:
        why = dump_fits(usage, spec.memory_mib * 1024 * 1024, free_bytes)
        if why is not None:
            log.warning("not checkpointing %s: %s", spec.container_id, why)
            return None
    return await hooks.checkpoint(runtime, spec.container_id, str(image_dir), timeout=RESTORE_TIMEOUT_S)
