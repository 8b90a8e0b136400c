"""Starting one warm container of a checkpointed stub: from the stub's checkpoint, or cold and then snapshotted.

The worker's warm pool (:mod:`levers9.worker.warm.launch`) decides *whether* a
container boots this way (:func:`wants_checkpoint`) and connects to its runner
afterwards; this module does the start in between:

1. the container gets a signal directory (see :meth:`Checkpointing.prepare_spec`):
   no network, the runner on a unix socket there;
2. it is restored from the stub's newest usable checkpoint, or started cold;
3. the first cold container of a stub on this worker is checkpointed once its
   handler has loaded (the image is published in the background);
4. the go file, holding this container's token, lets the runner carry on: a
   restored runner remembers its original's token, so it learns its own here.

What was done so far is marked on the caller's container (:class:`BootMarks`)
as it happens, so a start that fails half way is still cleaned up in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from levers9.checkpoint.snapshot import Checkpointing
from levers9.files import write_atomic
from levers9.hooks.facade import Hooks
from levers9.hooks.types import ContainerSpec, RuntimeCapabilities, RuntimeContext

__all__ = ["GO_FILE", "BootMarks", "boot_checkpointed", "wants_checkpoint"]

#: the file, in the signal directory, whose appearance lets the runner go on; it holds the container's token
GO_FILE = "go"


class BootMarks(Protocol):
    """What a container's owner must know to clean up after a start that failed half way."""

    #: the runtime was asked to prepare it: it must be removed
    prepared: bool
    #: it was started: it must be stopped before it is removed
    started: bool


async def wants_checkpoint(
    checkpointing: Checkpointing | None,
    hooks: Hooks,
    runtime: RuntimeContext,
    capabilities: RuntimeCapabilities,
    *,
    enabled: bool,
) -> bool:
    """Whether a stub's container boots through :func:`boot_checkpointed`.

    Only when the stub asks (``enabled``), the worker has checkpoint storage, the runtime gives containers
    a filesystem of their own (the signal directory is a mount) and it says it can checkpoint here.
    """
    if checkpointing is None or not enabled or capabilities.host_filesystem:
        return False
    return await checkpointing.available(hooks, runtime)


async def boot_checkpointed(
    checkpointing: Checkpointing,
    hooks: Hooks,
    runtime: RuntimeContext,
    capabilities: RuntimeCapabilities,
    spec: ContainerSpec,
    *,
    marks: BootMarks,
    signal_dir: Path,
    images_dir: Path,
    workspace_id: str,
    stub_id: str,
    token: str,
    timeout_s: float,
) -> None:
    """Start ``spec``'s container from the stub's checkpoint, or cold and then checkpoint it once loaded.

    Raises ``Levers9Error`` (the runtime failed) or ``TimeoutError`` (the start took over ``timeout_s``);
    a checkpoint that cannot be restored or taken never raises (see :mod:`levers9.checkpoint.restore`).
    """
    spec = checkpointing.prepare_spec(spec, signal_dir)
    marks.prepared = True
    started = await checkpointing.start(hooks, runtime, spec, stub_id=stub_id, timeout=timeout_s)
    marks.started = True
    if started.restored_from is None and stub_id not in checkpointing.taken:
        checkpointing.taken.add(stub_id)
        await checkpointing.snapshot(
            hooks,
            runtime,
            spec,
            signal_dir=signal_dir,
            images=images_dir,
            workspace_id=workspace_id,
            stub_id=stub_id,
            cgroup_parent=capabilities.cgroup_parent,
        )
    write_atomic(signal_dir / GO_FILE, token.encode(), mode=0o600)
