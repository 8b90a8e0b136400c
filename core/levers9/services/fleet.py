"""The workers' side of the controlplane: who a worker is, registering it, what it may read and write, leaving.

Workers authenticate with their own machine (or pool worker) token, and a
worker of one machine cannot speak for another.

A machine's token as its provider booted it with (``WorkerBootstrap.token``,
the machine record's ``token_id``) is a *join* token: single use, expiring
with the machine's ``register_by``. The first registration with it spends it
(:meth:`TokenStore.redeem`, one conditional update, so of two racing
registrations exactly one wins) and answers a session credential: another
machine token of the same machine, which the worker uses for every later call
and for registering again, on any replica. A second registration with the
join token is refused (Unauthenticated), even from the same machine: a worker
whose first answer was lost cannot join, never registers, and the reconciler
replaces its machine at ``register_by``; that costs one machine in a rare
case, where accepting a spent token again would let whoever read the user
data join in the worker's place. Terminating the machine revokes both (they
share its id as subject). Pool worker tokens (``levers9 token create --kind
worker``) are not join tokens: they are reused as they are. A worker of a workspace's
attached pool only ever serves that workspace: every task, blob, stub and
checkpoint it names is checked with :func:`may_serve`. A worker reads only the
arguments of an unfinished task placed in its pools and writes blobs only into
that task's workspace.

Where the machine's provider can prove which machine a worker runs on (its
``levers9_verify_identity``: EC2 checks the signed instance identity
document), the join token is also bound to the machine: the registration must
carry the identity the worker's ``levers9_machine_identity`` made, and the
provider must accept it for this machine, *before* the token is spent. A
token read from the user data and shown from anywhere else is refused
(Unauthenticated) and stays unspent, so the real worker still joins. A
machine whose record has no provider id yet (its provision's answer is still
being recovered) cannot be checked: that registration is answered ABORTED,
which the worker retries.

A worker registers only with a controlplane of its own levers9 version
(:func:`check_worker_version`): the full version string must be equal, local
and development segments included, because the wire protocol and the
functions pickled for a worker may change between any two builds. A worker of
another version (or one that names none) is refused with
:class:`WorkerVersionMismatch` (FAILED_PRECONDITION on the wire) before its
join token is spent, so the same machine registers once its image is rebuilt.

Whether the controlplane can connect to a worker is decided at each
registration (:func:`levers9.services.tunnels.decide_tunnel`: the provider's
declaration, else a connection tried to the port the worker offers); a worker
it cannot reach is told to open its tunnel (``Registration.tunnel``), and the
verdict is kept with the worker (``WorkerInfo.tunnel``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from levers9.__about__ import __version__
from levers9.hooks.errors import IdentityRejected, Levers9Error
from levers9.hooks.types import MachineIdentity
from levers9.payloads import parse_ref
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.provisioning import stored_machine
from levers9.services import reach, tunnels
from levers9.services.auth import PermissionDenied, Principal, Unauthenticated
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.reports import ServingReport
from levers9.services.sandbox_hosts import SandboxHosts
from levers9.services.stubs import StubSettings
from levers9.services.tunnels import decide_tunnel
from levers9.state.errors import Conflict, NotFound
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.records import CheckpointRecord, MachineRecord, StubRecord, TokenKind, root_workspace

__all__ = [
    "Registration",
    "StubBundle",
    "WorkerIdentity",
    "WorkerVersionMismatch",
    "authenticate_worker",
    "calling_worker",
    "check_worker_version",
    "cordon",
    "heartbeats",
    "leave",
    "may_serve",
    "read_arguments",
    "record_checkpoint",
    "register",
    "store_result",
    "stub_bundle",
    "with_work",
]

log = logging.getLogger(__name__)


class WorkerVersionMismatch(Levers9Error):
    """A worker of another levers9 version than the controlplane's: refused at registration, not retried."""


def check_worker_version(version: str, expected: str = __version__) -> None:
    """WorkerVersionMismatch unless ``version`` (what the worker says at Register) is exactly ``expected``."""
    if version.strip() == expected:
        return
    said = version.strip() or "(a worker that names no version)"
    raise WorkerVersionMismatch(
        f"worker levers9 {said} does not match the controlplane's {expected}: rebuild the worker image with "
        f"`levers9 worker-image build` on a machine with levers9 {expected} (or install the controlplane's own "
        "wheel, GET /api/v1/wheels, never levers9 by name from a package index)"
    )


