"""The Worker gRPC service: registration and the session each worker holds open.

A session is one bidirectional stream. Downstream, the controlplane sends a
stub's definition the first time the session needs it, then container
requests as the scheduler places work on the worker, and cancellations.
Upstream, the worker sends keepalives and batches of started tasks, results
and output. Workers authenticate with their own machine (or pool worker)
token; a worker of one machine cannot speak for another. A machine's first
registration spends its join token and answers the worker's session
credential (``RegisterResponse.session_token``, see :mod:`levers9.services.fleet`). A worker the
controlplane cannot connect to (``RegisterResponse.tunnel``) holds a ``Tunnel`` stream, whose frames go
to and from :class:`levers9.services.tunnels.TunnelRegistry`, and the serving containers it reports are
recorded at ``tunnel://`` addresses. Who a worker is and
what it may touch is decided in :mod:`levers9.services.fleet`; this module only
translates messages.

An idle session costs no timer and no Redis command of its own: the sessions a
replica holds share one timer (:class:`_Sessions`), which every :data:`TICK_S`
(a tenth of ``scheduler.worker_keepalive_s`` when that is shorter)

* sends the keepalives received since its last tick to Redis in one step. A
  keepalive therefore reaches Redis at most one tick late, well within the
  worker's keepalive TTL; a worker found presumed dead (reaped) has its session
  ended, and registers again. A tick that fails (Redis unreachable) is logged
  and its keepalives go with the next one. Keepalives still waiting when the
  replica's last session ends are dropped: their workers have left this
  replica and register again wherever they reconnect.
* asks Redis in one step which workers have requests on their queue that they
  have not taken, and wakes the sessions it holds of those. Work placed on a
  worker is announced by the hub's wake-up; that is an optimisation (a notice
  from another replica can be lost), and this bounds what a lost one costs to
  one tick.

A replica that was frozen (SIGSTOP, a host that stalled) does not trust the sessions it held: their
workers' pings found it gone and they registered elsewhere, and a session that resumed would take
their calls off the queue into a dead stream. The shared timer notices the gap (its tick came more
than :data:`STALE_S` late) and ends every session it holds, and a session checks the same before each
take; a worker that was still there registers again (saying what it runs, so nothing is run twice).

A session and a tunnel hold their token's guard (:mod:`levers9.services.revocation`)
for as long as they are open: when the worker's credential is revoked (by an
operator, or with its machine, which terminating revokes), they end with
UNAUTHENTICATED, "token revoked", and the worker stops rather than register again. When the replica
stops they end at once with UNAVAILABLE (:meth:`~levers9.services.revocation.OpenStreams.stop`), and the
worker registers with another replica, saying what it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import grpc
from pydantic import ValidationError

from levers9.cancelling import raise_if_cancelling
from levers9.controlplane.grpc_api import blob_upload
from levers9.controlplane.grpc_errors import status_of, streaming, unary
from levers9.hooks.types import MachineIdentity
from levers9.payloads import BATCH_BYTES
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from levers9.services import fleet, tunnels
from levers9.services.auth import Principal, bearer
from levers9.services.dataplane import DataPlane
from levers9.services.reports import ServingReport, TaskOutcome, WorkerReport
from levers9.services.revocation import ReplicaStopping, TokenRevoked
from levers9.services.stubs import CALLED_KINDS
from levers9.services.volume_access import DAV_PREFIX, VolumeToken, mint_token
from levers9.state.sql.records import CheckpointRecord
from levers9.tunnel import frames

__all__ = ["WorkerService"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
_TAKE = 256
#: the period of the timer a replica's sessions share (see the module docstring)
TICK_S = 1.0
#: a tick this late means the replica was stopped (or stalled) meanwhile: its sessions are not trusted
STALE_S = 5.0


def checkpoint_ref(record: CheckpointRecord) -> worker_pb2.CheckpointRef:
    return worker_pb2.CheckpointRef(
        id=record.id,
        runtime=record.runtime,
        status=record.status.value,
        path=record.path or "",
        size_bytes=record.size_bytes or 0,
        gpu=record.gpu or "",
        workspace_id=record.workspace_id,
        stub_id=record.stub_id or "",
    )


def _metadata(context: Context, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return None


def _identity(request: worker_pb2.RegisterRequest) -> MachineIdentity | None:
    """The machine identity a Register carries; None when it has none (a worker whose provider proves nothing)."""
    if not request.HasField("identity") or not request.identity.document:
        return None
    try:
        return MachineIdentity(document=request.identity.document, signature=request.identity.signature)
    except ValidationError as exc:
        raise ValueError(f"RegisterRequest.identity: {exc.errors()[0]['msg']}") from None


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        dataplane: DataPlane,
        tunnel_registry: tunnels.TunnelRegistry | None = None,
        *,
        registry_url: str = "",
        http_url: str = "",
    ) -> None:
        self.dp = dataplane
        #: the controlplane's image registry, as workers reach it (empty: none)
        self.registry_url = registry_url
        #: the controlplane's HTTP listener, as workers reach it: where they mount volumes over WebDAV
        self.http_url = http_url.rstrip("/")
        self.services = dataplane.services
        #: the tunnels workers hold to this replica (shared with the gateway's upstream)
        self.tunnels = tunnel_registry or tunnels.TunnelRegistry()
        self.sessions = _Sessions(dataplane)

    async def _principal(self, context: Context) -> Principal:
        return await fleet.authenticate_worker(self.services, bearer(context.invocation_metadata()))

    async def _worker(self, context: Context) -> fleet.WorkerIdentity:
        """The calling worker, once its token is shown to speak for it."""
        _, worker = await self._caller(context)
        return worker

    async def _caller(self, context: Context) -> tuple[Principal, fleet.WorkerIdentity]:
        """The calling worker and the token it showed."""
        principal = await self._principal(context)
        worker_id = _metadata(context, WORKER_ID_METADATA) or ""
        return principal, await fleet.calling_worker(self.services, principal, worker_id)

    @unary
    async def Register(self, request: worker_pb2.RegisterRequest, context: Context) -> worker_pb2.RegisterResponse:
        principal = await self._principal(context)
        done = await fleet.register(
            self.dp,
            principal,
            pool=request.pool,
            worker_id=request.worker_id,
            gpus=[g.gpu for g in request.gpus],
            cpu_millicores=request.cpu_millicores,
            memory_mib=request.memory_mib,
            hostname=request.hostname,
            running=list(request.running),
            version=request.version,
            peer_host=tunnels.peer_host(context.peer() or ""),
            probe_port=request.probe_port,
            probe_nonce=request.probe_nonce,
            identity=_identity(request),
            max_queued=max(0, request.max_queued),
        )
        return worker_pb2.RegisterResponse(
            worker_id=done.worker_id,
            keepalive_s=done.keepalive_s,
            runtime=done.runtime,
            runtime_settings_json=done.runtime_settings_json,
            checkpoint_storage_url=done.checkpoint_storage_url,
            checkpoint_cache_max_bytes=done.checkpoint_cache_max_bytes,
            checkpoint_cache_dir=done.checkpoint_cache_dir,
            max_payload_bytes=done.max_payload_bytes,
            session_token=done.session_token,
            tunnel=done.tunnel,
            cpu_millicores=done.cpu_millicores,
            memory_mib=done.memory_mib,
            registry_url=self.registry_url,
            volumes_metadata_url=done.volumes_metadata_url,
            volumes_env=done.volumes_env,
            max_sandboxes=done.max_sandboxes,
            warm_sandboxes=done.warm_sandboxes,
        )

    @unary
    async def PutBlob(
        self, request_iterator: AsyncIterator[common_pb2.BlobChunk], context: Context
    ) -> common_pb2.BlobRef:
        """A worker stores a big result, in the workspace of the unfinished task it belongs to."""
        worker = await self._worker(context)
        first, pieces = await blob_upload(request_iterator)
        blob_id = await fleet.store_result(self.dp, worker, first.task_id, first.total_bytes, pieces)
        return common_pb2.BlobRef(blob_id=blob_id, size_bytes=first.total_bytes)

    @streaming
    async def GetBlob(
        self, request: common_pb2.GetBlobRequest, context: Context
    ) -> AsyncIterator[common_pb2.BlobChunk]:
        """A worker reads the big arguments of an unfinished task, and only the blob those name."""
        worker = await self._worker(context)
        async for piece in fleet.read_arguments(self.dp, worker, request.task_id, request.blob_id):
            yield common_pb2.BlobChunk(data=piece)

    @unary
    async def RecordCheckpoint(
        self, request: worker_pb2.RecordCheckpointRequest, context: Context
    ) -> worker_pb2.CheckpointRef:
        """A worker records the checkpoints it takes of its stubs, and how restoring them went."""
        worker = await self._worker(context)
        record = await fleet.record_checkpoint(
            self.dp,
            worker,
            checkpoint_id=request.checkpoint_id,
            stub_id=request.stub_id,
            runtime=request.runtime,
            gpu=request.gpu,
            status=request.status,
            path=request.path,
            size_bytes=request.size_bytes,
            error=request.error,
        )
        return checkpoint_ref(record)

    async def Session(
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: Context
    ) -> AsyncIterator[worker_pb2.ControllerMessage]:
        try:
            principal, worker = await self._caller(context)
        except Exception as exc:
            await context.abort(status_of(exc) or grpc.StatusCode.INTERNAL, str(exc))
            return
        session = _Session(
            self.dp,
            self.sessions,
            worker.worker_id,
            gpus=worker.gpu_count,
            tunnel=worker.tunnel,
            peer_host=tunnels.peer_host(context.peer() or ""),
            volumes_url="" if fleet.mounts_volumes_directly(worker.spec) else f"{self.http_url}{DAV_PREFIX}",
        )
        ended: TokenRevoked | ReplicaStopping | None = None
        with self.services.auth.streams.open(principal.token_id) as guard:
            try:
                # closed with this stream (the guard closes the session's generator however it ends)
                async with contextlib.aclosing(guard.iterate(session.run(request_iterator))) as messages:
                    async for message in messages:
                        yield message
            except (TokenRevoked, ReplicaStopping) as exc:
                ended = exc
        if ended is not None:
            await context.abort(status_of(ended) or grpc.StatusCode.UNAVAILABLE, str(ended))

    async def Tunnel(self, request_iterator: AsyncIterator[worker_pb2.TunnelFrame], context: Context) -> None:
        """A worker's tunnel: frames in both directions until either side ends it."""
        try:
            principal, worker = await self._caller(context)
        except Exception as exc:
            await context.abort(status_of(exc) or grpc.StatusCode.INTERNAL, str(exc))
            return

        async def incoming() -> AsyncIterator[frames.Frame]:
            async for message in request_iterator:
                yield frames.from_message(message)

        async def send(frame: frames.Frame) -> None:
            await context.write(frames.to_message(frame))

        ended: TokenRevoked | ReplicaStopping | None = None
        with self.services.auth.streams.open(principal.token_id) as guard:
            try:
                await guard.wait(self.tunnels.serve(worker.worker_id, incoming(), send))
            except (TokenRevoked, ReplicaStopping) as exc:
                ended = exc
        if ended is not None:
            await context.abort(status_of(ended) or grpc.StatusCode.UNAVAILABLE, str(ended))


