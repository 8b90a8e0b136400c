"""The worker's sandboxes: containers driven from outside, booted, watched and ended here.

A sandbox is a container of kind ``sandbox`` (:data:`levers9.worker.calls.SANDBOX_KIND`): its runner
runs no handler but serves processes and files (:mod:`levers9.runner.sandbox_wire`), driven by a
:class:`~levers9.worker.warm.sandbox_client.SandboxSession`. :class:`Sandboxes` keeps this worker's:
it boots each through the warm pool's :class:`~levers9.worker.warm.launch.Launcher` (the same recipe,
runtime and leftover clean-up as a call's container: a worker killed with sandboxes running leaves
containers that :func:`levers9.worker.leftovers.remove_leftovers` removes at the next start), but a
sandbox is not a call and the pool never sees it: it takes no call, is never reused and is never
stopped to make room.

Invariants and lifecycle:

* A sandbox is ``running`` from :meth:`Sandboxes.create`'s return until it ends; it ends exactly once,
  and then its session is closed, its container killed and removed, and its ports, GPUs and directory
  freed. Its record stays (the last :data:`KEPT_ENDED` ended ones), so every later request names why it
  ended instead of saying it never existed.
* ``timeout_s`` ends it that many seconds after it was created (or after :meth:`update_ttl`, which sets
  a new deadline counted from then); 0 is no deadline.
* ``idle_timeout_s`` ends one nobody used for that long. Used means: a request (:meth:`Sandboxes.use`)
  touched it, a request is still in flight (:meth:`Sandboxes.held`: an output stream being read counts), or a
  process it started still runs. So a sandbox running a long job is not idle; a sandbox whose only
  process is a background ``sleep infinity`` is not idle either, and only ``timeout_s`` ends it.
* A sandbox whose container dies (killed, out of memory, the runner gone) is seen by its session at
  once; it is marked ``gone`` with the session's reason, its container removed, and every request in
  flight or later fails with :class:`~levers9.worker.warm.sandbox_client.SandboxGone` naming it:
  nothing waits on a dead sandbox.
* At most ``max_sandboxes`` run (or start) at once; another create is :class:`SandboxesFull`.
* :meth:`Sandboxes.close` (the worker stopping) ends every sandbox; nothing is left.

Isolation: a sandbox needs a runtime that gives its containers their own filesystem (runc, gVisor);
on one whose containers see the host (``host_filesystem``, the process runtime) creating one is
refused. A sandbox gets only the environment and secrets of its spec, never the worker's (a name starting
``LEVERS9_`` is refused: the runner's own variables must not be overridden).

Its network: by default what every container of the pool has (the other containers on the bridge and
what the host routes to, never the host itself: :mod:`levers9.engine.host_guard`). ``block_network``
cuts it: the sandbox opens no connection to anything (another container, another network, the cloud's
metadata address; no DNS either), while the worker still reaches its runner and the ports it exposes,
whose replies pass. ``allow_list`` cuts it the same way but for new connections to its networks (IPv4 and
IPv6 addresses and CIDR networks; a bare address is that one address); it implies ``block_network``.
A host name is refused, not resolved: the sandbox has no DNS to use it with, and the addresses a name had
when the sandbox was created are not those it has later, so the rule would quietly allow the wrong ones.
The rules (host_guard's confined containers: a chain per container, matched by its veth) are made before
its container starts, so nothing it runs ever had the network, and taken back once the container is
removed; a killed worker's are removed at its next start (:func:`levers9.worker.leftovers.remove_leftovers`).
A worker that cannot make them (no ``iptables``/``ip6tables``, no ``br_netfilter``, a runtime whose
containers are not on levers9's bridge) refuses the sandbox (:class:`SandboxRefused` naming the field)
rather than run it with the network.

Snapshots (:meth:`Sandboxes.snapshot`, the issue's memory snapshots): a sandbox created with
``snapshots`` is booted so that its container can be checkpointed with its processes running: its
runner is reached over a unix socket in a signal directory of its own (mounted at
``/run/levers9``, as a checkpointed function's is) and the container has no network at all (gVisor
cannot checkpoint a sandbox on the host's network stack, what ``auto`` uses where its own fails, and a
memory image must hold no connection to this machine), so ``ports``, ``block_network`` (implied) and
``allow_list`` are refused with it. A snapshot detaches the runner (its processes run on, their output
held; :mod:`levers9.runner.sandbox_wire`), checkpoints the container (memory and root filesystem changes;
the sandbox keeps running: runsc's checkpoint stops it and :mod:`levers9.engine.oci` restores it in place
at once, which the sandbox sees as a pause), reattaches, and stores the image in the worker's checkpoint
storage (:mod:`levers9.worker.sandbox_snapshots`). ``create`` with ``snapshot`` restores one on this
worker (any worker of the pool with the same runtime: the storage is shared) as a new sandbox whose
session takes over the runner's processes, started before the snapshot and still running. Only a runtime
whose plugin checkpoints here and a worker with checkpoint storage can; otherwise
:class:`~levers9.worker.sandbox_snapshots.SnapshotUnavailable` names which. A request while a snapshot is
being taken is :class:`SandboxBusy`.

Images: a sandbox of a registry image (a Blueprint's) is pulled first, as a stub's image is
(:class:`~levers9.worker.images.ImagePulls`, given as ``images``; a pull that fails is :class:`StartFailed`
naming the ref). :meth:`Sandboxes.commit` makes a running sandbox's filesystem an image in the
controlplane's registry (:mod:`levers9.worker.sandbox_images`: the base's layers and one layer of its
changes, read while its container is paused; it keeps running).

GPUs: a sandbox's ``gpu_count`` devices come from the worker's one
:class:`~levers9.worker.gpu_ledger.GpuLedger`, shared with the warm pool: too few free stops the pool's idle
GPU containers for it (never a busy one), and when that cannot free enough, or they are not back within
:data:`GPU_CLAIM_TIMEOUT_S`, the create is :class:`SandboxesFull` (the controlplane asks the next worker).
The devices are the sandbox's until it is removed; the container sees exactly them
(``NVIDIA_VISIBLE_DEVICES`` by uuid, their device nodes). A sandbox with GPUs cannot take memory snapshots
(gVisor does not checkpoint a GPU's memory): ``snapshots`` with ``gpu_count`` is :class:`SandboxRefused`.

The worker keeps a :class:`Sandboxes` only when ``LEVERS9_SANDBOXES`` (``WorkerOptions.sandboxes``) is a
positive count, its ``max_sandboxes``; unset, the default, it has none and nothing changes for its pool
(:mod:`levers9.worker.sandbox_api` says how they are reached).

Errors (what each means): :class:`SandboxNotFound` (no sandbox of that id on this worker, or one of
another workspace), :class:`SandboxEnded` (it was terminated, timed out or idled out; the message says
which), ``SandboxGone`` (its container died), :class:`SandboxesFull`, :class:`SandboxRefused` (the spec
asks for what this worker cannot do, naming the field), :class:`SandboxBusy` (a snapshot is being taken),
the snapshot errors of :mod:`levers9.worker.sandbox_snapshots`, and
:class:`~levers9.worker.warm.launch.StartFailed` (the container did not come up; its output quoted).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import re
import secrets
import shutil
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from levers9.checkpoint.boot import GO_FILE
from levers9.checkpoint.restore import RESTORE_TIMEOUT_S
from levers9.checkpoint.snapshot import SIGNAL_SOCKET, Checkpointing
from levers9.checkpoint.storage import CheckpointMissing, CheckpointStorage, StorageError
from levers9.engine import host_guard
from levers9.engine.network import veth_name
from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import CheckpointImage, ContainerStatus
from levers9.worker.calls import SANDBOX_KIND, StubSpec
from levers9.worker.gpu_ledger import GpuLedger
from levers9.worker.images import ImagePullFailed, ImagePulls, names_registry
from levers9.worker.sandbox_images import (
    CommitRefused,
    CommittedImage,
    CommitUnavailable,
    check_repository_of,
    commit_tag,
)
from levers9.worker.sandbox_images import commit as commit_image
from levers9.worker.sandbox_snapshots import (
    KEY_PREFIX,
    SnapshotFailed,
    SnapshotInfo,
    SnapshotMissing,
    SnapshotUnavailable,
    new_snapshot_id,
    snapshot_key,
)
from levers9.worker.volumes import VolumeSpec
from levers9.worker.warm.launch import Launcher, PortPicker, StartFailed, container_id
from levers9.worker.warm.runner_client import RunnerClient
from levers9.worker.warm.sandbox_client import SandboxError, SandboxGone, SandboxProcess, SandboxSession
from levers9.worker.warm.scaling import WarmContainer, WarmStub

__all__ = [
    "DEFAULT_MAX_SANDBOXES",
    "KEPT_ENDED",
    "Sandbox",
    "SandboxBusy",
    "SandboxEnded",
    "SandboxNotFound",
    "SandboxRefused",
    "SandboxSpec",
    "Sandboxes",
    "SandboxesFull",
    "StartFailed",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_SANDBOXES = 32
#: how long a sandbox waits for GPUs held by the warm pool's idle containers, stopped for it, to come back
GPU_CLAIM_TIMEOUT_S = 30.0
#: after a warm sandbox failed to start, how long before another is tried
WARM_BACKOFF_S = 30.0
#: ended sandboxes remembered, so a late request hears why it ended
KEPT_ENDED = 256
#: the longest the watcher sleeps between two looks at a sandbox with an idle timeout
IDLE_CHECK_S = 0.5
#: the most networks an allow_list may hold (each is a rule every packet of the sandbox may meet)
MAX_ALLOWED = 64

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the file a detached runner creates in its signal directory once it waits (``LEVERS9_READY_FILE``)
READY_FILE = "ready"
#: seconds a detached runner is given to say it waits, before the snapshot fails
DETACH_TIMEOUT_S = 30.0


class SandboxNotFound(Exception):
    """No sandbox of that id on this worker (for the workspace asking)."""


class SandboxEnded(Exception):
    """The sandbox was terminated, timed out or idled out; the message says which and when."""


class SandboxesFull(Exception):
    """This worker already runs its most sandboxes."""


class SandboxBusy(Exception):
    """A snapshot of the sandbox is being taken; the request may be made again in a moment."""


class SandboxRefused(ValueError):
    """The spec asks for what this worker cannot give; the message names the field and what is accepted."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox runs on and with; checked by :meth:`check`."""

    workspace_id: str
    #: "host" or an image the runtime resolves, as a warm pool's stub takes it (a blueprint's image ref included)
    image: str = "host"
    #: the Python inside the image ("3.11"); the runner needs one
    python_version: str = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cpu_millicores: int = 1000
    memory_mib: int = 1024
    gpu_count: int = 0
    env: dict[str, str] = field(default_factory=dict)
    #: the workspace's secrets, given as environment variables; never logged
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    #: ports a server in the sandbox listens on, reached at the container's address (``Sandbox.ports``)
    ports: tuple[int, ...] = ()
    #: no connection out of the sandbox (see the module's docstring)
    block_network: bool = False
    #: the networks it may open connections to, its egress otherwise cut: IPv4/IPv6 addresses and CIDRs
    allow_list: tuple[str, ...] = ()
    #: seconds from creation to its end; 0: no deadline
    timeout_s: float = 300.0
    #: seconds unused before it ends (see the module's docstring); 0: never for idleness
    idle_timeout_s: float = 0.0
    #: the working directory of a process started without one
    workdir: str = "/"
    name: str = ""
    #: created so it can be snapshotted: runner over a unix socket, no network (see the module's docstring)
    snapshots: bool = False
    #: restore this snapshot instead of starting afresh (its image, Python, cpu and memory are the snapshot's)
    snapshot: SnapshotInfo | None = None
    #: the workspace's volumes it mounts (the worker mounts them as for a call's container); never with snapshots
    volumes: tuple[VolumeSpec, ...] = ()

    def _check_snapshots(self) -> None:
        if self.snapshots or self.snapshot is not None:
            network: tuple[tuple[str, object], ...] = (
                ("ports", self.ports),
                ("block_network", self.block_network),
                ("allow_list", self.allow_list),
            )
            for name, value in network:
                if value:
                    raise SandboxRefused(
                        f"{name} cannot be given with snapshots (or a snapshot to restore): a sandbox that can be "
                        f"snapshotted has no network at all; leave {name} unset"
                    )
        if (self.snapshots or self.snapshot is not None) and self.volumes:
            raise SandboxRefused(
                "volumes cannot be given with snapshots (or a snapshot to restore): a mounted file system is not part "
                "of a sandbox's memory; leave volumes empty, or snapshots unset"
            )
        if self.snapshot is not None and self.snapshot.workspace_id != self.workspace_id:
            raise SandboxRefused(
                f"snapshot {self.snapshot.id} belongs to another workspace; restore a snapshot of {self.workspace_id}"
            )

    def _check_volumes(self) -> None:
        seen: set[str] = set()
        for volume in self.volumes:
            where = volume.mount_path
            if not where.startswith("/") or where == "/" or "\0" in where or ".." in where.split("/") or where in seen:
                raise SandboxRefused(
                    f"volumes mounts one at {where!r}; each needs its own absolute path other than / (no ..)"
                )
            if bool(volume.bucket) == bool(volume.volume_id):
                raise SandboxRefused(
                    f"volumes: the mount at {where!r} names {'both' if volume.bucket else 'neither'} a volume (volume_id) "
                    "and a cloud bucket (bucket); give one"
                )
            seen.add(where)

    def check(self) -> None:
        """SandboxRefused naming the first field that cannot be used."""
        if not self.workspace_id:
            raise SandboxRefused("workspace_id is empty; a sandbox belongs to a workspace")
        if not self.image:
            raise SandboxRefused("image is empty; give 'host' or an image the pool's runtime resolves")
        for name, value, low in (("cpu_millicores", self.cpu_millicores, 1), ("memory_mib", self.memory_mib, 16)):
            if value < low:
                raise SandboxRefused(f"{name} is {value}; it must be at least {low}")
        if self.gpu_count < 0:
            raise SandboxRefused(f"gpu_count is {self.gpu_count}; it must be 0 or more")
        if self.gpu_count and self.snapshots:
            raise SandboxRefused(
                f"snapshots is on with gpu_count {self.gpu_count}; a memory snapshot cannot hold a GPU's memory, "
                "so a sandbox with GPUs takes none (leave snapshots off)"
            )
        for name, seconds in (("timeout_s", self.timeout_s), ("idle_timeout_s", self.idle_timeout_s)):
            if not 0 <= seconds < 10**7:
                raise SandboxRefused(f"{name} is {seconds}; give seconds from 0 (none) up to 10000000")
        self._check_volumes()
        for port in self.ports:
            if not 1 <= port <= 65535:
                raise SandboxRefused(f"ports holds {port}; a port is from 1 to 65535")
        for key in [*self.env, *self.secret_env]:
            if not _ENV_NAME.match(key) or key.startswith("LEVERS9_"):
                raise SandboxRefused(f"env holds {key!r}; a name is letters, digits and _, not starting LEVERS9_")
        if not self.workdir.startswith("/") or "\0" in self.workdir:
            raise SandboxRefused(f"workdir is {self.workdir!r}; it must be an absolute path")
        self._check_snapshots()
        self.networks()

    @property
    def confined(self) -> bool:
        """Whether its egress is cut (``block_network``, or an ``allow_list``, which implies it)."""
        return self.block_network or bool(self.allow_list)

    def networks(self) -> list[host_guard.IPNetwork]:
        """``allow_list`` as networks (a bare address: that one address); SandboxRefused naming a bad entry."""
        if len(self.allow_list) > MAX_ALLOWED:
            raise SandboxRefused(f"allow_list holds {len(self.allow_list)} networks; at most {MAX_ALLOWED}")
        found = []
        for entry in self.allow_list:
            try:
                if not isinstance(entry, str) or "%" in entry:  # an IPv6 scope names this host's interface
                    raise ValueError(entry)
                found.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise SandboxRefused(
                    f"allow_list holds {entry!r}, which is not an IP address or network; give IPv4 or IPv6 addresses "
                    "or CIDR networks such as 203.0.113.7, 198.51.100.0/24 or 2001:db8::/32 (host names are not "
                    "resolved: the sandbox has no DNS to use one with, and a name's addresses change)"
                ) from None
        return found


