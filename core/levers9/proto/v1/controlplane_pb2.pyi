from levers9.proto.v1 import common_pb2 as _common_pb2
from levers9.proto.v1 import volume_pb2 as _volume_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("workspace_id", "workspace_name", "token_id", "max_payload_bytes")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    workspace_name: str
    token_id: str
    max_payload_bytes: int
    def __init__(self, workspace_id: _Optional[str] = ..., workspace_name: _Optional[str] = ..., token_id: _Optional[str] = ..., max_payload_bytes: _Optional[int] = ...) -> None: ...

class StubConfig(_message.Message):
    __slots__ = ("kind", "app", "name", "image", "cpu_millicores", "memory_mib", "gpu", "gpu_count", "fallback_after_s", "retries", "timeout_s", "secrets", "env", "keep_warm_s", "python_version", "checkpoint_enabled", "min_containers", "max_containers", "tasks_per_container", "public", "interface", "ports", "max_pending", "start_timeout_s", "volumes")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    KEEP_WARM_S_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MIN_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    TASKS_PER_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_FIELD_NUMBER: _ClassVar[int]
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_FIELD_NUMBER: _ClassVar[int]
    START_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    app: str
    name: str
    image: str
    cpu_millicores: int
    memory_mib: int
    gpu: _containers.RepeatedScalarFieldContainer[str]
    gpu_count: int
    fallback_after_s: float
    retries: int
    timeout_s: float
    secrets: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    keep_warm_s: float
    python_version: str
    checkpoint_enabled: bool
    min_containers: int
    max_containers: int
    tasks_per_container: int
    public: bool
    interface: str
    ports: _containers.RepeatedScalarFieldContainer[int]
    max_pending: int
    start_timeout_s: float
    volumes: _containers.RepeatedCompositeFieldContainer[_volume_pb2.VolumeMount]
    def __init__(self, kind: _Optional[str] = ..., app: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpu: _Optional[_Iterable[str]] = ..., gpu_count: _Optional[int] = ..., fallback_after_s: _Optional[float] = ..., retries: _Optional[int] = ..., timeout_s: _Optional[float] = ..., secrets: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., keep_warm_s: _Optional[float] = ..., python_version: _Optional[str] = ..., checkpoint_enabled: _Optional[bool] = ..., min_containers: _Optional[int] = ..., max_containers: _Optional[int] = ..., tasks_per_container: _Optional[int] = ..., public: _Optional[bool] = ..., interface: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ..., max_pending: _Optional[int] = ..., start_timeout_s: _Optional[float] = ..., volumes: _Optional[_Iterable[_Union[_volume_pb2.VolumeMount, _Mapping]]] = ...) -> None: ...

class GetOrCreateStubRequest(_message.Message):
    __slots__ = ("config", "handler")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    config: StubConfig
    handler: bytes
    def __init__(self, config: _Optional[_Union[StubConfig, _Mapping]] = ..., handler: _Optional[bytes] = ...) -> None: ...