class _Sessions:
    """The sessions held on this replica and the one timer they share (see the module docstring)."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self._attached: set[_Session] = set()
        #: sessions whose worker sent a keepalive since the last tick
        self._beats: set[_Session] = set()
        self._timer: asyncio.Task[None] | None = None
        #: when the timer began its current sleep (monotonic, which counts on while the process is stopped);
        #: None while it ticks (a slow Redis is not a stopped replica)
        self._asleep_at: float | None = None

    def tick_s(self) -> float:
        """The timer's period: :data:`TICK_S`, shorter where a short keepalive TTL needs it (tests)."""
        return min(TICK_S, self.dp.services.config.scheduler.worker_keepalive_s / 10)

    def attach(self, session: _Session) -> None:
        self._attached.add(session)
        if self._timer is None or self._timer.done():
            self._asleep_at = None
            self._timer = asyncio.create_task(self._run(), name="worker sessions")

    def stale(self) -> bool:
        """Whether the timer's sleep overran by more than :data:`STALE_S`: this replica was stopped meanwhile."""
        asleep_at = self._asleep_at
        return asleep_at is not None and time.monotonic() - asleep_at > STALE_S + self.tick_s()

    def detach(self, session: _Session) -> None:
        self._attached.discard(session)
        if not self._attached and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._beats.clear()

    def keepalive(self, session: _Session) -> None:
        """The session's worker sent a keepalive: it reaches Redis at the next tick."""
        self._beats.add(session)

    async def _run(self) -> None:
        period = self.tick_s()
        while True:
            self._asleep_at = time.monotonic()
            await asyncio.sleep(period)
            if self.stale():
                late = time.monotonic() - self._asleep_at - period
                log.warning(
                    "worker sessions: this replica was stopped for %.0f s; ending its %d sessions (their "
                    "workers may have registered elsewhere)",
                    late,
                    len(self._attached),
                )
                for session in list(self._attached):
                    session.outdated()
                self._beats.clear()  # heard before the stop: their workers have moved on, or will say so again
            self._asleep_at = None
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelling(exc)
                log.warning(
                    "worker sessions: a tick failed (%s: %s); trying again in %g s", type(exc).__name__, exc, period
                )

    async def _tick(self) -> None:
        services = self.dp.services
        beats, self._beats = self._beats, set()
        if beats:
            try:
                lost = await fleet.heartbeats(services, sorted({s.worker_id for s in beats}))
            except BaseException:
                self._beats |= beats  # they go with the next tick
                raise
            for session in beats:
                if session.worker_id in lost:
                    session.presumed_dead()
        if self._attached:
            queued = await fleet.with_work(services)
            for session in list(self._attached) if queued else ():
                if session.worker_id in queued:
                    session.wake()


