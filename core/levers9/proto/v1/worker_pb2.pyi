from levers9.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "gpu", "memory_mib")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    gpu: str
    memory_mib: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., memory_mib: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("pool", "machine_id", "cpu_millicores", "memory_mib", "gpus", "runtime", "hostname", "version", "running", "worker_id", "probe_port", "probe_nonce", "identity", "max_queued")
    POOL_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    PROBE_NONCE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    pool: str
    machine_id: str
    cpu_millicores: int
    memory_mib: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    runtime: str
    hostname: str
    version: str
    running: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    probe_port: int
    probe_nonce: str
    identity: MachineIdentity
    max_queued: int
    def __init__(self, pool: _Optional[str] = ..., machine_id: _Optional[str] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., runtime: _Optional[str] = ..., hostname: _Optional[str] = ..., version: _Optional[str] = ..., running: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ..., probe_port: _Optional[int] = ..., probe_nonce: _Optional[str] = ..., identity: _Optional[_Union[MachineIdentity, _Mapping]] = ..., max_queued: _Optional[int] = ...) -> None: ...

class MachineIdentity(_message.Message):
    __slots__ = ("document", "signature")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    document: str
    signature: str
    def __init__(self, document: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("worker_id", "keepalive_s", "runtime", "runtime_settings_json", "checkpoint_storage_url", "checkpoint_cache_max_bytes", "checkpoint_cache_dir", "max_payload_bytes", "session_token", "tunnel", "cpu_millicores", "memory_mib", "registry_url", "volumes_metadata_url", "volumes_env", "max_sandboxes", "warm_sandboxes")
    class VolumesEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_S_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORAGE_URL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CACHE_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CACHE_DIR_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TUNNEL_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_URL_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_METADATA_URL_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_ENV_FIELD_NUMBER: _ClassVar[int]
    MAX_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    WARM_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    keepalive_s: float
    runtime: str
    runtime_settings_json: str
    checkpoint_storage_url: str
    checkpoint_cache_max_bytes: int
    checkpoint_cache_dir: str
    max_payload_bytes: int
    session_token: str
    tunnel: bool
    cpu_millicores: int
    memory_mib: int
    registry_url: str
    volumes_metadata_url: str
    volumes_env: _containers.ScalarMap[str, str]
    max_sandboxes: int
    warm_sandboxes: int
    def __init__(self, worker_id: _Optional[str] = ..., keepalive_s: _Optional[float] = ..., runtime: _Optional[str] = ..., runtime_settings_json: _Optional[str] = ..., checkpoint_storage_url: _Optional[str] = ..., checkpoint_cache_max_bytes: _Optional[int] = ..., checkpoint_cache_dir: _Optional[str] = ..., max_payload_bytes: _Optional[int] = ..., session_token: _Optional[str] = ..., tunnel: _Optional[bool] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., registry_url: _Optional[str] = ..., volumes_metadata_url: _Optional[str] = ..., volumes_env: _Optional[_Mapping[str, str]] = ..., max_sandboxes: _Optional[int] = ..., warm_sandboxes: _Optional[int] = ...) -> None: ...

class CheckpointRef(_message.Message):
    __slots__ = ("id", "runtime", "status", "path", "size_bytes", "gpu", "workspace_id", "stub_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    runtime: str
    status: str
    path: str
    size_bytes: int
    gpu: str
    workspace_id: str
    stub_id: str
    def __init__(self, id: _Optional[str] = ..., runtime: _Optional[str] = ..., status: _Optional[str] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., gpu: _Optional[str] = ..., workspace_id: _Optional[str] = ..., stub_id: _Optional[str] = ...) -> None: ...

class RecordCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id", "stub_id", "runtime", "gpu", "status", "path", "size_bytes", "error")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    stub_id: str
    runtime: str
    gpu: str
    status: str
    path: str
    size_bytes: int
    error: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., stub_id: _Optional[str] = ..., runtime: _Optional[str] = ..., gpu: _Optional[str] = ..., status: _Optional[str] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class StubDefinition(_message.Message):
    __slots__ = ("stub_id", "workspace_id", "image", "handler", "python_version", "env", "keep_warm_s", "name", "kind", "secret_env", "cpu_millicores", "memory_mib", "gpu_count", "checkpoint_enabled", "checkpoint", "interface", "tasks_per_container", "ports", "volumes")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    KEEP_WARM_S_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    TASKS_PER_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    stub_id: str
    workspace_id: str
    image: str
    handler: bytes
    python_version: str
    env: _containers.ScalarMap[str, str]
    keep_warm_s: float
    name: str
    kind: str
    secret_env: _containers.ScalarMap[str, str]
    cpu_millicores: int
    memory_mib: int
    gpu_count: int
    checkpoint_enabled: bool
    checkpoint: CheckpointRef
    interface: str
    tasks_per_container: int
    ports: _containers.RepeatedScalarFieldContainer[int]
    volumes: _containers.RepeatedCompositeFieldContainer[WorkerVolume]
    def __init__(self, stub_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., image: _Optional[str] = ..., handler: _Optional[bytes] = ..., python_version: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., keep_warm_s: _Optional[float] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., secret_env: _Optional[_Mapping[str, str]] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpu_count: _Optional[int] = ..., checkpoint_enabled: _Optional[bool] = ..., checkpoint: _Optional[_Union[CheckpointRef, _Mapping]] = ..., interface: _Optional[str] = ..., tasks_per_container: _Optional[int] = ..., ports: _Optional[_Iterable[int]] = ..., volumes: _Optional[_Iterable[_Union[WorkerVolume, _Mapping]]] = ...) -> None: ...

class WorkerVolume(_message.Message):
    __slots__ = ("mount_path", "volume_id", "webdav_url", "webdav_token", "bucket", "read_only", "force_path_style", "endpoint", "region", "access_key_id", "secret_access_key", "volume_name")
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    WEBDAV_URL_FIELD_NUMBER: _ClassVar[int]
    WEBDAV_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FORCE_PATH_STYLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    VOLUME_NAME_FIELD_NUMBER: _ClassVar[int]
    mount_path: str
    volume_id: str
    webdav_url: str
    webdav_token: str
    bucket: str
    read_only: bool
    force_path_style: bool
    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str
    volume_name: str
    def __init__(self, mount_path: _Optional[str] = ..., volume_id: _Optional[str] = ..., webdav_url: _Optional[str] = ..., webdav_token: _Optional[str] = ..., bucket: _Optional[str] = ..., read_only: _Optional[bool] = ..., force_path_style: _Optional[bool] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., access_key_id: _Optional[str] = ..., secret_access_key: _Optional[str] = ..., volume_name: _Optional[str] = ...) -> None: ...

class ContainerRequest(_message.Message):
    __slots__ = ("task_id", "stub_id", "args", "cpu_millicores", "memory_mib", "gpu_count", "timeout_s", "attempt", "queued")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STUB_ID_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    stub_id: str
    args: bytes
    cpu_millicores: int
    memory_mib: int
    gpu_count: int
    timeout_s: float
    attempt: int
    queued: bool
    def __init__(self, task_id: _Optional[str] = ..., stub_id: _Optional[str] = ..., args: _Optional[bytes] = ..., cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpu_count: _Optional[int] = ..., timeout_s: _Optional[float] = ..., attempt: _Optional[int] = ..., queued: _Optional[bool] = ...) -> None: ...

class CancelTask(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ContainerRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ContainerRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ContainerRequest, _Mapping]]] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("stub", "request", "cancel", "drain", "requests")
    STUB_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    stub: StubDefinition
    request: ContainerRequest
    cancel: CancelTask
    drain: bool
    requests: ContainerRequests
    def __init__(self, stub: _Optional[_Union[StubDefinition, _Mapping]] = ..., request: _Optional[_Union[ContainerRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelTask, _Mapping]] = ..., drain: _Optional[bool] = ..., requests: _Optional[_Union[ContainerRequests, _Mapping]] = ...) -> None: ...

