"""The Worker gRPC service: registration and the session each worker holds open.

A session is one bidirectional stream. Downstream, the controlplane sends a
stub's definition the first time the session needs it, then container
requests as the scheduler places work on the worker, and cancellations.
Upstream, the worker sends keepalives and batches of started tasks, results
and output. Workers authenticate with their own machine (or pool worker)
token; a worker of one machine cannot speak for another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from levers9.controlplane.grpc_api import blob_upload
from levers9.controlplane.grpc_errors import status_of, streaming, unary
from levers9.payloads import BATCH_BYTES, parse_ref
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from levers9.scheduler.pools import PoolSpec
from levers9.services.auth import PermissionDenied, Principal, bearer
from levers9.services.dataplane import CALLED_KINDS, DataPlane, ServingReport, TaskOutcome, WorkerReport
from levers9.state.errors import NotFound
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.records import CheckpointRecord, TokenKind

__all__ = ["WorkerService"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
_TAKE = 256


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


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane
        self.services = dataplane.services

    async def _principal(self, context: Context) -> Principal:
        return await self.services.auth.verify(
            bearer(context.invocation_metadata()), TokenKind.MACHINE, TokenKind.WORKER
        )

    async def _pool_of(self, principal: Principal, asked: str) -> tuple[PoolSpec, str | None]:
        """The pool the token may serve and the machine id it speaks for."""
        pools = self.services.pools
        machine_id: str | None = None
        if principal.kind is TokenKind.MACHINE:
            machine_id = principal.subject
            machine = await self.services.machines.get(machine_id or "")
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

    @unary
    async def Register(self, request: worker_pb2.RegisterRequest, context: Context) -> worker_pb2.RegisterResponse:
        principal = await self._principal(context)
        spec, machine_id = await self._pool_of(principal, request.pool)
        registry = self.services.scheduler.workers
        worker_id = ""
        if request.worker_id:
            old = await registry.get(request.worker_id)
            if old is None or old.info.machine_id == machine_id:
                worker_id = request.worker_id  # a reconnect keeps its id, so late reports still match
        worker_id = worker_id or f"wkr_{uuid.uuid4().hex[:16]}"
        gpus = [g for g in request.gpus if not spec.gpu or g.gpu == spec.gpu]
        info = WorkerInfo(
            id=worker_id,
            pool=spec.name,
            cpu_millicores=min(request.cpu_millicores or spec.cpu_millicores, spec.cpu_millicores),
            memory_mib=min(request.memory_mib or spec.memory_mib, spec.memory_mib),
            gpu=spec.gpu,
            gpu_count=min(spec.gpu_count, len(gpus)) if spec.gpu else 0,
            runtime=spec.pool.runtime,
            machine_id=machine_id,
            address=request.hostname or None,
            workspace=spec.workspace,
        )
        if spec.gpu and info.gpu_count < spec.gpu_count:
            log.warning(
                "worker %s of pool %s found %d %s GPUs, the pool promises %d",
                worker_id, spec.name, info.gpu_count, spec.gpu, spec.gpu_count,
            )  # fmt: skip
        await self.dp.register_worker(info)
        settings = self.services.loaded.runtime_settings.get(spec.name)
        log.info("worker %s registered for pool %s (%s)", worker_id, spec.name, request.hostname)
        checkpoints = self.services.config.checkpoints
        return worker_pb2.RegisterResponse(
            worker_id=worker_id,
            keepalive_s=max(0.5, self.services.config.scheduler.worker_keepalive_s / 3),
            runtime=spec.pool.runtime,
            runtime_settings_json=json.dumps(settings.model_dump(mode="json")) if settings is not None else "",
            checkpoint_storage_url=checkpoints.storage_url
            or str(Path(self.services.config.data_dir).expanduser().resolve() / "checkpoints"),
            checkpoint_cache_max_bytes=checkpoints.cache_max * 1024 * 1024,
            checkpoint_cache_dir=checkpoints.cache_dir or "",
            max_payload_bytes=self.dp.max_payload_bytes,
        )

    async def _worker(self, context: Context) -> tuple[PoolSpec, str, int]:
        """The calling worker's pool, id and GPU count, once its token is shown to speak for it."""
        principal = await self._principal(context)
        worker_id = _metadata(context, WORKER_ID_METADATA) or ""
        state = await self.services.scheduler.workers.get(worker_id)
        if state is None:
            raise NotFound("worker", f"{worker_id} (register again)")
        spec, machine_id = await self._pool_of(principal, state.info.pool)
        if state.info.machine_id != machine_id:
            raise PermissionDenied(f"worker {worker_id} belongs to another machine")
        return spec, worker_id, state.info.gpu_count

    async def _unfinished_task(self, spec: PoolSpec, task_id: str) -> tuple[str, bytes]:
        """The workspace and stored arguments of an unfinished task the worker's pool may run."""
        found = await self.dp.calls.dispatch([task_id])
        if not found or found[0].status not in ("pending", "running"):
            raise NotFound("task", f"{task_id} (unknown, or it has ended)")
        self._may_serve(spec, found[0].workspace_id, f"task {task_id}")
        return found[0].workspace_id, found[0].args

    @unary
    async def PutBlob(
        self, request_iterator: AsyncIterator[common_pb2.BlobChunk], context: Context
    ) -> common_pb2.BlobRef:
        """A worker stores a big result, in the workspace of the unfinished task it belongs to."""
        spec, _, _ = await self._worker(context)
        first, pieces = await blob_upload(request_iterator)
        workspace, _ = await self._unfinished_task(spec, first.task_id)
        blob_id = await self.dp.put_blob(workspace, first.total_bytes, pieces, "the call's result")
        return common_pb2.BlobRef(blob_id=blob_id, size_bytes=first.total_bytes)

    @streaming
    async def GetBlob(
        self, request: common_pb2.GetBlobRequest, context: Context
    ) -> AsyncIterator[common_pb2.BlobChunk]:
        """A worker reads the big arguments of an unfinished task, and only the blob those name."""
        spec, _, _ = await self._worker(context)
        workspace, args = await self._unfinished_task(spec, request.task_id)
        ref = parse_ref(args)
        if ref is None or ref[0] != request.blob_id:
            raise NotFound("blob", f"{request.blob_id} (not the arguments of task {request.task_id})")
        async for piece in self.dp.read_blob(workspace, request.blob_id):
            yield common_pb2.BlobChunk(data=piece)

    @unary
    async def RecordCheckpoint(
        self, request: worker_pb2.RecordCheckpointRequest, context: Context
    ) -> worker_pb2.CheckpointRef:
        """A worker records the checkpoints it takes of its stubs, and how restoring them went."""
        spec, _, _ = await self._worker(context)
        store = CheckpointStore(self.services.db)
        if request.checkpoint_id:
            found = await store.get(request.checkpoint_id)
            if found is None:
                raise NotFound("checkpoint", request.checkpoint_id)
            self._may_serve(spec, found.workspace_id, f"checkpoint {found.id}")
            record = await store.set_status(
                found.id,
                request.status,
                path=request.path or None,
                size_bytes=request.size_bytes or None,
                error=request.error[:2000] or None,
            )
        else:
            stub, _ = await self.dp.stub(request.stub_id)
            self._may_serve(spec, stub.workspace_id, f"stub {stub.id}")
            record = await store.create(stub.workspace_id, request.runtime, stub_id=stub.id, gpu=request.gpu or None)
        return checkpoint_ref(record)

    @staticmethod
    def _may_serve(spec: PoolSpec, workspace_id: str, what: str) -> None:
        if spec.workspace is not None and spec.workspace != workspace_id:
            raise PermissionDenied(f"{what} belongs to a workspace pool {spec.name} does not serve")

    async def Session(
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: Context
    ) -> AsyncIterator[worker_pb2.ControllerMessage]:
        try:
            _, worker_id, gpus = await self._worker(context)
        except Exception as exc:
            await context.abort(status_of(exc) or grpc.StatusCode.INTERNAL, str(exc))
            return
        session = _Session(self.dp, worker_id, gpus=gpus)
        async for message in session.run(request_iterator):
            yield message