class _Session:
    def __init__(
        self,
        dp: DataPlane,
        sessions: _Sessions,
        worker_id: str,
        *,
        gpus: int,
        tunnel: bool = False,
        peer_host: str = "",
        volumes_url: str = "",
    ) -> None:
        self.dp = dp
        self.sessions = sessions
        self.worker_id = worker_id
        #: where this worker mounts volumes over WebDAV; "" when it mounts the file system itself
        self.volumes_url = volumes_url
        #: its serving containers are reached through its tunnel
        self.tunnel = tunnel
        #: the address its session comes from ("" when not an IP): where its serving containers may answer
        self.peer_host = peer_host
        #: GPUs of this worker: a GPU stub placed here by its CPU fallback runs without any
        self.gpus = gpus
        self.sent_stubs: set[str] = set()
        self.draining = False
        self.lost = False
        #: set when there is something to send: work placed, a cancellation, the worker presumed dead
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    def presumed_dead(self) -> None:
        """Its worker was reaped: the session ends, and the worker registers again."""
        if not self.lost:
            log.warning("worker %s was presumed dead; asking it to register again", self.worker_id)
            self.lost = True
            self._event.set()

    def outdated(self) -> None:
        """This replica was stopped while it held the session: end it without taking anything more."""
        self.lost = True
        self._event.set()

    async def run(
        self, incoming: AsyncIterator[worker_pb2.WorkerMessage]
    ) -> AsyncGenerator[worker_pb2.ControllerMessage, None]:
        event, cancels = self.dp.hub.attach_worker(self.worker_id)
        self._event = event
        reader = asyncio.create_task(self._read(incoming), name=f"session {self.worker_id}")
        self.sessions.attach(self)
        try:
            while not reader.done():
                event.clear()
                while not cancels.empty():
                    yield worker_pb2.ControllerMessage(cancel=worker_pb2.CancelTask(task_id=cancels.get_nowait()))
                if self.lost or self.sessions.stale():
                    return
                took = await self.dp.take(self.worker_id, _TAKE)
                batch: list[worker_pb2.ContainerRequest] = []
                batch_bytes = 0
                for d in took:
                    if d.stub_id and d.stub_id not in self.sent_stubs:
                        yield worker_pb2.ControllerMessage(stub=await self._stub(d.stub_id))
                        self.sent_stubs.add(d.stub_id)
                    _, settings = await self.dp.stub(d.stub_id or "")
                    if batch and batch_bytes + len(d.args) > BATCH_BYTES:  # no message near a channel's limit
                        yield worker_pb2.ControllerMessage(requests=worker_pb2.ContainerRequests(requests=batch))
                        batch, batch_bytes = [], 0
                    batch_bytes += len(d.args)
                    batch.append(
                        worker_pb2.ContainerRequest(
                            task_id=d.task_id,
                            stub_id=d.stub_id or "",
                            args=d.args,
                            cpu_millicores=settings.cpu_millicores,
                            memory_mib=settings.memory_mib,
                            gpu_count=settings.gpu_count if self.gpus else 0,
                            timeout_s=settings.timeout_s if settings.kind in CALLED_KINDS else 0.0,
                            attempt=d.attempts,
                            queued=d.queued,
                        )
                    )
                if batch:  # one message for all of them: per-message cost dominates tiny calls
                    yield worker_pb2.ControllerMessage(requests=worker_pb2.ContainerRequests(requests=batch))
                if len(took) >= _TAKE:
                    continue
                waiter = asyncio.create_task(event.wait())
                try:  # no timeout: the replica's timer wakes the session for work no wake-up announced
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # also when the session is cancelled mid-wait (its worker went away): a waiter left
                    # pending is destroyed with the dropped event ("Task was destroyed but it is pending!")
                    waiter.cancel()
        finally:
            self.sessions.detach(self)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.dp.hub.detach_worker(self.worker_id)
            if self.draining:
                await self._leave()

    def _volume_access(self, workspace_id: str, volume_id: str) -> tuple[str, str]:
        """A volume's WebDAV URL and this worker's token for it; ("", "") when it mounts the file system itself."""
        if not self.volumes_url:
            return "", ""
        token = mint_token(self.dp.services, VolumeToken(self.worker_id, workspace_id, volume_id))
        return f"{self.volumes_url}/{volume_id}/", token

    async def _stub(self, stub_id: str) -> worker_pb2.StubDefinition:
        bundle = await fleet.stub_bundle(self.dp, stub_id)
        record, settings = bundle.record, bundle.settings
        return worker_pb2.StubDefinition(
            checkpoint_enabled=settings.checkpoint_enabled,
            checkpoint=checkpoint_ref(bundle.checkpoint) if bundle.checkpoint is not None else None,
            stub_id=stub_id,
            workspace_id=record.workspace_id,
            image=settings.image,
            handler=bundle.handler,
            python_version=settings.python_version,
            env=settings.env,
            secret_env=bundle.secret_env,
            keep_warm_s=settings.keep_warm_s,
            name=record.name,
            kind=record.kind,
            cpu_millicores=settings.cpu_millicores,
            memory_mib=settings.memory_mib,
            gpu_count=settings.gpu_count if self.gpus else 0,
            interface=settings.interface,
            tasks_per_container=settings.tasks_per_container,
            ports=settings.ports,
            volumes=_worker_volumes(bundle, self._volume_access),
        )

    async def _read(self, incoming: AsyncIterator[worker_pb2.WorkerMessage]) -> None:
        services = self.dp.services
        async for message in incoming:
            if message.keepalive:
                self.sessions.keepalive(self)
            if message.HasField("sandbox_api"):
                await fleet.announce_sandboxes(
                    services, self.worker_id, message.sandbox_api.port, message.sandbox_api.secret
                )
            if message.sandboxes_ended:
                await fleet.sandboxes_ended(services, self.worker_id, list(message.sandboxes_ended))
            if message.draining and not self.draining:
                self.draining = True
                await fleet.cordon(services, self.worker_id)
                log.info("worker %s is draining", self.worker_id)
            if message.started or message.results or message.logs:
                report = WorkerReport(
                    started=[(s.task_id, s.container_id) for s in message.started],
                    serving=[
                        admitted
                        for s in message.started
                        if (s.address or s.ports)
                        and (admitted := self._serving(ServingReport(s.task_id, s.address, dict(s.ports))))
                    ],
                    outcomes=[
                        TaskOutcome(
                            task_id=r.task_id,
                            status=r.status,
                            result=r.result or None,
                            error=(f"{r.error.type}: {r.error.message}" if r.HasField("error") else None),
                            error_type=r.error.type if r.HasField("error") else None,
                            traceback=r.error.traceback if r.HasField("error") else None,
                        )
                        for r in message.results
                    ],
                    logs=[(entry.task_id, entry.data) for entry in message.logs],
                )
                await self.dp.report(self.worker_id, report)

    def _serving(self, report: ServingReport) -> ServingReport | None:
        return fleet.serving_report(self.dp, self.worker_id, report, tunnel=self.tunnel, peer_host=self.peer_host)

    async def _leave(self) -> None:
        """A drained worker that hung up is gone for good: take it out now instead of waiting for the reaper."""
        await fleet.leave(self.dp.services, self.worker_id)


def _worker_volumes(
    bundle: fleet.StubBundle, access: Callable[[str, str], tuple[str, str]]
) -> list[worker_pb2.WorkerVolume]:
    """The stub's volumes and cloud buckets as its worker mounts them, the buckets' keys decrypted; ``access``
    gives a volume's WebDAV URL and token for this worker (empty when it mounts the file system itself)."""
    out = []
    for v in bundle.settings.volumes:
        if v.bucket is None:
            url, token = access(bundle.record.workspace_id, v.volume_id)
            out.append(
                worker_pb2.WorkerVolume(
                    mount_path=v.mount_path,
                    volume_id=v.volume_id,
                    volume_name=v.name,
                    webdav_url=url,
                    webdav_token=token,
                )
            )
            continue
        b = v.bucket
        out.append(
            worker_pb2.WorkerVolume(
                mount_path=v.mount_path,
                bucket=v.name,
                read_only=b.read_only,
                force_path_style=b.force_path_style,
                endpoint=b.endpoint,
                region=b.region,
                access_key_id=bundle.bucket_keys.get(b.access_key, ""),
                secret_access_key=bundle.bucket_keys.get(b.secret_key, ""),
            )
        )
    return out
