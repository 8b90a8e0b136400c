"""The levers9 hook specification: the one contract every plugin implements.

A plugin is a module (or object) registered under the ``levers9`` entry-point
group. Its entry-point name is the name operators write in config: a pool with
``provider: ec2`` is served by the plugin named ``ec2``, a pool with
``runtime: gvisor`` runs its containers through the plugin named ``gvisor``.

Hooks come in four families:

* **provider hooks**, called on the controlplane, only on the plugin a pool
  names as its ``provider``;
* **GPU discovery**: ``levers9_gpu_offers`` (per pool, from its provider) and
  ``levers9_gpu_devices`` (asked of every plugin on a worker machine, answers merged);
* **runtime hooks**, called on a worker, only on the plugin a pool names as its ``runtime``;
* **checkpoint hooks**, asked of every plugin with the runtime in question; the
  first plugin that answers (returns something other than None) wins, so a
  checkpointing plugin such as CRIU can serve another plugin's runtime (runc).

Every hook is a plain synchronous function: the core calls it in a worker
thread with a deadline, so a plugin may block on its SDK. A plugin that takes
fewer arguments than the spec lists gets only those. Hooks raise the typed
errors of :mod:`levers9.hooks.errors`; anything else is reported as a
:class:`~levers9.hooks.errors.PluginError` naming the plugin and the hook.

Each hook below says when it is called, what it must return, and which errors
it may raise. ``docs/plugins.md`` explains how to write a plugin from this alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from levers9.hooks.markers import hookspec

if TYPE_CHECKING:
    from pydantic import BaseModel

    from levers9.hooks.types import (
        CheckpointImage,
        CheckpointSupport,
        ContainerSpec,
        ContainerState,
        GpuDevice,
        GpuOffer,
        LogChunk,
        Machine,
        Pool,
        PreparedContainer,
        ProvisionRequest,
        RuntimeCapabilities,
        RuntimeContext,
    )

# --------------------------------------------------------------------------- provider hooks


@hookspec
def levers9_provider_settings() -> type[BaseModel]:
    """Declare this plugin a provider and return the pydantic model of its pool settings.

    Called when config is loaded. The ``settings:`` mapping of every pool that
    names this provider is validated with the returned model, and errors are
    reported with the config file's line numbers, so reject bad values here
    rather than at provisioning time. The validated instance reaches the other
    provider hooks as ``Pool.settings``. Must not import the provider's SDK.

    :returns: a ``pydantic.BaseModel`` subclass (use ``extra="forbid"`` so typos are caught).
    """
    raise NotImplementedError


@hookspec
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    """List the GPU machines this provider can start for ``pool``.

    Called by the scheduler to learn which GPU types a pool can supply and in
    which regions, and by ``levers9 pools``. Report ``availability`` and
    ``price_per_hour`` when the provider's API says; leave them unknown
    otherwise. Every ``gpu`` must be a canonical type (use
    :func:`levers9.gpu.normalize`). Return an empty list for a CPU-only pool.

    :raises AuthenticationFailed: the credentials were rejected.
    :raises Throttled: the API asked to slow down.
    """
    raise NotImplementedError


@hookspec
def levers9_provision(request: ProvisionRequest) -> Machine:
    """Start one machine for ``request.pool`` that will run a levers9 worker (or agent).

    Called by a pool controller when the backlog has nowhere to go or the pool
    is below ``min_workers``. Return as soon as the provider has accepted the
    request (state ``pending`` is fine): the machine proves it is up by
    registering with ``request.token``. Tag the machine with
    ``request.machine_id`` so ``levers9_list_machines`` can report it back.
    The machine's worker must only dial out to ``request.controlplane_url``.

    :raises InsufficientCapacity: no machine of this kind is free; the scheduler
        fails over to its next candidate at once.
    :raises QuotaExceeded: the account's limit is reached.
    :raises Throttled: retry later (``retry_after`` seconds if known).
    :raises AuthenticationFailed: credentials rejected.
    :raises InvalidRequest: the request can never succeed as asked.
    """
    raise NotImplementedError


@hookspec
def levers9_terminate(pool: Pool, provider_id: str) -> None:
    """Terminate the machine ``provider_id`` of ``pool``, and release everything it holds.

    Called when a worker is released, when it never registered in time, and by
    the reconciler for machines levers9 has no record of. Must be idempotent:
    terminating a machine that is already gone, or terminating twice, succeeds.

    :raises AuthenticationFailed: credentials rejected.
    :raises Throttled: retry later.
    """
    raise NotImplementedError


@hookspec
def levers9_list_machines(pool: Pool) -> list[Machine]:
    """List every machine the provider currently has for ``pool``, levers9's or not yet tagged.

    Called by the reconciler on a timer. Include machines that are still
    starting; leave out ones that are fully terminated. The reconciler
    terminates machines it has no record of, so report only machines that
    belong to this pool (filter by the tags ``levers9_provision`` set).

    :raises AuthenticationFailed: credentials rejected.
    :raises Throttled: retry later.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- GPU discovery on a machine


