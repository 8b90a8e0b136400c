"""The ControlPlane gRPC service (SDK and CLI): each method authenticates, calls one service, renders the answer.

Every operation and who may do it live in :mod:`levers9.services`, shared with
the REST API: cancelling a task here is the same call as REST's cancel, and
pools and workers are listed under the same visibility rule. Every method takes
a user token bound to a workspace, except ListPools, ListWorkers and the
joined-machine calls, which an operator's token (bound to none) may call too
(an operator's joined machines serve the shared pools).

A method that streams (Invoke, SubmitAndWatch, Watch, WatchMany, StreamLogs,
GetBlob, PutBlob) holds its token's guard for as long as it streams
(:mod:`levers9.services.revocation`): when the token is revoked, here or on
another replica, the stream ends with UNAUTHENTICATED, "token revoked".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc

from levers9.controlplane.grpc_errors import streaming, unary
from levers9.payloads import BATCH_BYTES
from levers9.proto.v1 import common_pb2, controlplane_pb2, controlplane_pb2_grpc
from levers9.services import clusters, deployments, joined_machines, pools, secrets, tasks, workspaces
from levers9.services.auth import Principal, bearer
from levers9.services.dataplane import DataPlane
from levers9.services.pools import PoolView, WorkerView
from levers9.services.revocation import StreamGuard
from levers9.state.sql.records import CallResult, DeploymentVersionRecord, SecretInfo, TaskRecord, TaskStatus, TokenKind

__all__ = ["ControlPlaneService", "blob_upload", "event_batches", "task_event"]

Context = grpc.aio.ServicerContext[Any, Any]
_MAX_SUBMIT = 10_000


def deployment_version(v: DeploymentVersionRecord) -> controlplane_pb2.DeploymentVersion:
    return controlplane_pb2.DeploymentVersion(
        version=v.version,
        stub_id=v.stub_id,
        created_at=v.created_at.timestamp(),
        stopped_at=v.stopped_at.timestamp() if v.stopped_at else 0.0,
    )


def task_event(result: CallResult) -> controlplane_pb2.TaskEvent:
    error = None
    if result.status != TaskStatus.COMPLETE.value:
        kind = result.error_type or result.status
        message = result.error or ""
        if message.startswith(f"{kind}: "):
            message = message[len(kind) + 2 :]  # stored as "Type: message" for listings
        error = common_pb2.RemoteError(type=kind, message=message, traceback=result.traceback or "")
    return controlplane_pb2.TaskEvent(
        task_id=result.task_id,
        status=result.status,
        result=common_pb2.TaskResult(
            task_id=result.task_id, status=result.status, result=result.result or b"", error=error
        ),
    )


async def blob_upload(
    chunks: AsyncIterator[common_pb2.BlobChunk],
) -> tuple[common_pb2.BlobChunk, AsyncIterator[bytes]]:
    """The first chunk of an upload (its total_bytes, and task_id from a worker) and its bytes as they arrive."""
    first = await anext(chunks, None)
    if first is None:
        raise ValueError("an upload needs at least one chunk, the first with total_bytes")

    async def pieces() -> AsyncIterator[bytes]:
        yield first.data
        async for chunk in chunks:
            yield chunk.data

    return first, pieces()


def event_batches(results: Sequence[CallResult]) -> Iterator[controlplane_pb2.TaskEvents]:
    """``results`` as few messages as fit: each cut at about BATCH_BYTES, so none is over a channel's limit."""
    events: list[controlplane_pb2.TaskEvent] = []
    size = 0
    for result in results:
        event = task_event(result)
        cost = len(result.result or b"") + len(result.error or "") + len(result.traceback or "") + 64
        if events and size + cost > BATCH_BYTES:
            yield controlplane_pb2.TaskEvents(events=events)
            events, size = [], 0
        events.append(event)
        size += cost
    yield controlplane_pb2.TaskEvents(events=events)


def _epoch(value: Any) -> float:
    return value.timestamp() if value is not None else 0.0


def _secret(info: SecretInfo) -> controlplane_pb2.SecretInfo:
    return controlplane_pb2.SecretInfo(
        name=info.name, created_at=_epoch(info.created_at), updated_at=_epoch(info.updated_at)
    )


