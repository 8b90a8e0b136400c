"""The ControlPlane gRPC service (SDK and CLI): each method authenticates, calls one service, renders the answer.

Every operation and who may do it live in :mod:`levers9.services`, shared with
the REST API: cancelling a task here is the same call as REST's cancel, and
pools and workers are listed under the same visibility rule. Every method takes
a user token bound to a workspace, except ListPools, ListWorkers and the
joined-machine calls, which an operator's token (bound to none) may call too
(an operator's joined machines serve the shared pools), and ListMachines, which
only an operator's may.

A method that streams (Invoke, SubmitAndWatch, Watch, WatchMany, StreamLogs,
GetBlob, PutBlob, BuildImage) holds its token's guard for as long as it streams
(:mod:`levers9.services.revocation`): when the token is revoked, here or on
another replica, the stream ends with UNAUTHENTICATED, "token revoked".
Rendering records into messages is :mod:`levers9.controlplane.grpc_messages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from levers9.controlplane.grpc_auth import user_principal
from levers9.controlplane.grpc_errors import streaming, unary
from levers9.controlplane.grpc_messages import (
    build_event,
    cluster_message,
    cluster_options,
    deployment_version,
    epoch,
    event_batches,
    joined_machine,
    machine_summary,
    pool_info,
    secret_info,
    stub_config,
    task_event,
    task_message,
    worker_summary,
)
from levers9.controlplane.wheels import OwnWheels
from levers9.proto.v1 import common_pb2, controlplane_pb2, controlplane_pb2_grpc
from levers9.services import deployments, machines, pools, secrets, tasks, workspaces
from levers9.services.agent_pools import clusters, joined_machines
from levers9.services.auth import Principal
from levers9.services.builds import Builds, NoBuildPool
from levers9.services.dataplane import DataPlane
from levers9.services.revocation import StreamGuard
from levers9.state.sql.records import Role, TaskStatus

__all__ = ["ControlPlaneService", "blob_upload"]

Context = grpc.aio.ServicerContext[Any, Any]
_MAX_SUBMIT = 10_000


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


class ControlPlaneService(controlplane_pb2_grpc.ControlPlaneServicer):
    def __init__(self, dataplane: DataPlane, builds: Builds | None = None, wheels: OwnWheels | None = None) -> None:
        self.dp = dataplane
        self.services = dataplane.services
        self.builds = builds
        #: levers9's own wheel, which join commands fetch (None: they assume levers9 on the box)
        self.wheels = wheels

    async def _caller(self, context: Context, needed: Role) -> Principal:
        """Any user token (an operator's too) whose role allows ``needed``."""
        return await user_principal(self.services, context.invocation_metadata(), needed, bound=False)

    async def _user(self, context: Context, needed: Role) -> Principal:
        """A user token bound to a workspace, whose role there allows ``needed``."""
        return await user_principal(self.services, context.invocation_metadata(), needed)

    def _guard(self, principal: Principal, *, lasting: bool = True) -> contextlib.AbstractContextManager[StreamGuard]:
        """Hold ``principal``'s token for a stream: it ends with "token revoked" once the token is revoked, and
        (``lasting``: a watch, a followed log, not a transfer) with UNAVAILABLE once this replica stops."""
        return self.services.auth.streams.open(principal.token_id, lasting=lasting)

    @unary
    async def WhoAmI(
        self, request: controlplane_pb2.WhoAmIRequest, context: Context
    ) -> controlplane_pb2.WhoAmIResponse:
        caller = await workspaces.whoami(self.services, await self._user(context, Role.VIEWER))
        return controlplane_pb2.WhoAmIResponse(
            workspace_id=caller.workspace_id,
            workspace_name=caller.workspace_name,
            token_id=caller.token_id,
            max_payload_bytes=self.dp.max_payload_bytes,
        )

    def _builds(self) -> Builds:
        if self.builds is None:
            raise NoBuildPool("this controlplane builds no images (it was started without an image registry)")
        return self.builds

    @streaming
    async def BuildImage(
        self, request: controlplane_pb2.BuildImageRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.BuildImageEvent]:
        principal = await self._user(context, Role.MEMBER)
        events = self._builds().build(principal, request.spec, dict(request.contents))
        with self._guard(principal, lasting=False) as guard:
            async for event in guard.iterate(events):  # closes ``events`` however it ends
                yield build_event(event)

    @unary
    async def ListImages(
        self, request: controlplane_pb2.ListImagesRequest, context: Context
    ) -> controlplane_pb2.ListImagesResponse:
        principal = await self._user(context, Role.VIEWER)
        return controlplane_pb2.ListImagesResponse(
            images=[
                controlplane_pb2.BuiltImage(
                    key=image.key,
                    image=ref,
                    manifest_digest=image.manifest_digest,
                    size_bytes=image.size_bytes,
                    steps=image.steps,
                    created_at=epoch(image.created_at),
                    last_used_at=epoch(image.last_used_at),
                )
                for image, ref in await self._builds().images(principal)
            ]
        )

    @unary
    async def GetOrCreateStub(
        self, request: controlplane_pb2.GetOrCreateStubRequest, context: Context
    ) -> controlplane_pb2.GetOrCreateStubResponse:
        principal = await self._user(context, Role.MEMBER)
        stub_id, created = await self.dp.get_or_create_stub(principal, stub_config(request.config), request.handler)
        return controlplane_pb2.GetOrCreateStubResponse(stub_id=stub_id, created=created)

    @unary
    async def Deploy(
        self, request: controlplane_pb2.DeployRequest, context: Context
    ) -> controlplane_pb2.DeployResponse:
        principal = await self._user(context, Role.MEMBER)
        deployed = await deployments.deploy(self.dp, principal, request.stub_id, request.name)
        return controlplane_pb2.DeployResponse(deployment_id=deployed.deployment_id, version=deployed.version)

    @unary
    async def ListDeployments(
        self, request: controlplane_pb2.ListDeploymentsRequest, context: Context
    ) -> controlplane_pb2.ListDeploymentsResponse:
        principal = await self._user(context, Role.VIEWER)
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
        principal = await self._user(context, Role.MEMBER)
        return deployment_version(await deployments.stop_version(self.dp, principal, request.name, request.version))

    @streaming
    async def Invoke(
        self, request: controlplane_pb2.InvokeRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvent]:
        principal = await self._user(context, Role.MEMBER)
        [task_id], replayed = await self.dp.submit_once(
            principal, request.stub_id, [request.args], request.submission_id
        )
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
        principal = await self._user(context, Role.MEMBER)
        ids, _ = await self._submit(principal, request)
        return controlplane_pb2.SubmitResponse(task_ids=ids)

    @streaming
    async def SubmitAndWatch(
        self, request: controlplane_pb2.SubmitRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvents]:
        principal = await self._user(context, Role.MEMBER)
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
        principal = await self._user(context, Role.VIEWER)
        with self._guard(principal) as guard:
            async for result in guard.iterate(self.dp.watch(principal, list(request.task_ids))):
                yield task_event(result)

    @streaming
    async def WatchMany(
        self, request: controlplane_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.TaskEvents]:
        principal = await self._user(context, Role.VIEWER)
        with self._guard(principal) as guard:
            async for batch in guard.iterate(self.dp.watch_batches(principal, list(request.task_ids))):
                for message in event_batches(batch):
                    yield message

    @unary
    async def ListTasks(
        self, request: controlplane_pb2.ListTasksRequest, context: Context
    ) -> controlplane_pb2.ListTasksResponse:
        principal = await self._user(context, Role.VIEWER)
        statuses = [request.status] if request.status else None
        records = await tasks.list_tasks(self.dp, principal, statuses=statuses, limit=request.limit or 100)
        names = await tasks.function_names(self.dp, records)
        return controlplane_pb2.ListTasksResponse(
            tasks=[task_message(r, names.get(r.stub_id or "", "")) for r in records]
        )

    @unary
    async def GetTask(self, request: controlplane_pb2.GetTaskRequest, context: Context) -> controlplane_pb2.Task:
        principal = await self._user(context, Role.VIEWER)
        record = await tasks.get_task(self.dp, principal, request.task_id)
        names = await tasks.function_names(self.dp, [record])
        return task_message(record, names.get(record.stub_id or "", ""))

    @unary
    async def CancelTask(
        self, request: controlplane_pb2.CancelTaskRequest, context: Context
    ) -> controlplane_pb2.CancelTaskResponse:
        """The same operation as REST's ``POST /api/v1/tasks/ID/cancel``."""
        principal = await self._user(context, Role.MEMBER)
        cancelled, _ = await tasks.cancel_task(self.dp, principal, request.task_id)
        return controlplane_pb2.CancelTaskResponse(cancelled=cancelled)

    @unary
    async def PutSecret(
        self, request: controlplane_pb2.PutSecretRequest, context: Context
    ) -> controlplane_pb2.SecretInfo:
        """Create or replace a secret of the caller's workspace; the answer never carries the value."""
        principal = await self._user(context, Role.OWNER)
        info, _ = await secrets.put_secret(self.services, principal, request.name, request.value)
        return secret_info(info)

    @unary
    async def ListSecrets(
        self, request: controlplane_pb2.ListSecretsRequest, context: Context
    ) -> controlplane_pb2.ListSecretsResponse:
        principal = await self._user(context, Role.VIEWER)
        found = await secrets.list_secrets(self.services, principal)
        return controlplane_pb2.ListSecretsResponse(secrets=[secret_info(s) for s in found])

    @unary
    async def DeleteSecret(
        self, request: controlplane_pb2.DeleteSecretRequest, context: Context
    ) -> controlplane_pb2.DeleteSecretResponse:
        """NOT_FOUND when the workspace has no such secret (whatever other workspaces have), as over REST."""
        principal = await self._user(context, Role.OWNER)
        await secrets.delete_secret(self.services, principal, request.name)
        return controlplane_pb2.DeleteSecretResponse(deleted=True)

    @unary
    async def CreateJoinedMachine(
        self, request: controlplane_pb2.CreateJoinedMachineRequest, context: Context
    ) -> controlplane_pb2.CreateJoinedMachineResponse:
        """The same as REST's ``POST /api/v1/joined-machines``; the join token is in this answer only."""
        principal = await self._caller(context, Role.OWNER)
        ttl = request.ttl_s or joined_machines.JOIN_TTL_S
        made = await joined_machines.create(
            self.services, principal, request.pool, request.name or None, ttl_s=ttl, existing_ok=request.existing_ok
        )
        wheel = await self.wheels.ref() if self.wheels is not None else None
        answer = controlplane_pb2.CreateJoinedMachineResponse(
            machine=joined_machine(joined_machines.JoinedMachineView(made.machine)),
            controlplane_url=made.controlplane_url,
            ca_pem=made.ca_pem,
            ssh_json=json.dumps(made.ssh),
            existing=made.join is None,
            wheel_url=wheel.url if wheel else "",
            wheel_sha256=wheel.sha256 if wheel else "",
        )
        if made.join is not None:
            answer.join_token = made.join.token
            answer.expires_at = epoch(made.join.expires_at)
            answer.join_command = joined_machines.join_command(
                made.controlplane_url,
                made.join.token,
                ca_pem=made.ca_pem,
                wheel_url=answer.wheel_url,
                wheel_sha256=answer.wheel_sha256,
            )
        return answer

    @unary
    async def ListJoinedMachines(
        self, request: controlplane_pb2.ListJoinedMachinesRequest, context: Context
    ) -> controlplane_pb2.ListJoinedMachinesResponse:
        principal = await self._caller(context, Role.VIEWER)
        found = await joined_machines.list_machines(self.services, principal)
        return controlplane_pb2.ListJoinedMachinesResponse(machines=[joined_machine(v) for v in found])

    @unary
    async def RemoveJoinedMachine(
        self, request: controlplane_pb2.RemoveJoinedMachineRequest, context: Context
    ) -> controlplane_pb2.RemoveJoinedMachineResponse:
        principal = await self._caller(context, Role.OWNER)
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
        principal = await self._caller(context, Role.OWNER)
        made = await clusters.join(self.services, principal, cluster_options(request))
        view = clusters.ClusterView(
            made.cluster,
            made.pool.name,
            gpu=made.pool.gpu,
            gpu_count=made.pool.gpu_count,
            namespace=str(getattr(made.pool.pool.settings, "namespace", "")),
        )
        return controlplane_pb2.JoinClusterResponse(
            cluster=cluster_message(view),
            join_token=made.join.token,
            expires_at=epoch(made.join.expires_at),
            controlplane_url=made.controlplane_url,
            ca_pem=made.ca_pem,
        )

    @unary
    async def ListClusters(
        self, request: controlplane_pb2.ListClustersRequest, context: Context
    ) -> controlplane_pb2.ListClustersResponse:
        principal = await self._caller(context, Role.VIEWER)
        found = await clusters.list_clusters(self.services, principal)
        return controlplane_pb2.ListClustersResponse(clusters=[cluster_message(v) for v in found])

    @unary
    async def RemoveCluster(
        self, request: controlplane_pb2.RemoveClusterRequest, context: Context
    ) -> controlplane_pb2.RemoveClusterResponse:
        """The same as REST's ``DELETE /api/v1/clusters/{name}``."""
        principal = await self._caller(context, Role.OWNER)
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
        principal = await self._user(context, Role.MEMBER)
        with self._guard(principal, lasting=False) as guard:
            first, pieces = await guard.wait(blob_upload(request_iterator))
            size = first.total_bytes
            workspace = principal.require_workspace()
            blob_id = await guard.wait(self.dp.put_blob(workspace, size, pieces, "the call's arguments"))
        return common_pb2.BlobRef(blob_id=blob_id, size_bytes=size)

    @streaming
    async def GetBlob(
        self, request: common_pb2.GetBlobRequest, context: Context
    ) -> AsyncIterator[common_pb2.BlobChunk]:
        principal = await self._user(context, Role.VIEWER)
        with self._guard(principal, lasting=False) as guard:
            async for piece in guard.iterate(self.dp.read_blob(principal.require_workspace(), request.blob_id)):
                yield common_pb2.BlobChunk(data=piece)

    @streaming
    async def StreamLogs(
        self, request: controlplane_pb2.StreamLogsRequest, context: Context
    ) -> AsyncIterator[controlplane_pb2.LogChunk]:
        principal = await self._user(context, Role.VIEWER)
        with self._guard(principal, lasting=request.follow) as guard:
            async for data in guard.iterate(
                tasks.task_logs(self.dp, principal, request.task_id, follow=request.follow)
            ):
                yield controlplane_pb2.LogChunk(data=data)

    @unary
    async def ListPools(
        self, request: controlplane_pb2.ListPoolsRequest, context: Context
    ) -> controlplane_pb2.ListPoolsResponse:
        """The pools REST's ``GET /api/v1/pools`` lists for the same token."""
        principal = await self._caller(context, Role.VIEWER)
        return controlplane_pb2.ListPoolsResponse(
            pools=[pool_info(p) for p in await pools.list_pools(self.services, principal)]
        )

    @unary
    async def ListWorkers(
        self, request: controlplane_pb2.ListWorkersRequest, context: Context
    ) -> controlplane_pb2.ListWorkersResponse:
        """The workers REST's ``GET /api/v1/workers`` lists for the same token."""
        principal = await self._caller(context, Role.VIEWER)
        found = await pools.list_workers(self.services, principal, request.pool or None)
        return controlplane_pb2.ListWorkersResponse(workers=[worker_summary(w) for w in found])

    @unary
    async def ListMachines(
        self, request: controlplane_pb2.ListMachinesRequest, context: Context
    ) -> controlplane_pb2.ListMachinesResponse:
        """The machines levers9 started from its providers (operators only); see :func:`machines.started_machines`."""
        principal = await self._caller(context, Role.VIEWER)
        found = await machines.started_machines(
            self.services, principal, pool=request.pool or None, states=list(request.states) or None
        )
        return controlplane_pb2.ListMachinesResponse(machines=[machine_summary(m) for m in found])