@dataclass(frozen=True)
class WarmShape:
    """What a warm sandbox was started with, which a create must ask for exactly to take it."""

    image: str
    python_version: str
    cpu_millicores: int
    memory_mib: int
    #: the workspace whose image it is ("" for the worker's own filesystem, ``host``, which is nobody's)
    workspace_id: str

    @classmethod
    def of(cls, spec: SandboxSpec) -> WarmShape | None:
        """The shape of ``spec``; None for one no warm sandbox serves: anything fixed when its container starts
        beyond the shape (GPUs, ports, volumes, network rules, snapshots, a restore)."""
        if spec.snapshot is not None or spec.snapshots or spec.gpu_count or spec.ports or spec.volumes:
            return None
        if spec.confined:
            return None
        workspace = "" if spec.image == "host" else spec.workspace_id
        return cls(spec.image, spec.python_version, spec.cpu_millicores, spec.memory_mib, workspace)


@dataclass(eq=False)
class Sandbox:
    """One sandbox: its container, its session and where it is in its life."""

    id: str
    spec: SandboxSpec
    group: WarmStub
    box: WarmContainer
    #: seconds since the epoch
    created_at: float
    session: SandboxSession | None = None
    #: "starting", "running", "ended" (terminated, timed out, idled out) or "gone" (its container died)
    state: str = "starting"
    #: why it ended ("" while it runs)
    reason: str = ""
    ended_at: float = 0.0
    #: loop times: its deadline (0: none) and when it was last used
    deadline: float = 0.0
    touched: float = 0.0
    #: requests in flight (see :meth:`Sandboxes.held`)
    in_flight: int = 0
    #: the processes started through this worker, by the sandbox's own id
    processes: dict[int, SandboxProcess] = field(default_factory=dict)
    #: processes whose output is being read now (one reader each)
    reading: set[int] = field(default_factory=set)
    #: the container's address on the worker's network ("" when the runtime reports none)
    ip: str = ""
    #: the host-side veth whose rules cut its network ("" when it is not confined)
    veth: str = ""
    #: a snapshot is being taken: requests are refused (SandboxBusy) meanwhile
    snapshotting: bool = False
    watcher: asyncio.Task[None] | None = None
    #: removing what it held, once it ended
    ending: asyncio.Task[None] | None = None
    #: images made of its filesystem so far (:meth:`Sandboxes.commit`), and whether one is being made now
    commits: int = 0
    committing: bool = False

    @property
    def ports(self) -> dict[int, str]:
        """Each port of the spec -> ``ip:port`` where the worker's host reaches it."""
        return {p: f"{self.ip}:{p}" for p in self.spec.ports} if self.ip else {}

    def busy(self) -> bool:
        return self.in_flight > 0 or any(p.running for p in self.processes.values())

    def info(self) -> dict[str, Any]:
        """What the API reports about it (no secret, no token)."""
        return {
            "id": self.id,
            "name": self.spec.name,
            "workspace_id": self.spec.workspace_id,
            "image": self.spec.image,
            "state": self.state,
            "reason": self.reason,
            "created_at": self.created_at,
            "ended_at": self.ended_at or None,
            "timeout_s": self.spec.timeout_s,
            "idle_timeout_s": self.spec.idle_timeout_s,
            "cpu_millicores": self.spec.cpu_millicores,
            "memory_mib": self.spec.memory_mib,
            "gpu_count": self.spec.gpu_count,
            "workdir": self.spec.workdir,
            "ports": {str(p): a for p, a in self.ports.items()},
            "block_network": self.spec.confined,
            "allow_list": list(self.spec.allow_list),
            "container_id": self.box.cid,
            "snapshots": self.spec.snapshots,
            "restored_from": self.spec.snapshot.id if self.spec.snapshot is not None else None,
        }


