"""Typed data objects passed through the hook spec.

Every argument and result of a hook is one of these (or a list of them), so a
plugin author sees exactly what they receive and what they must return, and the
core validates what comes back before using it. They are immutable: a plugin
that wants to change one builds a new one with ``model_copy(update=...)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from levers9.hooks.errors import InvalidRequest


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- provisioning


class Pool(_Frozen):
    """A pool as a provider sees it: the operator's config for it, with the provider's settings already validated."""

    name: str
    provider: str
    runtime: str
    #: canonical GPU type (see ``levers9 gpu normalize``), or None for a CPU pool
    gpu: str | None = None
    #: GPUs per worker machine
    gpu_count: int = 0
    #: the first of ``regions``: where the pool's machines go unless an offer names another region
    region: str | None = None
    #: every region the operator lets this pool use, in preference order (config's ``region`` or ``regions``);
    #: the single source: a provider reads its regions here, never from its own settings
    regions: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    preemptible: bool = False
    #: how offers of one preference group are ordered: ``preference`` keeps the provider's order,
    #: ``cheapest`` puts offers with the lowest price first (offers without a price last)
    strategy: Literal["preference", "cheapest"] = "preference"
    #: the workspace that owns the pool (an attached cluster, a workspace's joined machines); None for the
    #: operator's shared pools. Providers backed by agents serve a pool only with its workspace's agents.
    workspace: str | None = None
    #: the provider's settings, an instance of the model its ``levers9_provider_settings`` returned
    settings: Any = None


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def settings_of(pool: Pool, model: type[SettingsT]) -> SettingsT:
    """``pool.settings`` as the provider's settings model, so a provider never casts ``Any`` by hand.

    The core hands a provider the instance its ``levers9_provider_settings``
    returned: that instance is returned as it is. A pool built by hand (tests,
    tools) may carry the raw mapping or nothing; that is validated through
    ``model`` here. Anything else (another provider's model, a string) is a
    pool routed to the wrong provider or a broken tool: :class:`InvalidRequest`
    naming the pool, its provider and the model it should have held, not an
    ``AttributeError`` deep in the provider.
    """
    settings = pool.settings
    if isinstance(settings, model):
        return settings
    if settings is None or isinstance(settings, Mapping):
        try:
            return model.model_validate(settings or {})
        except ValidationError as exc:
            raise InvalidRequest(
                f"pool {pool.name!r}: its settings are not valid {model.__name__}: {exc}", plugin=pool.provider
            ) from exc
    raise InvalidRequest(
        f"pool {pool.name!r}: its settings are a {type(settings).__name__}, "
        f"but provider {pool.provider!r} takes {model.__name__} (or a mapping of its fields)",
        plugin=pool.provider,
    )


class Resources(_Frozen):
    """What one worker machine must have."""

    #: CPU in millicores (1000 = one core)
    cpu_millicores: int = Field(1000, ge=1)
    memory_mib: int = Field(1024, ge=1)
    gpu: str | None = None
    gpu_count: int = Field(0, ge=0)


class WorkerBootstrap(_Frozen):
    """Everything a booted machine needs to start its levers9 worker, and nothing else.

    The worker reads exactly these fields (as the ``LEVERS9_*`` variables
    :func:`levers9.bootstrap.worker_environment` names) and nothing a provider
    invents. A VM provider passes :func:`levers9.bootstrap.cloud_init` (or
    :func:`levers9.bootstrap.shell_script`) as the machine's user data; a
    container provider runs :func:`levers9.bootstrap.container_spec`.
    """

    #: where the worker dials, for example ``grpcs://cp.example.com:1993``; several replicas' addresses are
    #: separated by commas (``grpcs://a:1993,grpcs://b:1993``) and the worker moves to the next on failure
    controlplane_url: str
    #: PEM CA bundle that verifies the controlplane's certificate; empty: the system trust store
    controlplane_ca: str = ""
    #: the machine's credential: single-use to register, scoped to this one machine, expiring with the
    #: registration deadline; never log it, never put it on a command line
    token: str = Field(repr=False)
    #: levers9's id for the machine (also ``ProvisionRequest.machine_id``)
    machine_id: str
    pool: str
    #: the levers9 version the worker must run (the controlplane's own)
    levers9_version: str
    #: the worker image to run where the machine runs containers (``ghcr.io/levers9/worker:0.9.0``);
    #: None: install levers9's own wheel (``wheel_url``) with pip on the machine
    worker_image: str | None = None
    #: levers9's own wheel on the controlplane's HTTP listener (``/api/v1/wheels/...``) and its sha256 (hex):
    #: what a machine without levers9 or Docker installs, the hash checked; never ``levers9`` by name from a
    #: package index (that name is another project's there). Empty: such a machine cannot start a worker
    wheel_url: str = ""
    wheel_sha256: str = ""
    #: the worker's settings as its ``LEVERS9_*`` variables (sizes, GPUs it may use, disconnect exit...):
    #: only names :data:`levers9.worker_variables.WORKER_VARIABLES` lists
    environment: dict[str, str] = Field(default_factory=dict)
    #: labels the worker reports (the pool's labels and the provider's own)
    labels: dict[str, str] = Field(default_factory=dict)
    #: the pool's runtime (``Pool.runtime``): a ``runc`` or ``gvisor`` worker container gets what running
    #: containers of its own needs (:mod:`levers9.worker_container`), and the boot script makes sure ``runc``
    #: is on the machine; the default keeps a bootstrap made without it (a third party's) a ``process`` one
    runtime: str = "process"


class ProvisionRequest(_Frozen):
    """Everything a provider needs to start one worker machine for a pool."""

    pool: Pool
    resources: Resources
    #: levers9's own id for the machine; providers tag what they create with it
    #: (``levers9:machine-id``) so the reconciler can match it later
    machine_id: str
    #: how the machine starts its worker; pass it to the machine as it is (see :mod:`levers9.bootstrap`)
    bootstrap: WorkerBootstrap
    #: the region to start in: the offer's region when there is an offer, else the pool's first region
    region: str | None = None
    #: the offer the scheduler chose (instance type, zone, spot, price), or None when the provider
    #: made no offers (a CPU pool) and the pool's own shape is all there is
    offer: GpuOffer | None = None


class MachineState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"
    #: the provider took the machine back (a spot interruption): its calls are requeued at once
    PREEMPTED = "preempted"
    #: the machine will never run (a failed launch, a host fault): it is terminated and its calls requeued
    FAILED = "failed"
    UNKNOWN = "unknown"


#: states in which a machine is no longer of any use; the reconciler ends its record at once
ENDED_STATES = frozenset({MachineState.TERMINATED, MachineState.PREEMPTED, MachineState.FAILED})

#: the most bytes ``Machine.provider_data`` may take as JSON
PROVIDER_DATA_MAX_BYTES = 4096


class Machine(_Frozen):
    """A machine as the provider reports it."""

    #: the provider's id for it (EC2 instance id, OCI instance OCID, Lambda instance id, pod name...)
    provider_id: str
    #: levers9's id, read back from the machine's tags; None for a machine levers9 did not tag
    machine_id: str | None = None
    pool: str
    state: MachineState = MachineState.PENDING
    gpu: str | None = None
    gpu_count: int = 0
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    address: str | None = None
    created_at: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: what the provider needs to find the machine again (its zone, compartment, cluster...): small JSON
    #: (at most ``PROVIDER_DATA_MAX_BYTES``), stored with levers9's record and handed back to
    #: ``levers9_terminate`` and to the reconciler. One key levers9 reads: ``reachable``. ``False`` for a
    #: machine nothing can connect into (a container marketplace's pod publishing no port, a machine behind
    #: NAT): its worker then serves through a tunnel and is never dialled (:mod:`levers9.services.tunnels`);
    #: ``True``: dialled without trying first; absent: tried once when the worker registers
    provider_data: dict[str, Any] = Field(default_factory=dict)
    #: why the machine is ``failed`` or ``preempted``, in the provider's words
    reason: str | None = None


# --------------------------------------------------------------------------- GPUs


class Availability(StrEnum):
    AVAILABLE = "available"
    LIMITED = "limited"
    UNAVAILABLE = "unavailable"
    UNKNOWN = "unknown"


#: the most keys :attr:`GpuOffer.details` may hold
OFFER_DETAILS_MAX_KEYS = 16
#: what a key of :attr:`GpuOffer.details` must look like: lower case, digits and ``_``, 32 characters at most
OFFER_DETAILS_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: the longest value :attr:`GpuOffer.details` may hold, in characters
OFFER_DETAILS_MAX_VALUE_CHARS = 200


class GpuOffer(_Frozen):
    """One kind of GPU machine a provider can start for a pool."""

    #: canonical GPU type
    gpu: str
    #: GPUs per machine
    gpu_count: int = Field(ge=1)
    #: memory of one GPU
    gpu_memory_mib: int = Field(ge=1)
    region: str | None = None
    #: the availability zone (or OCI availability domain) when the provider places by zone
    zone: str | None = None
    #: the provider's name for the machine kind (``p5.48xlarge``, ``BM.GPU.H100.8``, ``gpu_8x_h100_sxm5``)
    instance_type: str | None = None
    cpu_millicores: int | None = None
    memory_mib: int | None = None
    availability: Availability = Availability.UNKNOWN
    #: US dollars per machine-hour, when the provider publishes it
    price_per_hour: float | None = Field(None, ge=0)
    spot: bool = False
    #: facts of the offer that have no field of their own, for people to read (``levers9 offers`` shows them):
    #: a marketplace's ``cloud: secure`` or ``community``, ``form_factor: sxm``, ``host_reliability: 0.998``.
    #: At most :data:`OFFER_DETAILS_MAX_KEYS` keys matching :data:`OFFER_DETAILS_KEY`, values at most
    #: :data:`OFFER_DETAILS_MAX_VALUE_CHARS` characters. The scheduler never reads them: what decides a
    #: placement (GPU type and memory, price, region, spot) has its own field.
    details: dict[str, str] = Field(default_factory=dict)

    @field_validator("details")
    @classmethod
    def _bounded_details(cls, details: dict[str, str]) -> dict[str, str]:
        if len(details) > OFFER_DETAILS_MAX_KEYS:
            raise ValueError(f"details holds {len(details)} keys; at most {OFFER_DETAILS_MAX_KEYS} are allowed")
        for name, value in details.items():
            if not OFFER_DETAILS_KEY.fullmatch(name):
                raise ValueError(
                    f"details key {name[:40]!r} is not allowed: keys are a lower-case letter, then up to 31 "
                    "lower-case letters, digits or '_'"
                )
            if len(value) > OFFER_DETAILS_MAX_VALUE_CHARS:
                raise ValueError(
                    f"details[{name!r}] is {len(value)} characters long; at most "
                    f"{OFFER_DETAILS_MAX_VALUE_CHARS} are allowed"
                )
        return details

    @property
    def key(self) -> str:
        """``instance_type/region/zone[/spot]``: what a capacity miss marks unavailable (not the whole pool)."""
        parts = [self.instance_type or self.gpu, self.region or "-", self.zone or "-"]
        return "/".join(parts) + ("/spot" if self.spot else "")


class ProviderCheck(_Frozen):
    """What ``levers9_check`` found about a pool's provider: do its credentials and settings work?"""

    ok: bool
    #: one line: what was checked and what it said (``credentials of profile 'prod' accepted in us-east-1``)
    message: str
    #: what the operator should do when not ok (``run aws sso login --profile prod``)
    hint: str | None = None


#: the most a machine identity may carry (EC2's document and signature take about 1.5 KiB)
MACHINE_IDENTITY_MAX_CHARS = 16384


class MachineIdentity(_Frozen):
    """What a worker shows to prove which machine it runs on: a document its provider signed, and the signature.

    Opaque to the core: ``levers9_machine_identity`` makes it on the machine,
    ``levers9_verify_identity`` of the same provider reads it on the
    controlplane (for EC2: the instance identity document and its base64
    RSA-SHA256 signature from the instance metadata service).
    """

    document: str = Field(min_length=1, max_length=MACHINE_IDENTITY_MAX_CHARS)
    signature: str = Field(default="", max_length=MACHINE_IDENTITY_MAX_CHARS)


class GpuDevice(_Frozen):
    """A GPU actually present on a machine."""

    index: int = Field(ge=0)
    uuid: str
    #: the name as the driver reports it (``NVIDIA H100 80GB HBM3``)
    model: str
    #: canonical GPU type, or None when the model is not in the catalog
    gpu: str | None = None
    memory_mib: int = Field(ge=0)


# --------------------------------------------------------------------------- runtimes


class Isolation(StrEnum):
    NONE = "none"  # a plain process: development only
    NAMESPACES = "namespaces"  # Linux namespaces and cgroups (runc)
    SANDBOX = "sandbox"  # a user-space kernel (gVisor)
    VM = "vm"


class RuntimeContext(_Frozen):
    """Which runtime is being asked, with the pool's settings for it and where it may keep state."""

    name: str
    #: an instance of the model the runtime's ``levers9_runtime_settings`` returned, or None
    settings: Any = None
    #: a directory the runtime owns on this host (bundles, logs, checkpoints)
    state_dir: str


class RuntimeCapabilities(_Frozen):
    """What a runtime can do on this host, and why not when it can't.

    The worker treats runtimes alike and decides every difference from these fields, never from a
    runtime's name: a third-party runtime that reports the same capabilities gets the same treatment.
    The defaults describe a container with a root filesystem and a network of its own, in no cgroup the
    worker can read, so a plugin that predates a field still validates and is treated as isolated.
    """

    available: bool
    unavailable_reason: str | None = None
    isolation: Isolation
    gpu: bool = False
    checkpoint: bool = False
    checkpoint_reason: str | None = None
    version: str | None = None
    #: commands see the worker's own filesystem: no image root and no mounts, so the worker hands the runner
    #: and the handler over by their paths on the host (and the host's GPUs are only hidden by CUDA's filter)
    host_filesystem: bool = False
    #: containers share the worker's network: the runner listens on 127.0.0.1 and is reached there; False:
    #: each container has a network namespace of its own and is reached at the address the runtime reports
    host_network: bool = False
    #: the cgroup (a path below the cgroup root, for example ``/levers9``) holding each container's own
    #: cgroup, named by its container id; None when the runtime gives containers no cgroup the worker can read
    cgroup_parent: str | None = Field(None, pattern=r"^/\S*$")
    #: what an operator should know about how this host runs the runtime's containers, in the runtime's own
    #: words (which network mode ``auto`` chose here, and why); ``levers9 check`` shows them
    notes: list[str] = Field(default_factory=list)
    #: calls run as the worker's own user, with its privileges: they can read whatever the worker can (an
    #: operator's opt-in for a single-user machine); ``levers9 check`` and ``levers9 pools`` show it in red
    calls_as_worker_user: bool = False
    #: the host uid a container's root is (runc in a user namespace: its mapping's first id; else 0): a worker
    #: mounting a volume gives every file there to it, so what a container's root finds there is its own
    root_host_uid: int = Field(0, ge=0)


class Mount(_Frozen):
    source: str
    target: str
    read_only: bool = True
    #: in a user namespace, the source is idmapped like the image's layers (its owners seen as the container's);
    #: False binds it as it is: a volume, whose mount gives every file one owner and cannot be idmapped
    idmap: bool = True


class ContainerSpec(_Frozen):
    """One container to run."""

    container_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    #: a local image: a directory holding a root filesystem, an OCI layout or a ``docker save`` tarball
    image: str
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/"
    user: str | None = None
    cpu_millicores: int = Field(1000, ge=1)
    memory_mib: int = Field(1024, ge=1)
    pids_limit: int | None = Field(None, ge=1)
    gpus: list[GpuDevice] = Field(default_factory=list)
    mounts: list[Mount] = Field(default_factory=list)
    network: Literal["bridge", "host", "none"] = "bridge"
    ports: list[int] = Field(default_factory=list)
    #: the worker may checkpoint this container and restore it into another: a runtime then leaves out what it
    #: cannot checkpoint (runc: the user namespace, which CRIU cannot restore)
    checkpointable: bool = False


class PreparedContainer(_Frozen):
    """A container whose bundle is ready; start it, or restore a checkpoint into it."""

    container_id: str
    runtime: str
    spec: ContainerSpec
    #: the runtime's working directory for this container (an OCI bundle for runc and runsc)
    bundle_dir: str | None = None


class ContainerStatus(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


class ContainerState(_Frozen):
    container_id: str
    status: ContainerStatus
    pid: int | None = None
    exit_code: int | None = None
    oom_killed: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: ``host:port`` where the container's first port is reachable from the worker
    address: str | None = None
    #: the container's own IP on the worker's network, reachable from the worker's host (bridge network only)
    ip: str | None = None


class LayerDiff(_Frozen):
    """The filesystem changes of an exited container, written as one uncompressed OCI layer tar.

    What ``levers9_container_changes`` returns: the builder turns a build step's container into an image
    layer with it. Owners in the tar are as the container saw them (its root is uid 0 whatever user
    namespace it ran in), deletions are OCI whiteouts (``.wh.<name>``, ``.wh..wh..opq``).
    """

    #: the tar on this host: the ``dest`` the hook was given
    path: str
    #: ``sha256:<64 hex>`` of the tar's bytes: the diff id an image config lists for the layer
    diff_id: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    #: the tar's size in bytes
    size_bytes: int = Field(ge=0)


class LogChunk(_Frozen):
    """Bytes of a container's combined output from ``offset``; read again from ``next_offset``."""

    data: bytes
    next_offset: int = Field(ge=0)
    #: True when the container has exited and nothing more will come
    eof: bool = False


# --------------------------------------------------------------------------- checkpointing


class CheckpointSupport(_Frozen):
    """Whether a runtime's containers can be checkpointed on this host."""

    available: bool
    #: why not (CRIU's own words where CRIU is the reason), or a note when available
    reason: str | None = None
    #: ``runsc``, ``criu``...
    mechanism: str


class CheckpointImage(_Frozen):
    checkpoint_id: str
    runtime: str
    #: a directory or file on this host holding the image
    path: str
    size_bytes: int = Field(ge=0)
    created_at: datetime | None = None
