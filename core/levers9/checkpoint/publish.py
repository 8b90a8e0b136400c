"""Moving an image between a node and the workspace's storage, and deciding whether one is worth taking.

:func:`publish` records a fresh image, keeps it in the node cache and uploads
it; the record turns ``available`` only once the upload is complete, so no
start anywhere tries an image that is not fully stored. :func:`fetch_for_start`
brings a recorded image to this node for a restore. :func:`dump_fits` says why
a container's dump would not fit (in its memory limit on restore, or on the
node's disk) before any dump is taken.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.record import CheckpointRecord, CheckpointStatus
from levers9.checkpoint.storage import CheckpointMissing, CheckpointRecorder, CheckpointStorage, storage_key
from levers9.hooks.types import CheckpointImage

__all__ = ["dump_fits", "fetch_for_start", "publish"]

log = logging.getLogger(__name__)

#: the most of an error message kept in the database
_ERROR_LIMIT = 2000


def _describe_error(exc: BaseException) -> str:
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:_ERROR_LIMIT]


async def _evict_quietly(cache: NodeCache) -> None:
    """Trim the cache; a failure here must not fail the checkpoint or the start that caused it."""
    try:
        await asyncio.to_thread(cache.evict, 1)
    except Exception:
        log.exception("trimming the checkpoint cache %s failed", cache.root)


async def publish(
    image: CheckpointImage,
    *,
    workspace_id: str,
    stub_id: str | None,
    task_id: str | None,
    gpu: str | None,
    store: CheckpointRecorder,
    storage: CheckpointStorage,
    cache: NodeCache,
) -> CheckpointRecord:
    """Record a fresh image, keep it in the node cache and upload it; only then can other tasks restore it.

    The record stays ``pending`` until the upload is complete, so no start
    anywhere tries an image that is not fully stored. Any failure marks it
    ``failed`` with the reason (for the operator) and is raised again; the
    node's copy is dropped then, as nothing will ever restore it.
    """
    record = await store.create(workspace_id, image.runtime, stub_id=stub_id, task_id=task_id, gpu=gpu)
    key = storage_key(workspace_id, stub_id, record.id)
    uploaded = False
    try:
        local = await asyncio.to_thread(cache.adopt, record.id, Path(image.path))
        size = await asyncio.to_thread(storage.put_dir, key, local)
        uploaded = True
        record = await store.set_status(record.id, CheckpointStatus.AVAILABLE.value, path=key, size_bytes=size)
    except BaseException as exc:
        await _mark_failed(record, exc, key=key, uploaded=uploaded, store=store, storage=storage, cache=cache)
        raise
    log.info("checkpoint %s stored at %s (%d bytes)", record.id, f"{storage.describe()} {key}", size)
    await _evict_quietly(cache)
    return record


async def _mark_failed(
    record: CheckpointRecord,
    exc: BaseException,
    *,
    key: str,
    uploaded: bool,
    store: CheckpointRecorder,
    storage: CheckpointStorage,
    cache: NodeCache,
) -> None:
    """Best effort on every step: the original failure is what the caller must see, not a second one."""
    log.warning("checkpoint %s could not be published to %s: %s", record.id, storage.describe(), exc)
    try:
        await store.set_status(record.id, CheckpointStatus.FAILED.value, error=_describe_error(exc))
    except Exception:
        log.exception("could not mark checkpoint %s failed", record.id)
    try:
        if uploaded:
            await asyncio.to_thread(storage.delete, key)
        await asyncio.to_thread(cache.remove, record.id)
    except Exception:
        log.exception("could not clean up after checkpoint %s", record.id)


async def fetch_for_start(record: CheckpointRecord, *, storage: CheckpointStorage, cache: NodeCache) -> CheckpointImage:
    """The image to restore ``record`` from, as a directory on this node (downloaded only when not cached).

    To keep eviction away while the runtime reads it, restore inside
    ``cache.hold(record.id)``.
    """
    if record.path is None:
        raise CheckpointMissing(f"checkpoint {record.id} has no stored image (it is {record.status})")
    local = await asyncio.to_thread(cache.fetch, record.id, storage, record.path)
    await _evict_quietly(cache)
    return CheckpointImage(
        checkpoint_id=record.id,
        runtime=record.runtime,
        path=str(local),
        size_bytes=record.size_bytes or 0,
        created_at=record.created_at,
    )


# --------------------------------------------------------------------------- should a checkpoint be taken at all


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1024
    return f"{value:.1f} TiB"


def dump_fits(memory_usage_bytes: int, memory_limit_bytes: int, free_cache_bytes: int) -> str | None:
    """Why a checkpoint of a container using ``memory_usage_bytes`` should not be taken, or None when it fits.

    The dump is about the size of the memory in use. Restoring brings all of
    it back at once, so a container over its limit (page cache counted by its
    cgroup, say) would be killed on restore; and the dump must fit on the node's
    disk beside the cache. A limit of 0 or less means the container has none.
    """
    if memory_usage_bytes < 0 or free_cache_bytes < 0:
        raise ValueError("memory in use and free space cannot be negative")
    if 0 < memory_limit_bytes < memory_usage_bytes:
        return (
            f"the dump (~{_human(memory_usage_bytes)}, the memory in use) would not fit in the container's "
            f"memory limit ({_human(memory_limit_bytes)}) when restored"
        )
    if memory_usage_bytes > free_cache_bytes:
        return (
            f"the dump (~{_human(memory_usage_bytes)}, the memory in use) would not fit in the "
            f"{_human(free_cache_bytes)} free for the node's checkpoint cache"
        )
    return None
