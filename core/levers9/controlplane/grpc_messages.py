"""The ControlPlane gRPC service's messages: records and views of the services turned into protobuf, and back.

Pure translation, no decisions: each function renders one record (or reads one request) field by field,
so :mod:`levers9.controlplane.grpc_api` keeps to authenticating and calling the services.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from levers9.payloads import BATCH_BYTES
from levers9.proto.v1 import common_pb2, controlplane_pb2, volume_pb2
from levers9.services.agent_pools import clusters, joined_machines
from levers9.services.builds import BuildEvent
from levers9.services.pools import PoolView, WorkerView
from levers9.state.sql.records import (
    CallResult,
    DeploymentVersionRecord,
    MachineRecord,
    SecretInfo,
    TaskRecord,
    TaskStatus,
)

__all__ = [
    "build_event",
    "cluster_message",
    "cluster_options",
    "deployment_version",
    "epoch",
    "event_batches",
    "joined_machine",
    "pool_info",
    "secret_info",
    "stub_config",
    "task_event",
    "task_message",
    "worker_summary",
]


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


def epoch(value: Any) -> float:
    return value.timestamp() if value is not None else 0.0


def secret_info(info: SecretInfo) -> controlplane_pb2.SecretInfo:
    return controlplane_pb2.SecretInfo(
        name=info.name, created_at=epoch(info.created_at), updated_at=epoch(info.updated_at)
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
        created_at=epoch(c.created_at),
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
        created_at=epoch(m.created_at),
        joined_at=epoch(m.joined_at),
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
        docker_version=view.docker_version,
        docker_runtimes=view.docker_runtimes,
        arch=view.arch,
    )


def machine_summary(m: MachineRecord) -> controlplane_pb2.MachineSummary:
    return controlplane_pb2.MachineSummary(
        id=m.id,
        pool=m.pool,
        provider=m.provider,
        state=m.state,
        instance_type=m.instance_type or "",
        region=m.region or "",
        zone=m.zone or "",
        price_per_hour=m.price_per_hour,
        gpu=m.gpu or "",
        gpu_count=m.gpu_count,
        created_at=epoch(m.created_at),
        worker_id=m.worker_id or "",
        last_error=m.last_error or "",
    )


def pool_info(view: PoolView) -> controlplane_pb2.PoolInfo:
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


def worker_summary(view: WorkerView) -> controlplane_pb2.WorkerSummary:
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


def task_message(record: TaskRecord, function: str = "") -> controlplane_pb2.Task:
    return controlplane_pb2.Task(
        id=record.id,
        stub_id=record.stub_id or "",
        status=record.status.value,
        attempts=record.attempts,
        worker_id=record.worker_id or "",
        pool=record.pool or "",
        gpu=record.gpu or "",
        error=record.error or "",
        created_at=epoch(record.created_at),
        started_at=epoch(record.started_at),
        finished_at=epoch(record.finished_at),
        function=function,
    )


def build_event(event: BuildEvent) -> controlplane_pb2.BuildImageEvent:
    return controlplane_pb2.BuildImageEvent(
        kind=event.kind,
        text=event.text,
        image=event.image,
        key=event.key,
        cached=event.cached,
        task_id=event.task_id,
        steps=event.steps,
        steps_cached=event.steps_cached,
    )


def stub_config(c: controlplane_pb2.StubConfig) -> dict[str, Any]:
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
    if c.volumes:
        raw["volumes"] = [_volume_setting(v) for v in c.volumes]
    return raw


def _volume_setting(v: volume_pb2.VolumeMount) -> dict[str, Any]:
    setting: dict[str, Any] = {"name": v.name, "mount_path": v.mount_path}
    if v.HasField("bucket"):
        b = v.bucket
        setting["bucket"] = {
            "read_only": b.read_only,
            "force_path_style": b.force_path_style,
            "access_key": b.access_key,
            "secret_key": b.secret_key,
            "endpoint": b.endpoint,
            "region": b.region,
        }
    return setting
