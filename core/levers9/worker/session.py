"""``levers9 worker``: dial the controlplane, register, and run what the session delivers.

The worker only ever dials out. It registers with its own token (its
machine's join token, exchanged at the first registration for the session
credential it uses from then on, see :mod:`levers9.worker.credentials`; or a
pool worker token), reads only :data:`levers9.worker_variables.WORKER_VARIABLES`,
then holds one session stream: container requests come down, batches of
started tasks, results and output go up. If the controlplane goes away the worker keeps running its
calls, reconnects with backoff and re-sends the results of the last minute
(storing a result is idempotent, so a result lost in the break is not lost).
SIGTERM makes it drain: it says so, takes no new work, finishes what it has,
then leaves. A worker that cannot reach its controlplane for
``disconnect_exit_s`` stops by itself, so nothing runs orphaned for long.

A worker the controlplane cannot connect to (it tries a port the worker
offers at registration, :mod:`levers9.worker.tunnel`) is told so, and holds a
tunnel to the replica of its session for as long as the session lasts: the
gateway reaches its serving containers through it.

The controlplane may be several replicas (``LEVERS9_CONTROLPLANE_URL`` /
``--controlplane`` as a comma list, :func:`levers9.proto.target.parse_targets`):
when one fails the worker moves straight to the next and registers there
(with ``running=`` what it runs, so those calls are claimed, not run again),
backing off only after every replica failed once in a row; the limit above
counts from the last contact with any of them. The replica it just left is
tried last. A replica that stops answering without closing anything (frozen
by SIGSTOP, a host that stalled: its kernel still accepts connections) counts
as failed too: a registration unanswered within :data:`~levers9.worker.dialing.REGISTER_TIMEOUT_S`,
or a session whose ping goes unanswered (:mod:`levers9.worker.dialing`, 16 s), which is well within the
``scheduler.worker_keepalive_s`` (30 s by default) after which another
replica would judge the worker gone and requeue its calls. Over TLS the worker verifies
the controlplane's certificate with ``LEVERS9_CONTROLPLANE_CA`` (PEM text) or
``LEVERS9_CONTROLPLANE_CA_FILE`` (a path), else the system trust store
(:mod:`levers9.proto.tls`). The CA is public, so unlike the token these
variables are not scrubbed from the environment of what the worker starts.

What goes up is batched by :mod:`levers9.worker.outbox`; what runs on the pool's runtime is set up by
:mod:`levers9.worker.runtime_setup`; calls run in the
warm pool (:mod:`levers9.worker.warm`). The worker speaks the wire protocol
(:mod:`levers9.proto`) and nothing else of the controlplane: it imports
neither the database layer (``levers9.state``) nor the SDK (``levers9.sdk``).

It says its levers9 version at Register; a controlplane of another version
refuses it with FAILED_PRECONDITION, which no retry can fix (the image must be
rebuilt): the worker logs the controlplane's message and exits with
:data:`EXIT_REFUSED` at once, running calls or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from levers9.__about__ import __version__
from levers9.backoff import Backoff
from levers9.blueprints.order import BUILD_KIND
from levers9.checkpoint.snapshot import record_of
from levers9.hooks.facade import Hooks
from levers9.hooks.types import GpuDevice
from levers9.payloads import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    INLINE_MAX_BYTES,
    PayloadTooLarge,
    parse_ref,
)
from levers9.proto import WORKER_ID_METADATA
from levers9.proto.blobs import download, upload
from levers9.proto.target import parse_targets
from levers9.proto.tls import system_roots
from levers9.proto.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from levers9.registry.auth import RegistryAuth
from levers9.worker.admission import MAX_QUEUED, Admission
from levers9.worker.builds import BuildTasks
from levers9.worker.calls import Call, Outcome, RemoteErrorInfo, StubSpec
from levers9.worker.credentials import save_session_credential
from levers9.worker.dialing import REGISTER_TIMEOUT_S, SESSION_PING_S, SESSION_PING_TIMEOUT_S, session_channel_options
from levers9.worker.environment import default_state_dir, options_from_env
from levers9.worker.identity import machine_identity
from levers9.worker.images import ImagePullFailed, ImagePulls
from levers9.worker.leftovers import remove_leftovers
from levers9.worker.outbox import Outbox
from levers9.worker.runtime_setup import runtime_for
from levers9.worker.sandboxes import Sandboxes
from levers9.worker.tunnel import ProbeListener, hold_tunnel
from levers9.worker.volumes import volume_spec
from levers9.worker.warm.pool import WarmPool

if TYPE_CHECKING:
    from levers9.worker.sandbox_api import SandboxAPI

__all__ = [
    "EXIT_REFUSED",
    "REGISTER_TIMEOUT_S",
    "SESSION_PING_S",
    "SESSION_PING_TIMEOUT_S",
    "WorkerOptions",
    "WorkerProcess",
    "WorkerRefused",
    "default_state_dir",
    "options_from_env",
]


log = logging.getLogger(__name__)


@dataclass
class WorkerOptions:
    controlplane: str
    token: str = field(repr=False)
    pool: str = ""
    machine_id: str = ""
    cpu_millicores: int = 0
    memory_mib: int = 0
    state_dir: Path = Path("/var/lib/levers9/worker")
    #: exit after this long without a session to the controlplane; 0 = never
    disconnect_exit_s: float = 0.0
    visible_gpus: list[int] | None = None
    #: after SIGTERM, how long running calls may go on before they are stopped (0 = as long as they take)
    drain_timeout_s: float = 0.0
    #: PEM CA bundle that verifies a TLS controlplane; empty means the system trust store
    controlplane_ca: str = field(default="", repr=False)
    #: the id an earlier worker process on this machine registered as (saved with its session credential)
    worker_id: str = ""
    #: the levers9 version it says at Register (this package's; the controlplane refuses another)
    version: str = __version__
    #: the plugin whose levers9_machine_identity proves which machine this is ("": none is shown)
    machine_identity: str = ""
    #: the most sandboxes served at once on the worker's loopback (levers9.worker.sandbox_api); 0: none
    sandboxes: int = 0
    #: sandboxes kept started for the next creates; None: the pool's (``RegisterResponse.warm_sandboxes``)
    sandboxes_warm: int | None = None


#: the exit code of a worker the controlplane refuses at Register for good (another levers9 version)
EXIT_REFUSED = 4


class WorkerRefused(Exception):
    """Register answered FAILED_PRECONDITION: the controlplane will not take this worker until something changes."""


class WorkerProcess:
    def __init__(self, options: WorkerOptions, hooks: Hooks) -> None:
        self.options = options
        self.hooks = hooks
        self.worker_id = options.worker_id
        #: the worker id saved with the session credential ("" when none is saved)
        self._saved_as = options.worker_id
        self.stubs: dict[str, StubSpec] = {}
        self.inflight: dict[str, asyncio.Task[None]] = {}
        #: which calls run now and which wait in this worker's own queue
        self.admission = Admission()
        self.outbox = Outbox()
        self.draining = asyncio.Event()
        self.pool: WarmPool | None = None
        #: the build tasks this worker runs (blueprints), on the same runtime as its pool
        self.builds: BuildTasks | None = None
        #: registry images pulled into the runtime's cache (None until the pool is made)
        self.images: ImagePulls | None = None
        #: the controlplane's Worker service on the current connection (checkpoints are recorded through it)
        self._rpc: worker_pb2_grpc.WorkerStub | None = None
        self.runtime = ""
        self.gpus: list[GpuDevice] = []
        self._session_stop = asyncio.Event()
        #: the cap on one call's arguments or result, as the controlplane says
        self.max_payload = DEFAULT_MAX_PAYLOAD_BYTES
        #: cancelled tasks still running here: their results are dropped, their transfers stopped
        self.cancelled: set[str] = set()
        self._transfers: dict[str, asyncio.Task[bytes]] = {}
        #: the port the controlplane tries at registration, to know whether it can connect to this worker
        self.probe = ProbeListener()
        #: this machine's identity as shown at Register (None: none asked for, or it could not be had)
        self.identity: worker_pb2.MachineIdentity | None = None
        #: the sandboxes and their loopback API, on the pool's runtime (None unless ``options.sandboxes``)
        self.sandboxes: Sandboxes | None = None
        self.sandbox_api: SandboxAPI | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.drain)
        # a worker that was killed on this state directory may have left containers running
        await remove_leftovers(self.hooks, self.options.state_dir)
        self.options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        drainer = asyncio.create_task(self._drain_deadline())
        try:
            self.gpus = await self._discover_gpus()
            self.identity = await machine_identity(self.hooks, self.options.machine_identity)
            await self.probe.start()
            return await self._sessions()
        finally:
            drainer.cancel()
            await self.probe.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self._close_sandboxes()
            if self.pool is not None:
                await self.pool.close()
            shutil.rmtree(self.options.state_dir, ignore_errors=True)

    def drain(self) -> None:
        if not self.draining.is_set():
            dropped = len(self.admission.clear())  # placed again by the scheduler when this worker leaves
            log.info("draining: finishing %d running calls, dropping %d queued", len(self.inflight), dropped)
            self.draining.set()
            self.outbox.draining = True
            self.outbox.wake.set()

    async def _drain_deadline(self) -> None:
        """Stop waiting for running calls before whoever sent SIGTERM sends SIGKILL, so containers are removed."""
        await self.draining.wait()
        limit = self.options.drain_timeout_s
        if limit <= 0:
            return
        deadline = time.monotonic() + limit
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.inflight:
            log.warning("%d calls still running after %.0f s of draining; stopping them", len(self.inflight), limit)
            for task in list(self.inflight.values()):
                task.cancel()

    async def _discover_gpus(self) -> list[GpuDevice]:
        found = (await self.hooks.gpu_devices()).devices
        visible = self.options.visible_gpus
        return [g for g in found if visible is None or g.index in visible]

    async def _sessions(self) -> int:
        """Hold a session, reconnecting with backoff; give up after ``disconnect_exit_s`` without contact.

        The time without contact counts from the last moment a controlplane replica was known to be there:
        the end of the last session that registered (a healthy session runs until the connection breaks, so
        that moment is when it broke), or the start of the worker if it never registered. After each try
        the next replica is dialled at once; the backoff applies when every replica failed in a row.
        """
        reconnect = Backoff(initial_s=0.5, cap_s=15.0, jitter=True)
        last_ok = time.monotonic()
        targets, tls = parse_targets(self.options.controlplane)
        roots = self.options.controlplane_ca.encode() if self.options.controlplane_ca else system_roots()
        index = failed = 0  # failed: replicas that failed in a row since the last registration
        while True:
            if self.draining.is_set() and not self.inflight and not self.outbox.results:
                return 0
            target = targets[index]
            creds = grpc.ssl_channel_credentials(root_certificates=roots) if tls else None
            options = session_channel_options()
            channel = (
                grpc.aio.secure_channel(target, creds, options) if creds else grpc.aio.insecure_channel(target, options)
            )
            try:
                async with channel:
                    factory: Any = worker_pb2_grpc.WorkerStub  # generated, unannotated
                    stub: worker_pb2_grpc.WorkerStub = factory(channel)
                    self._rpc = stub
                    response = await self._register(stub)
                    reconnect.reset()
                    failed = 0
                    try:
                        await self._session(stub, response)
                    finally:
                        last_ok = time.monotonic()
                    if self.draining.is_set() and not self.inflight:
                        return 0
            except WorkerRefused as exc:
                log.error("the controlplane refused this worker: %s", exc)
                return EXIT_REFUSED
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    log.error("the controlplane refused this worker: %s", exc.details())
                    if not self.inflight:
                        return 2
                else:
                    log.warning("controlplane %s unreachable (%s: %s)", target, exc.code().name, exc.details())
            limit = self.options.disconnect_exit_s
            if limit and time.monotonic() - last_ok > limit:
                log.error("no controlplane for %.0f s; stopping", limit)
                return 3
            index, failed = (index + 1) % len(targets), failed + 1
            if failed >= len(targets):  # every replica failed in a row: wait before the next round
                wait, failed = reconnect.next_s(), 0
                log.info("retrying the controlplane at %s in %.1fs", targets[index], wait)
                if self.draining.is_set():  # stopping, with results still to deliver: keep the pace
                    await asyncio.sleep(wait)
                else:  # a stop (SIGTERM: docker stop, systemd) ends the wait, before the SIGKILL that follows
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.draining.wait(), wait)

    def _registry_auth(self) -> RegistryAuth:
        """How this worker logs in to the controlplane's registry: its id and its current credential."""
        return RegistryAuth(username=self.worker_id, password=self.options.token)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.options.token}"), (WORKER_ID_METADATA, self.worker_id))

    async def _register(self, stub: worker_pb2_grpc.WorkerStub) -> worker_pb2.RegisterResponse:
        request = worker_pb2.RegisterRequest(
            pool=self.options.pool,
            machine_id=self.options.machine_id,
            cpu_millicores=self.options.cpu_millicores,
            memory_mib=self.options.memory_mib,
            gpus=[
                worker_pb2.Gpu(index=g.index, uuid=g.uuid, model=g.model, gpu=g.gpu or "", memory_mib=g.memory_mib)
                for g in self.gpus
            ],
            runtime=self.runtime,
            hostname=socket.gethostname(),
            version=self.options.version,
            # all it holds, the calls waiting in its own queue too
            running=list(dict.fromkeys([*self.inflight, *self.admission.waiting, *self.outbox.undelivered()])),
            worker_id=self.worker_id,
            probe_port=self.probe.port,
            probe_nonce=self.probe.nonce,
            identity=self.identity,
            max_queued=MAX_QUEUED,
        )
        try:
            response: worker_pb2.RegisterResponse = await stub.Register(
                request, metadata=self._metadata(), timeout=REGISTER_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                raise WorkerRefused(exc.details() or "Register failed its precondition") from None
            raise
        if response.session_token:  # the join token is spent: this credential is the worker's from now on
            self.options.token = response.session_token
        if self.worker_id and response.worker_id != self.worker_id:
            log.warning("registered again as %s (was %s)", response.worker_id, self.worker_id)
        self.worker_id = response.worker_id
        self.admission.set_room(response.cpu_millicores, response.memory_mib)
        await self._ensure_pool(response)
        if response.session_token or self._saved_as not in ("", self.worker_id):  # new, or registered anew
            self._keep_session_credential(self.options.token)
        self.outbox.resend_recent()
        log.info("registered as %s (runtime %s)", self.worker_id, response.runtime)
        return response

    def _keep_session_credential(self, token: str) -> None:
        """Save it for a restarted worker, unless calls see the worker's files (then it stays in memory only)."""
        if self.pool is None or self.pool.capabilities.host_filesystem:
            log.info(
                "runtime %s shares this worker's files: the session credential is kept in memory only", self.runtime
            )
            return
        try:
            save_session_credential(self.options.state_dir, token, self.worker_id)
            self._saved_as = self.worker_id
        except OSError as exc:
            log.warning(
                "cannot keep the session credential in %s (%s): a restarted worker could not register again",
                self.options.state_dir,
                exc.strerror,
            )

    async def _ensure_pool(self, response: worker_pb2.RegisterResponse) -> None:
        if self.pool is not None and self.runtime == response.runtime:
            return
        await self._close_sandboxes()
        if self.pool is not None:
            await self.pool.close()
        made = await runtime_for(
            self.hooks,
            self.options,
            response,
            self.gpus,
            self._record_checkpoint,
            self._registry_auth,
            in_use=lambda: [s.image for s in self.stubs.values()],
        )
        self.runtime = response.runtime
        self.max_payload = made.max_payload
        self.pool, self.builds, self.images = made.pool, made.builds, made.images
        most = self.options.sandboxes or response.max_sandboxes
        warm = response.warm_sandboxes if self.options.sandboxes_warm is None else self.options.sandboxes_warm
        if most > 0:
            await self._open_sandboxes(made.pool, most, warm=min(most, warm))

    async def _open_sandboxes(self, pool: WarmPool, most: int, *, warm: int = 0) -> None:
        """Sandboxes on the pool's runtime, served on the loopback: the pool's ``sandboxes`` as the controlplane
        sent it at registration (``max_sandboxes``), or ``LEVERS9_SANDBOXES`` on the worker, which wins."""
        from levers9.worker.sandbox_api import SandboxAPI  # uvicorn and starlette: only where switched on

        self.sandboxes = Sandboxes(
            pool.launcher,
            pool.client,
            pool._ports,  # one picker: a sandbox's runner port is never a call's
            state_dir=pool.state_dir,
            max_sandboxes=most,
            warm=warm,
            gpus=pool.gpu_ledger,  # one account of the worker's GPUs: a device is a call's or a sandbox's
            images=self.images,  # a sandbox's registry image is pulled as a stub's is; an image made of one pushed
        )
        self.sandboxes.on_end = self.outbox.sandbox_ended  # the controlplane frees the room it held
        self.sandbox_api = SandboxAPI(self.sandboxes)
        await self.sandbox_api.start()

    async def _close_sandboxes(self) -> None:
        """End every sandbox and stop their API (the worker stops, or its runtime changes)."""
        api, sandboxes, self.sandbox_api, self.sandboxes = self.sandbox_api, self.sandboxes, None, None
        if api is not None:
            await api.close()
        if sandboxes is not None:
            await sandboxes.close()

    async def _record_checkpoint(self, request: worker_pb2.RecordCheckpointRequest) -> worker_pb2.CheckpointRef:
        if self._rpc is None:
            raise RuntimeError("not connected to the controlplane")
        ref: worker_pb2.CheckpointRef = await self._rpc.RecordCheckpoint(request, metadata=self._metadata(), timeout=30)
        return ref

    async def _session(self, stub: worker_pb2_grpc.WorkerStub, response: worker_pb2.RegisterResponse) -> None:
        stop = self._session_stop = asyncio.Event()
        api = self.sandbox_api
        # every session starts by saying where this worker serves sandboxes: the controlplane reaches them only so
        first = (
            worker_pb2.WorkerMessage(sandbox_api=worker_pb2.SandboxApi(port=api.port, secret=api.secret))
            if api is not None
            else None
        )
        call = stub.Session(self.outbox.messages(response.keepalive_s, stop, first), metadata=self._metadata())
        reaper = asyncio.create_task(self._reap_idle())
        # the controlplane cannot connect to this worker: its containers are reached through the tunnel
        tunnel = asyncio.create_task(hold_tunnel(stub, self._metadata)) if response.tunnel else None
        try:
            async for message in call:
                kind = message.WhichOneof("kind")
                if kind == "stub":
                    self._add_stub(message.stub)
                elif kind == "request":
                    self._start(message.request)
                elif kind == "requests":
                    for request in message.requests.requests:
                        self._start(request)
                elif kind == "cancel":
                    await self._cancel(message.cancel.task_id)
                elif kind == "drain":
                    self.drain()
                if self.draining.is_set() and not self.inflight and not self.outbox.results:
                    break
        finally:
            stop.set()
            self.outbox.wake.set()
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            if tunnel is not None:
                tunnel.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await tunnel
            call.cancel()

    async def _cancel(self, task_id: str) -> None:
        """Stop a task: its container (and whatever it started) goes, its result is never sent."""
        self.outbox.drop(task_id)
        if self.admission.drop(task_id) or task_id not in self.inflight:
            return
        self.cancelled.add(task_id)
        transfer = self._transfers.get(task_id)
        if transfer is not None:
            transfer.cancel()
        if self.pool is not None:
            await self.pool.cancel(task_id)

    async def _transfer(self, task_id: str, work: Any) -> bytes:
        """Run an upload or download of ``task_id``'s payload so that cancelling the task stops it."""
        transfer: asyncio.Task[bytes] = asyncio.ensure_future(work)
        self._transfers[task_id] = transfer
        try:
            return await transfer
        finally:
            self._transfers.pop(task_id, None)

    async def _arguments(self, call: Call) -> Call:
        """The call with its arguments themselves, fetched when they travelled as a blob."""
        if parse_ref(call.args) is None:
            return call
        rpc = self._rpc
        if rpc is None:
            raise ConnectionError("not connected to the controlplane")
        args = await self._transfer(
            call.task_id, download(rpc.GetBlob, call.args, metadata=self._metadata(), task_id=call.task_id)
        )
        return dataclasses.replace(call, args=args)

    async def _stored_result(self, task_id: str, data: bytes) -> bytes | None:
        """A reference to ``data`` stored as a blob; retried while the controlplane is away.

        None when the task ended meanwhile (cancelled, or given to another worker): its result has no
        one to go to.
        """
        retry = Backoff(initial_s=0.5, cap_s=10.0)
        while True:
            rpc = self._rpc
            try:
                if rpc is None:
                    raise ConnectionError("not connected to the controlplane")
                return await self._transfer(
                    task_id, upload(rpc.PutBlob, data, metadata=self._metadata(), task_id=task_id, timeout=600)
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    log.warning("dropping the result of %s: %s", task_id, exc.details())
                    return None
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise PayloadTooLarge("the call's result", len(data), self.max_payload) from None
                log.warning("storing the result of %s failed (%s); retrying", task_id, exc.code().name)
            except ConnectionError as exc:
                log.warning("storing the result of %s failed (%s); retrying", task_id, exc)
            await asyncio.sleep(retry.next_s())

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.pool is not None:
                with contextlib.suppress(Exception):
                    await self.pool.reap_idle()
            if self.draining.is_set() and not self.inflight:
                # drained: end the session (the last results go out as the stream closes) and leave
                self._session_stop.set()
                self.outbox.wake.set()

    def _add_stub(self, d: worker_pb2.StubDefinition) -> None:
        self.stubs[d.stub_id] = StubSpec(
            stub_id=d.stub_id,
            workspace_id=d.workspace_id,
            name=d.name,
            image=d.image or "host",
            handler=d.handler,
            python_version=d.python_version,
            cpu_millicores=d.cpu_millicores or 125,
            memory_mib=d.memory_mib or 128,
            gpu_count=d.gpu_count,
            env=dict(d.env),
            secret_env=dict(d.secret_env),
            keep_warm_s=d.keep_warm_s,
            checkpoint_enabled=d.checkpoint_enabled,
            kind=d.kind or "function",
            interface=d.interface or "function",
            tasks_per_container=max(1, d.tasks_per_container),
            ports=tuple(d.ports),
            volumes=tuple(volume_spec(v) for v in d.volumes),
        )
        if d.checkpoint_enabled and d.HasField("checkpoint") and self.pool is not None and self.pool.checkpointing:
            self.pool.checkpointing.latest[d.stub_id] = record_of(d.checkpoint)

    def _start(self, request: worker_pb2.ContainerRequest) -> None:
        if request.task_id in self.inflight or self.admission.holds(request.task_id):
            return  # delivered twice (a reconnect): it is already running or waiting here
        stub = self.stubs.get(request.stub_id)
        call = Call(task_id=request.task_id, args=request.args, timeout_s=request.timeout_s, attempt=request.attempt)

        def run() -> None:
            self.inflight[call.task_id] = asyncio.create_task(self._run(stub, call), name=call.task_id)

        self.admission.start(call.task_id, request.cpu_millicores, request.memory_mib, queued=request.queued, run=run)

    async def _run(self, stub: StubSpec | None, call: Call) -> None:
        task_id = call.task_id
        try:
            outcome = await self._outcome(stub, call)
            result: bytes | None = outcome.result
            if result and len(result) > INLINE_MAX_BYTES and task_id not in self.cancelled:
                try:
                    result = await self._stored_result(task_id, result)
                except PayloadTooLarge as exc:
                    outcome, result = Outcome(task_id, "error", error=_error("PayloadTooLarge", str(exc))), None
                if result is None and outcome.status == "complete":
                    return  # the task ended elsewhere: nothing to report
        except asyncio.CancelledError:
            if task_id in self.cancelled:
                return
            raise
        finally:
            self.inflight.pop(task_id, None)
            self.admission.ended(task_id)  # its room goes to the calls waiting here (none once draining)
            cancelled = task_id in self.cancelled
            self.cancelled.discard(task_id)
        if cancelled:
            return  # the caller cancelled it: its result goes nowhere
        error = None
        if outcome.error is not None:
            error = common_pb2.RemoteError(
                type=outcome.error.type, message=outcome.error.message, traceback=outcome.error.traceback
            )
        self.outbox.result(
            common_pb2.TaskResult(task_id=task_id, status=outcome.status, result=result or b"", error=error)
        )

    async def _outcome(self, stub: StubSpec | None, call: Call) -> Outcome:
        try:
            if stub is None or self.pool is None:
                return Outcome(
                    call.task_id, "error", error=_error("WorkerError", "the stub was not sent before its call")
                )
            try:
                call = await self._arguments(call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                return Outcome(
                    call.task_id,
                    "error",
                    error=_error("WorkerError", f"fetching the call's arguments failed: {message}"),
                )
            if stub.kind == BUILD_KIND:
                if self.builds is None:
                    return Outcome(call.task_id, "error", error=_error("WorkerError", "no runtime to build with"))
                return await self.builds.run(stub, call, self.outbox.log)
            if self.images is not None:
                try:
                    await self.images.ensure(stub.image)
                except ImagePullFailed as exc:
                    return Outcome(call.task_id, "error", error=_error("ImagePullFailed", str(exc)))
            return await self.pool.run(
                stub,
                call,
                on_started=None if stub.serves else lambda cid: self.outbox.started_task(call.task_id, cid),
                on_log=self.outbox.log,
                on_serving=lambda serving: self.outbox.serving(call.task_id, serving),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("running %s failed in the worker", call.task_id)
            return Outcome(call.task_id, "error", error=_error("WorkerError", f"{type(exc).__name__}: {exc}"))


def _error(kind: str, message: str) -> RemoteErrorInfo:
    return RemoteErrorInfo(kind, message)


def main_entry(options: WorkerOptions, hooks: Hooks) -> int:
    logging.basicConfig(
        level=os.environ.get("LEVERS9_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(WorkerProcess(options, hooks).run())
