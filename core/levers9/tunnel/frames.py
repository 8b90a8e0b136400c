"""The frames of a tunnel, and their translation to and from the ``TunnelFrame`` protobuf message.

A tunnel carries many byte streams over one ordered message channel (a gRPC
bidirectional stream in production, an in-memory pair in tests). Every frame
names its stream. The opener numbers its streams: odd ids on the side that
was created as the initiator (the controlplane), even on the other, so both
may open streams without agreeing first.

- :class:`Open` asks the other side to connect the stream to ``host:port``;
  :class:`Opened` says it did; :class:`Reset` refuses, or later abandons, a
  stream with a reason.
- :class:`Data` carries at most :data:`MAX_DATA` bytes; a side never sends
  more than the window the other side announced plus the :class:`Credit` it
  has granted since (bytes read by its reader), so each stream buffers a
  bounded amount on the receiving side whatever its reader does.
- :class:`Close` ends the sender's half of a stream (the other side reads
  end-of-file once the data before it is read).

A message that is not a valid frame (no kind, a zero stream id) raises
:class:`FrameError`: the peer does not speak this protocol and the tunnel ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers9.proto.v1 import worker_pb2

__all__ = [
    "MAX_DATA",
    "Close",
    "Credit",
    "Data",
    "Frame",
    "FrameError",
    "Open",
    "Opened",
    "Reset",
    "from_message",
    "to_message",
]

#: the most bytes one Data frame carries
MAX_DATA = 64 * 1024


class FrameError(ValueError):
    """A message that is not a tunnel frame."""


@dataclass(frozen=True, slots=True)
class Open:
    stream: int
    host: str
    port: int
    #: the bytes the opener takes before it grants credit
    window: int


@dataclass(frozen=True, slots=True)
class Opened:
    stream: int
    #: the bytes the accepting side takes before it grants credit
    window: int


@dataclass(frozen=True, slots=True)
class Data:
    stream: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Credit:
    stream: int
    amount: int


@dataclass(frozen=True, slots=True)
class Close:
    stream: int


@dataclass(frozen=True, slots=True)
class Reset:
    stream: int
    reason: str


Frame = Open | Opened | Data | Credit | Close | Reset


def to_message(frame: Frame) -> worker_pb2.TunnelFrame:
    match frame:
        case Open(stream, host, port, window):
            return worker_pb2.TunnelFrame(
                stream=stream, open=worker_pb2.TunnelOpen(host=host, port=port, window=window)
            )
        case Opened(stream, window):
            return worker_pb2.TunnelFrame(stream=stream, opened=window)
        case Data(stream, data):
            return worker_pb2.TunnelFrame(stream=stream, data=data)
        case Credit(stream, amount):
            return worker_pb2.TunnelFrame(stream=stream, credit=amount)
        case Close(stream):
            return worker_pb2.TunnelFrame(stream=stream, close=True)
        case Reset(stream, reason):
            return worker_pb2.TunnelFrame(stream=stream, reset=reason or "reset")


def from_message(message: worker_pb2.TunnelFrame) -> Frame:
    stream = message.stream
    if stream == 0:
        raise FrameError("a tunnel frame without a stream id")
    kind = message.WhichOneof("kind")
    if kind == "open":
        return Open(stream, message.open.host, message.open.port, message.open.window)
    if kind == "opened":
        return Opened(stream, message.opened)
    if kind == "data":
        return Data(stream, message.data)
    if kind == "credit":
        return Credit(stream, message.credit)
    if kind == "close":
        return Close(stream)
    if kind == "reset":
        return Reset(stream, message.reset)
    raise FrameError(f"a tunnel frame of stream {stream} without a kind")
