"""A restart: what Redis lost is rebuilt from SQL, and the workers it forgot are waited for, not judged gone.

SQL holds every unfinished task; Redis only the working copy. With the embedded
Redis (or a Redis that restarted empty), a controlplane starts with none of it:
no backlog, no placements, no workers. :func:`rebuild` puts SQL's unfinished
tasks back:

* a pending task, a running one SQL knows no worker for, and one whose worker
  Redis knows but has stopped reporting, go back on the backlog;
* a running task whose worker Redis does not know is *kept for that worker*
  (``orphan.lua``): its worker runs on while the controlplane is away and
  registers again holding it, and then has it back (``reclaim.lua``), so the
  call is neither killed nor run twice. Only when the worker has not come back
  after :func:`return_grace_s` is it queued again, its attempt counted
  (:func:`requeue_kept`, from every replica's reaper);
* meanwhile no machine is stopped for having a worker Redis does not know
  (:meth:`~levers9.state.redis.workers.WorkerRegistry.returning`), and no
  worker Redis kept is judged gone for the keepalives it sent while no
  controlplane listened: the reaper waits out the same grace after every
  start (a replica's start delays the reaping of a dead worker by it).

The wait is the longer of the keepalive a live worker is allowed anyway and
:data:`RETURN_GRACE_MIN_S`, which covers a worker's longest pause between two
tries to reconnect. A call may still run twice when its worker does not come
back in time, as calls are at least once; none is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from levers9.config.model import SchedulerConfig
from levers9.scheduler import events
from levers9.scheduler.candidates import NoPoolOffers
from levers9.scheduler.context import Context
from levers9.scheduler.request import PlacementRequest
from levers9.state.errors import InvalidTransition
from levers9.state.redis.backlog import Backlog, QueuedRequest

__all__ = ["RETURN_GRACE_MIN_S", "RebuildReport", "rebuild", "requeue_kept", "return_grace_s"]

log = logging.getLogger(__name__)

#: the least a restarted controlplane waits for a worker Redis forgot before judging it gone: longer than a
#: worker's or an agent's longest wait between two tries to reconnect (15 s, levers9.worker.session and
#: levers9.agent.connection)
RETURN_GRACE_MIN_S = 20.0

#: turns a task's stored request into what the backlog holds (the scheduler's ``_queued``); NoPoolOffers when no
#: configured pool could take it any more
Queue = Callable[[PlacementRequest, None, str | None], QueuedRequest]


@dataclass
class RebuildReport:
    requeued_pending: int = 0
    requeued_running: int = 0
    #: running tasks kept for their workers, which Redis forgot, until they register again (or their time is up)
    kept_for_workers: int = 0
    failed: int = 0


def return_grace_s(settings: SchedulerConfig) -> float:
    """How long workers Redis forgot are waited for before their calls are queued again and machines stopped."""
    return max(settings.worker_keepalive_s, RETURN_GRACE_MIN_S)


async def rebuild(ctx: Context, backlog: Backlog, queue: Queue, grace_s: float) -> RebuildReport:
    """Put SQL's unfinished tasks back into Redis (see the module's docstring); a task Redis knows is left alone."""
    report = RebuildReport()
    pending: list[QueuedRequest] = []
    kept: list[tuple[QueuedRequest, str, str, int]] = []
    unfinished = await ctx.tasks.unfinished()
    registered = await ctx.workers.ids()
    alive = set(registered) - set(await ctx.workers.silent()) if registered else set()
    grace_ms = round(grace_s * 1000)
    # Whatever Redis kept, the workers get the grace to come back: when it lost its data they are unknown, and
    # when it kept them their keepalives lapsed while no controlplane listened; neither means they are gone
    await ctx.workers.expect_returning(grace_ms)
    for start in range(0, len(unfinished), 500):
        chunk = unfinished[start : start + 500]
        known = await backlog.get_many([t.id for t in chunk])
        for task, state in zip(chunk, known, strict=True):
            if state is not None:
                continue
            if task.status == "running" and task.worker_id and task.worker_id in alive:
                # another replica runs this cluster: the task finished in Redis a moment ago and SQL
                # has yet to hear, or its worker still holds it and will report it
                continue
            try:
                queued = queue(PlacementRequest.from_json(task.request), None, task.stub_id)
            except NoPoolOffers as exc:
                await ctx.tasks.finish(task.id, "error", error=f"after a restart with a new config: {exc}")
                report.failed += 1
                continue
            except ValueError as exc:
                await ctx.tasks.finish(task.id, "error", error=f"its stored request is unreadable: {exc}")
                report.failed += 1
                continue
            if task.status == "running" and task.worker_id and task.pool and task.worker_id not in registered:
                held = next((g.gpu_count for g in queued.groups if task.pool in g.pools), queued.gpu_count)
                kept.append((queued, task.worker_id, task.pool, held))
                continue
            if task.status == "running":
                try:  # SQL knows no worker for it: nobody can come back for it
                    await ctx.tasks.requeue(task.id, "the controlplane restarted and lost track of its worker")
                except InvalidTransition:
                    continue  # it finished between the two reads
                report.requeued_running += 1
            else:
                report.requeued_pending += 1
            pending.append(queued)
    await backlog.enqueue(pending)
    if kept:
        report.kept_for_workers = await backlog.keep_for_workers(kept, until_ms=ctx.now_ms() + grace_ms)
        await ctx.workers.expect_returning(grace_ms)
    if report.requeued_running:
        ctx.emit(events.Requeued(events.REQUEUE_RESTART, report.requeued_running))
    if pending or kept:
        log.info("rebuilt the backlog from SQL: %s", report)
    ctx.placer_wanted.set()
    return report


async def requeue_kept(ctx: Context, backlog: Backlog, grace_s: float) -> list[str]:
    """Queue again, in Redis and SQL, the calls kept for workers that did not come back in time; their ids."""
    due = await backlog.orphans_due(ctx.now_ms())
    if not due:
        return []
    why = f"its worker did not register again within {grace_s:g} s of the controlplane's restart"
    again = await ctx.requeue_in_sql(due, why)
    log.warning("%d calls were kept for workers that did not come back; queued again", len(again))
    if again:
        ctx.emit(events.Requeued(events.REQUEUE_RESTART, len(again)))
    ctx.placer_wanted.set()
    return again
