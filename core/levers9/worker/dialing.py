"""How a worker dials the controlplane: its session channel's options and its deadlines.

Invariant: a replica that stops answering without closing anything (frozen by SIGSTOP, a host that
stalled: its kernel still accepts connections and acknowledges TCP) is left well within
``scheduler.worker_keepalive_s`` (30 s by default), after which another replica would judge the worker
gone and requeue its calls: a registration unanswered within :data:`REGISTER_TIMEOUT_S` fails, and a
session whose ping is unanswered fails after at most :data:`SESSION_PING_S` + :data:`SESSION_PING_TIMEOUT_S`.
Either failure sends the worker to the next address (:mod:`levers9.worker.session`).
"""

from __future__ import annotations

from levers9.payloads import MESSAGE_MAX_BYTES

__all__ = ["REGISTER_TIMEOUT_S", "SESSION_PING_S", "SESSION_PING_TIMEOUT_S", "session_channel_options"]

#: how long a registration may go unanswered before the worker tries the next address: a frozen replica (SIGSTOP,
#: a host that stalled) accepts the connection (the kernel answers) and then says nothing
REGISTER_TIMEOUT_S = 10.0

#: how often the worker pings the replica its session is on; above the server's
#: grpc.http2.min_ping_interval_without_data_ms (10 s), or the server would end the connection for pinging
#: too often
SESSION_PING_S = 12.0
#: how long a ping may go unanswered before the connection is taken for dead. gRPC acknowledges pings in
#: its own transport, not in the replica's busy Python loop, so a live replica answers in milliseconds.
#: Both keepalive_timeout_ms and grpc.http2.ping_timeout_ms are set: with the first alone, grpcio 1.85
#: waited 60 s (the second's default) for the answer, 75 s in all, and a frozen replica kept its workers
#: past scheduler.worker_keepalive_s (30 s), so another replica judged them gone
SESSION_PING_TIMEOUT_S = 4.0


def session_channel_options() -> list[tuple[str, int]]:
    """The gRPC options of the channel a worker registers and holds its session on."""
    return [
        ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
        ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
        # a replica whose host vanished (or that was frozen) resets nothing: pings find it gone within
        # SESSION_PING_S + SESSION_PING_TIMEOUT_S (16 s) instead of TCP's retransmission timeout (minutes)
        ("grpc.keepalive_time_ms", int(SESSION_PING_S * 1000)),
        ("grpc.keepalive_timeout_ms", int(SESSION_PING_TIMEOUT_S * 1000)),
        ("grpc.http2.ping_timeout_ms", int(SESSION_PING_TIMEOUT_S * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