@dataclass(frozen=True)
class Registration:
    worker_id: str
    keepalive_s: float
    runtime: str
    #: the pool's runtime settings as JSON ("" when it has none)
    runtime_settings_json: str
    checkpoint_storage_url: str
    checkpoint_cache_max_bytes: int
    checkpoint_cache_dir: str
    max_payload_bytes: int
    #: the worker's session credential, when it registered with its machine's join token (else "")
    session_token: str = field(default="", repr=False)
    #: the controlplane cannot connect to the worker: it must open its tunnel to this replica
    tunnel: bool = False
    #: the room the scheduler counts the worker as having (the worker starts queued calls within it)
    cpu_millicores: int = 0
    memory_mib: int = 0
    #: the volumes' file system, for a worker that mounts it itself (see :func:`mounts_volumes_directly`)
    volumes_metadata_url: str = ""
    volumes_env: dict[str, str] = field(default_factory=dict, repr=False)
    #: the pool's ``sandboxes``: the most the worker runs at once (0: none; see :mod:`levers9.services.sandboxes`)
    max_sandboxes: int = 0
    #: the pool's ``sandboxes_warm``: sandboxes kept started for the next creates
    warm_sandboxes: int = 0


@dataclass(frozen=True)
class WorkerIdentity:
    """A registered worker whose token was shown to speak for it."""

    spec: PoolSpec
    worker_id: str
    gpu_count: int
    #: its serving containers are reached through its tunnel
    tunnel: bool = False


@dataclass(frozen=True)
class StubBundle:
    """Everything a worker needs to run a stub's containers."""

    record: StubRecord
    settings: StubSettings
    handler: bytes
    #: the values of the secrets the stub names (a secret deleted since is left out)
    secret_env: dict[str, str]
    #: the newest checkpoint to restore from, for a stub that checkpoints
    checkpoint: CheckpointRecord | None
    #: the values of the secrets its cloud buckets name, by secret name
    bucket_keys: dict[str, str] = field(default_factory=dict, repr=False)


async def authenticate_worker(services: Services, token: str | None) -> Principal:
    """The machine or pool worker behind ``token``; Unauthenticated for any other."""
    return await services.auth.verify(token, TokenKind.MACHINE, TokenKind.WORKER)


async def _pool_of(services: Services, principal: Principal, asked: str) -> tuple[PoolSpec, str | None]:
    """The pool the token may serve and the machine id it speaks for."""
    pools = services.pools
    machine_id: str | None = None
    if principal.kind is TokenKind.MACHINE:
        machine_id = principal.subject
        machine = await services.machines.get(machine_id or "")
        if machine is None:
            raise PermissionDenied(f"machine {machine_id} is not known (terminated?); its token is no longer valid")
        pool_name = machine.pool
    else:
        pool_name = principal.subject or ""
    if asked and asked != pool_name:
        raise PermissionDenied(f"this token serves pool {pool_name!r}, not {asked!r}")
    spec = pools.get(pool_name)
    if spec is None:
        raise NotFound("pool", f"{pool_name} (configured pools: {', '.join(sorted(pools)) or 'none'})")
    return spec, machine_id


