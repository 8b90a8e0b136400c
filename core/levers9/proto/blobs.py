"""Moving a big payload to or from the controlplane in chunks: the SDK's arguments, a worker's results.

Both the ControlPlane service (user tokens) and the Worker service (worker
tokens) have ``PutBlob`` (a stream of chunks in, a reference out) and
``GetBlob`` (a request in, a stream of chunks out); these helpers take the
bound stub method, so one implementation serves both. See
:mod:`levers9.payloads` for the limits and the reference format. A protocol
helper, not an SDK one: the worker uses it too, and must not import the SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from levers9.payloads import CHUNK_BYTES, chunks, make_ref, parse_ref
from levers9.proto.v1 import common_pb2

__all__ = ["download", "upload"]

Metadata = Sequence[tuple[str, str]]


async def upload(
    put_blob: Any, data: bytes, *, metadata: Metadata, task_id: str = "", timeout: float | None = None
) -> bytes:
    """Store ``data`` as a blob through ``put_blob`` (a stub's PutBlob); the reference that stands for it."""

    async def requests() -> AsyncIterator[common_pb2.BlobChunk]:
        for i, piece in enumerate(chunks(data, CHUNK_BYTES)):
            if i == 0:
                yield common_pb2.BlobChunk(total_bytes=len(data), data=bytes(piece), task_id=task_id)
            else:
                yield common_pb2.BlobChunk(data=bytes(piece))

    ref: common_pb2.BlobRef = await put_blob(requests(), metadata=metadata, timeout=timeout)
    return make_ref(ref.blob_id, ref.size_bytes)


async def download(
    get_blob: Any, payload: bytes, *, metadata: Metadata, task_id: str = "", timeout: float | None = None
) -> bytes:
    """``payload`` itself, or, when it is a reference, the blob it names, read through ``get_blob``."""
    ref = parse_ref(payload)
    if ref is None:
        return payload
    blob_id, size = ref
    out = bytearray()
    async for chunk in get_blob(
        common_pb2.GetBlobRequest(blob_id=blob_id, task_id=task_id), metadata=metadata, timeout=timeout
    ):
        out += chunk.data
    if len(out) != size:
        raise ConnectionError(f"blob {blob_id} came back with {len(out)} of its {size} bytes")
    return bytes(out)
