"""Checkpointed function containers: the first one is snapshotted once loaded, later ones start from it.

A stub with ``checkpoint_enabled`` gets containers that talk to the worker
over a unix socket in their signal directory (``/run/levers9``, bind-mounted
from the worker) instead of TCP, and have no network: gVisor checkpoints only
a sandbox with no host connection open. The runner loads the function, creates
the ready file and waits for the go file; the worker checkpoints it in
between (it keeps running), then says go. A restored container carries on from
that same wait, so it is told go at once.

The image goes to the node cache and the workspace's storage, and the
controlplane records it (:meth:`WorkerStub.RecordCheckpoint`), so the next
cold start of the stub anywhere restores it. Nothing here can fail a call: a
checkpoint that cannot be taken is logged and skipped, and a restore that
fails starts the container cold and marks the checkpoint ``restore_failed``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.publish import publish
from levers9.checkpoint.record import CheckpointRecord, CheckpointStatus
from levers9.checkpoint.restore import READY_DIR, Started, checkpoint_when_ready, start_container
from levers9.checkpoint.storage import CheckpointStorage
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import ContainerSpec, Mount, RuntimeContext
from levers9.runner import main as runner

__all__ = ["SIGNAL_SOCKET", "Checkpointing", "RecordStore"]

log = logging.getLogger(__name__)

#: the runner's socket, in the signal directory
SIGNAL_SOCKET = "runner.sock"


class RecordStore:
    """What :func:`publish` and :func:`start_container` need of a checkpoint store, answered by the controlplane.

    ``call(request)`` sends a ``RecordCheckpointRequest`` and answers the ``CheckpointRef``.
    """

    def __init__(self, call: Any) -> None:
        self._call = call

    async def create(
        self,
        workspace_id: str,
        runtime: str,
        *,
        stub_id: str | None = None,
        task_id: str | None = None,
        gpu: str | None = None,
    ) -> CheckpointRecord:
        from levers9.proto.v1 import worker_pb2

        ref = await self._call(
            worker_pb2.RecordCheckpointRequest(stub_id=stub_id or "", runtime=runtime, gpu=gpu or "")
        )
        return record_of(ref)

    async def set_status(
        self,
        checkpoint_id: str,
        status: str,
        *,
        path: str | None = None,
        size_bytes: int | None = None,
        error: str | None = None,
    ) -> CheckpointRecord:
        from levers9.proto.v1 import worker_pb2

        ref = await self._call(
            worker_pb2.RecordCheckpointRequest(
                checkpoint_id=checkpoint_id,
                status=status,
                path=path or "",
                size_bytes=size_bytes or 0,
                error=error or "",
            )
        )
        return record_of(ref)


def record_of(ref: Any) -> CheckpointRecord:
    """A ``CheckpointRef`` as the record type the checkpoint functions take (times are not sent: now)."""
    now = datetime.now(UTC)
    return CheckpointRecord(
        id=ref.id,
        workspace_id=ref.workspace_id,
        stub_id=ref.stub_id or None,
        task_id=None,
        status=CheckpointStatus(ref.status),
        runtime=ref.runtime,
        gpu=ref.gpu or None,
        path=ref.path or None,
        size_bytes=ref.size_bytes or None,
        error=None,
        created_at=now,
        updated_at=now,
    )


@dataclass
class Checkpointing:
    """A worker's means to checkpoint and restore: where images go, its cache, and the controlplane's record."""

    store: RecordStore
    storage: CheckpointStorage
    cache: NodeCache
    #: the newest checkpoint of each stub this worker knows of (sent with the stub, or taken here)
    latest: dict[str, CheckpointRecord] = field(default_factory=dict)
    #: stubs whose checkpoint this worker has taken or is taking: one per stub is enough
    taken: set[str] = field(default_factory=set)
    _support: dict[str, bool] = field(default_factory=dict)
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    async def available(self, hooks: Hooks, runtime: RuntimeContext) -> bool:
        """Whether the runtime can checkpoint here (asked once; the reason is logged once)."""
        if runtime.name not in self._support:
            try:
                support = await hooks.checkpoint_support(runtime, timeout=30)
            except Levers9Error as exc:
                self._support[runtime.name] = False
                log.warning("runtime %s cannot say whether it checkpoints (%s); no checkpoints", runtime.name, exc)
            else:
                self._support[runtime.name] = support.available
                if not support.available:
                    log.warning("runtime %s cannot checkpoint here: %s", runtime.name, support.reason)
        return self._support[runtime.name]

    @staticmethod
    def prepare_spec(spec: ContainerSpec, signal_dir: Path) -> ContainerSpec:
        """``spec`` talking over a unix socket in ``signal_dir`` (mounted at /run/levers9), with no network."""
        signal_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = {
            **spec.env,
            runner.ENV_READY: f"{READY_DIR}/ready",
            runner.ENV_GO: f"{READY_DIR}/go",
            runner.ENV_SOCKET: f"{READY_DIR}/{SIGNAL_SOCKET}",
        }
        env.pop(runner.ENV_PORT, None)
        mounts = [*spec.mounts, Mount(source=str(signal_dir), target=READY_DIR, read_only=False)]
        return spec.model_copy(
            update={"env": env, "mounts": mounts, "network": "none", "ports": [], "checkpointable": True}
        )

    async def start(
        self, hooks: Hooks, runtime: RuntimeContext, spec: ContainerSpec, *, stub_id: str, timeout: float
    ) -> Started:
        """Start the container, from the stub's newest checkpoint of this runtime when there is one."""
        record = self.latest.get(stub_id)
        if record is not None and (record.runtime != runtime.name or record.status != CheckpointStatus.AVAILABLE):
            record = None
        started = await asyncio.wait_for(
            start_container(
                hooks,
                runtime,
                spec,
                checkpoint=record,
                checkpoints=self.store,
                storage=self.storage,
                cache=self.cache,
            ),
            timeout,
        )
        if started.restore_error is not None:
            self.latest.pop(stub_id, None)
        return started

    async def snapshot(
        self,
        hooks: Hooks,
        runtime: RuntimeContext,
        spec: ContainerSpec,
        *,
        signal_dir: Path,
        images: Path,
        workspace_id: str,
        stub_id: str,
        cgroup_parent: str | None = None,
    ) -> None:
        """Checkpoint a freshly started container once it is loaded; publish the image in the background.

        ``cgroup_parent`` is the runtime's (see :func:`~levers9.checkpoint.restore.memory_in_use`).
        """
        image_dir = images / spec.container_id
        try:
            image = await checkpoint_when_ready(
                hooks,
                runtime,
                spec,
                host_dir=signal_dir,
                image_dir=image_dir,
                free_bytes=self.cache.free_bytes(),
                cgroup_parent=cgroup_parent,
            )
        except Levers9Error as exc:
            log.warning("checkpointing %s of stub %s failed: %s", spec.container_id, stub_id, exc)
            shutil.rmtree(image_dir, ignore_errors=True)
            return
        if image is None:
            shutil.rmtree(image_dir, ignore_errors=True)
            return
        task = asyncio.create_task(self._publish(image, workspace_id, stub_id, image_dir), name=f"publish {stub_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _publish(self, image: Any, workspace_id: str, stub_id: str, image_dir: Path) -> None:
        try:
            record = await publish(
                image,
                workspace_id=workspace_id,
                stub_id=stub_id,
                task_id=None,
                gpu=None,
                store=self.store,
                storage=self.storage,
                cache=self.cache,
            )
        except Exception as exc:
            log.warning("the checkpoint of stub %s was not stored: %s", stub_id, exc)
        else:
            self.latest[stub_id] = record
        finally:
            shutil.rmtree(image_dir, ignore_errors=True)

    async def close(self) -> None:
        """Wait for uploads under way (an image half stored is marked failed by publish itself)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=60)
