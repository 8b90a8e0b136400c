"""The call engine: stubs, payloads, submitting, watching, cancelling, and what workers take and report.

REST, gRPC and the gateway reach it through the service modules (or, for the
call path itself, through its public methods); none of them touches its stores.

The path of a call: :meth:`DataPlane.submit` stores it (SQL first, then the
Redis backlog); the scheduler places it on a worker and the hub wakes that
worker's session; the session takes it with :meth:`DataPlane.take`, which
also loads its arguments; the worker reports with :meth:`DataPlane.report`,
which stores outcomes in one transaction per batch, retries failed attempts
the stub allows to retry, frees the worker's resources and wakes watchers.

**Who owns a call's life.** The data plane submits and watches; the
scheduler (:class:`~levers9.scheduler.service.Scheduler`) places. They meet
at five points per call, each one method: submit
(:meth:`Scheduler.submit_many`: the task row and the backlog entry), placement
(the scheduler's ``on_placed``, :meth:`DataPlane._on_placed`: the only way it
tells of a placement; the hub wakes the worker), take (:meth:`Scheduler.take`),
the worker's outcome (:meth:`Scheduler.release_reported`, whose verdict says
whether it may be stored, or :meth:`Scheduler.retry` for a failed attempt
retried) and cancel (:meth:`Scheduler.cancel`). Redis holds the placement,
read through :meth:`Scheduler.placements` and :meth:`Scheduler.held_by`: what
this replica remembers sending is a shortcut, never the authority over what a
worker may report. The ``tasks`` table has one writer,
:class:`~levers9.state.sql.tasks.TaskStore`, whose docstring lists the states
and which side moves a task between them; :class:`~levers9.state.sql.calls.CallStore`
here only reads tasks (and writes their output).

A worker reports only on what was placed on it; what it reports goes through
:class:`~levers9.services.worker_reports.WorkerReports`, whose docstring says
how that is checked and what a refusal does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from levers9.gpu.preference import GpuRequest
from levers9.payloads import INLINE_MAX_BYTES, make_ref, parse_ref
from levers9.scheduler.request import PlacementRequest
from levers9.services.access import owned_task
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.hub import Hub
from levers9.services.image_refs import check_image
from levers9.services.metrics import Metrics
from levers9.services.reports import ServingListener, WorkerReport
from levers9.services.stubs import BUILD_KIND, CALLED_KINDS, USER_KINDS, InvalidStub, StubSettings
from levers9.services.submissions import SUBMISSION_ID, submission_task_id
from levers9.services.volumes import resolve_volumes
from levers9.services.worker_reports import WorkerReports
from levers9.state.errors import NotFound
from levers9.state.redis.backlog import PlaceResult, RequestState
from levers9.state.redis.workers import WorkerInfo
from levers9.state.sql.blobs import BlobStore
from levers9.state.sql.calls import CallStore, Dispatch
from levers9.state.sql.models import new_id
from levers9.state.sql.records import CallResult, StubRecord

__all__ = ["DataPlane", "InvalidPayload"]

log = logging.getLogger(__name__)

#: submitted calls whose arguments are kept in memory until a worker takes them
_MAX_FRESH = 200_000
#: (worker, stub) pairs remembered for :meth:`DataPlane.ran_stub`
_SERVED_KEPT = 20_000
_PLACE_NOW_MAX = 16  # submissions of at most this many calls place themselves (not the placement loop)
#: how often, and after how long, blobs whose upload never finished are removed
_SWEEP_BLOBS_S = 3600.0


class InvalidPayload(ValueError):
    """A call's arguments name a blob the caller's workspace does not have."""


@dataclass
class _Running:
    stub_id: str | None
    attempts: int
    dispatched: float
    #: the worker it was sent to (SQL learns it only once the worker reports the start)
    worker_id: str = ""


class DataPlane:
    def __init__(self, services: Services, hub: Hub, metrics: Metrics | None = None) -> None:
        self.services = services
        self.hub = hub
        hub.on_revoked = services.auth.revoked  # another replica revoked a token: its streams here end too
        self.metrics = metrics
        #: host:port of the controlplane's image registry as image refs name it (set where one is served):
        #: a stub may name only its own workspace's images there
        self.registry_host: str | None = None
        self.calls = CallStore(services.db, max_task_log_bytes=services.config.limits.max_task_log_bytes)
        self.blobs = BlobStore(services.db)
        self._blobs_swept = 0.0
        #: stubs read so far (a stub never changes): the gateway's short path looks here without awaiting
        self.stubs_read: dict[str, tuple[StubRecord, StubSettings]] = {}
        self._gpu: dict[str, GpuRequest] = {}
        self._running: dict[str, _Running] = {}
        services.scheduler.on_placed = self._on_placed
        #: arguments of calls submitted here and not yet taken, so a worker's take needs no SQL read;
        #: bounded, and anything missing is read from SQL (the source of truth)
        self._fresh: dict[str, tuple[str, str, bytes]] = {}
        #: the gateway, when there is one: told where serving containers answer and when they end
        self.serving_listener: ServingListener | None = None
        #: what workers report, admitted, freed and stored
        self.reports = WorkerReports(self)
        #: (worker, stub) pairs of calls sent to workers from here lately, oldest first (see ran_stub)
        self._served: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: (worker, workspace) pairs of the same calls (see placed_workspaces)
        self._served_workspaces: OrderedDict[tuple[str, str], None] = OrderedDict()

    @classmethod
    def standalone(cls, services: Services, metrics: Metrics | None = None) -> DataPlane:
        """A data plane of its own over ``services`` (the REST API served alone): it reaches workers via Redis."""
        return cls(services, Hub(services.redis, name=services.scheduler.name), metrics)

    # ------------------------------------------------------------------ stubs

    async def get_or_create_stub(
        self, principal: Principal, raw: dict[str, Any], handler: bytes, *, internal: bool = False
    ) -> tuple[str, bool]:
        """The id of the stub ``raw`` defines (made if new), and whether it was made.

        ``internal``: the controlplane's own stub (a build's); users may define only :data:`USER_KINDS`.
        """
        workspace = principal.require_workspace()
        if not internal and raw.get("kind", "function") not in USER_KINDS:
            raise InvalidStub(f"kind must be one of {', '.join(USER_KINDS)}, got {raw.get('kind')!r}")
        if not handler:
            raise InvalidStub("handler: empty; the SDK sends the pickled function here")
        try:
            settings = StubSettings.model_validate({**raw, "handler_sha256": hashlib.sha256(handler).hexdigest()})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "config"
            raise InvalidStub(f"{where}: {first['msg']}") from None
        settings.gpu_request()
        config = self.services.config
        check_image(
            settings.image,
            workspace,
            registry_host=self.registry_host,
            repository_prefix=config.registry.repository_prefix,
            local_dirs=config.images.local_dirs,
        )
        missing = [name for name in settings.secrets if name not in await self.services.secrets.names(workspace)]
        if missing:
            raise InvalidStub(
                f"secrets: {', '.join(missing)} not found in this workspace; create them first "
                "(POST /api/v1/secrets or `levers9 secret create`)"
            )
        settings = await self._resolve_volumes(workspace, settings)
        app = await self.services.apps.get_or_create(workspace, settings.app)
        stub = await self.services.stubs.get_or_create(
            workspace, app.id, settings.name, settings.kind, settings.model_dump(mode="json")
        )
        created = await self.calls.handler(stub.id) is None
        if created:
            await self.calls.set_handler(stub.id, handler)
        return stub.id, created

    async def _resolve_volumes(self, workspace: str, settings: StubSettings) -> StubSettings:
        """``settings`` with each volume's id; InvalidStub naming a volume the workspace lacks, or a cloud
        bucket's secret it lacks."""
        if not settings.volumes:
            return settings
        names = [v.name for v in settings.volumes if v.bucket is None]
        try:
            found = await resolve_volumes(self.services.volumes, workspace, names)
        except ValueError as exc:
            raise InvalidStub(f"volumes: {exc}") from None
        secrets = set(await self.services.secrets.names(workspace))
        for v in settings.volumes:
            for field in ("access_key", "secret_key"):
                name = getattr(v.bucket, field, "") if v.bucket is not None else ""
                if name and name not in secrets:
                    raise InvalidStub(
                        f"volumes: cloud bucket {v.name!r}: config.{field} names secret {name!r}, which this "
                        "workspace does not have; create it first (`levers9 secret create`)"
                    )
        resolved = tuple(
            v if v.bucket is not None else v.model_copy(update={"volume_id": found[v.name].id})
            for v in settings.volumes
        )
        return settings.model_copy(update={"volumes": resolved})

    async def _volumes_exist(self, workspace: str, settings: StubSettings) -> None:
        """InvalidStub, before anything is queued, when a volume the stub mounts was deleted since it was defined."""
        ids = [v.volume_id for v in settings.volumes if v.volume_id]
        if ids:
            found = await self.services.volumes.by_ids(workspace, ids)
            for v in settings.volumes:
                if v.volume_id and v.volume_id not in found:
                    raise InvalidStub(
                        f"volumes: volume {v.name!r} was deleted after this function was defined; define it again "
                        "(the SDK makes the volume anew on its next call or deploy)"
                    )

    async def stub(self, stub_id: str, workspace: str | None = None) -> tuple[StubRecord, StubSettings]:
        """A stub and its settings (cached: a stub never changes); another workspace's stub is NotFound."""
        hit = self.stubs_read.get(stub_id)
        if hit is None:
            record = await self.services.stubs.get(stub_id)
            if record is None:
                raise NotFound("stub", stub_id)
            hit = (record, StubSettings.model_validate(record.config))
            self.stubs_read[stub_id] = hit
        if workspace is not None and hit[0].workspace_id != workspace:
            raise NotFound("stub", stub_id)
        return hit

    # ------------------------------------------------------------------ payloads

    @property
    def max_payload_bytes(self) -> int:
        """The cap on one call's arguments or result (``limits.max_payload_bytes``)."""
        return self.services.config.limits.max_payload_bytes

    async def put_blob(self, workspace: str, size: int, pieces: AsyncIterable[bytes], what: str) -> str:
        """Store a payload of ``size`` bytes in ``workspace``; its reference. PayloadTooLarge over the cap."""
        now = time.monotonic()
        if now - self._blobs_swept > _SWEEP_BLOBS_S:  # what a crash left half uploaded goes, now and then
            self._blobs_swept = now
            await self.blobs.delete_unfinished(timedelta(seconds=_SWEEP_BLOBS_S))
        blob_id = await self.blobs.put(workspace, pieces, size=size, cap=self.max_payload_bytes, what=what)
        return blob_id

    async def read_blob(self, workspace: str, blob_id: str) -> AsyncIterator[bytes]:
        """A finished blob of ``workspace`` in chunks; NotFound (before the first) for any other."""
        async for piece in self.blobs.read(blob_id, workspace):
            yield piece

    async def payload(self, workspace: str, data: bytes) -> bytes:
        """The payload itself: ``data``, or the blob it refers to (for the few who read results here)."""
        ref = parse_ref(data)
        if ref is None:
            return data
        return await self.blobs.read_all(ref[0], workspace)

    async def _stored_args(self, workspace: str, args: Sequence[bytes]) -> list[bytes]:
        """``args`` as they are stored: big inline ones become blobs, references must name this workspace's."""
        out: list[bytes] = []
        for i, payload in enumerate(args):
            ref = parse_ref(payload)
            if ref is not None:
                try:
                    info = await self.blobs.info(ref[0], workspace)
                except NotFound:
                    raise InvalidPayload(
                        f"calls[{i}].args: names blob {ref[0]}, which this workspace has not stored (upload it "
                        "with PutBlob first)"
                    ) from None
                out.append(make_ref(info.id, info.size_bytes))
            elif len(payload) > INLINE_MAX_BYTES:

                async def one(data: bytes = payload) -> AsyncIterator[bytes]:
                    yield data

                blob_id = await self.put_blob(workspace, len(payload), one(), f"calls[{i}].args")
                out.append(make_ref(blob_id, len(payload)))
            else:
                out.append(payload)
        return out

    # ------------------------------------------------------------------ calls

    async def submit(self, principal: Principal, stub_id: str, args: Sequence[bytes]) -> list[str]:
        """Store and queue one call per payload; raises NoPoolOffers (storing nothing) if no pool can run them."""
        ids, _ = await self.submit_once(principal, stub_id, args, "")
        return ids

    async def submit_once(
        self, principal: Principal, stub_id: str, args: Sequence[bytes], submission: str
    ) -> tuple[list[str], bool]:
        """:meth:`submit`, at most once per ``submission`` (a client's id for this batch of calls).

        Task ids derive from the submission (:mod:`levers9.services.submissions`), so a batch sent again,
        to any replica, finds its tasks (stored all or none). Returns them and whether they were stored before.
        """
        workspace = principal.require_workspace()
        record, settings = await self.stub(stub_id, workspace)
        if record.kind not in CALLED_KINDS:
            raise InvalidStub(
                f"stub {stub_id} is a {record.kind}; it is served over HTTP by the gateway, not called this way"
            )
        if not submission:
            return await self._queue(workspace, stub_id, settings, args), False
        if not SUBMISSION_ID.fullmatch(submission):
            raise ValueError(f"submission_id {submission[:80]!r}: expected 8-64 letters, digits, '-' or '_'")
        ids = [submission_task_id(workspace, stub_id, submission, i) for i in range(len(args))]
        # stored first, looked up only when that fails (sent again): one transaction for nearly all
        try:
            return await self._queue(workspace, stub_id, settings, args, ids=ids), False
        except Exception:
            if await self.calls.dispatch(ids[:1]):  # stored before, here or by another replica
                await self.services.scheduler.ensure_queued(ids)
                return ids, True
            raise

    def build_pools(self, workspace: str) -> tuple[str, ...]:
        """The pools that run ``workspace``'s builds: ``builds: true``, and shared or bound to that workspace."""
        return tuple(
            sorted(
                name
                for name, pool in self.services.pools.items()
                if pool.builds and pool.workspace in (None, workspace)
            )
        )

    @staticmethod
    def new_serving_id() -> str:
        """The id of a serving container's task, named before it is queued (see ``start_serving``)."""
        return new_id("task")

    async def start_serving(self, workspace: str, stub_id: str, task_id: str) -> None:
        """Queue one serving container of an endpoint or box (the gateway scales them) as task ``task_id``.

        The caller names the task (``new_serving_id``) so that it can expect the container's reports before
        this returns: the task is visible to workers from the moment it is queued.
        """
        record, settings = await self.stub(stub_id, workspace)
        if record.kind in CALLED_KINDS:
            raise InvalidStub(f"stub {stub_id} is a {record.kind}; only endpoints and boxes serve")
        await self._queue(workspace, stub_id, settings, [b""], ids=[task_id])

    async def stop_task(self, task_id: str, worker_id: str | None) -> bool:
        """Cancel a task the controlplane itself started (a serving container); True if it had not ended."""
        cancelled = await self.services.scheduler.cancel(task_id)
        if cancelled:
            self._running.pop(task_id, None)  # its worker drops the result: nothing will pop it later
            if worker_id:
                await self.hub.cancel(worker_id, task_id)
            await self.hub.finished([task_id])
        return cancelled

    async def _queue(
        self, workspace: str, stub_id: str, settings: StubSettings, args: Sequence[bytes], *, ids: Sequence[str] = ()
    ) -> list[str]:
        self.services.require_room()  # new work: refused while the data directory is full (health says so too)
        if not args:
            return []
        await self._volumes_exist(workspace, settings)
        if any(len(a) > INLINE_MAX_BYTES or parse_ref(a) for a in args):
            args = await self._stored_args(workspace, args)
        gpu = self._gpu.get(stub_id)
        if gpu is None:
            gpu = self._gpu[stub_id] = settings.gpu_request()
        now_ms = int(time.time() * 1000)
        template = PlacementRequest(
            id=ids[0] if ids else new_id("task"),
            workspace=workspace,
            cpu_millicores=settings.cpu_millicores,
            memory_mib=settings.memory_mib,
            gpu=gpu,
            submitted_ms=now_ms,
            # a build goes only to the pools that build images (services.builds checks there is one)
            pools=self.build_pools(workspace) if settings.kind == BUILD_KIND else None,
        )
        # validated once; the others differ only by their generated id
        more = ids[1:] if ids else [new_id("task") for _ in args[1:]]
        requests = [template] + [template.model_copy(update={"id": task_id}) for task_id in more]
        # known before they are queued: a worker may take them the moment they are placed
        if len(self._fresh) < _MAX_FRESH:
            self._fresh.update((r.id, (workspace, stub_id, a)) for r, a in zip(requests, args, strict=True))
        try:
            await self.services.scheduler.submit_many(
                requests, stub_id=stub_id, args=args, place_now=len(requests) <= _PLACE_NOW_MAX, alike=True
            )
        except BaseException:
            for r in requests:
                self._fresh.pop(r.id, None)
            raise
        return [r.id for r in requests]

    async def watch(
        self, principal: Principal, task_ids: Sequence[str], *, just_submitted: bool = False
    ) -> AsyncGenerator[CallResult, None]:
        """Yield each task's outcome as it finishes; finished ones first. Unknown ids raise NotFound at once.

        ``just_submitted``: the caller submitted these tasks a moment ago in this process, so they are
        its own and none has finished yet (the watch is in place before the event loop turns).
        """
        async for batch in self.watch_batches(principal, task_ids, just_submitted=just_submitted):
            for result in batch:
                yield result

    async def watch_batches(
        self, principal: Principal, task_ids: Sequence[str], *, just_submitted: bool = False
    ) -> AsyncGenerator[list[CallResult], None]:
        """:meth:`watch`, with the outcomes that are ready together in one list."""
        workspace = principal.require_workspace()
        wanted = list(dict.fromkeys(task_ids))
        if not just_submitted:
            owned = await self.calls.owned(workspace, wanted)
            missing = [t for t in wanted if t not in owned]
            if missing:
                raise NotFound("task", ", ".join(missing[:5]) + ("..." if len(missing) > 5 else ""))
        pending = set(wanted)
        w = self.hub.watch(wanted)  # before reading, so nothing finishing in between is missed
        try:
            done = [] if just_submitted else await self.calls.results(wanted, workspace_id=workspace)
            pending.difference_update(r.task_id for r in done)
            if done:
                yield done
            while pending:
                try:
                    items = await asyncio.wait_for(w.ready.get(), 5.0)
                except TimeoutError:
                    items = [(t, None) for t in pending]  # a missed wake-up costs a poll, never a result
                while not w.ready.empty():  # everything that finished meanwhile, in one query
                    items = items + w.ready.get_nowait()
                batch: list[CallResult] = []
                to_read: list[str] = []
                for task_id, known in items:
                    if task_id not in pending:
                        continue
                    if known is None:
                        to_read.append(task_id)
                    else:
                        pending.discard(task_id)
                        batch.append(known)
                for result in await self.calls.results(to_read, workspace_id=workspace):
                    pending.discard(result.task_id)
                    batch.append(result)
                if batch:
                    yield batch
        finally:
            self.hub.unwatch(w)

    async def cancel(self, principal: Principal, task_id: str) -> bool:
        """Cancel one of the caller's tasks (see :func:`levers9.services.tasks.cancel_task`); False if it had ended."""
        task = await owned_task(self.services, principal, task_id)
        cancelled = await self.services.scheduler.cancel(task_id)
        if cancelled:
            # read again: a worker may have taken it between the first read and the cancel; a task sent
            # from this replica whose start is not stored yet is known here
            after = await self.services.tasks.get(task_id) or task
            running = self._running.pop(task_id, None)
            worker_id = after.worker_id or task.worker_id or (running.worker_id if running else "")
            if worker_id:
                await self.hub.cancel(worker_id, task_id)
            await self.hub.finished([task_id])
            if self.metrics is not None:  # REST and gRPC cancel here alike, so both are counted
                started, finished = after.started_at, after.finished_at
                ran = (finished - started).total_seconds() if started and finished else 0.0
                self.metrics.task_finished("cancelled", ran)
        return cancelled

    # ------------------------------------------------------------------ workers

    async def register_worker(self, info: WorkerInfo) -> None:
        await self.services.scheduler.register_worker(info)

    async def claim(self, worker_id: str, task_ids: Sequence[str]) -> int:
        """Track calls a worker that registered again says it runs, as if this replica had dispatched them.

        Only unfinished tasks are claimed: one that ended meanwhile (cancelled, or finished through another
        report) stays ended, and the worker's late result for it is ignored when stored. Returns how many
        were claimed.
        """
        now = time.monotonic()
        claimed = 0
        for d in await self.calls.dispatch(list(task_ids)):
            if d.status not in ("pending", "running"):
                continue
            if d.task_id not in self._running:
                self._running[d.task_id] = _Running(d.stub_id, d.attempts, now, worker_id)
                self._serve(worker_id, d.stub_id, d.workspace_id)
            claimed += 1
        return claimed

    def _serve(self, worker_id: str, stub_id: str | None, workspace_id: str) -> None:
        for served, key in ((self._served, stub_id), (self._served_workspaces, workspace_id)):
            if key:
                served[(worker_id, key)] = None
                served.move_to_end((worker_id, key))
                if len(served) > _SERVED_KEPT:
                    served.popitem(last=False)

    async def ran_stub(self, worker_id: str, stub_id: str) -> bool:
        """Whether a call of ``stub_id`` was placed on ``worker_id``: only then may it record the stub's checkpoints.

        A checkpoint is restored into later containers of the stub, on any worker, so a worker that never ran
        the stub (a forged one holding a shared pool's token) must not be able to offer one. Asked of the calls
        sent from this replica lately, then of what Redis has placed on the worker now.
        """
        if (worker_id, stub_id) in self._served:
            return True
        return any(state.request.function == stub_id for state in await self.services.scheduler.held_by(worker_id))

    async def placed_workspaces(self, worker_id: str) -> set[str]:
        """The workspaces of the calls placed on ``worker_id``: now (Redis, every replica's) or lately from here.

        What the registry relay lets a worker pull (:mod:`levers9.services.registry_access`): the images of
        workspaces whose calls it runs, and no other's.
        """
        found = {workspace for (worker, workspace) in self._served_workspaces if worker == worker_id}
        found.update(state.request.workspace for state in await self._held(worker_id) if state.request.workspace)
        return found

    async def building_workspaces(self, worker_id: str) -> set[str]:
        """The workspaces of the build tasks (stubs of :data:`BUILD_KIND`) placed on ``worker_id`` now.

        Only while one is placed may the worker push to that workspace's repository; a build that ended
        (its result reported, its room freed) no longer counts. Read from Redis, so every replica agrees.
        """
        found: set[str] = set()
        for state in await self._held(worker_id):
            request = state.request
            if not request.function or not request.workspace or request.workspace in found:
                continue
            try:
                record, _ = await self.stub(request.function, request.workspace)
            except NotFound:
                continue
            if record.kind == BUILD_KIND:
                found.add(request.workspace)
        return found

    async def _held(self, worker_id: str) -> list[RequestState]:
        """The requests Redis has placed on ``worker_id`` now."""
        return await self.services.scheduler.held_by(worker_id)

    async def placed_on(self, worker_id: str, task_ids: Iterable[str], *, ended: bool = False) -> set[str]:
        """Which of ``task_ids`` were placed on ``worker_id`` (see :meth:`WorkerReports.placed_on`)."""
        return await self.reports.placed_on(worker_id, task_ids, ended=ended)

    def refuse(self, worker_id: str, what: str, task_ids: Iterable[str], reason: str = "") -> None:
        """Log and count a worker's attempt on tasks not placed on it (see :meth:`WorkerReports.refuse`)."""
        self.reports.refuse(worker_id, what, task_ids, reason)

    async def take(self, worker_id: str, max_count: int = 256) -> list[Dispatch]:
        took = await self.services.scheduler.take(worker_id, max_count)
        if not took:
            return []
        found: list[Dispatch] = []
        unknown: list[str] = []
        queued = {t.request for t in took if t.queued}
        for task_id, _ in took:
            fresh = self._fresh.pop(task_id, None)
            if fresh is None:
                unknown.append(task_id)
            else:  # a first attempt, taken straight from the backlog: still pending
                found.append(Dispatch(task_id, fresh[0], fresh[1], fresh[2], 0, "pending", task_id in queued))
        if unknown:
            found += [replace(d, queued=d.task_id in queued) for d in await self.calls.dispatch(unknown)]
        now = time.monotonic()
        out: list[Dispatch] = []
        for d in found:
            if d.status not in ("pending", "running"):
                # cancelled or finished while it waited: give the worker's resources back
                await self.services.scheduler.release_many([d.task_id])
                continue
            self._running[d.task_id] = _Running(d.stub_id, d.attempts, now, worker_id)
            self._serve(worker_id, d.stub_id, d.workspace_id)
            out.append(d)
        return out

    async def report(self, worker_id: str, report: WorkerReport) -> None:
        """What a worker reports of the calls placed on it: see :meth:`WorkerReports.report`."""
        await self.reports.report(worker_id, report)

    async def close(self) -> None:
        """Free and store what is queued, then stop the flusher."""
        await self.reports.close()

    async def _on_placed(self, result: PlaceResult) -> None:
        await self.hub.placed(p.worker for p in result.placed)
        if self.metrics is not None:
            per_pool: dict[str, list[int]] = {}  # pool -> [placed, of which queued on a worker]
            for p in result.placed:
                counts = per_pool.setdefault(p.pool, [0, 0])
                counts[0], counts[1] = counts[0] + 1, counts[1] + p.queued
            for pool, (count, queued) in per_pool.items():  # one counter update per pool, not per call
                spec = self.services.pools.get(pool)
                self.metrics.placed(pool, (spec.gpu if spec else None) or "cpu", count, queued=queued)