@hookspec
def levers9_gpu_devices() -> list[GpuDevice]:
    """List the GPUs present on this machine.

    Called once when a worker starts, on every plugin that implements it (an
    ``nvidia-smi`` reader, a kubelet device-plugin reader...); answers are
    merged by ``uuid``. A plugin that finds no tool to ask returns an empty
    list; one that finds the tool but cannot read it raises. A plugin that
    raises or exceeds its deadline is logged and left out; the others' answers
    are kept.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- runtime hooks


@hookspec
def levers9_runtime_settings() -> type[BaseModel]:
    """Declare this plugin a container runtime and return the pydantic model of its settings.

    Called when config is loaded; a pool's ``runtime_settings:`` mapping is
    validated with it and reaches the runtime hooks as ``RuntimeContext.settings``.
    """
    raise NotImplementedError


@hookspec
def levers9_runtime_capabilities(runtime: RuntimeContext) -> RuntimeCapabilities:
    """Say what this runtime can do on this host, and why not where it can't.

    Called when a worker starts and by ``levers9 plugins``. Must be cheap and
    must not fail because a binary is missing: report ``available=False`` with
    the reason instead.
    """
    raise NotImplementedError


@hookspec
def levers9_container_prepare(runtime: RuntimeContext, spec: ContainerSpec) -> PreparedContainer:
    """Make everything ``spec`` needs to run (bundle, root filesystem, cgroups, network) without starting it.

    Called by the worker for each container request, before either
    ``levers9_container_start`` or ``levers9_restore``.

    :raises InvalidRequest: the spec cannot be run by this runtime (missing image, GPUs on a CPU-only runtime).
    """
    raise NotImplementedError


@hookspec
def levers9_container_start(runtime: RuntimeContext, container: PreparedContainer) -> ContainerState:
    """Start a prepared container and return once its process is running (or has already exited).

    Called by the worker right after ``levers9_container_prepare`` for a cold
    start. A process that fails to start is reported as exited with its code,
    not raised, so the task's error carries the container's own output.
    """
    raise NotImplementedError


@hookspec
def levers9_container_state(runtime: RuntimeContext, container_id: str) -> ContainerState:
    """Report a container's state; ``oom_killed`` must be set when the memory limit killed it.

    Called by the worker's monitor while the container lives. An unknown id
    returns ``status=unknown`` rather than raising.
    """
    raise NotImplementedError


@hookspec
def levers9_container_kill(runtime: RuntimeContext, container_id: str, signal: int) -> None:
    """Send ``signal`` to the container's processes.

    Called when a task is cancelled or times out (SIGTERM, then SIGKILL after a
    grace period) and when the worker shuts down. Killing an exited or unknown
    container succeeds.
    """
    raise NotImplementedError


@hookspec
def levers9_container_logs(runtime: RuntimeContext, container_id: str, offset: int) -> LogChunk:
    """Return the container's combined stdout and stderr from byte ``offset``.

    Called repeatedly while logs are streamed; returns whatever is available
    now (possibly nothing) and never blocks waiting for more.
    """
    raise NotImplementedError


@hookspec
def levers9_container_remove(runtime: RuntimeContext, container_id: str) -> None:
    """Remove the container and everything prepared for it (bundle, mounts, cgroups, network namespace).

    Called after a container exits and its result and logs are collected, and
    on worker shutdown. Must be idempotent and must kill a container that is
    still running: nothing may be left behind.
    """
    raise NotImplementedError


@hookspec
def levers9_container_list(runtime: RuntimeContext) -> list[str]:
    """Return the ids of every container this runtime holds in ``runtime.state_dir``, running or not.

    Called when a worker starts on a state directory that a worker which died
    used (and by ``levers9 worker cleanup``), to remove what it left with
    ``levers9_container_remove``: a container is listed for as long as the
    runtime keeps anything of it (a record, a process, a bundle), so the
    worker never needs to know where or how a runtime keeps its containers.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- checkpoint hooks


@hookspec(firstresult=True)
def levers9_checkpoint_support(runtime: RuntimeContext) -> CheckpointSupport | None:
    """Say whether containers of ``runtime`` can be checkpointed on this host, and why not.

    Asked of every plugin; return None when this plugin does not checkpoint
    ``runtime.name`` at all, so another plugin may answer. When it does but the
    host cannot (a kernel CRIU does not support, say), return
    ``available=False`` with the tool's own reason: never pretend.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def levers9_checkpoint(runtime: RuntimeContext, container_id: str, image_dir: str) -> CheckpointImage | None:
    """Checkpoint a running container into ``image_dir`` and leave it running.

    Return None when this plugin does not checkpoint ``runtime.name``.

    :raises CheckpointUnavailable: this host cannot checkpoint (with the reason).
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def levers9_restore(
    runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage
) -> ContainerState | None:
    """Start a prepared container from a checkpoint instead of cold.

    Return None when this plugin does not checkpoint ``runtime.name``.

    :raises RestoreFailed: the image is unusable or the restore did not come up;
        the worker then starts the container cold and marks the checkpoint failed.
        Clean up whatever the failed restore left before raising.
    """
    raise NotImplementedError