class TaskStarted(_message.Message):
    __slots__ = ("task_id", "container_id", "address", "ports")
    class PortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    container_id: str
    address: str
    ports: _containers.ScalarMap[int, str]
    def __init__(self, task_id: _Optional[str] = ..., container_id: _Optional[str] = ..., address: _Optional[str] = ..., ports: _Optional[_Mapping[int, str]] = ...) -> None: ...

class TaskLog(_message.Message):
    __slots__ = ("task_id", "data")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    data: bytes
    def __init__(self, task_id: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("started", "results", "logs", "keepalive", "draining", "sandbox_api", "sandboxes_ended")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_API_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_ENDED_FIELD_NUMBER: _ClassVar[int]
    started: _containers.RepeatedCompositeFieldContainer[TaskStarted]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskResult]
    logs: _containers.RepeatedCompositeFieldContainer[TaskLog]
    keepalive: bool
    draining: bool
    sandbox_api: SandboxApi
    sandboxes_ended: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, started: _Optional[_Iterable[_Union[TaskStarted, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[_common_pb2.TaskResult, _Mapping]]] = ..., logs: _Optional[_Iterable[_Union[TaskLog, _Mapping]]] = ..., keepalive: _Optional[bool] = ..., draining: _Optional[bool] = ..., sandbox_api: _Optional[_Union[SandboxApi, _Mapping]] = ..., sandboxes_ended: _Optional[_Iterable[str]] = ...) -> None: ...

class SandboxApi(_message.Message):
    __slots__ = ("port", "secret")
    PORT_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    port: int
    secret: str
    def __init__(self, port: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class TunnelFrame(_message.Message):
    __slots__ = ("stream", "open", "opened", "data", "credit", "close", "reset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    stream: int
    open: TunnelOpen
    opened: int
    data: bytes
    credit: int
    close: bool
    reset: str
    def __init__(self, stream: _Optional[int] = ..., open: _Optional[_Union[TunnelOpen, _Mapping]] = ..., opened: _Optional[int] = ..., data: _Optional[bytes] = ..., credit: _Optional[int] = ..., close: _Optional[bool] = ..., reset: _Optional[str] = ...) -> None: ...

class TunnelOpen(_message.Message):
    __slots__ = ("host", "port", "window")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    window: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., window: _Optional[int] = ...) -> None: ...