async def register(
    dp: DataPlane,
    principal: Principal,
    *,
    pool: str,
    worker_id: str,
    gpus: Sequence[str],
    cpu_millicores: int,
    memory_mib: int,
    hostname: str,
    running: Sequence[str] = (),
    version: str | None = None,
    peer_host: str = "",
    probe_port: int = 0,
    probe_nonce: str = "",
    identity: MachineIdentity | None = None,
    max_queued: int = 0,
) -> Registration:
    """Register a worker of the token's pool (a reconnect of the same machine keeps its id).

    ``max_queued``: how many calls the worker can hold waiting in its own queue (capped by the scheduler's
    ``worker_queue``; 0 for a worker that starts every call it is sent).

    ``identity``: the machine identity the worker sent, checked before a join token is spent where the
    machine's provider binds tokens to machines (see the module docstring).

    ``peer_host``: the address the worker's call came from; ``probe_port``/``probe_nonce``: what it listens
    on and answers for the reachability check (see :func:`levers9.services.tunnels.decide_tunnel`).

    ``version``: the worker's levers9 version, checked with :func:`check_worker_version` before anything
    else (None: the caller checked it, or registers a worker of this process).

    ``running``: the calls the worker still holds (running, or with a result yet to be delivered), as it says
    when it comes back (to this replica or another, after the one it talked to went away). They are claimed
    for it here, so this replica finishes them as the one that dispatched them would have (retries included);
    they are not run again. A call the worker was sent but never got goes back on the backlog.
    """
    if version is not None:
        check_worker_version(version)
    services = dp.services
    spec, machine_id = await _pool_of(services, principal, pool)
    session_id, session_token = await _redeem_join_token(services, principal, spec, machine_id, identity)
    try:
        registration = await _register(
            dp,
            spec,
            machine_id,
            worker_id=worker_id,
            gpus=gpus,
            cpu_millicores=cpu_millicores,
            memory_mib=memory_mib,
            hostname=hostname,
            running=running,
            reach=(peer_host, probe_port, probe_nonce),
            max_queued=max_queued,
        )
    except BaseException:
        if session_id:  # the join token stays spent: the registration failed for a reason of its own
            await services.tokens.revoke(session_id)
        raise
    if not session_token:
        return registration
    return dataclasses.replace(registration, session_token=session_token)


async def _redeem_join_token(
    services: Services, principal: Principal, spec: PoolSpec, machine_id: str | None, identity: MachineIdentity | None
) -> tuple[str, str]:
    """The session credential's id and value for a registration with a machine's join token (empty for others)."""
    if principal.kind is not TokenKind.MACHINE or machine_id is None:
        return "", ""
    machine = await services.machines.get(machine_id)
    if machine is None or machine.token_id != principal.token_id:
        return "", ""  # a session credential: not single use
    deadline = machine.register_by
    if deadline is not None:
        deadline = deadline if deadline.tzinfo is not None else deadline.replace(tzinfo=UTC)
        if deadline <= datetime.now(UTC):
            raise Unauthenticated(
                f"machine {machine_id}'s join token expired with its registration deadline "
                f"({deadline.isoformat(timespec='seconds')})"
            )
    await _verify_identity(services, spec, machine, identity)
    if not await services.tokens.redeem(principal.token_id):
        services.auth.forget(principal.token_id)
        raise Unauthenticated(
            f"machine {machine_id}'s join token was already used: a worker registers with it once, then with "
            "the session credential it was given"
        )
    services.auth.forget(principal.token_id)
    record, session_token = await services.tokens.issue("machine", subject=machine_id)
    log.info("machine %s joined: its join token is spent, its worker holds a session credential", machine_id)
    return record.id, session_token


async def _verify_identity(
    services: Services, spec: PoolSpec, machine: MachineRecord, identity: MachineIdentity | None
) -> None:
    """Refuse a join token shown by a worker that does not prove it runs on ``machine`` (where its provider can tell)."""
    hooks = services.hooks
    if not hooks.binds_identity(spec.pool.provider):
        return
    if machine.provider_id is None:
        raise Conflict(
            f"machine {machine.id} has no provider id recorded yet, so its identity cannot be checked; register "
            "again in a moment"
        )
    try:
        await hooks.verify_identity(spec.pool, stored_machine(machine), identity)
    except IdentityRejected as exc:
        log.warning("machine %s: a registration with its join token was refused: %s", machine.id, exc)
        raise Unauthenticated(
            f"machine {machine.id}'s join token was shown by a worker that did not prove it runs on that machine "
            f"({spec.pool.provider} {machine.provider_id}): {exc}; the token is not spent"
        ) from None


