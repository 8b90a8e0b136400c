from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("join_token", "version", "hostname")
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    join_token: str
    version: str
    hostname: str
    def __init__(self, join_token: _Optional[str] = ..., version: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("agent_id", "agent_token", "provider", "workspace_id", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    agent_token: str
    provider: str
    workspace_id: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, agent_id: _Optional[str] = ..., agent_token: _Optional[str] = ..., provider: _Optional[str] = ..., workspace_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "inventory", "heartbeat", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    inventory: Inventory
    heartbeat: Heartbeat
    ack: Ack
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("version", "provider", "labels", "hostname")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    version: str
    provider: str
    labels: _containers.ScalarMap[str, str]
    hostname: str
    def __init__(self, version: _Optional[str] = ..., provider: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., hostname: _Optional[str] = ...) -> None: ...

class GpuCapacity(_message.Message):
    __slots__ = ("gpu", "count", "free")
    GPU_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    count: int
    free: int
    def __init__(self, gpu: _Optional[str] = ..., count: _Optional[int] = ..., free: _Optional[int] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("cpu_millicores", "memory_mib", "free_cpu_millicores", "free_memory_mib", "gpus", "machines", "details_json")
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    FREE_CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    cpu_millicores: int
    memory_mib: int
    free_cpu_millicores: int
    free_memory_mib: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuCapacity]
    machines: _containers.RepeatedScalarFieldContainer[str]
    details_json: str
    def __init__(self, cpu_millicores: _Optional[int] = ..., memory_mib: _Optional[int] = ..., free_cpu_millicores: _Optional[int] = ..., free_memory_mib: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuCapacity, _Mapping]]] = ..., machines: _Optional[_Iterable[str]] = ..., details_json: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Ack(_message.Message):
    __slots__ = ("order_id", "ok", "result_json", "error", "error_kind")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    ok: bool
    result_json: str
    error: str
    error_kind: str
    def __init__(self, order_id: _Optional[str] = ..., ok: _Optional[bool] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ..., error_kind: _Optional[str] = ...) -> None: ...

class AgentCommand(_message.Message):
    __slots__ = ("welcome", "order", "ping")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    order: Order
    ping: Ping
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., order: _Optional[_Union[Order, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("agent_id", "heartbeat_s")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    heartbeat_s: float
    def __init__(self, agent_id: _Optional[str] = ..., heartbeat_s: _Optional[float] = ...) -> None: ...

class Order(_message.Message):
    __slots__ = ("order_id", "kind", "payload_json")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    kind: str
    payload_json: str
    def __init__(self, order_id: _Optional[str] = ..., kind: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
