"""What workers report of the calls placed on them: admitted, freed in Redis, then stored in a few transactions.

A worker's session hands every batch it reads to :meth:`WorkerReports.report`:
calls started, serving containers ready, outcomes and output. The worker's
places are freed at once (Redis), successes reach watchers on this replica
before they are stored, and one flusher stores whatever piled up meanwhile
(SQL), retrying failed attempts the stub allows to retry.

**A worker reports only on what was placed on it** (:meth:`WorkerReports.placed_on`).
Any holder of a shared pool's worker token can register a worker, so without
this a forged worker could finish another workspace's pending call with a
pickled result of its choosing, which the caller's SDK unpickles, or write its
output. A start, output, an outcome, a serving container's address or a big
result for a task not placed on the reporting worker is refused, logged as a
security event (once a minute per worker, with how many since) and counted in
``levers9_worker_refusals_total``, unless SQL says the task is finished and
was that worker's: a worker that registers again with another replica re-sends
what it reported lately, so such a report is a repeat, dropped with a debug
line and counted nowhere (:meth:`WorkerReports._resent`, one SQL read for the
refused ones only). An outcome is stored only once Redis has
released its request from that very worker (``finish_many.lua`` leaves a
request placed on another worker, or on none, alone and names it): a late
report from a worker presumed dead, whose call was queued or placed again
elsewhere, is dropped however far behind SQL's record of the new placement is.
The flusher therefore waits for Redis's verdict on an outcome before storing it.
A start is checked against Redis's placement too, by the flusher before it is
stored (:meth:`WorkerReports._still_placed`): a late start from a worker
presumed dead would otherwise mark the call running there, and its new
worker's outcome would then be refused by SQL's check of the owner.

Failures: storing a batch is tried five times, then given up (the tasks stay
unfinished in SQL and run again after a restart: calls are at least once);
freeing is retried every half second while Redis is away (one warning per
outage, and a line when Redis answers again), and nothing is stored meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from levers9.services.reports import TaskOutcome, WorkerReport
from levers9.services.stubs import CALLED_KINDS
from levers9.state.redis.outage import Outage
from levers9.state.sql.records import CallResult, TaskStatus
from levers9.state.sql.tasks import Finish

if TYPE_CHECKING:
    from levers9.services.dataplane import DataPlane

__all__ = ["WorkerReports"]

log = logging.getLogger(__name__)

#: worker reports queued before sessions wait for the flusher (backpressure)
_MAX_QUEUED_REPORTS = 10_000
#: calls that ended here whose worker is remembered, so that output trailing the outcome needs no SQL read
_ENDED_KEPT = 20_000
#: a worker's refused reports are logged at most once per this many seconds (with how many since)
_REFUSED_LOG_S = 60.0
#: what a worker may try on a task not placed on it (the metric's label), and how the log says it
_REFUSALS = {
    "report": "reports on {n} task(s) not placed on it",
    "outcome": "outcomes of {n} task(s) Redis has placed on another worker, or on none",
    "start": "starts of {n} task(s) Redis has placed on another worker, or on none",
    "result": "a result upload for a task not placed on it",
    "arguments": "a read of the arguments of a task not placed on it",
    "address": "a serving address the gateway may not connect to",
    "checkpoint": "a checkpoint of a stub it ran no call of",
}


class WorkerReports:
    """The report path of one :class:`~levers9.services.dataplane.DataPlane` (whose calls in flight it reads)."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        #: reports waiting to be stored, each with the release it waits for; one flusher stores everything
        #: that piled up in one go, so a busy worker's thousands of small messages cost a few transactions
        self._reports: list[tuple[str, WorkerReport, int]] = []
        self._reports_ready = asyncio.Event()
        self._reports_room = asyncio.Event()
        self._reports_room.set()
        self._flusher: asyncio.Task[None] | None = None
        #: calls reported finished whose places are not freed yet, per worker (see report)
        self._to_release: dict[str, list[str]] = {}
        self._releaser: asyncio.Task[None] | None = None
        #: the worker of each call that ended here lately (bounded, oldest first)
        self._ended: OrderedDict[str, str] = OrderedDict()
        #: outcomes handed to the releaser so far, and how many of them it has settled with Redis: the
        #: flusher stores an outcome only once Redis has said whether its worker may report it
        self._release_seq = 0
        self._released_seq = 0
        self._settled = asyncio.Event()
        #: (task, worker) outcomes Redis refused: the request is placed on another worker, or on none
        self._refused: set[tuple[str, str]] = set()
        #: per worker: when its refused reports were last logged, and how many were refused since
        self._refused_log: dict[str, tuple[float, int]] = {}
        #: Redis not answering the releaser: one warning per outage, not a traceback every half second
        self._outage = Outage(log, "freeing the places of reported calls")

    @property
    def idle(self) -> bool:
        """Nothing is waiting to be stored."""
        return not self._reports

    async def placed_on(self, worker_id: str, task_ids: Iterable[str], *, ended: bool = False) -> set[str]:
        """Which of ``task_ids`` were placed on ``worker_id``: the only tasks it may report on.

        Asked in order, each only of the ids the one before did not vouch for: the calls this replica sent
        to the worker (or claimed for it when it registered again, once Redis confirmed them); Redis's
        placement record, the authority while it holds the request (placed, running, or waiting in a
        worker's queue: a request placed on another worker, or queued with none, is not this worker's); and
        for a request Redis no longer holds (it finished there, or Redis was lost), the worker SQL says ran
        it, while the task is unfinished, or at any status with ``ended`` (output may trail its outcome).
        A task SQL knows no worker for is nobody's: a pending call cannot be claimed by reporting on it.
        """
        wanted = set(task_ids)
        mine = {t for t in wanted if getattr(self.dp._running.get(t), "worker_id", None) == worker_id}
        if ended:
            mine.update(t for t in wanted - mine if self._ended.get(t) == worker_id)
        rest = sorted(wanted - mine)
        if not rest:
            return mine
        in_sql: list[str] = []
        for task_id, state in zip(rest, await self.dp.services.scheduler.placements(rest), strict=True):
            if state is None:
                in_sql.append(task_id)
            elif state.worker == worker_id and state.state in ("placed", "running", "waiting"):
                mine.add(task_id)
        if in_sql:
            for task_id, (status, owner) in (await self.dp.calls.owners(in_sql)).items():
                if owner == worker_id and (ended or status in ("pending", "running")):
                    mine.add(task_id)
        return mine

    async def admit(self, worker_id: str, report: WorkerReport) -> WorkerReport:
        """``report`` without what it says of tasks not placed on ``worker_id`` (refused and logged)."""
        named = (
            {t for t, _ in report.started} | {o.task_id for o in report.outcomes} | {r.task_id for r in report.serving}
        )
        logged = {t for t, _ in report.logs} - named
        running = self.dp._running
        if all(getattr(running.get(t), "worker_id", None) == worker_id for t in named) and all(
            getattr(running.get(t), "worker_id", None) == worker_id or self._ended.get(t) == worker_id for t in logged
        ):
            return report  # the usual case: every task is one this replica sent it
        mine = await self.placed_on(worker_id, named) if named else set()
        if logged:
            mine |= await self.placed_on(worker_id, logged, ended=True)
        refused = (named | logged) - mine
        if not refused:
            return report
        self.refuse(worker_id, "report", refused - await self._resent(worker_id, refused, "reports"))
        return WorkerReport(
            started=[(t, c) for t, c in report.started if t in mine],
            serving=[r for r in report.serving if r.task_id in mine],
            outcomes=[o for o in report.outcomes if o.task_id in mine],
            logs=[(t, d) for t, d in report.logs if t in mine],
        )

    async def _resent(self, worker_id: str, task_ids: Iterable[str], what: str) -> set[str]:
        """Which of ``task_ids`` (refused: not placed on ``worker_id`` now) are finished calls that worker ran.

        A worker re-sends what it reported lately when it registers again with another replica (storing an
        outcome is idempotent), so after a failover it reports on calls already finished, often by the
        replica it left. Those are dropped too, but quietly: not a security event. One SQL read for all.
        Should that read fail, nothing is excused and the refusal is logged as before.
        """
        ids = sorted(task_ids)
        try:
            owners = await self.dp.calls.owners(ids)
        except Exception:
            log.exception("reading which of %d refused task(s) worker %s ran failed", len(ids), worker_id)
            return set()
        resent = {t for t, (status, owner) in owners.items() if owner == worker_id and TaskStatus(status).terminal}
        if resent:
            log.debug(
                "worker %s re-sent %s on %d finished call(s) it ran (%s%s): dropped",
                worker_id,
                what,
                len(resent),
                ", ".join(sorted(resent)[:5]),
                ", ..." if len(resent) > 5 else "",
            )
        return resent

    def refuse(self, worker_id: str, what: str, task_ids: Iterable[str], reason: str = "") -> None:
        """Log and count a worker's attempt to act on tasks not placed on it: a security event.

        One warning per worker per :data:`_REFUSED_LOG_S`, with how many were refused since, so a
        misbehaving worker cannot flood the log.
        """
        ids = sorted(task_ids)
        if not ids:
            return
        if self.dp.metrics is not None:
            self.dp.metrics.worker_refused(what, len(ids))
        now = time.monotonic()
        last, since = self._refused_log.get(worker_id, (-_REFUSED_LOG_S, 0))
        if now - last < _REFUSED_LOG_S:
            self._refused_log[worker_id] = (last, since + len(ids))
            return
        self._refused_log[worker_id] = (now, 0)
        more = f" ({since} more refused since the last warning)" if since else ""
        log.warning(
            "security: refused worker %s %s%s (%s%s)%s",
            worker_id,
            _REFUSALS.get(what, what).format(n=len(ids)),
            f": {reason}" if reason else "",
            ", ".join(ids[:5]),
            ", ..." if len(ids) > 5 else "",
            more,
        )

    async def report(self, worker_id: str, report: WorkerReport) -> None:
        """Free what finished and queue the report for the flusher; waits only when far too much is queued.

        The worker's resources come back now, before the outcomes are stored, so its next calls are
        placed without waiting on the database. Only calls placed on this worker are freed: a late
        report from a worker presumed dead frees nothing. Should storing fail, the task is still
        unfinished in SQL and runs again after a restart (calls are at least once).
        """
        report = await self.admit(worker_id, report)
        listener = self.dp.serving_listener
        if listener is not None:
            for ready in report.serving:
                running = self.dp._running.get(ready.task_id)
                if running is not None and running.stub_id and running.worker_id == worker_id:
                    listener.serving(running.stub_id, worker_id, ready)
            serving = [o for o in report.outcomes if self._serves(o.task_id)]
            if serving:
                listener.ended(serving)
        seq = self._released_seq
        if report.outcomes:
            self._deliver_early(worker_id, report.outcomes)
            self._to_release.setdefault(worker_id, []).extend(o.task_id for o in report.outcomes)
            self._release_seq += 1
            seq = self._release_seq
            if self._releaser is None or self._releaser.done():
                self._releaser = asyncio.create_task(self._release(), name="releaser")
        await self._reports_room.wait()
        self._reports.append((worker_id, report, seq))
        if len(self._reports) >= _MAX_QUEUED_REPORTS:
            self._reports_room.clear()
        self._reports_ready.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_reports(), name="report flusher")

    def _deliver_early(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> None:
        """Successes of calls sent to this worker reach watchers before they are stored (failures wait)."""
        early = {
            o.task_id: CallResult(o.task_id, "", o.status, o.result, None, None, None, 0)
            for o in outcomes
            if o.status == "complete"
            and getattr(self.dp._running.get(o.task_id), "worker_id", None) == worker_id
            and not self._serves(o.task_id)
        }
        if early:
            self.dp.hub.deliver(early)

    def _serves(self, task_id: str) -> bool:
        """Whether a running task is a serving container (of a stub whose settings are cached here)."""
        running = self.dp._running.get(task_id)
        if running is None or not running.stub_id:
            return False
        hit = self.dp.stubs_read.get(running.stub_id)
        return hit is not None and hit[0].kind not in CALLED_KINDS

    async def _release(self) -> None:
        """Free the places of reported calls: whatever piled up meanwhile goes in one step per worker.

        Redis frees only what is placed on the reporting worker; the rest it names, and their outcomes
        are dropped by the flusher, which waits for this verdict before storing them.
        """
        while self._to_release:
            batch, self._to_release = self._to_release, {}
            upto, settled = self._release_seq, True
            for worker_id, task_ids in batch.items():
                try:
                    refused = await self.dp.services.scheduler.release_reported(worker_id, task_ids)
                except Exception as exc:
                    # Redis is away: try again shortly (freeing is idempotent), or the places stay taken
                    if not self._outage.failed(exc):
                        log.exception("freeing the places of %d calls on worker %s failed", len(task_ids), worker_id)
                    self._to_release.setdefault(worker_id, []).extend(task_ids)
                    settled = False
                    await asyncio.sleep(0.5)
                    continue
                self._outage.answered()
                if refused:
                    self._refused.update((t, worker_id) for t in refused)
                    self.refuse(worker_id, "outcome", set(refused) - await self._resent(worker_id, refused, "outcomes"))
            if settled:
                self._released_seq = max(self._released_seq, upto)
                self._settled.set()

    async def close(self) -> None:
        """Free and store what is queued, then stop the flusher."""
        if self._releaser is not None:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._releaser), 5.0)
            self._releaser.cancel()
            # what Redis could not settle in time is stored on the word of the calls sent from here
            self._released_seq = self._release_seq
            self._settled.set()
        if self._flusher is not None:
            while self._reports:
                await asyncio.sleep(0.01)
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None

    async def _flush_reports(self) -> None:
        while True:
            await self._reports_ready.wait()
            # a turn of the loop first: watchers handed an outcome early send it before it is stored
            await asyncio.sleep(0)
            self._reports_ready.clear()
            queued, self._reports = self._reports, []
            self._reports_room.set()
            if not queued:
                continue
            need = max(seq for _, _, seq in queued)
            while self._released_seq < need:  # Redis's verdict on the outcomes first
                self._settled.clear()
                await self._settled.wait()
            batch = [(worker_id, report) for worker_id, report, _ in queued]
            for attempt in range(5):
                try:
                    await self._store(batch)
                    break
                except Exception:
                    log.exception("storing %d worker reports failed (attempt %d)", len(batch), attempt + 1)
                    await asyncio.sleep(0.2 * 2**attempt)

    async def _store(self, batch: list[tuple[str, WorkerReport]]) -> None:
        """Everything in ``batch``, in order: starts, then output, then outcomes, a few transactions in all."""
        by_worker: dict[str, WorkerReport] = {}
        for worker_id, report in batch:
            merged = by_worker.setdefault(worker_id, WorkerReport())
            merged.started += report.started
            merged.outcomes += report.outcomes
            merged.logs += report.logs
        logs = [chunk for r in by_worker.values() for chunk in r.logs]
        for worker_id, r in by_worker.items():
            # a call that started and ended within this batch is stored once, by its finish
            ending = {o.task_id for o in r.outcomes}
            started = dict(r.started)
            only_started = [(t, c) for t, c in r.started if t not in ending]
            r.outcomes = [
                TaskOutcome(o.task_id, o.status, o.result, o.error, o.error_type, o.traceback, started.get(o.task_id))
                if o.task_id in started
                else o
                for o in r.outcomes
            ]
            if only_started:
                only_started = await self._still_placed(worker_id, only_started)
            if only_started:
                await self.dp.services.tasks.start_many(worker_id, only_started)
        if logs:
            await self.dp.calls.append_logs(logs)
        for worker_id, r in by_worker.items():
            if r.outcomes:
                await self._finish(worker_id, r.outcomes)

    async def _still_placed(self, worker_id: str, started: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The starts of ``started`` whose request Redis still has on ``worker_id``; the others are refused.

        What this replica remembers sending to a worker does not change when the worker is presumed dead and its
        calls are placed again, so :meth:`admit` lets its late report through; SQL's record of the new placement
        may lag (the history writer stores it). Redis holds the placement itself: a start from a worker it no
        longer has the request on is not stored, or the call's new worker could not store its outcome. A request
        Redis no longer holds (it finished, or Redis lost it) is left to SQL's own check (a pending task, no
        other worker). One Redis read per batch.
        """
        ids = [task_id for task_id, _ in started]
        states = await self.dp.services.scheduler.placements(ids)
        kept: list[tuple[str, str]] = []
        refused: list[str] = []
        for pair, state in zip(started, states, strict=True):
            if state is None or state.worker == worker_id:
                kept.append(pair)
            else:
                refused.append(pair[0])
        if refused:
            self.refuse(worker_id, "start", set(refused) - await self._resent(worker_id, refused, "starts"))
        return kept

    async def _finish(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> None:
        final: list[Finish] = []
        for o in outcomes:
            if (o.task_id, worker_id) in self._refused:
                self._refused.discard((o.task_id, worker_id))
                continue
            running = self.dp._running.get(o.task_id)
            if o.status in ("error", "timeout") and running is not None and running.stub_id:
                _, settings = await self.dp.stub(running.stub_id)
                if settings.kind in CALLED_KINDS and running.attempts < settings.retries:
                    self.dp._running.pop(o.task_id, None)
                    self.dp._fresh.pop(o.task_id, None)
                    reason = f"attempt {running.attempts + 1} failed: {o.error or o.status}"
                    await self.dp.services.scheduler.retry(o.task_id, reason[:2000])
                    continue
            final.append(
                Finish(
                    o.task_id,
                    o.status,
                    o.result,
                    (o.error or "")[:10_000] or None,
                    o.error_type,
                    o.traceback,
                    container_id=o.container_id,
                )
            )
        stored = await self.dp.services.tasks.finish_many(final, worker_id=worker_id)
        if stored:
            # watchers on this replica get the outcome itself: no read back from SQL
            outcome = {f.task_id: f for f in final}
            await self.dp.hub.finished(
                stored,
                {
                    t: CallResult(
                        t,
                        "",
                        outcome[t].status,
                        outcome[t].result,
                        outcome[t].error,
                        outcome[t].error_type,
                        outcome[t].traceback,
                        0,
                    )
                    for t in stored
                },
            )
        now = time.monotonic()
        by_id = {f.task_id: f for f in final}
        for task_id in stored:
            running = self.dp._running.pop(task_id, None)
            self._ended[task_id] = worker_id
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
            if self.dp.metrics is not None:
                self.dp.metrics.task_finished(by_id[task_id].status, now - running.dispatched if running else 0.0)