def cluster_message(view: clusters.ClusterView) -> controlplane_pb2.Cluster:
    c = view.cluster
    return controlplane_pb2.Cluster(
        id=c.id,
        name=c.name,
        pool=view.pool,
        gpu=view.gpu or "",
        gpu_count=view.gpu_count,
        namespace=view.namespace,
        agent_id=view.agent_id,
        connected=view.connected,
        last_seen=view.last_seen,
        version=view.version,
        nodes=view.nodes,
        gpus=[
            controlplane_pb2.GpuCount(gpu=gpu, count=count, free=view.free_gpus.get(gpu, 0))
            for gpu, count in sorted(view.gpus.items())
        ],
        cpu_millicores=view.cpu_millicores,
        memory_mib=view.memory_mib,
        workers=view.workers,
        created_at=_epoch(c.created_at),
    )


def cluster_options(request: controlplane_pb2.JoinClusterRequest) -> clusters.ClusterOptions:
    """The request's options; what it leaves out keeps the defaults. :raises ValueError: bad settings_json."""
    settings: Any = {}
    if request.settings_json:
        try:
            settings = json.loads(request.settings_json)
        except ValueError as exc:
            raise ValueError(f"settings_json is not JSON: {exc}") from None
        if not isinstance(settings, dict):
            raise ValueError("settings_json must be a JSON object of attached_cluster settings")
    given: dict[str, Any] = {"name": request.name, "settings": settings}
    for key in ("gpu_count", "cpu", "min_workers", "max_workers", "idle_timeout_s"):
        if request.HasField(key):
            given[key] = getattr(request, key)
    for key in ("gpu", "memory", "runtime", "namespace", "worker_image", "pool"):
        if getattr(request, key):
            given[key] = getattr(request, key)
    if request.ttl_s:
        given["ttl_s"] = request.ttl_s
    return clusters.ClusterOptions(**given)


def joined_machine(view: joined_machines.JoinedMachineView) -> controlplane_pb2.JoinedMachine:
    m = view.machine
    return controlplane_pb2.JoinedMachine(
        id=m.id,
        name=m.name,
        pool=m.pool,
        state=m.state,
        hostname=m.hostname or "",
        created_at=_epoch(m.created_at),
        joined_at=_epoch(m.joined_at),
        connected=view.connected,
        last_seen=view.last_seen,
        version=view.version,
        gpus=[
            controlplane_pb2.GpuCount(gpu=gpu, count=count, free=view.free_gpus.get(gpu, 0))
            for gpu, count in sorted(view.gpus.items())
        ],
        cpu_millicores=view.cpu_millicores,
        memory_mib=view.memory_mib,
        free_cpu_millicores=view.free_cpu_millicores,
        free_memory_mib=view.free_memory_mib,
        workers=view.workers,
        workspace_id=m.workspace_id or "",
    )


def _pool(view: PoolView) -> controlplane_pb2.PoolInfo:
    return controlplane_pb2.PoolInfo(
        name=view.name,
        provider=view.provider,
        runtime=view.runtime,
        gpu=view.gpu or "",
        gpu_count=view.gpu_count,
        min_workers=view.min_workers,
        max_workers=view.max_workers,
        workers=view.workers,
        starting=view.starting,
        unavailable=view.unavailable or "",
        # how far its calls are kept from each other and from the worker: "none" for process
        isolation=view.isolation,
    )


def _worker(view: WorkerView) -> controlplane_pb2.WorkerSummary:
    return controlplane_pb2.WorkerSummary(
        id=view.id,
        pool=view.pool,
        status=view.status,
        gpu=view.gpu or "",
        gpu_total=view.gpu_count,
        gpu_free=view.gpu_free,
        cpu_millicores=view.cpu_millicores,
        cpu_free=view.cpu_free,
        memory_mib=view.memory_mib,
        memory_free=view.memory_free,
        running=view.running,
        machine_id=view.machine_id or "",
    )