class _Session:
    def __init__(self, dp: DataPlane, worker_id: str, *, gpus: int) -> None:
        self.dp = dp
        self.worker_id = worker_id
        #: GPUs of this worker: a GPU stub placed here by its CPU fallback runs without any
        self.gpus = gpus
        self.sent_stubs: set[str] = set()
        self.draining = False
        self.lost = False

    async def run(
        self, incoming: AsyncIterator[worker_pb2.WorkerMessage]
    ) -> AsyncIterator[worker_pb2.ControllerMessage]:
        event, cancels = self.dp.hub.attach_worker(self.worker_id)
        reader = asyncio.create_task(self._read(incoming, event), name=f"session {self.worker_id}")
        try:
            while not reader.done():
                event.clear()
                while not cancels.empty():
                    yield worker_pb2.ControllerMessage(cancel=worker_pb2.CancelTask(task_id=cancels.get_nowait()))
                if self.lost:
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
                        )
                    )
                if batch:  # one message for all of them: per-message cost dominates tiny calls
                    yield worker_pb2.ControllerMessage(requests=worker_pb2.ContainerRequests(requests=batch))
                if len(took) >= _TAKE:
                    continue
                waiter = asyncio.create_task(event.wait())
                try:
                    await asyncio.wait({waiter, reader}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # also when the session is cancelled mid-wait (its worker went away): a waiter left
                    # pending is destroyed with the dropped event ("Task was destroyed but it is pending!")
                    waiter.cancel()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.dp.hub.detach_worker(self.worker_id)
            if self.draining:
                await self._leave()

    async def _stub(self, stub_id: str) -> worker_pb2.StubDefinition:
        record, settings = await self.dp.stub(stub_id)
        handler = await self.dp.calls.handler(stub_id) or b""
        secret_env: dict[str, str] = {}
        for name in settings.secrets:
            value = await self.dp.services.secrets.get(record.workspace_id, name)
            if value is not None:
                secret_env[name] = value
        latest = await CheckpointStore(self.dp.services.db).latest(stub_id) if settings.checkpoint_enabled else None
        return worker_pb2.StubDefinition(
            checkpoint_enabled=settings.checkpoint_enabled,
            checkpoint=checkpoint_ref(latest) if latest is not None else None,
            stub_id=stub_id,
            workspace_id=record.workspace_id,
            image=settings.image,
            handler=handler,
            python_version=settings.python_version,
            env=settings.env,
            secret_env=secret_env,
            keep_warm_s=settings.keep_warm_s,
            name=record.name,
            kind=record.kind,
            cpu_millicores=settings.cpu_millicores,
            memory_mib=settings.memory_mib,
            gpu_count=settings.gpu_count if self.gpus else 0,
            interface=settings.interface,
            tasks_per_container=settings.tasks_per_container,
            ports=settings.ports,
        )

    async def _read(self, incoming: AsyncIterator[worker_pb2.WorkerMessage], event: asyncio.Event) -> None:
        scheduler = self.dp.services.scheduler
        async for message in incoming:
            if message.keepalive and not await scheduler.heartbeat(self.worker_id):
                log.warning("worker %s was presumed dead; asking it to register again", self.worker_id)
                self.lost = True
                event.set()
                return
            if message.draining and not self.draining:
                self.draining = True
                await scheduler.workers.cordon(self.worker_id)
                log.info("worker %s is draining", self.worker_id)
            if message.started or message.results or message.logs:
                report = WorkerReport(
                    started=[(s.task_id, s.container_id) for s in message.started],
                    serving=[
                        ServingReport(s.task_id, s.address, dict(s.ports))
                        for s in message.started
                        if s.address or s.ports
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

    async def _leave(self) -> None:
        """A drained worker that hung up is gone for good: take it out now instead of waiting for the reaper."""
        scheduler = self.dp.services.scheduler
        with contextlib.suppress(Exception):
            ids = await scheduler.workers.remove(self.worker_id, now_ms=scheduler.ctx.now_ms(), force=True)
            for rid in ids or []:
                await scheduler.ctx.tasks.requeue(rid, f"worker {self.worker_id} left while draining")
            if ids:
                scheduler.ctx.placer_wanted.set()