class Sandboxes:
    """This worker's sandboxes, on the runtime of its warm pool (``launcher`` and ``client`` are the pool's)."""

    def __init__(
        self,
        launcher: Launcher,
        client: RunnerClient,
        ports: PortPicker,
        *,
        state_dir: Path,
        gpus: GpuLedger | None = None,
        max_sandboxes: int = DEFAULT_MAX_SANDBOXES,
        images: ImagePulls | None = None,
        storage: CheckpointStorage | None = None,
        warm: int = 0,
    ) -> None:
        if max_sandboxes < 1:
            raise ValueError(f"max_sandboxes is {max_sandboxes}; it must be at least 1")
        self.launcher = launcher
        self.client = client
        self.ports = ports
        self.state_dir = Path(state_dir)
        self.max_sandboxes = max_sandboxes
        #: pulls registry images, and the controlplane's registry a commit pushes to; None: neither
        self.images = images
        #: the worker's GPUs, shared with its warm pool (not given: none, and a sandbox asking any is refused)
        self.gpus = gpus if gpus is not None else GpuLedger()
        #: where snapshots go; None: the launcher's checkpoint storage, if the worker has one
        self.storage = storage
        self._live: dict[str, Sandbox] = {}
        self._ended: OrderedDict[str, Sandbox] = OrderedDict()
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: told the id of every sandbox that ends, once (the worker reports it, so the room it held is freed)
        self.on_end: Callable[[str], None] | None = None
        #: how many sandboxes to keep started for the next creates (of :attr:`_shape`); 0: none
        self.warm = max(0, min(warm, max_sandboxes))
        #: the shape of the last create a warm sandbox could have served: what is kept warm
        self._shape: WarmShape | None = None
        #: started sandboxes waiting to be taken, their runner up and nothing run in them (each of its spec's shape)
        self._warm: list[Sandbox] = []
        self._warming = 0
        self._warm_tasks: set[asyncio.Task[None]] = set()
        #: loop time before which no warm sandbox is started again (one failed to start)
        self._warm_after = 0.0

    # ----------------------------------------------------------------- create

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Boot a sandbox (or restore ``spec.snapshot``) and return it running; SandboxRefused, SandboxesFull,
        StartFailed, SnapshotUnavailable or SnapshotMissing (a StartFailed) say why not."""
        spec = self._admit(spec)
        taken = await self._take_warm(spec)
        if taken is not None:
            return taken
        if self.images is not None and names_registry(spec.image):
            try:
                await self.images.ensure(spec.image)
            except ImagePullFailed as exc:
                raise StartFailed(f"the sandbox's image could not be pulled: {exc}") from exc
        sid = f"sb-{secrets.token_hex(8)}"
        stub = _stub(sid, spec)
        gpus = await self.gpus.claim(spec.gpu_count, timeout_s=GPU_CLAIM_TIMEOUT_S)
        if gpus is None:
            raise SandboxesFull(
                f"the sandbox needs {spec.gpu_count} GPUs; {self.gpus.free} of this worker's {self.gpus.total} are "
                "free and its busy containers hold the rest"
            )
        handler_dir = self.state_dir / "sandboxes" / sid  # mounted at the handler's place, empty: no handler
        try:
            if len(self._live) >= self.max_sandboxes or self._closed:  # others came while this one waited
                raise SandboxesFull(f"this worker already runs {len(self._live)} sandboxes, its most (max_sandboxes)")
            handler_dir.mkdir(parents=True, mode=0o700)
        except (OSError, SandboxesFull):
            self.gpus.give(gpus)
            raise
        box = WarmContainer(cid=container_id(stub), port=self.ports.pick(), token=secrets.token_urlsafe(32), gpus=gpus)
        sandbox = Sandbox(sid, spec, WarmStub(key=sid, spec=stub, handler_dir=handler_dir), box, time.time())
        self._live[sid] = sandbox
        try:
            if spec.confined:  # before its container starts: nothing it runs ever has the network
                await self._confine(sandbox)
            await self._boot(sandbox)
            if sandbox.veth:
                await self._check_confined(sandbox)
            reader, writer = await self.client.connect(box)
            sandbox.session = SandboxSession(reader, writer, name=sid).start()
            if spec.snapshot is not None:  # the restored runner's processes, running since before the snapshot
                sandbox.processes = {p.id: p for p in await sandbox.session.attach()}
            state = await self.launcher.state(box.cid)
            sandbox.ip = state.ip or ""
        except BaseException as exc:
            failed = isinstance(exc, StartFailed | SandboxRefused)
            reason = f"it did not start: {exc}" if failed else "its start was interrupted"
            await self._end(sandbox, "ended", reason)
            raise
        self._running(sandbox)
        log.info("sandbox %s of workspace %s runs in container %s", sid, spec.workspace_id, box.cid)
        self._refill()
        return sandbox

    def _running(self, sandbox: Sandbox) -> None:
        """It runs from now: its deadline counts from now, and its watcher starts."""
        now = asyncio.get_running_loop().time()
        sandbox.state, sandbox.touched = "running", now
        sandbox.deadline = now + sandbox.spec.timeout_s if sandbox.spec.timeout_s else 0.0
        sandbox.watcher = asyncio.ensure_future(self._watch(sandbox))
        sandbox.watcher.set_name(f"levers9-sandbox-watch-{sandbox.id}")

    def _admit(self, spec: SandboxSpec) -> SandboxSpec:
        """``spec`` checked (a restore's made from its snapshot), or why this worker takes no such sandbox now."""
        spec.check()
        if spec.snapshot is not None:
            spec = self._restoring(spec, spec.snapshot)
        if self._closed:
            raise SandboxesFull("this worker is stopping and takes no new sandbox")
        if self.launcher.capabilities.host_filesystem:
            raise SandboxRefused(
                f"this pool's runtime ({self.launcher.runtime.name}) runs containers on the host's filesystem, which "
                "a sandbox must not see; sandboxes need a runtime that isolates them (runc or gvisor)"
            )
        if len(self._live) >= self.max_sandboxes:
            raise SandboxesFull(
                f"this worker already runs {len(self._live)} sandboxes, its most (max_sandboxes); "
                "terminate one or create it on another worker"
            )
        if spec.gpu_count > self.gpus.total:
            raise SandboxesFull(f"the sandbox needs {spec.gpu_count} GPUs; this worker has {self.gpus.total}")
        return spec

    # ----------------------------------------------------------------- warm sandboxes

    async def _take_warm(self, spec: SandboxSpec) -> Sandbox | None:
        """A warm sandbox of ``spec``'s shape, made this sandbox (its variables and secrets set in its runner);
        None when there is none (the shape is then what is kept warm next)."""
        shape = WarmShape.of(spec)
        if shape is None or not self.warm:
            return None
        self._shape = shape
        while True:
            sandbox = next((s for s in self._warm if WarmShape.of(s.spec) == shape), None)
            if sandbox is None:
                return None
            self._warm.remove(sandbox)
            session = sandbox.session
            if session is None or session.gone is not None:  # its container died while it waited
                self._discard(sandbox)
                continue
            sid = f"sb-{secrets.token_hex(8)}"
            sandbox.id, sandbox.spec, sandbox.created_at = sid, spec, time.time()
            sandbox.group = WarmStub(key=sid, spec=_stub(sid, spec), handler_dir=sandbox.group.handler_dir)
            session.name = sid
            self._live[sid] = sandbox
            try:
                if spec.env or spec.secret_env:
                    await session.configure({**spec.env, **spec.secret_env})
            except (SandboxError, SandboxGone) as exc:
                self._live.pop(sid, None)
                log.warning("a warm sandbox could not be taken for %s (%s); starting one", sid, exc)
                self._discard(sandbox)
                continue
            self._running(sandbox)
            log.info("sandbox %s of workspace %s took warm container %s", sid, spec.workspace_id, sandbox.box.cid)
            self._refill()
            return sandbox

    def _refill(self) -> None:
        """Start warm sandboxes of the current shape up to :attr:`warm`, ending those of another shape."""
        if self._closed or self._shape is None or not self.warm:
            return
        for other in [s for s in self._warm if WarmShape.of(s.spec) != self._shape]:
            self._warm.remove(other)
            self._discard(other)
        if asyncio.get_running_loop().time() < self._warm_after:
            return
        for _ in range(self.warm - len(self._warm) - self._warming):
            self._warming += 1
            task = asyncio.ensure_future(self._start_warm(self._shape))
            task.set_name("levers9-sandbox-warm")
            self._warm_tasks.add(task)
            task.add_done_callback(self._warm_tasks.discard)

    async def _start_warm(self, shape: WarmShape) -> None:
        wid = f"sbw-{secrets.token_hex(7)}"
        spec = SandboxSpec(
            workspace_id=shape.workspace_id or "warm",
            image=shape.image,
            python_version=shape.python_version,
            cpu_millicores=shape.cpu_millicores,
            memory_mib=shape.memory_mib,
            timeout_s=0,
        )
        stub = _stub(wid, spec)
        handler_dir = self.state_dir / "sandboxes" / wid
        box = WarmContainer(cid=container_id(stub), port=self.ports.pick(), token=secrets.token_urlsafe(32), gpus=[])
        sandbox = Sandbox(wid, spec, WarmStub(key=wid, spec=stub, handler_dir=handler_dir), box, time.time())
        sandbox.state = "warm"
        try:
            handler_dir.mkdir(parents=True, mode=0o700)
            if self.images is not None and names_registry(spec.image):
                await self.images.ensure(spec.image)
            await self.launcher.boot(sandbox.group, box)
            reader, writer = await self.client.connect(box)
            sandbox.session = SandboxSession(reader, writer, name=wid).start()
            sandbox.ip = (await self.launcher.state(box.cid)).ip or ""
        except BaseException as exc:
            if isinstance(exc, Exception):
                log.warning("a warm sandbox did not start (%s); none is started for %g s", exc, WARM_BACKOFF_S)
                self._warm_after = asyncio.get_running_loop().time() + WARM_BACKOFF_S
            await asyncio.shield(self._remove(sandbox))
            if not isinstance(exc, Exception):
                raise  # cancelled: the worker is closing
            return
        finally:
            self._warming -= 1
        if self._closed or shape != self._shape:
            await self._remove(sandbox)
            return
        self._warm.append(sandbox)
        log.info("warm sandbox container %s is ready", box.cid)

    def _discard(self, sandbox: Sandbox) -> None:
        """Remove a warm sandbox nobody took (never reported: no create knew it)."""
        task = asyncio.ensure_future(self._remove(sandbox))
        task.set_name(f"levers9-sandbox-discard-{sandbox.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _confine(self, sandbox: Sandbox) -> None:
        """Cut its network (host_guard's rules for its veth, named by its container's id); SandboxRefused if not."""
        sandbox.veth = veth_name(sandbox.box.cid)  # set first: _remove takes back whatever was made
        try:
            await asyncio.to_thread(
                host_guard.confine, sandbox.veth, sandbox.spec.networks(), label=sandbox.id, owner=self.state_dir
            )
        except (host_guard.HostGuardError, ValueError) as exc:
            raise SandboxRefused(f"{_confining(sandbox.spec)} cannot be enforced on this worker: {exc}") from exc

    async def _check_confined(self, sandbox: Sandbox) -> None:
        """SandboxRefused unless its started container is held by its rules (before anything runs in it)."""
        try:
            await asyncio.to_thread(host_guard.check_confined, sandbox.veth)
        except host_guard.HostGuardError as exc:
            raise SandboxRefused(f"{_confining(sandbox.spec)} cannot be enforced on this worker: {exc}") from exc

    def _restoring(self, spec: SandboxSpec, snap: SnapshotInfo) -> SandboxSpec:
        """The spec of a sandbox restored from ``snap`` (the snapshot's image, Python, cpu and memory)."""
        if snap.runtime != self.launcher.runtime.name:
            raise SandboxRefused(
                f"snapshot {snap.id} was taken on runtime {snap.runtime}, and this worker's pool runs "
                f"{self.launcher.runtime.name}; restore it on a pool of runtime {snap.runtime}"
            )
        if self._storage() is None:
            raise SnapshotUnavailable(
                "this worker has no checkpoint storage (the controlplane's checkpoints.storage_url is unset), "
                f"so it cannot read snapshot {snap.id}"
            )
        return dataclasses.replace(
            spec,
            image=snap.image,
            python_version=snap.python_version,
            cpu_millicores=snap.cpu_millicores,
            memory_mib=snap.memory_mib,
            snapshots=True,
        )

    async def _boot(self, sandbox: Sandbox) -> None:
        """Start its container: the warm pool's way, or, for snapshots, :meth:`_boot_for_snapshots`."""
        if sandbox.spec.snapshots:
            await self._boot_for_snapshots(sandbox)
        else:
            await self.launcher.boot(sandbox.group, sandbox.box)

    async def _boot_for_snapshots(self, sandbox: Sandbox) -> None:
        """Start the container of a sandbox that can be snapshotted (see the module's docstring), or restore
        ``spec.snapshot`` into it: the restored runner waits for its go file, which holds this box's token."""
        box, hooks, runtime = sandbox.box, self.launcher.hooks, self.launcher.runtime
        box.signal_dir = self.state_dir / "sandbox-signals" / sandbox.id
        spec = Checkpointing.prepare_spec(self.launcher.spec(sandbox.group, box), box.signal_dir)
        snap = sandbox.spec.snapshot
        image_dir = self.state_dir / "sandbox-images" / sandbox.id
        box.prepared = True  # a prepare that fails half way still leaves something to remove
        try:
            if snap is not None:
                await self._fetch(snap, image_dir)
            prepared = await hooks.container_prepare(runtime, spec, timeout=self.launcher.start_timeout_s)
            if snap is None:
                await hooks.container_start(runtime, prepared, timeout=self.launcher.start_timeout_s)
            else:
                image = CheckpointImage(
                    checkpoint_id=snap.id, runtime=runtime.name, path=str(image_dir), size_bytes=snap.size_bytes
                )
                await hooks.restore(runtime, prepared, image, timeout=RESTORE_TIMEOUT_S)
                write_atomic(box.signal_dir / GO_FILE, box.token.encode(), mode=0o600)
            box.started = True
        except Levers9Error as exc:
            what = f"restore snapshot {snap.id}" if snap is not None else "start the container"
            raise StartFailed(f"the runtime could not {what}: {exc}") from exc
        finally:
            shutil.rmtree(image_dir, ignore_errors=True)

    async def _fetch(self, snap: SnapshotInfo, image_dir: Path) -> None:
        storage = self._storage()
        assert storage is not None  # create checked
        shutil.rmtree(image_dir, ignore_errors=True)
        try:
            await asyncio.to_thread(storage.get_dir, snap.key, image_dir)
        except CheckpointMissing:
            raise SnapshotMissing(
                f"snapshot {snap.id} is not in the checkpoint storage ({storage.describe()}, key {snap.key}): it was "
                "deleted, or this worker's storage is not the one it was written to"
            ) from None
        except (StorageError, ValueError, OSError) as exc:
            raise StartFailed(f"reading snapshot {snap.id} from {storage.describe()} failed: {exc}") from exc

    def _storage(self) -> CheckpointStorage | None:
        if self.storage is not None:
            return self.storage
        checkpointing = self.launcher.checkpointing
        return checkpointing.storage if checkpointing is not None else None

    # ----------------------------------------------------------------- snapshots

    async def snapshot(self, sid: str, workspace_id: str | None = None) -> SnapshotInfo:
        """Checkpoint a running sandbox, memory and files, into the checkpoint storage; it keeps running.

        SandboxEnded, SandboxGone (its container died, also during the snapshot), SandboxBusy (a snapshot is
        under way), SnapshotUnavailable (not created for snapshots, no storage, a runtime that cannot checkpoint
        here) or SnapshotFailed (the runtime or the storage failed; the sandbox runs on) say why not.
        """
        sandbox, session = self.use(sid, workspace_id)
        if not sandbox.spec.snapshots:
            raise SnapshotUnavailable(
                f"the sandbox {sid} was not created for snapshots; create it with snapshots=true (such a sandbox "
                "has no network: its runner is reached over a unix socket, and its container can be checkpointed)"
            )
        storage = self._storage()
        if storage is None:
            raise SnapshotUnavailable(
                "this worker has no checkpoint storage (the controlplane's checkpoints.storage_url is unset), so a "
                "snapshot could not be kept"
            )
        hooks, runtime = self.launcher.hooks, self.launcher.runtime
        support = await hooks.checkpoint_support(runtime, timeout=30)
        if not support.available:
            raise SnapshotUnavailable(f"the runtime {runtime.name} cannot checkpoint on this worker: {support.reason}")
        box = sandbox.box
        assert box.signal_dir is not None  # booted for snapshots
        snapshot_id = new_snapshot_id()
        key = snapshot_key(sandbox.spec.workspace_id, snapshot_id)
        image_dir = self.state_dir / "sandbox-images" / snapshot_id
        sandbox.snapshotting = True
        if sandbox.watcher is not None:  # the session ends at the detach: not the sandbox's end
            sandbox.watcher.cancel()
        try:
            for name in (READY_FILE, GO_FILE):
                (box.signal_dir / name).unlink(missing_ok=True)
            carry = await session.detach()
            failure: BaseException | None = None
            try:
                await self._until_detached(sandbox)
                image = await hooks.checkpoint(runtime, box.cid, str(image_dir), timeout=RESTORE_TIMEOUT_S)
            except (Levers9Error, TimeoutError) as exc:
                failure = exc
            await self._reattach(sandbox, carry)
            if failure is not None:
                raise SnapshotFailed(f"checkpointing the sandbox {sid} failed (it runs on): {failure}") from failure
            try:
                size = await asyncio.to_thread(storage.put_dir, key, image_dir)
            except (StorageError, OSError) as exc:
                raise SnapshotFailed(f"storing the snapshot of {sid} in {storage.describe()} failed: {exc}") from exc
        finally:
            shutil.rmtree(image_dir, ignore_errors=True)
            sandbox.snapshotting = False
            if sandbox.state == "running":
                sandbox.watcher = asyncio.ensure_future(self._watch(sandbox))
                sandbox.watcher.set_name(f"levers9-sandbox-watch-{sid}")
        spec = sandbox.spec
        names = {*spec.env, *spec.secret_env, *(spec.snapshot.env_names if spec.snapshot is not None else ())}
        info = SnapshotInfo(
            id=snapshot_id,
            sandbox_id=sid,
            workspace_id=spec.workspace_id,
            runtime=image.runtime,
            image=spec.image,
            python_version=spec.python_version,
            cpu_millicores=spec.cpu_millicores,
            memory_mib=spec.memory_mib,
            env_names=tuple(sorted(names)),
            size_bytes=size,
            created_at=time.time(),
            key=key,
        )
        log.info("sandbox %s snapshotted as %s (%d bytes, key %s)", sid, snapshot_id, size, key)
        return info

    async def _until_detached(self, sandbox: Sandbox) -> None:
        """Wait until the detached runner says it waits (its ready file); Levers9Error if its container ended."""
        assert sandbox.box.signal_dir is not None
        ready = sandbox.box.signal_dir / READY_FILE
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DETACH_TIMEOUT_S
        while not ready.exists():
            state = await self.launcher.state(sandbox.box.cid)
            if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
                raise Levers9Error(f"its container {sandbox.box.cid} ended after its runner was detached")
            if loop.time() > deadline:
                raise Levers9Error(f"its runner did not say it waits within {DETACH_TIMEOUT_S:g} s of the detach")
            await asyncio.sleep(0.01)

    async def _reattach(self, sandbox: Sandbox, carry: dict[int, SandboxProcess]) -> None:
        """Let the detached runner listen again, connect, and take its processes over; a sandbox whose runner
        does not answer is gone (SandboxGone)."""
        box = sandbox.box
        assert box.signal_dir is not None
        (box.signal_dir / READY_FILE).unlink(missing_ok=True)
        (box.signal_dir / SIGNAL_SOCKET).unlink(missing_ok=True)  # the old listener's: connect waits for the new
        write_atomic(box.signal_dir / GO_FILE, box.token.encode(), mode=0o600)
        try:
            reader, writer = await self.client.connect(box)
            session = SandboxSession(reader, writer, name=sandbox.id).start()
            sandbox.session = session
            adopted = await session.attach(carry)
        except (StartFailed, SandboxGone) as exc:
            for process in carry.values():
                process._fail(SandboxGone(f"the sandbox {sandbox.id} is gone: {exc}"))
            await self._end(sandbox, "gone", f"its runner did not come back after a snapshot: {exc}")
            raise SandboxGone(
                f"the sandbox {sandbox.id} is gone: its runner did not come back after a snapshot: {exc}"
            ) from exc
        sandbox.processes = {p.id: p for p in adopted}

    async def delete_snapshot(self, key: str, workspace_id: str | None = None) -> None:
        """Remove a stored snapshot (nothing there is no error); SandboxRefused for a key that is not a snapshot's
        (of the workspace), SnapshotUnavailable without storage."""
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != KEY_PREFIX or snapshot_key(parts[1], parts[2]) != key:
            raise SandboxRefused(f"key {key!r} is not a sandbox snapshot's; it is {KEY_PREFIX}/<workspace>/<snapshot>")
        if workspace_id is not None and parts[1] != workspace_id:
            raise SandboxRefused(f"key {key!r} is a snapshot of another workspace")
        storage = self._storage()
        if storage is None:
            raise SnapshotUnavailable("this worker has no checkpoint storage, so it holds no snapshot to delete")
        try:
            await asyncio.to_thread(storage.delete, key)
        except (StorageError, ValueError) as exc:
            raise SnapshotFailed(f"deleting snapshot {key} from {storage.describe()} failed: {exc}") from exc

    # ----------------------------------------------------------------- images

    async def commit(self, sid: str, workspace_id: str | None, repository: object) -> CommittedImage:
        """Make the running sandbox's filesystem an image pushed to ``repository`` (one of its workspace's); it
        keeps running (:mod:`levers9.worker.sandbox_images`).

        SandboxRefused (the repository, named), the errors of :meth:`use` (SandboxEnded, SandboxGone...),
        :class:`~levers9.worker.sandbox_images.CommitUnavailable` (its image, or this worker, cannot; or another
        image of it is being made now) or
        :class:`~levers9.worker.sandbox_images.CommitFailed` (the runtime or the registry; the cause quoted).
        """
        sandbox, _ = self.use(sid, workspace_id)
        try:
            repository = check_repository_of(repository, sandbox.spec.workspace_id)
        except CommitRefused as exc:
            raise SandboxRefused(str(exc)) from None
        if sandbox.committing:
            raise CommitUnavailable(f"an image of the sandbox {sid} is being made now; ask again once it is made")
        sandbox.commits += 1
        sandbox.committing = True
        try:
            with self.held(sandbox):
                return await commit_image(
                    self.launcher.hooks,
                    self.launcher.runtime,
                    self.images,
                    sandbox_id=sid,
                    container_id=sandbox.box.cid,
                    image=sandbox.spec.image,
                    repository=repository,
                    tag=commit_tag(sid, sandbox.commits),
                    scratch=self.state_dir / "sandbox-commits",
                )
        finally:
            sandbox.committing = False

    # ----------------------------------------------------------------- find and use

    def get(self, sid: str, workspace_id: str | None = None) -> Sandbox:
        """The sandbox, running or ended; SandboxNotFound (also for another workspace's: it is not told apart)."""
        sandbox = self._live.get(sid) or self._ended.get(sid)
        if sandbox is None or (workspace_id is not None and sandbox.spec.workspace_id != workspace_id):
            raise SandboxNotFound(f"no sandbox {sid} on this worker")
        return sandbox

    def running(self, workspace_id: str | None = None) -> list[Sandbox]:
        """The running sandboxes (of the workspace), oldest first."""
        return [s for s in self._live.values() if workspace_id is None or s.spec.workspace_id == workspace_id]

    def use(self, sid: str, workspace_id: str | None = None) -> tuple[Sandbox, SandboxSession]:
        """A running sandbox and its session, touched (its idle clock starts again); why not, as an error."""
        sandbox = self.get(sid, workspace_id)
        if sandbox.state == "gone":
            raise SandboxGone(f"the sandbox {sid} is gone: {sandbox.reason}")
        if sandbox.state != "running" or sandbox.session is None:
            raise SandboxEnded(f"the sandbox {sid} has ended: {sandbox.reason}")
        if sandbox.snapshotting:
            raise SandboxBusy(f"a snapshot of the sandbox {sid} is being taken; ask again in a moment")
        if sandbox.session.gone is not None:  # died, and its watcher has not run yet
            raise sandbox.session.gone
        sandbox.touched = asyncio.get_running_loop().time()
        return sandbox, sandbox.session

    @contextlib.contextmanager
    def held(self, sandbox: Sandbox) -> Iterator[None]:
        """A request that lasts (an exec, a file, an output stream) is in flight: the sandbox is not idle meanwhile."""
        sandbox.in_flight += 1
        try:
            yield
        finally:
            sandbox.in_flight -= 1
            sandbox.touched = asyncio.get_running_loop().time()

    def update_ttl(self, sid: str, seconds: float, workspace_id: str | None = None) -> Sandbox:
        """End the sandbox ``seconds`` from now (0: no deadline), whatever its timeout said before."""
        if not 0 <= seconds < 10**7:
            raise SandboxRefused(f"ttl is {seconds}; give seconds from 0 (no deadline) up to 10000000")
        sandbox, _ = self.use(sid, workspace_id)
        loop = asyncio.get_running_loop()
        sandbox.deadline = loop.time() + seconds if seconds else 0.0
        if sandbox.watcher is not None:  # it sleeps until the old deadline: look again now
            sandbox.watcher.cancel()
        sandbox.watcher = asyncio.ensure_future(self._watch(sandbox))
        return sandbox

    # ----------------------------------------------------------------- end

    async def terminate(self, sid: str, workspace_id: str | None = None, reason: str = "terminated") -> Sandbox:
        """End a sandbox (nothing of it is left); an ended one is returned as it is."""
        sandbox = self.get(sid, workspace_id)
        await self._end(sandbox, "ended", reason)
        return sandbox

    async def close(self) -> None:
        """End every sandbox: the worker is stopping."""
        self._closed = True
        warm, self._warm = self._warm, []
        await asyncio.gather(
            *(self._end(s, "ended", "the worker stopped") for s in list(self._live.values())),
            *(self._remove(s) for s in warm),
            return_exceptions=True,
        )
        # warm sandboxes still starting are stopped (each removes what it made); discards finish
        for task in self._warm_tasks:
            task.cancel()
        await asyncio.gather(*list(self._warm_tasks), *list(self._tasks), return_exceptions=True)
        # and those that ended just before, still being removed
        await asyncio.gather(*(s.ending for s in self._ended.values() if s.ending is not None), return_exceptions=True)
        for made in ("sandboxes", "sandbox-signals", "sandbox-images"):
            with contextlib.suppress(OSError):
                (self.state_dir / made).rmdir()

    async def _watch(self, sandbox: Sandbox) -> None:
        """End the sandbox at its deadline, when idle too long, or as gone when its container dies."""
        assert sandbox.session is not None
        loop = asyncio.get_running_loop()
        idle_s = sandbox.spec.idle_timeout_s
        while sandbox.state == "running":
            now = loop.time()
            if sandbox.deadline and now >= sandbox.deadline:
                self._spawn_end(sandbox, "ended", f"it timed out ({sandbox.spec.timeout_s:g} s after it was created)")
                return
            wake = sandbox.deadline - now if sandbox.deadline else None
            if idle_s:
                if sandbox.busy():
                    sandbox.touched = now
                if now - sandbox.touched >= idle_s:
                    self._spawn_end(sandbox, "ended", f"it was idle for {idle_s:g} s (idle_timeout)")
                    return
                until_idle = min(IDLE_CHECK_S, sandbox.touched + idle_s - now)
                wake = until_idle if wake is None else min(wake, until_idle)
            try:
                gone = await asyncio.wait_for(sandbox.session.wait_ended(), wake)
            except TimeoutError:
                continue
            if sandbox.state == "running":
                self._spawn_end(sandbox, "gone", str(gone))
            return

    def _spawn_end(self, sandbox: Sandbox, state: str, reason: str) -> None:
        # the watcher is cancelled by _end: it must not be the task that awaits it
        task = asyncio.ensure_future(self._end(sandbox, state, reason))
        task.set_name(f"levers9-sandbox-end-{sandbox.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end(self, sandbox: Sandbox, state: str, reason: str) -> None:
        """Mark it ended (the first reason stays) and return once everything it held is removed."""
        if sandbox.ending is None:
            sandbox.state, sandbox.reason, sandbox.ended_at = state, reason, time.time()
            log.info("sandbox %s ended: %s", sandbox.id, reason)
            if self.on_end is not None:
                self.on_end(sandbox.id)
            self._live.pop(sandbox.id, None)
            self._ended[sandbox.id] = sandbox
            while len(self._ended) > KEPT_ENDED:
                self._ended.popitem(last=False)
            watcher = sandbox.watcher
            if watcher is not None and watcher is not asyncio.current_task():
                watcher.cancel()
            sandbox.ending = asyncio.ensure_future(self._remove(sandbox))
            sandbox.ending.set_name(f"levers9-sandbox-remove-{sandbox.id}")
        await asyncio.shield(sandbox.ending)

    async def _remove(self, sandbox: Sandbox) -> None:
        box = sandbox.box
        try:
            hung_up = False
            if sandbox.session is not None:
                await sandbox.session.close()  # the runner ends when its worker hangs up, and its container with it
                hung_up = True
            try:
                await self.launcher.stop(box, hung_up=hung_up)
            except Levers9Error as exc:
                log.error("removing sandbox %s's container %s failed: %s", sandbox.id, box.cid, exc)
                if sandbox.veth:  # it may still run: its rules stay, until the worker's next start
                    log.error("sandbox %s's network rules (%s) stay while its container may run", sandbox.id, box.cid)
            else:
                if sandbox.veth:
                    try:
                        await asyncio.to_thread(host_guard.unconfine, sandbox.veth)
                    except host_guard.HostGuardError as exc:
                        log.error("removing sandbox %s's network rules failed: %s", sandbox.id, exc)
        finally:
            if box.signal_dir is not None:
                shutil.rmtree(box.signal_dir, ignore_errors=True)
            self.ports.release(box.port)
            gpus, box.gpus = box.gpus, []
            self.gpus.give(gpus)
            shutil.rmtree(sandbox.group.handler_dir, ignore_errors=True)


def _stub(sid: str, spec: SandboxSpec) -> StubSpec:
    """The warm pool's description of a sandbox's container (no handler: the runner serves processes and files)."""
    return StubSpec(
        stub_id=sid,
        workspace_id=spec.workspace_id,
        name=spec.name or sid,
        image=spec.image,
        handler=b"",
        python_version=spec.python_version,
        cpu_millicores=spec.cpu_millicores,
        memory_mib=spec.memory_mib,
        gpu_count=spec.gpu_count,
        env=dict(spec.env),
        secret_env=dict(spec.secret_env),
        kind=SANDBOX_KIND,
        ports=spec.ports,
        volumes=spec.volumes,
    )


def _confining(spec: SandboxSpec) -> str:
    """The field that asked for the sandbox's network to be cut, for an error."""
    return "allow_list" if spec.allow_list else "block_network"
