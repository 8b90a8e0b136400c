"""The levers9 hook specification: the one contract every plugin implements.

A plugin is an object whose ``levers9_*`` methods are its hooks (every
built-in provider and runtime), or a module of ``levers9_*`` functions (what
plugins written before objects were recommended are), registered under the
``levers9`` entry-point group. Its entry-point name is the name operators
write in config: a pool with ``provider: ec2`` is served by the plugin named
``ec2``, a pool with ``runtime: gvisor`` runs its containers through the
plugin named ``gvisor``.

Hooks come in five families:

* **provider hooks**, called on the controlplane, only on the plugin a pool
  names as its ``provider``;
* **machine identity**: ``levers9_machine_identity`` on a worker (only the
  plugin its ``LEVERS9_MACHINE_IDENTITY`` names) makes a provider-signed proof
  of which machine it runs on, which the pool's provider checks in
  ``levers9_verify_identity`` before the machine's join token is spent;
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

The spec has an edition, :data:`SPEC_VERSION`. A plugin declares the edition it
was written to as ``LEVERS9_SPEC_VERSION`` (a class attribute of a plugin
object, or a module attribute of a module plugin); the manager checks it at
load (:mod:`levers9.hooks.manager`). A change that would break plugins of the
current edition raises it; a hook on its way out stays in the spec, marked with
pluggy's ``warn_on_impl``, so plugins that implement it load with a warning
naming them until the next edition removes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from levers9.hooks.markers import hookspec

if TYPE_CHECKING:
    from pydantic import BaseModel

    from levers9.hooks.context import PluginContext
    from levers9.hooks.types import (
        CheckpointImage,
        CheckpointSupport,
        ContainerSpec,
        ContainerState,
        GpuDevice,
        GpuOffer,
        LayerDiff,
        LogChunk,
        Machine,
        MachineIdentity,
        Pool,
        PreparedContainer,
        ProviderCheck,
        ProvisionRequest,
        RuntimeCapabilities,
        RuntimeContext,
    )

#: the edition of this spec; the first edition (``levers9_terminate(pool, provider_id)``, the machine's
#: token and controlplane address loose in ``ProvisionRequest``) is no longer accepted
SPEC_VERSION = 2

#: what changed since each edition the manager no longer loads, for the message that refuses such a plugin
RETIRED_EDITIONS: dict[int, str] = {
    1: (
        "since the first edition, levers9_terminate takes the Machine (not its provider_id); ProvisionRequest "
        "carries a WorkerBootstrap (token, controlplane URL and CA moved into it), an offer and the region; "
        "Machine gained provider_data, zone, reason and the preempted and failed states; and "
        "levers9_check, levers9_startup and levers9_shutdown were added"
    ),
}

# --------------------------------------------------------------------------- lifecycle


@hookspec
def levers9_startup(ctx: PluginContext) -> None:
    """Called once on each controlplane replica after config is loaded, before any other hook of this plugin.

    ``ctx`` is this plugin's handle on what the core owns: its logger and
    metrics (named for the plugin), a dict for its own state, and the agent
    hub (send an order to an agent and await its acknowledgement, read the
    agents' inventories). Keep ``ctx`` for later hooks. A plugin that raises
    here is marked unhealthy with the error and its pools are skipped; the
    other plugins start normally.
    """
    raise NotImplementedError


@hookspec
def levers9_shutdown(ctx: PluginContext) -> None:
    """Called once when the replica stops; release what ``levers9_startup`` took (threads, sessions).

    Machines are not terminated in this hook: another replica (or this one
    restarted) reconciles them. `levers9 up` terminates its own pools' machines
    before (``levers9_terminate``), except with ``--keep-machines``.
    """
    raise NotImplementedError


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
def levers9_check(pool: Pool) -> ProviderCheck:
    """Say whether this provider's credentials and settings work for ``pool``; optional, must be cheap.

    Called by ``levers9 check``. Make one read-only call (describe the region,
    list instance types, read the namespace) and report what it said; never
    start anything. Return ``ok=False`` with a ``hint`` rather than raising for
    the failures an operator can fix; a raised typed error is shown as it is.
    """
    raise NotImplementedError


@hookspec
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    """List the machines with GPUs this provider can start for ``pool``: one offer per (instance type, zone, spot).

    Called by the planner (cached for ``scheduler.offers_ttl_s`` and refreshed
    in the background; a failure keeps the last good answer), by
    ``levers9 offers`` and ``levers9 pools``. Only offers in ``pool.regions``
    (every region, when the pool names none), of ``pool.gpu`` and
    ``pool.gpu_count``. Report ``availability`` and ``price_per_hour`` when the
    provider's API says; leave them unknown otherwise. Every ``gpu`` must be a
    canonical type (use :func:`levers9.gpu.normalize`). Return an empty list
    for a CPU-only pool. The planner tries offers in the order returned (or
    cheapest first, with ``strategy: cheapest``), passes the chosen one in
    ``ProvisionRequest.offer``, and on ``InsufficientCapacity`` marks only that
    offer unavailable and tries the pool's next offer.

    :raises AuthenticationFailed: the credentials were rejected.
    :raises PermissionDenied: the credentials may not list offers.
    :raises Throttled: the API asked to slow down.
    """
    raise NotImplementedError


@hookspec
def levers9_provision(request: ProvisionRequest) -> Machine:
    """Start one machine for ``request.pool`` that will run a levers9 worker (or agent).

    Called by the planner when the backlog has nowhere to go or the pool is
    below ``min_workers``. Start what ``request.offer`` names (instance type,
    region, zone, spot) when there is an offer, else the pool's own shape in
    ``request.region``. Pass ``request.bootstrap`` to the machine as it is:
    :func:`levers9.bootstrap.cloud_init` as a VM's user data, or
    :func:`levers9.bootstrap.container_spec` for a pod or container; the
    machine proves it is up by registering with the bootstrap's token. Tag the
    machine with ``request.machine_id`` (and the pool name) so
    ``levers9_list_machines`` can report it back, and put in
    ``Machine.provider_data`` whatever ``levers9_terminate`` will need to find
    it (its zone, say). Return as soon as the provider has accepted the request
    (state ``pending`` is fine). Idempotent per ``request.machine_id``: a retry
    after a timeout returns the machine already started for it.

    :raises InsufficientCapacity: no machine of this offer is free; the scheduler
        tries the pool's next offer, then the next pool, at once.
    :raises QuotaExceeded: the account's limit is reached.
    :raises BillingRefused: the account is not paid for (no balance, a declined card); the pool is skipped whole.
    :raises Throttled: retry later (``retry_after`` seconds if known).
    :raises AuthenticationFailed: credentials rejected.
    :raises PermissionDenied: credentials accepted, the action denied (IAM, RBAC).
    :raises InvalidRequest: the request can never succeed as asked.
    """
    raise NotImplementedError


@hookspec
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    """Terminate ``machine`` of ``pool``, and release everything it holds.

    ``machine`` is what ``levers9_provision`` or ``levers9_list_machines``
    returned (its ``provider_id``, ``region``, ``zone`` and ``provider_data``),
    as levers9 stored it. Called when a worker is released, when it never
    registered in time, and by the reconciler for machines levers9 has no
    record of. Must be idempotent: terminating a machine that is already gone,
    that was never known (an unknown id), or terminating twice, succeeds.

    :raises AuthenticationFailed: credentials rejected.
    :raises PermissionDenied: the credentials may not terminate.
    :raises Throttled: retry later.
    """
    raise NotImplementedError


@hookspec
def levers9_list_machines(pool: Pool) -> list[Machine]:
    """List every machine the provider currently has for ``pool``, levers9's or not yet tagged.

    Called by the reconciler on a timer. Include machines that are still
    starting; leave out ones that are fully terminated (a provider that keeps
    them listed for a while reports them ``terminated``, never ``running``).
    Report a spot interruption as ``preempted`` and a machine that will never
    run as ``failed`` (with ``reason``): their calls are requeued at once
    instead of after the workers' keepalive timeout. The reconciler terminates
    machines it has no record of, so report only machines that belong to this
    pool (filter by the tags ``levers9_provision`` set).

    :raises AuthenticationFailed: credentials rejected.
    :raises Throttled: retry later.
    """
    raise NotImplementedError


@hookspec
def levers9_verify_identity(pool: Pool, machine: Machine, identity: MachineIdentity | None) -> None:
    """Check that a worker registering with ``machine``'s join token runs on that very machine; optional.

    Called on the controlplane, on the pool's provider only, when a worker
    registers with a machine's join token (never with its session
    credential), before the token is spent. ``identity`` is what the worker's
    ``levers9_machine_identity`` made (None when it sent none); ``machine`` is
    levers9's record of the machine (``provider_id``, ``region``, ``zone``,
    ``provider_data``). Return None when the identity proves the worker runs
    on ``machine``; raise ``IdentityRejected`` saying what did not match
    otherwise, and the registration is refused with the token unspent. A
    provider without this hook binds nothing: the token alone admits the worker.
    Must be quick and should not call the provider's API (a signature check).

    :raises IdentityRejected: the identity is missing, unsigned, or names another machine.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- on a worker machine


