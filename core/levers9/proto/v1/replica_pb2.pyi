from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RelayOpen(_message.Message):
    __slots__ = ("worker_id", "host", "port")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    port: int
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class RelayChunk(_message.Message):
    __slots__ = ("open", "opened", "refused", "no_tunnel", "data")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    NO_TUNNEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    open: RelayOpen
    opened: bool
    refused: str
    no_tunnel: str
    data: bytes
    def __init__(self, open: _Optional[_Union[RelayOpen, _Mapping]] = ..., opened: _Optional[bool] = ..., refused: _Optional[str] = ..., no_tunnel: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...
