"""The placement history writer: placing hands its events over, one task stores them in large batches.

A placement is made in Redis; SQL's placement history (``task_placements``, and on
each task the worker, pool and GPU it went to) is the record of it. Writing that
record in every placement batch would put a transaction on the placement path.
Instead :meth:`Scheduler.place_once <levers9.scheduler.service.Scheduler.place_once>`
adds its batch's events to this writer's buffer and goes on; one writer task stores
whatever has piled up meanwhile, up to :data:`MAX_BATCH` events in one transaction
(:meth:`TaskStore.record <levers9.state.sql.tasks.TaskStore.record>`: one statement
per table). The busier the scheduler, the larger the batches and the fewer the
transactions.

Invariants:

- **Order.** Events are stored in the order they were added: there is one writer,
  it takes the oldest events first, and a batch that failed is written again
  before anything added after it.
- **Nothing is dropped while the writer runs.** A failed write is logged and
  retried with the same events, after a pause that doubles from
  ``retry_initial_s`` up to ``retry_max_s`` (a database that is down or
  restarting). Two kinds of events are left out, each counted in
  :attr:`HistoryWriter.dropped` and logged: those of a task that no longer
  exists in SQL (deleted with its workspace: there is no row to keep them on),
  and one the database refuses for what it holds (a value too long for its
  column). A batch the database refuses is written again one event at a time,
  so only the refused event is left out.
- **Bounded.** :meth:`HistoryWriter.room` waits while :data:`MAX_BUFFERED` or more
  events are unstored; the placement loop awaits it after each batch, so a
  database that falls behind slows placement down instead of losing history or
  growing memory without end. :meth:`HistoryWriter.add` itself never waits: a
  placement already made in Redis always gets its events buffered, so the buffer
  can exceed the bound by one placement batch per caller.
- **Written means stored.** :meth:`HistoryWriter.written` returns once every event
  added up to its ticket is stored (or left out as above), which is what
  ``place_once(wait_for_history=True)`` promises; it raises :class:`HistoryLost`
  when :meth:`HistoryWriter.close` gave up on them.
- **Stopping.** :meth:`HistoryWriter.close` writes what is buffered, waiting at
  most its timeout, then stops the writer. Events still unstored then (the
  database did not answer in time) are lost: they are counted in
  :attr:`HistoryWriter.lost` and logged as an error. Adding after a close starts
  a new writer.

What a loss means: a task's placement history misses a line, and the task's row may not
say which worker it went to. The placement itself is in Redis, so the call still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from levers9.state.sql.records import PlacementEvent

if TYPE_CHECKING:
    from levers9.state.sql.tasks import TaskStore

__all__ = ["MAX_BATCH", "MAX_BUFFERED", "HistoryLost", "HistoryWriter"]

log = logging.getLogger(__name__)

#: at most this many events wait to be stored before the placement loop waits for the writer
MAX_BUFFERED = 8192
#: at most this many events go into one transaction
MAX_BATCH = 2048


class HistoryLost(RuntimeError):
    """Placement history events were given up at stop before they were stored."""


def _refused(exc: Exception) -> bool:
    """Whether ``exc`` says the batch's content is refused, so writing the same events again cannot succeed.

    An error raised before the statement reached the database (a value a column type rejects) is
    a ``StatementError`` that is not a ``DBAPIError``; a database that is down raises an
    ``OperationalError`` or ``InterfaceError``, which are retried.
    """
    if isinstance(exc, DataError | IntegrityError | ValueError):
        return True
    return isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)


class HistoryWriter:
    """Stores placement events in the background, in order, in batches (see the module docstring)."""

    def __init__(
        self,
        tasks: TaskStore,
        *,
        max_buffered: int = MAX_BUFFERED,
        max_batch: int = MAX_BATCH,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 5.0,
    ) -> None:
        if max_buffered < 1 or max_batch < 1:
            raise ValueError(f"max_buffered ({max_buffered}) and max_batch ({max_batch}) must be at least 1")
        self._tasks = tasks
        self.max_buffered = max_buffered
        self.max_batch = max_batch
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        #: events added and not yet stored, oldest first; the writer's batch is a prefix of it
        self._buffer: list[PlacementEvent] = []
        #: events ever added; an event's ticket is its position in that count (the first is 1)
        self._added = 0
        #: events ever settled: stored, left out (see ``dropped``) or lost; always ``_added - len(_buffer)``
        self._settled = 0
        #: ticket ranges ``(after, through]`` given up by a close
        self._lost_ranges: list[tuple[int, int]] = []
        self._ready = asyncio.Event()
        #: set and replaced whenever events settle, waking whoever waits for room or for a ticket
        self._progress = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        #: transactions that stored events, events stored, events left out, events lost at a close
        self.transactions = 0
        self.stored = 0
        self.dropped = 0
        self.lost = 0
        #: failed writes (each retried)
        self.failures = 0

    @property
    def buffered(self) -> int:
        """Events added and not yet stored, the batch being written included."""
        return len(self._buffer)

    @property
    def added(self) -> int:
        """The ticket of the newest event added: :meth:`written` with it waits for everything so far."""
        return self._added

    def add(self, events: Sequence[PlacementEvent]) -> int:
        """Buffer ``events`` for the writer; returns their ticket for :meth:`written`. Never waits."""
        if events:
            self._buffer.extend(events)
            self._added += len(events)
            self._ready.set()
            if self._writer is None or self._writer.done():
                self._writer = asyncio.create_task(self._run(), name="placement history writer")
        return self._added

    async def room(self) -> None:
        """Wait while the buffer holds :attr:`max_buffered` events or more (backpressure on placement)."""
        await self._until(lambda: len(self._buffer) < self.max_buffered)

    async def written(self, ticket: int) -> None:
        """Return once every event up to ``ticket`` is stored; :class:`HistoryLost` if a close gave them up."""
        await self._until(lambda: self._settled >= ticket)
        # a close loses the whole buffer, a suffix of what was added: if any event of an add is lost, its last is
        if any(after < ticket <= through for after, through in self._lost_ranges):
            raise HistoryLost(f"placement history up to event {ticket} was not stored before the scheduler stopped")

    async def close(self, timeout: float) -> int:
        """Store what is buffered, waiting at most ``timeout`` seconds, and stop the writer.

        Returns how many events were lost (still unstored when the time was up); they are logged.
        """
        writer = self._writer
        if writer is None:
            return 0
        if self._buffer:
            flushed = asyncio.ensure_future(self._until(lambda: not self._buffer))
            try:
                # not asyncio.wait_for: on Python 3.11 it can swallow a cancellation of the caller
                await asyncio.wait({flushed}, timeout=timeout)
            finally:
                flushed.cancel()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        if self._writer is writer:
            self._writer = None
        lost = len(self._buffer)
        if lost:
            log.error(
                "the placement history of %d placements was lost: the database did not store it within %.0f s "
                "of stopping (the placements themselves are in Redis)",
                lost,
                timeout,
            )
            self._lost_ranges.append((self._settled, self._added))
            self.lost += lost
            self._settle(lost)
        return lost

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._progress.wait()

    def _settle(self, count: int) -> None:
        """The first ``count`` buffered events are done with: take them out and wake the waiters."""
        del self._buffer[:count]
        self._settled += count
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()

    async def _run(self) -> None:
        pause = self.retry_initial_s
        while True:
            if not self._buffer:
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._buffer[: self.max_batch]
            try:
                try:
                    await self._store(batch)
                except Exception as exc:
                    if not _refused(exc) or len(batch) == 1:
                        raise
                    log.warning(
                        "the database refused a batch of %d placement history events (%s); writing them one at a time",
                        len(batch),
                        exc,
                    )
                    for event in batch:
                        await self._store([event])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _refused(exc):  # one event the database will never take: leave it out, or all history stalls
                    refused = self._buffer[0]
                    log.error("left out placement history event %s: the database refused it (%s)", refused, exc)
                    self.dropped += 1
                    self._settle(1)
                    continue
                self.failures += 1
                log.warning(
                    "storing %d placement history events failed (%s); retrying in %.2f s", len(batch), exc, pause
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.retry_max_s)
                continue
            pause = self.retry_initial_s

    async def _store(self, batch: list[PlacementEvent]) -> None:
        """Store ``batch``, the buffer's first events, in one transaction, and settle them."""
        missing = await self._tasks.record(batch, skip_missing=True)
        if missing:
            gone = set(missing)
            left_out = sum(1 for event in batch if event.task_id in gone)
            log.warning(
                "left out %d placement history events of %d tasks that no longer exist: %s",
                left_out,
                len(gone),
                ", ".join(missing[:5]) + ("..." if len(missing) > 5 else ""),
            )
            self.dropped += left_out
            self.stored += len(batch) - left_out
        else:
            self.stored += len(batch)
        self.transactions += 1
        self._settle(len(batch))