async def _register(
    dp: DataPlane,
    spec: PoolSpec,
    machine_id: str | None,
    *,
    worker_id: str,
    gpus: Sequence[str],
    cpu_millicores: int,
    memory_mib: int,
    hostname: str,
    running: Sequence[str],
    reach: tuple[str, int, str] = ("", 0, ""),
    max_queued: int = 0,
) -> Registration:
    services = dp.services
    registry = services.scheduler.workers
    kept = ""
    if worker_id:
        old = await registry.get(worker_id)
        if old is None or old.info.machine_id == machine_id:
            kept = worker_id  # a reconnect keeps its id, so late reports still match
    worker_id = kept or f"wkr_{uuid.uuid4().hex[:16]}"
    machine = await services.machines.get(machine_id) if machine_id else None
    tunnel = await decide_tunnel(
        declared_reachable=((machine.provider_data or {}).get("reachable") if machine is not None else None),
        peer_host=reach[0],
        probe_port=reach[1],
        probe_nonce=reach[2],
        worker=worker_id,
    )
    usable = [g for g in gpus if not spec.gpu or g == spec.gpu]
    info = WorkerInfo(
        id=worker_id,
        pool=spec.name,
        cpu_millicores=min(cpu_millicores or spec.cpu_millicores, spec.cpu_millicores),
        memory_mib=min(memory_mib or spec.memory_mib, spec.memory_mib),
        gpu=spec.gpu,
        gpu_count=min(spec.gpu_count, len(usable)) if spec.gpu else 0,
        runtime=spec.pool.runtime,
        machine_id=machine_id,
        address=hostname or None,
        workspace=spec.workspace,
        tunnel=tunnel,
        queue=max(0, max_queued),
    )
    if spec.gpu and info.gpu_count < spec.gpu_count:
        log.warning(
            "worker %s of pool %s found %d %s GPUs, the pool promises %d",
            worker_id,
            spec.name,
            info.gpu_count,
            spec.gpu,
            spec.gpu_count,
        )
    await dp.register_worker(info)
    if kept:
        # what a replica took off its queue but it never got goes back on the backlog; what it holds is its own
        still = await services.scheduler.reclaim_worker(worker_id, running)
        if still:
            claimed = await dp.claim(worker_id, still)
            log.info("worker %s came back holding %d calls; %d are unfinished", worker_id, len(still), claimed)
    settings = services.loaded.runtime_settings.get(spec.name)
    log.info("worker %s registered for pool %s (%s)", worker_id, spec.name, hostname)
    checkpoints = services.config.checkpoints
    return Registration(
        worker_id=worker_id,
        keepalive_s=max(0.5, services.config.scheduler.worker_keepalive_s / 3),
        runtime=spec.pool.runtime,
        runtime_settings_json=json.dumps(settings.model_dump(mode="json")) if settings is not None else "",
        checkpoint_storage_url=checkpoint_storage_url(services),
        checkpoint_cache_max_bytes=checkpoints.cache_max * 1024 * 1024,
        checkpoint_cache_dir=checkpoints.cache_dir or "",
        max_payload_bytes=dp.max_payload_bytes,
        # a worker serving sandboxes keeps its tunnel open even when reachable: its sandbox server listens on its
        # loopback only, reached through the tunnel (the gateway still connects to its containers directly)
        tunnel=tunnel or spec.sandboxes > 0,
        max_sandboxes=spec.sandboxes,
        warm_sandboxes=spec.sandboxes_warm,
        cpu_millicores=info.cpu_millicores,
        memory_mib=info.memory_mib,
        **_volumes_access(services, spec),
    )


def checkpoint_storage_url(services: Services) -> str:
    """Where every worker stores checkpoints and sandbox snapshots (a directory or s3://...), as it is told."""
    configured = services.config.checkpoints.storage_url
    return configured or str(Path(services.config.data_dir).expanduser().resolve() / "checkpoints")


def mounts_volumes_directly(spec: PoolSpec) -> bool:
    """Whether a pool's workers mount the volumes' file system themselves (``volume_access``; by default the
    ``local`` provider's, which run on the controlplane's own host). Every other worker reaches each volume
    through the controlplane, with a token for that volume alone, and never holds the file system's
    credentials."""
    if spec.volume_access is not None:
        return spec.volume_access == "direct"
    return spec.pool.provider == "local"