@hookspec
def levers9_machine_identity() -> MachineIdentity:
    """Fetch the provider-signed proof of which machine this is, for the worker's first registration.

    Called on a worker, once before it registers, only on the plugin its
    ``LEVERS9_MACHINE_IDENTITY`` variable names (the provider's boot script
    sets it, for example ``ec2``, whose answer is the instance identity
    document and its signature from the instance metadata service). The
    controlplane checks the answer with the same plugin's
    ``levers9_verify_identity``. Retry briefly on the machine's own metadata
    service; raise ``ProviderError`` when it cannot be had, and the worker
    registers without it (and is refused where the provider binds tokens).
    """
    raise NotImplementedError


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


@hookspec
def levers9_container_changes(runtime: RuntimeContext, container_id: str, dest: str) -> LayerDiff | None:
    """Write what a container changed in its root filesystem to ``dest`` as one OCI layer tar.

    Called by the image builder on a worker after a build step's container has
    exited and before ``levers9_container_remove``, and by the worker on a
    running sandbox's container (a sandbox's filesystem made an image); only on
    the runtime a pool names. A running container's changes must be one moment's
    view: pause it while they are read and resume it after (it keeps running),
    or refuse it. Write an uncompressed tar at ``dest`` (a path the caller chose, not
    yet existing) holding every file the container added or changed, a
    ``.wh.<name>`` whiteout for each one it deleted and ``.wh..wh..opq`` in
    each directory it replaced whole; owners as the container saw them (its
    root is uid 0 even in a user namespace), and nothing of the runtime's own
    mount points (an empty directory or file made only to mount on). Return
    its ``sha256`` diff id and size. Return None when this runtime cannot say
    what a container changed (a plugin that does not implement the hook is
    treated the same): the builder then refuses to build on it.

    :raises InvalidRequest: the container is unknown, or it runs and cannot be paused.
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