def _task(record: TaskRecord, function: str = "") -> controlplane_pb2.Task:
    return controlplane_pb2.Task(
        id=record.id,
        stub_id=record.stub_id or "",
        status=record.status.value,
        attempts=record.attempts,
        worker_id=record.worker_id or "",
        pool=record.pool or "",
        gpu=record.gpu or "",
        error=record.error or "",
        created_at=_epoch(record.created_at),
        started_at=_epoch(record.started_at),
        finished_at=_epoch(record.finished_at),
        function=function,
    )


class ControlPlaneService(controlplane_pb2_grpc.ControlPlaneServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane
        self.services = dataplane.services

    async def _caller(self, context: Context) -> Principal:
        """Any user token (an operator's too)."""
        return await self.services.auth.verify(bearer(context.invocation_metadata()), TokenKind.USER)

    async def _user(self, context: Context) -> Principal:
        """A user token bound to a workspace."""
        principal = await self._caller(context)
        principal.require_workspace()
        return principal

    def _guard(self, principal: Principal) -> contextlib.AbstractContextManager[StreamGuard]:
        """Hold ``principal``'s token for a stream: it ends with "token revoked" once the token is revoked."""
        return self.services.auth.streams.open(principal.token_id)

    @unary
    async def WhoAmI(
        self, request: controlplane_pb2.WhoAmIRequest, context: Context
    ) -> controlplane_pb2.WhoAmIResponse:
        caller = await workspaces.whoami(self.services, await self._user(context))
        return controlplane_pb2.WhoAmIResponse(
            workspace_id=caller.workspace_id,
            workspace_name=caller.workspace_name,
            token_id=caller.token_id,
            max_payload_bytes=self.dp.max_payload_bytes,
        )

    @unary
    async def GetOrCreateStub(
        self, request: controlplane_pb2.GetOrCreateStubRequest, context: Context
    ) -> controlplane_pb2.GetOrCreateStubResponse:
        principal = await self._user(context)
        stub_id, created = await self.dp.get_or_create_stub(principal, _stub_config(request.config), request.handler)
        return controlplane_pb2.GetOrCreateStubResponse(stub_id=stub_id, created=created)

    @unary
    async def Deploy(
        self, request: controlplane_pb2.DeployRequest, context: Context
    ) -> controlplane_pb2.DeployResponse:
        principal = await self._user(context)
        deployed = await deployments.deploy(self.dp, principal, request.stub_id, request.name)
        return controlplane_pb2.DeployResponse(deployment_id=deployed.deployment_id, version=deployed.version)

    @unary
    async def ListDeployments(
        self, request: controlplane_pb2.ListDeploymentsRequest, context: Context
    ) -> controlplane_pb2.ListDeploymentsResponse:
        principal = await self._user(context)
        return controlplane_pb2.ListDeploymentsResponse(
            deployments=[
                controlplane_pb2.DeploymentInfo(
                    id=d.deployment.id,
                    name=d.deployment.name,
                    kind=d.kind,
                    active_version=d.deployment.active_version or 0,
                    versions=[deployment_version(v) for v in d.versions],
                )
                for d in await deployments.list_deployments(self.dp, principal)
            ]
        )

    @unary
    async def StopDeployment(
        self, request: controlplane_pb2.StopDeploymentRequest, context: Context
    ) -> controlplane_pb2.DeploymentVersion:
        principal = await self._user(context)
        return deployment_version(await deployments.stop_version(self.dp, principal, request.name, request.version))

    @streaming
    async def Invoke(
        self, request: controlplane_pb2.InvokeRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvent]:
        principal = await self._user(context)
        [task_id], replayed = await self.dp.submit_once(principal, request.stub_id, [request.args],
                                                        request.submission_id)  # fmt: skip
        events = self.dp.watch(principal, [task_id], just_submitted=not replayed)
        first = asyncio.ensure_future(anext(events))  # watching before anything else can run
        try:
            with self._guard(principal) as guard:
                yield controlplane_pb2.TaskEvent(task_id=task_id, status=TaskStatus.PENDING.value, message="queued")
                yield task_event(await guard.wait(first))
        finally:
            first.cancel()
            await events.aclose()

    async def _submit(self, principal: Principal, request: controlplane_pb2.SubmitRequest) -> tuple[list[str], bool]:
        """Submit and SubmitAndWatch store their calls the same way, within the same limit.

        Returns the task ids, and whether the submission had been stored already (sent again).
        """
        if len(request.calls) > _MAX_SUBMIT:
            raise ValueError(f"calls: at most {_MAX_SUBMIT} per Submit, got {len(request.calls)}; send several")
        return await self.dp.submit_once(
            principal, request.stub_id, [c.args for c in request.calls], request.submission_id
        )

    @unary
    async def Submit(
        self, request: controlplane_pb2.SubmitRequest, context: Context
    ) -> controlplane_pb2.SubmitResponse:
        principal = await self._user(context)
        ids, _ = await self._submit(principal, request)
        return controlplane_pb2.SubmitResponse(task_ids=ids)

    @streaming
    async def SubmitAndWatch(
        self, request: controlplane_pb2.SubmitRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvents]:
        principal = await self._user(context)
        ids, replayed = await self._submit(principal, request)
        if not ids:
            yield controlplane_pb2.TaskEvents()
            return
        # fresh tasks are the caller's own and none has finished: no SQL read to check either
        batches = self.dp.watch_batches(principal, ids, just_submitted=not replayed)
        first = asyncio.ensure_future(anext(batches))  # watching before anything else can run
        try:
            with self._guard(principal) as guard:
                yield controlplane_pb2.TaskEvents(
                    events=[controlplane_pb2.TaskEvent(task_id=t, status=TaskStatus.PENDING.value) for t in ids]
                )
                for message in event_batches(await guard.wait(first)):
                    yield message
                async for batch in guard.iterate(batches):
                    for message in event_batches(batch):
                        yield message
        finally:
            first.cancel()
            await batches.aclose()

    @streaming
    async def Watch(
        self, request: controlplane_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvent]:
        principal = await self._user(context)
        with self._guard(principal) as guard:
            async for result in guard.iterate(self.dp.watch(principal, list(request.task_ids))):
                yield task_event(result)

    @streaming
    async def WatchMany(
        self, request: controlplane_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvents]:
        principal = await self._user(context)
        with self._guard(principal) as guard:
            async for batch in guard.iterate(self.dp.watch_batches(principal, list(request.task_ids))):
                for message in event_batches(batch):
                    yield message

    @unary
    async def ListTasks(
        self, request: controlplane_pb2.ListTasksRequest, context: Context
    ) -> controlplane_pb2.ListTasksResponse:
        principal = await self._user(context)
        statuses = [request.status] if request.status else None
        records = await tasks.list_tasks(self.dp, principal, statuses=statuses, limit=request.limit or 100)
        names = await tasks.function_names(self.dp, records)
        return controlplane_pb2.ListTasksResponse(tasks=[_task(r, names.get(r.stub_id or "", "")) for r in records])

    @unary
    async def GetTask(self, request: controlplane_pb2.GetTaskRequest, context: Context) -> controlplane_pb2.Task:
        principal = await self._user(context)
        record = await tasks.get_task(self.dp, principal, request.task_id)
        names = await tasks.function_names(self.dp, [record])
        return _task(record, names.get(record.stub_id or "", ""))

    @unary
    async def CancelTask(
        self, request: controlplane_pb2.CancelTaskRequest, context: Context
    ) -> controlplane_pb2.CancelTaskResponse:
        """The same operation as REST's ``POST /api/v1/tasks/ID/cancel``."""
        principal = await self._user(context)
        cancelled, _ = await tasks.cancel_task(self.dp, principal, request.task_id)
        return controlplane_pb2.CancelTaskResponse(cancelled=cancelled)

    @unary
    async def PutSecret(
        self, request: controlplane_pb2.PutSecretRequest, context: Context
    ) -> controlplane_pb2.SecretInfo:
        """Create or replace a secret of the caller's workspace; the answer never carries the value."""
        principal = await self._user(context)
        info, _ = await secrets.put_secret(self.services, principal, request.name, request.value)
        return _secret(info)

    @unary
    async def ListSecrets(
        self, request: controlplane_pb2.ListSecretsRequest, context: Context
    ) -> controlplane_pb2.ListSecretsResponse:
        principal = await self._user(context)
        found = await secrets.list_secrets(self.services, principal)
        return controlplane_pb2.ListSecretsResponse(secrets=[_secret(s) for s in found])

    @unary
    async def DeleteSecret(
        self, request: controlplane_pb2.DeleteSecretRequest, context: Context
    ) -> controlplane_pb2.DeleteSecretResponse:
        """NOT_FOUND when the workspace has no such secret (whatever other workspaces have), as over REST."""
        principal = await self._user(context)
        await secrets.delete_secret(self.services, principal, request.name)
        return controlplane_pb2.DeleteSecretResponse(deleted=True)

    @unary
    async def CreateJoinedMachine(
        self, request: controlplane_pb2.CreateJoinedMachineRequest, context: Context
    ) -> controlplane_pb2.CreateJoinedMachineResponse:
        """The same as REST's ``POST /api/v1/joined-machines``; the join token is in this answer only."""
        principal = await self._caller(context)
        ttl = request.ttl_s or joined_machines.JOIN_TTL_S
        made = await joined_machines.create(self.services, principal, request.pool, request.name or None, ttl_s=ttl)
        return controlplane_pb2.CreateJoinedMachineResponse(
            machine=joined_machine(joined_machines.JoinedMachineView(made.machine)),
            join_token=made.join.token,
            expires_at=_epoch(made.join.expires_at),
            controlplane_url=made.controlplane_url,
            ca_pem=made.ca_pem,
            join_command=joined_machines.join_command(made.controlplane_url, made.join.token, ca_pem=made.ca_pem),
            ssh_json=json.dumps(made.ssh),
        )

    @unary
    async def ListJoinedMachines(
        self, request: controlplane_pb2.ListJoinedMachinesRequest, context: Context
    ) -> controlplane_pb2.ListJoinedMachinesResponse:
        principal = await self._caller(context)
        found = await joined_machines.list_machines(self.services, principal)
        return controlplane_pb2.ListJoinedMachinesResponse(machines=[joined_machine(v) for v in found])

    @unary
    async def RemoveJoinedMachine(
        self, request: controlplane_pb2.RemoveJoinedMachineRequest, context: Context
    ) -> controlplane_pb2.RemoveJoinedMachineResponse:
        principal = await self._caller(context)
        removed = await joined_machines.remove(self.services, principal, request.name)
        return controlplane_pb2.RemoveJoinedMachineResponse(
            machine=joined_machine(joined_machines.JoinedMachineView(removed.machine)),
            terminated=removed.terminated,
            not_terminated=removed.not_terminated,
        )

    @unary
    async def JoinCluster(
        self, request: controlplane_pb2.JoinClusterRequest, context: Context
    ) -> controlplane_pb2.JoinClusterResponse:
        """The same as REST's ``POST /api/v1/clusters``; the join token is in this answer only."""
        principal = await self._caller(context)
        made = await clusters.join(self.services, principal, cluster_options(request))
        view = clusters.ClusterView(made.cluster, made.pool.name, gpu=made.pool.gpu, gpu_count=made.pool.gpu_count,
                                    namespace=str(getattr(made.pool.pool.settings, "namespace", "")))  # fmt: skip
        return controlplane_pb2.JoinClusterResponse(
            cluster=cluster_message(view),
            join_token=made.join.token,
            expires_at=_epoch(made.join.expires_at),
            controlplane_url=made.controlplane_url,
            ca_pem=made.ca_pem,
        )

    @unary
    async def ListClusters(
        self, request: controlplane_pb2.ListClustersRequest, context: Context
    ) -> controlplane_pb2.ListClustersResponse:
        principal = await self._caller(context)
        found = await clusters.list_clusters(self.services, principal)
        return controlplane_pb2.ListClustersResponse(clusters=[cluster_message(v) for v in found])

    @unary
    async def RemoveCluster(
        self, request: controlplane_pb2.RemoveClusterRequest, context: Context
    ) -> controlplane_pb2.RemoveClusterResponse:
        """The same as REST's ``DELETE /api/v1/clusters/{name}``."""
        principal = await self._caller(context)
        removed = await clusters.remove(self.services, principal, request.name)
        return controlplane_pb2.RemoveClusterResponse(
            cluster=cluster_message(clusters.ClusterView(removed.cluster, removed.cluster.pool)),
            agents=removed.agents,
            terminated=removed.terminated,
            not_terminated=removed.not_terminated,
        )

    @unary
    async def PutBlob(
        self, request_iterator: AsyncIterator[common_pb2.BlobChunk], context: Context
    ) -> common_pb2.BlobRef:
        principal = await self._user(context)
        with self._guard(principal) as guard:
            first, pieces = await guard.wait(blob_upload(request_iterator))
            size = first.total_bytes
            workspace = principal.require_workspace()
            blob_id = await guard.wait(self.dp.put_blob(workspace, size, pieces, "the call's arguments"))
        return common_pb2.BlobRef(blob_id=blob_id, size_bytes=size)

    @streaming
    async def GetBlob(
        self, request: common_pb2.GetBlobRequest, context: Context
    ) -> AsyncIterator[common_pb2.BlobChunk]:
        principal = await self._user(context)
        with self._guard(principal) as guard:
            async for piece in guard.iterate(self.dp.read_blob(principal.require_workspace(), request.blob_id)):
                yield common_pb2.BlobChunk(data=piece)

    @streaming
    async def StreamLogs(
        self, request: controlplane_pb2.StreamLogsRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.LogChunk]:
        principal = await self._user(context)
        with self._guard(principal) as guard:
            async for data in guard.iterate(
                tasks.task_logs(self.dp, principal, request.task_id, follow=request.follow)
            ):
                yield controlplane_pb2.LogChunk(data=data)

    @unary
    async def ListPools(
        self, request: controlplane_pb2.ListPoolsRequest, context: Context
    ) -> controlplane_pb2.ListPoolsResponse:
        """The pools REST's ``GET /api/v1/pools`` lists for the same token."""
        principal = await self._caller(context)
        return controlplane_pb2.ListPoolsResponse(
            pools=[_pool(p) for p in await pools.list_pools(self.services, principal)]
        )

    @unary
    async def ListWorkers(
        self, request: controlplane_pb2.ListWorkersRequest, context: Context
    ) -> controlplane_pb2.ListWorkersResponse:
        """The workers REST's ``GET /api/v1/workers`` lists for the same token."""
        principal = await self._caller(context)
        found = await pools.list_workers(self.services, principal, request.pool or None)
        return controlplane_pb2.ListWorkersResponse(workers=[_worker(w) for w in found])


def _stub_config(c: controlplane_pb2.StubConfig) -> dict[str, Any]:
    """A stub's settings as the wire sends them, unset optional fields left out (the defaults apply)."""
    raw: dict[str, Any] = {
        "kind": c.kind or "function",
        "app": c.app or "default",
        "name": c.name,
        "image": c.image or "host",
        "gpu": list(c.gpu),
        "gpu_count": c.gpu_count,
        "retries": c.retries,
        "timeout_s": c.timeout_s,
        "secrets": list(c.secrets),
        "env": dict(c.env),
        "python_version": c.python_version,
        "checkpoint_enabled": c.checkpoint_enabled,
    }
    if c.cpu_millicores:
        raw["cpu_millicores"] = c.cpu_millicores
    if c.memory_mib:
        raw["memory_mib"] = c.memory_mib
    if c.HasField("fallback_after_s"):
        raw["fallback_after_s"] = c.fallback_after_s
    if c.HasField("keep_warm_s"):
        raw["keep_warm_s"] = c.keep_warm_s
    for name in ("min_containers", "max_containers", "tasks_per_container", "max_pending", "start_timeout_s"):
        if c.HasField(name):
            raw[name] = getattr(c, name)
    if c.public:
        raw["public"] = True
    if c.interface:
        raw["interface"] = c.interface
    if c.ports:
        raw["ports"] = list(c.ports)
    return raw