def _volumes_access(services: Services, spec: PoolSpec) -> dict[str, Any]:
    if not mounts_volumes_directly(spec):
        return {}
    fs = services.volume_files.fs
    return {"volumes_metadata_url": fs.metadata_url, "volumes_env": dict(fs.env)}


async def calling_worker(services: Services, principal: Principal, worker_id: str) -> WorkerIdentity:
    """The registered worker ``worker_id``, once ``principal`` is shown to speak for it."""
    state = await services.scheduler.workers.get(worker_id)
    if state is None:
        raise NotFound("worker", f"{worker_id} (register again)")
    spec, machine_id = await _pool_of(services, principal, state.info.pool)
    if state.info.machine_id != machine_id:
        raise PermissionDenied(f"worker {worker_id} belongs to another machine")
    return WorkerIdentity(spec, worker_id, state.info.gpu_count, tunnel=state.info.tunnel)


def may_serve(spec: PoolSpec, workspace_id: str, what: str) -> None:
    """PermissionDenied unless a worker of ``spec`` may act for ``workspace_id`` (an attached pool: only its own)."""
    if spec.workspace is not None and spec.workspace != root_workspace(workspace_id):
        raise PermissionDenied(f"{what} belongs to a workspace pool {spec.name} does not serve")


def serving_report(
    dp: DataPlane, worker_id: str, report: ServingReport, *, tunnel: bool, peer_host: str
) -> ServingReport | None:
    """Where the gateway reaches a worker's serving container (through its tunnel, if it has one); None if nowhere.

    An address the gateway may not connect to (:mod:`levers9.services.reach`) is refused and logged.
    """
    if tunnel:
        return tunnels.through_tunnel(worker_id, report)
    reason = reach.check_report(report, peer_host=peer_host)
    if reason is not None:
        dp.refuse(worker_id, "address", [report.task_id], reason)
        return None
    return report


async def _unfinished_task(dp: DataPlane, worker: WorkerIdentity, task_id: str, what: str) -> tuple[str, bytes]:
    """The workspace and stored arguments of an unfinished task placed on ``worker``.

    A task placed on another worker, or on none yet, is refused as unknown (and logged as a security
    event): a worker reads the arguments of, and uploads results for, its own calls only.
    """
    if not await dp.placed_on(worker.worker_id, [task_id]):
        dp.refuse(worker.worker_id, what, [task_id])
        raise NotFound("task", f"{task_id} (not placed on worker {worker.worker_id}, or it has ended)")
    found = await dp.calls.dispatch([task_id])
    if not found or found[0].status not in ("pending", "running"):
        raise NotFound("task", f"{task_id} (unknown, or it has ended)")
    may_serve(worker.spec, found[0].workspace_id, f"task {task_id}")
    return found[0].workspace_id, found[0].args


async def store_result(
    dp: DataPlane, worker: WorkerIdentity, task_id: str, size: int, pieces: AsyncIterable[bytes]
) -> str:
    """Store a big result of an unfinished task, in that task's workspace; the blob's id."""
    workspace, _ = await _unfinished_task(dp, worker, task_id, "result")
    return await dp.put_blob(workspace, size, pieces, "the call's result")


async def read_arguments(dp: DataPlane, worker: WorkerIdentity, task_id: str, blob_id: str) -> AsyncIterator[bytes]:
    """The big arguments of an unfinished task, and only the blob those name."""
    workspace, args = await _unfinished_task(dp, worker, task_id, "arguments")
    ref = parse_ref(args)
    if ref is None or ref[0] != blob_id:
        raise NotFound("blob", f"{blob_id} (not the arguments of task {task_id})")
    async for piece in dp.read_blob(workspace, blob_id):
        yield piece


