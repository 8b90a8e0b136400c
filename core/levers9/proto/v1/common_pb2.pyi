from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RemoteError(_message.Message):
    __slots__ = ("type", "message", "traceback")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    traceback: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("task_id", "status", "result", "error")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    status: str
    result: bytes
    error: RemoteError
    def __init__(self, task_id: _Optional[str] = ..., status: _Optional[str] = ..., result: _Optional[bytes] = ..., error: _Optional[_Union[RemoteError, _Mapping]] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("total_bytes", "data", "task_id")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    data: bytes
    task_id: str
    def __init__(self, total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., task_id: _Optional[str] = ...) -> None: ...

class BlobRef(_message.Message):
    __slots__ = ("blob_id", "size_bytes")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    size_bytes: int
    def __init__(self, blob_id: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class GetBlobRequest(_message.Message):
    __slots__ = ("blob_id", "task_id")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    task_id: str
    def __init__(self, blob_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...
