"""How big a call's arguments and result may be, and how the big ones travel: the limits, defined once.

Every part that carries a payload imports these numbers: the SDK, the
controlplane, the worker and the runner inside each container (so this
module uses the standard library only).

* A payload (pickled arguments, a pickled result or exception, a JSON body)
  of at most :data:`INLINE_MAX_BYTES` travels inside its message.
* A bigger one, up to the operator's cap (``limits.max_payload_bytes``,
  :data:`DEFAULT_MAX_PAYLOAD_BYTES` by default), is stored by the
  controlplane as a *blob*, streamed in chunks of :data:`CHUNK_BYTES` (the
  ``PutBlob``/``GetBlob`` RPCs), and its message carries a *reference*
  instead: :data:`REF_PREFIX`, the blob id and its size. A pickle never starts
  with a NUL byte, so a reference is never mistaken for a value, and every
  store and queue in between carries it as the opaque bytes it carries
  anyway.
* So no gRPC message holds more than :data:`INLINE_MAX_BYTES` of one payload,
  and messages that batch many (a map's submit, a worker's results, a watch's
  outcomes) are cut at :data:`BATCH_BYTES`; every channel accepts messages of
  :data:`MESSAGE_MAX_BYTES`, well above both. A message too big for a channel
  would otherwise fail the whole stream it travels on, again on every retry.
* A payload over the cap fails its own call with :class:`PayloadTooLarge`,
  naming the size and the cap; nothing else is affected.
"""

from __future__ import annotations

__all__ = [
    "BATCH_BYTES",
    "CHUNK_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "INLINE_MAX_BYTES",
    "JSON_CALL",
    "MAX_CAP_BYTES",
    "MESSAGE_MAX_BYTES",
    "MIN_CAP_BYTES",
    "REF_PREFIX",
    "PayloadTooLarge",
    "chunks",
    "human_bytes",
    "make_ref",
    "parse_ref",
]

#: the largest payload carried inside its message; bigger ones travel as blobs
INLINE_MAX_BYTES = 1 << 20
#: the size of one chunk of a blob on the wire (and of the rows that store it)
CHUNK_BYTES = 1 << 20
#: the default cap on one payload (``limits.max_payload_bytes``)
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 30
#: the bounds of that cap: below 1 MiB ordinary arguments fail; above 8 GiB one call can exhaust a
#: controlplane's or worker's memory (a payload is held whole in memory at each end)
MIN_CAP_BYTES = 1 << 20
MAX_CAP_BYTES = 8 << 30
#: messages that batch payloads (submits, results, outcomes) are cut at about this many bytes
BATCH_BYTES = 16 << 20
#: the largest message every levers9 gRPC channel accepts, both ways
MESSAGE_MAX_BYTES = 64 << 20
#: the first bytes of a call's arguments (and then of its result) sent as JSON rather than pickled: a
#: queue item or job run submitted over HTTP. Pickles never start with a NUL byte. The controlplane
#: never unpickles what a container sends, so results it must show as JSON travel as JSON.
JSON_CALL = b"\x00levers9-json\n"

#: the start of a reference to a stored blob, in place of the payload itself
REF_PREFIX = b"\x00levers9-blob\n"


class PayloadTooLarge(ValueError):
    """One call's payload is over the cap; the message names the size, the cap and the setting."""

    def __init__(self, what: str, size: int, cap: int, *, message: str | None = None) -> None:
        self.what = what
        self.size = size
        self.cap = cap
        super().__init__(
            message
            or f"{what} is {size:,} bytes ({human_bytes(size)}), over the cap of {cap:,} bytes "
            f"({human_bytes(cap)}) on one call's arguments or result (the controlplane's limits.max_payload_bytes)"
        )


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def make_ref(blob_id: str, size: int) -> bytes:
    """The bytes that stand for a stored blob in a message."""
    return REF_PREFIX + f"{blob_id} {size}".encode()


def parse_ref(payload: bytes) -> tuple[str, int] | None:
    """``(blob id, size)`` when ``payload`` is a reference, else None (a value that travelled inline)."""
    if not payload.startswith(REF_PREFIX) or len(payload) > len(REF_PREFIX) + 200:
        return None
    try:
        blob_id, size = payload[len(REF_PREFIX) :].decode("ascii").split(" ")
        return blob_id, int(size)
    except ValueError:
        return None


def chunks(data: bytes, size: int = CHUNK_BYTES) -> list[memoryview]:
    """``data`` cut into pieces of ``size`` bytes (views: nothing is copied)."""
    view = memoryview(data)
    return [view[i : i + size] for i in range(0, len(data), size)] or [view]