async def record_checkpoint(
    dp: DataPlane,
    worker: WorkerIdentity,
    *,
    checkpoint_id: str,
    stub_id: str,
    runtime: str,
    gpu: str,
    status: str,
    path: str,
    size_bytes: int,
    error: str,
) -> CheckpointRecord:
    """A new checkpoint of a stub (no ``checkpoint_id``), or how taking or restoring one went."""
    store = CheckpointStore(dp.services.db)
    if checkpoint_id:
        found = await store.get(checkpoint_id)
        if found is None:
            raise NotFound("checkpoint", checkpoint_id)
        may_serve(worker.spec, found.workspace_id, f"checkpoint {found.id}")
        await _ran(dp, worker, found.stub_id, f"checkpoint {found.id}")
        return await store.set_status(
            found.id, status, path=path or None, size_bytes=size_bytes or None, error=error[:2000] or None
        )
    stub, _ = await dp.stub(stub_id)
    may_serve(worker.spec, stub.workspace_id, f"stub {stub.id}")
    await _ran(dp, worker, stub.id, f"stub {stub.id}")
    return await store.create(stub.workspace_id, runtime, stub_id=stub.id, gpu=gpu or None)


async def _ran(dp: DataPlane, worker: WorkerIdentity, stub_id: str | None, what: str) -> None:
    """PermissionDenied (logged as a security event) unless a call of ``stub_id`` was placed on ``worker``."""
    if stub_id is not None and not await dp.ran_stub(worker.worker_id, stub_id):
        dp.refuse(worker.worker_id, "checkpoint", [stub_id])
        raise PermissionDenied(f"worker {worker.worker_id} ran no call of {what}: it may not record its checkpoints")


async def stub_bundle(dp: DataPlane, stub_id: str) -> StubBundle:
    """A stub's definition with its handler, its secrets' values and the checkpoint to restore from."""
    record, settings = await dp.stub(stub_id)
    handler = await dp.calls.handler(stub_id) or b""
    secret_env: dict[str, str] = {}
    for name in settings.secrets:
        value = await dp.services.secrets.get(record.workspace_id, name)
        if value is not None:
            secret_env[name] = value
    latest = await CheckpointStore(dp.services.db).latest(stub_id) if settings.checkpoint_enabled else None
    bucket_keys: dict[str, str] = {}
    for volume in settings.volumes:
        for name in (volume.bucket.access_key, volume.bucket.secret_key) if volume.bucket is not None else ():
            value = await dp.services.secrets.get(record.workspace_id, name) if name else None
            if value is not None:
                bucket_keys[name] = value
    return StubBundle(record, settings, handler, secret_env, latest, bucket_keys)


async def heartbeats(services: Services, worker_ids: Sequence[str]) -> set[str]:
    """Many workers' keepalives in one step; the ids that were presumed dead (their sessions end)."""
    return await services.scheduler.heartbeat_many(worker_ids)


async def with_work(services: Services) -> set[str]:
    """The workers (of any replica) with work placed on them that they have not taken, in one step."""
    return await services.scheduler.workers.with_work()


async def announce_sandboxes(services: Services, worker_id: str, port: int, secret: str) -> None:
    """The worker serves its sandboxes at ``port`` on its loopback, with ``secret``: kept for every replica."""
    hosts = SandboxHosts(services.redis, services.box, prefix=services.scheduler.workers.prefix)
    await hosts.announce(worker_id, port, secret)
    log.info("worker %s serves sandboxes", worker_id)


async def sandboxes_ended(services: Services, worker_id: str, sandbox_ids: Sequence[str]) -> None:
    """Sandboxes of this worker ended: the room each held goes back (only the worker's own are taken)."""
    hosts = SandboxHosts(services.redis, services.box, prefix=services.scheduler.workers.prefix)
    for sandbox_id in sandbox_ids:
        record = await hosts.find(sandbox_id)
        if record is None or record.worker_id != worker_id:
            continue
        await hosts.ended(record)
        if record.hold:
            await services.scheduler.workers.release_sandbox(record.hold, now_ms=services.scheduler.ctx.now_ms())


async def cordon(services: Services, worker_id: str) -> None:
    """The worker drains: no new work is placed on it."""
    await services.scheduler.workers.cordon(worker_id)


async def leave(services: Services, worker_id: str) -> None:
    """A drained worker that hung up is gone for good: take it out now, its work requeued as the reaper would."""
    try:
        await services.scheduler.remove_worker(worker_id, "left while draining", force=True)
    except Exception:
        # the reaper takes it out once its keepalive lapses
        log.exception("taking drained worker %s out failed; the reaper will", worker_id)
