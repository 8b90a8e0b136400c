"""A stand-in controlplane for the contract kit: a real gRPC server that records who registers.

The kit's boot check gives a provider a :class:`~levers9.hooks.types.WorkerBootstrap`
whose ``controlplane_url`` points here, boots what the provider was asked to
run, and then asks :meth:`Registrar.wait_for` whether a worker registered with
exactly the bootstrap's token and machine id. Nothing else of the controlplane
is emulated.

What it answers, on ``127.0.0.1`` only, in plain text (no TLS):

* ``Worker.Register``: records the bearer token of the ``authorization``
  metadata, the request's ``machine_id``, ``pool``, ``version`` and machine
  ``identity`` and the reachability port and nonce it offers (checked by
  the kit, not here), and answers
  a valid ``RegisterResponse`` (runtime ``process``, no checkpoint storage) so a
  real ``levers9 worker`` carries on as it would against a controlplane. Where
  the response has a session-credential field (a string field whose name holds
  ``token`` or ``credential``), it carries a random value, as a controlplane
  exchanging a single-use join token would.
* ``Worker.Session``: held open and idle until the stand-in stops, the way a
  quiet controlplane holds it (no work is ever sent); what the worker sends is
  read and dropped.
* everything else: ``UNIMPLEMENTED``, with a message saying this is the kit's stand-in.

Invariants: a registration is recorded before it is answered, so a worker that
saw its answer is always in :attr:`Registrar.registrations`; a request without
a bearer token is recorded too (with ``token=None``), so the kit can say
*which* token was missing rather than that nothing came. :meth:`Registrar.close`
cancels every open session and returns once the server has stopped.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

from levers9.hooks.types import MachineIdentity
from levers9.proto.v1 import worker_pb2, worker_pb2_grpc

__all__ = ["Registrar", "Registration"]

#: the runtime the stand-in tells a registering worker to use: built in, available on any host
STANDIN_RUNTIME = "process"


@dataclass(frozen=True)
class Registration:
    """One ``Register`` call the stand-in received."""

    #: the bearer token of the call's ``authorization`` metadata; None when it had none
    token: str | None
    machine_id: str
    pool: str
    version: str
    hostname: str
    #: the worker id the stand-in answered
    worker_id: str
    #: the machine identity the worker showed (``RegisterRequest.identity``); None when it showed none
    identity: MachineIdentity | None = None
    #: the TCP port the worker answers its reachability check on, and the nonce it answers (0, "": none offered)
    probe_port: int = 0
    probe_nonce: str = ""


def _bearer(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _credential_fields() -> list[str]:
    """String fields of ``RegisterResponse`` that carry a credential for the worker's later calls, if any."""
    fields = worker_pb2.RegisterResponse.DESCRIPTOR.fields
    return [
        f.name
        for f in fields
        if f.type == FieldDescriptor.TYPE_STRING and ("token" in f.name or "credential" in f.name)
    ]


class _Servicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, registrar: Registrar) -> None:
        self.registrar = registrar

    def Register(self, request: worker_pb2.RegisterRequest, context: grpc.ServicerContext) -> Any:
        worker_id = f"w-standin-{secrets.token_hex(4)}"
        self.registrar._record(
            Registration(
                token=_bearer(context),
                machine_id=request.machine_id,
                pool=request.pool,
                version=request.version,
                hostname=request.hostname,
                worker_id=worker_id,
                identity=(
                    MachineIdentity(document=request.identity.document, signature=request.identity.signature)
                    if request.HasField("identity") and request.identity.document
                    else None
                ),
                probe_port=request.probe_port,
                probe_nonce=request.probe_nonce,
            )
        )
        answer: dict[str, Any] = {"worker_id": worker_id, "keepalive_s": 30.0, "runtime": STANDIN_RUNTIME}
        answer.update({name: f"standin-session-{secrets.token_hex(16)}" for name in _credential_fields()})
        return worker_pb2.RegisterResponse(**answer)

    def Session(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        # Idle: read what the worker sends (keepalives) and send nothing, until the worker or the stand-in ends it.
        for _ in request_iterator:
            if self.registrar._closed.is_set():
                break
        yield from ()  # a streaming answer with no message in it

    def _refuse(self, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "levers9 contract kit stand-in controlplane: only Register (and an idle Session) are answered",
        )

    def RecordCheckpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._refuse(context)

    def PutBlob(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        self._refuse(context)

    def GetBlob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._refuse(context)


class Registrar:
    """The stand-in controlplane; ``url`` is what a bootstrap's ``controlplane_url`` should say."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Condition()
        self._registrations: list[Registration] = []
        self._closed = threading.Event()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="levers9-standin"))
        add_worker: Any = worker_pb2_grpc.add_WorkerServicer_to_server  # generated, unannotated
        add_worker(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port(f"{host}:0")
        if not self.port:
            raise RuntimeError(f"the contract kit's stand-in controlplane could not listen on {host}")
        self.host = host
        self._server.start()

    @property
    def url(self) -> str:
        return f"grpc://{self.host}:{self.port}"

    @property
    def registrations(self) -> list[Registration]:
        with self._lock:
            return list(self._registrations)

    def _record(self, registration: Registration) -> None:
        with self._lock:
            self._registrations.append(registration)
            self._lock.notify_all()

    def wait_for(
        self, token: str, machine_id: str, timeout: float, *, stop_early: Callable[[], bool] | None = None
    ) -> Registration | None:
        """The first registration with exactly ``token`` and ``machine_id``, waiting up to ``timeout`` seconds.

        Ends early with None as soon as any other registration came (a worker of that boot registered
        with another token or machine id: it will not register again, its session is held), or when
        ``stop_early`` (polled while waiting) returns True: the booted processes are all gone, say.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for registration in self._registrations:
                    if registration.token == token and registration.machine_id == machine_id:
                        return registration
                left = deadline - time.monotonic()
                if left <= 0 or self._registrations or (stop_early is not None and stop_early()):
                    return None
                self._lock.wait(min(left, 0.2))

    def close(self) -> None:
        self._closed.set()
        self._server.stop(grace=None).wait()

    def __enter__(self) -> Registrar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