class GetOrCreateStubResponse(_message.Message):
    __slots__ = ("stub_id", "created")
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    stub_id: str
    created: bool
    def __init__(self, stub_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class DeployRequest(_message.Message):
    __slots__ = ("stub_id", "name")
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    stub_id: str
    name: str
    def __init__(self, stub_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeployResponse(_message.Message):
    __slots__ = ("deployment_id", "version")
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    deployment_id: str
    version: int
    def __init__(self, deployment_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListDeploymentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeploymentVersion(_message.Message):
    __slots__ = ("version", "stub_id", "created_at", "stopped_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    stub_id: str
    created_at: float
    stopped_at: float
    def __init__(self, version: _Optional[int] = ..., stub_id: _Optional[str] = ..., created_at: _Optional[float] = ..., stopped_at: _Optional[float] = ...) -> None: ...

class DeploymentInfo(_message.Message):
    __slots__ = ("id", "name", "kind", "active_version", "versions")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    kind: str
    active_version: int
    versions: _containers.RepeatedCompositeFieldContainer[DeploymentVersion]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., active_version: _Optional[int] = ..., versions: _Optional[_Iterable[_Union[DeploymentVersion, _Mapping]]] = ...) -> None: ...

class ListDeploymentsResponse(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentInfo]
    def __init__(self, deployments: _Optional[_Iterable[_Union[DeploymentInfo, _Mapping]]] = ...) -> None: ...

class StopDeploymentRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class InvokeRequest(_message.Message):
    __slots__ = ("stub_id", "args", "submission_id")
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    stub_id: str
    args: bytes
    submission_id: str
    def __init__(self, stub_id: _Optional[str] = ..., args: _Optional[bytes] = ..., submission_id: _Optional[str] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: bytes
    def __init__(self, args: _Optional[bytes] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("stub_id", "calls", "submission_id")
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    stub_id: str
    calls: _containers.RepeatedCompositeFieldContainer[Call]
    submission_id: str
    def __init__(self, stub_id: _Optional[str] = ..., calls: _Optional[_Iterable[_Union[Call, _Mapping]]] = ..., submission_id: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ("task_id", "status", "result", "message")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    status: str
    result: _common_pb2.TaskResult
    message: str
    def __init__(self, task_id: _Optional[str] = ..., status: _Optional[str] = ..., result: _Optional[_Union[_common_pb2.TaskResult, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class TaskEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "stub_id", "status", "attempts", "worker_id", "pool", "gpu", "error", "created_at", "started_at", "finished_at", "function")
    ID_FIELD_NUMBER: _ClassVar[int]
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    stub_id: str
    status: str
    attempts: int
    worker_id: str
    pool: str
    gpu: str
    error: str
    created_at: float
    started_at: float
    finished_at: float
    function: str
    def __init__(self, id: _Optional[str] = ..., stub_id: _Optional[str] = ..., status: _Optional[str] = ..., attempts: _Optional[int] = ..., worker_id: _Optional[str] = ..., pool: _Optional[str] = ..., gpu: _Optional[str] = ..., error: _Optional[str] = ..., created_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., function: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("limit", "status")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    limit: int
    status: str
    def __init__(self, limit: _Optional[int] = ..., status: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class StreamLogsRequest(_message.Message):
    __slots__ = ("task_id", "follow")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    follow: bool
    def __init__(self, task_id: _Optional[str] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("name", "provider", "runtime", "gpu", "gpu_count", "min_workers", "max_workers", "workers", "starting", "unavailable", "isolation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    provider: str
    runtime: str
    gpu: str
    gpu_count: int
    min_workers: int
    max_workers: int
    workers: int
    starting: int
    unavailable: str
    isolation: str
    def __init__(self, name: _Optional[str] = ..., provider: _Optional[str] = ..., runtime: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_count: _Optional[int] = ..., min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., workers: _Optional[int] = ..., starting: _Optional[int] = ..., unavailable: _Optional[str] = ..., isolation: _Optional[str] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class ListMachinesRequest(_message.Message):
    __slots__ = ("pool", "states")
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    pool: str
    states: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pool: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ...) -> None: ...

class MachineSummary(_message.Message):
    __slots__ = ("id", "pool", "provider", "state", "instance_type", "region", "zone", "price_per_hour", "gpu", "gpu_count", "created_at", "worker_id", "last_error")
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    provider: str
    state: str
    instance_type: str
    region: str
    zone: str
    price_per_hour: float
    gpu: str
    gpu_count: int
    created_at: float
    worker_id: str
    last_error: str
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ..., provider: _Optional[str] = ..., state: _Optional[str] = ..., instance_type: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., price_per_hour: _Optional[float] = ..., gpu: _Optional[str] = ..., gpu_count: _Optional[int] = ..., created_at: _Optional[float] = ..., worker_id: _Optional[str] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListMachinesResponse(_message.Message):
    __slots__ = ("machines",)
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    machines: _containers.RepeatedCompositeFieldContainer[MachineSummary]
    def __init__(self, machines: _Optional[_Iterable[_Union[MachineSummary, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class WorkerSummary(_message.Message):
    __slots__ = ("id", "pool", "status", "gpu", "gpu_total", "gpu_free", "cpu_millicores", "cpu_free", "memory_mib", "memory_free", "running", "machine_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPU_FREE_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    CPU_FREE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    status: str
    gpu: str
    gpu_total: int
    gpu_free: int
    cpu_millicores: int
    cpu_free: int
    memory_mib: int
    memory_free: int
    running: int
    machine_id: str
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ..., status: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_total: _Optional[int] = ..., gpu_free: _Optional[int] = ..., cpu_millicores: _Optional[int] = ..., cpu_free: _Optional[int] = ..., memory_mib: _Optional[int] = ..., memory_free: _Optional[int] = ..., running: _Optional[int] = ..., machine_id: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerSummary]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerSummary, _Mapping]]] = ...) -> None: ...

class PutSecretRequest(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SecretInfo(_message.Message):
    __slots__ = ("name", "created_at", "updated_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    created_at: float
    updated_at: float
    def __init__(self, name: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class ListSecretsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSecretsResponse(_message.Message):
    __slots__ = ("secrets",)
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    secrets: _containers.RepeatedCompositeFieldContainer[SecretInfo]
    def __init__(self, secrets: _Optional[_Iterable[_Union[SecretInfo, _Mapping]]] = ...) -> None: ...

class DeleteSecretRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteSecretResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class CreateJoinedMachineRequest(_message.Message):
    __slots__ = ("pool", "name", "ttl_s", "existing_ok")
    POOL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    EXISTING_OK_FIELD_NUMBER: _ClassVar[int]
    pool: str
    name: str
    ttl_s: float
    existing_ok: bool
    def __init__(self, pool: _Optional[str] = ..., name: _Optional[str] = ..., ttl_s: _Optional[float] = ..., existing_ok: _Optional[bool] = ...) -> None: ...

class GpuCount(_message.Message):
    __slots__ = ("gpu", "count", "free")
    GPU_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    count: int
    free: int
    def __init__(self, gpu: _Optional[str] = ..., count: _Optional[int] = ..., free: _Optional[int] = ...) -> None: ...

class JoinedMachine(_message.Message):
    __slots__ = ("id", "name", "pool", "state", "hostname", "created_at", "joined_at", "connected", "last_seen", "version", "gpus", "cpu_millicores", "memory_mib", "free_cpu_millicores", "free_memory_mib", "workers", "workspace_id", "docker_version", "docker_runtimes", "arch")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    FREE_CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    DOCKER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCKER_RUNTIMES_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    pool: str
    state: str
    hostname: str
    created_at: float
    joined_at: float
    connected: bool
    last_seen: float
    version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuCount]
    cpu_millicores: int
    memory_mib: int
    free_cpu_millicores: int
    free_memory_mib: int
    workers: _containers.RepeatedScalarFieldContainer[str]
    workspace_id: str
    docker_version: str
    docker_runtimes: _containers.RepeatedScalarFieldContainer[str]
    arch: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., pool: _Optional[str] = ..., state: _Optional[str] = ..., hostname: _Optional[str] = ..., created_at: _Optional[float] = ..., joined_at: _Optional[float] = ..., connected: _Optional[bool] = ..., last_seen: _Optional[float] = ..., version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuCount, _Mapping]]] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., free_cpu_millicores: _Optional[int] = ..., free_memory_mib: _Optional[int] = ..., workers: _Optional[_Iterable[str]] = ..., workspace_id: _Optional[str] = ..., docker_version: _Optional[str] = ..., docker_runtimes: _Optional[_Iterable[str]] = ..., arch: _Optional[str] = ...) -> None: ...

class CreateJoinedMachineResponse(_message.Message):
    __slots__ = ("machine", "join_token", "expires_at", "controlplane_url", "ca_pem", "join_command", "ssh_json", "existing", "wheel_url", "wheel_sha256")
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_URL_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    JOIN_COMMAND_FIELD_NUMBER: _ClassVar[int]
    SSH_JSON_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    WHEEL_URL_FIELD_NUMBER: _ClassVar[int]
    WHEEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    machine: JoinedMachine
    join_token: str
    expires_at: float
    controlplane_url: str
    ca_pem: str
    join_command: str
    ssh_json: str
    existing: bool
    wheel_url: str
    wheel_sha256: str
    def __init__(self, machine: _Optional[_Union[JoinedMachine, _Mapping]] = ..., join_token: _Optional[str] = ..., expires_at: _Optional[float] = ..., controlplane_url: _Optional[str] = ..., ca_pem: _Optional[str] = ..., join_command: _Optional[str] = ..., ssh_json: _Optional[str] = ..., existing: _Optional[bool] = ..., wheel_url: _Optional[str] = ..., wheel_sha256: _Optional[str] = ...) -> None: ...

class ListJoinedMachinesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJoinedMachinesResponse(_message.Message):
    __slots__ = ("machines",)
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    machines: _containers.RepeatedCompositeFieldContainer[JoinedMachine]
    def __init__(self, machines: _Optional[_Iterable[_Union[JoinedMachine, _Mapping]]] = ...) -> None: ...

class RemoveJoinedMachineRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveJoinedMachineResponse(_message.Message):
    __slots__ = ("machine", "terminated", "not_terminated")
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    NOT_TERMINATED_FIELD_NUMBER: _ClassVar[int]
    machine: JoinedMachine
    terminated: _containers.RepeatedScalarFieldContainer[str]
    not_terminated: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, machine: _Optional[_Union[JoinedMachine, _Mapping]] = ..., terminated: _Optional[_Iterable[str]] = ..., not_terminated: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinClusterRequest(_message.Message):
    __slots__ = ("name", "gpu", "gpu_count", "cpu", "memory", "min_workers", "max_workers", "runtime", "namespace", "worker_image", "settings_json", "ttl_s", "idle_timeout_s", "pool")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WORKER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu: str
    gpu_count: int
    cpu: float
    memory: str
    min_workers: int
    max_workers: int
    runtime: str
    namespace: str
    worker_image: str
    settings_json: str
    ttl_s: float
    idle_timeout_s: float
    pool: str
    def __init__(self, name: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_count: _Optional[int] = ..., cpu: _Optional[float] = ..., memory: _Optional[str] = ..., min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., runtime: _Optional[str] = ..., namespace: _Optional[str] = ..., worker_image: _Optional[str] = ..., settings_json: _Optional[str] = ..., ttl_s: _Optional[float] = ..., idle_timeout_s: _Optional[float] = ..., pool: _Optional[str] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("id", "name", "pool", "gpu", "gpu_count", "namespace", "agent_id", "connected", "last_seen", "version", "nodes", "gpus", "cpu_millicores", "memory_mib", "workers", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    pool: str
    gpu: str
    gpu_count: int
    namespace: str
    agent_id: str
    connected: bool
    last_seen: float
    version: str
    nodes: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuCount]
    cpu_millicores: int
    memory_mib: int
    workers: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., pool: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_count: _Optional[int] = ..., namespace: _Optional[str] = ..., agent_id: _Optional[str] = ..., connected: _Optional[bool] = ..., last_seen: _Optional[float] = ..., version: _Optional[str] = ..., nodes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuCount, _Mapping]]] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., workers: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ...) -> None: ...

class JoinClusterResponse(_message.Message):
    __slots__ = ("cluster", "join_token", "expires_at", "controlplane_url", "ca_pem")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_URL_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    join_token: str
    expires_at: float
    controlplane_url: str
    ca_pem: str
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ..., join_token: _Optional[str] = ..., expires_at: _Optional[float] = ..., controlplane_url: _Optional[str] = ..., ca_pem: _Optional[str] = ...) -> None: ...

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class RemoveClusterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveClusterResponse(_message.Message):
    __slots__ = ("cluster", "agents", "terminated", "not_terminated")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    NOT_TERMINATED_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    agents: _containers.RepeatedScalarFieldContainer[str]
    terminated: _containers.RepeatedScalarFieldContainer[str]
    not_terminated: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ..., agents: _Optional[_Iterable[str]] = ..., terminated: _Optional[_Iterable[str]] = ..., not_terminated: _Optional[_Iterable[str]] = ...) -> None: ...

class BuildImageRequest(_message.Message):
    __slots__ = ("spec", "contents")
    class ContentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    spec: str
    contents: _containers.ScalarMap[str, bytes]
    def __init__(self, spec: _Optional[str] = ..., contents: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class BuildImageEvent(_message.Message):
    __slots__ = ("kind", "text", "image", "key", "cached", "task_id", "steps", "steps_cached")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEPS_CACHED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    text: str
    image: str
    key: str
    cached: bool
    task_id: str
    steps: int
    steps_cached: int
    def __init__(self, kind: _Optional[str] = ..., text: _Optional[str] = ..., image: _Optional[str] = ..., key: _Optional[str] = ..., cached: _Optional[bool] = ..., task_id: _Optional[str] = ..., steps: _Optional[int] = ..., steps_cached: _Optional[int] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BuiltImage(_message.Message):
    __slots__ = ("key", "image", "manifest_digest", "size_bytes", "steps", "created_at", "last_used_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    key: str
    image: str
    manifest_digest: str
    size_bytes: int
    steps: int
    created_at: float
    last_used_at: float
    def __init__(self, key: _Optional[str] = ..., image: _Optional[str] = ..., manifest_digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., steps: _Optional[int] = ..., created_at: _Optional[float] = ..., last_used_at: _Optional[float] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[BuiltImage]
    def __init__(self, images: _Optional[_Iterable[_Union[BuiltImage, _Mapping]]] = ...) -> None: ...
