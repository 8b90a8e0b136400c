"""The wire between a worker and the runner inside each of its containers.

A frame is a JSON header (an object with a ``kind``) and an opaque byte
payload, each preceded by its length::

    !IQ header length, payload length | header (UTF-8 JSON) | payload

The container runs untrusted code, so the worker must be able to read
everything it sends without unpickling: headers are plain JSON the worker
checks field by field, and pickled values (arguments, results, exceptions)
travel only as payloads the worker passes on without looking inside.

Both sides import this module: the runner from a blocking socket, the worker
from asyncio streams. It uses the standard library only, so the runner starts
fast.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from levers9.payloads import MAX_CAP_BYTES

if TYPE_CHECKING:  # the runner never needs asyncio's import time
    import asyncio

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Frame",
    "ProtocolError",
    "encode",
    "read_frame",
    "recv_frame",
    "send_frame",
    "write_frame",
]

_PREFIX = struct.Struct("!IQ")
#: a header is small metadata; a bigger one means the peer is broken or hostile
MAX_HEADER_BYTES = 1 << 20
#: the largest payload (arguments, a result, a pickled exception) a frame may carry: the highest cap an
#: operator may set (the worker reads a container's frames with the cap in force)
MAX_PAYLOAD_BYTES = MAX_CAP_BYTES


class ProtocolError(Exception):
    """The peer sent something that is not a well-formed frame; the connection cannot be trusted further."""


@dataclass(frozen=True)
class Frame:
    kind: str
    header: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""

    def text(self, key: str, default: str | None = None) -> str:
        """A string field of the header; anything else is the peer's error, not a crash of ours."""
        value = self.header.get(key, default)
        if not isinstance(value, str):
            raise ProtocolError(f"frame {self.kind!r}: field {key!r} is {type(value).__name__}, expected a string")
        return value

    def object(self, key: str) -> dict[str, Any]:
        value = self.header.get(key)
        if not isinstance(value, dict):
            raise ProtocolError(f"frame {self.kind!r}: field {key!r} is {type(value).__name__}, expected an object")
        return value


def encode(kind: str, payload: bytes = b"", **fields: Any) -> bytes:
    header = json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame {kind!r}: its header is {len(header)} bytes, over {MAX_HEADER_BYTES}")
    return _PREFIX.pack(len(header), len(payload)) + header + payload


def _lengths(prefix: bytes, max_payload: int) -> tuple[int, int]:
    header_len, payload_len = _PREFIX.unpack(prefix)
    if header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"a frame header of {header_len} bytes is over the limit of {MAX_HEADER_BYTES}")
    if payload_len > max_payload:
        raise ProtocolError(f"a frame payload of {payload_len} bytes is over the limit of {max_payload}")
    return header_len, payload_len


def _decode(header: bytes, payload: bytes) -> Frame:
    try:
        fields = json.loads(header)
    except ValueError as exc:
        raise ProtocolError(f"a frame header is not JSON: {exc}") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("kind"), str):
        raise ProtocolError("a frame header is not a JSON object with a string 'kind'")
    return Frame(kind=fields.pop("kind"), header=fields, payload=payload)


# --------------------------------------------------------------------------- blocking (the runner)


def send_frame(sock: socket.socket, kind: str, payload: bytes = b"", **fields: Any) -> None:
    """Send one frame; callers sharing the socket between threads hold a lock around it."""
    sock.sendall(encode(kind, payload, **fields))


def recv_frame(stream: BinaryIO, *, max_payload: int = MAX_PAYLOAD_BYTES) -> Frame | None:
    """The next frame from a buffered socket file, or None at a clean end of stream."""
    prefix = stream.read(_PREFIX.size)
    if not prefix:
        return None
    if len(prefix) < _PREFIX.size:
        raise ProtocolError("the stream ended inside a frame")
    header_len, payload_len = _lengths(prefix, max_payload)
    header = stream.read(header_len)
    payload = stream.read(payload_len)
    if len(header) < header_len or len(payload) < payload_len:
        raise ProtocolError("the stream ended inside a frame")
    return _decode(header, payload)


# --------------------------------------------------------------------------- asyncio (the worker)


async def write_frame(writer: asyncio.StreamWriter, kind: str, payload: bytes = b"", **fields: Any) -> None:
    writer.write(encode(kind, payload, **fields))
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader, *, max_payload: int = MAX_PAYLOAD_BYTES) -> Frame:
    """The next frame; :class:`asyncio.IncompleteReadError` when the peer has gone."""
    header_len, payload_len = _lengths(await reader.readexactly(_PREFIX.size), max_payload)
    header = await reader.readexactly(header_len)
    payload = await reader.readexactly(payload_len) if payload_len else b""
    return _decode(header, payload)
