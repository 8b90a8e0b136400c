"""Each plugin's own threads, and a deadline that starts when the hook does.

A plugin's hooks are plain synchronous functions; the facade runs them on
threads so a plugin blocking on its SDK never stalls the event loop. Every
plugin gets its own :class:`PluginLane`: a bounded set of threads that runs
only that plugin's hooks. A plugin whose threads are all stuck (a cloud API
that never answers) queues only its own calls; every other plugin keeps its
threads and answers at once.

Invariants:

* **At most ``threads`` calls of one plugin run at a time**; further calls wait
  in the lane's queue, first come first served. Threads start on demand and
  stay for the lane's life.
* **The deadline counts from when the hook starts running.** A call is
  bounded twice, separately: ``deadline`` seconds waiting for a free thread,
  then ``deadline`` seconds running. Time spent behind another call of the
  same plugin is never charged to this one.
* **A call that never started never runs.** When its wait for a thread runs
  out (or its caller is cancelled) it is withdrawn from the queue under the
  job's lock, so a late thread skips it: no provider call happens that nobody
  is waiting for.
* **A call that started cannot be stopped.** Python cannot kill a thread; when
  a running call passes its deadline the caller is told and the thread stays
  busy until the hook returns. Threads are daemons, so a hook that never
  returns does not keep the process from exiting.

Failures, as :meth:`PluginLane.run` raises them:

* :class:`NeverStarted`: every thread of the plugin stayed busy for the whole
  deadline; the hook did not run. The facade reports it as
  :class:`~levers9.hooks.errors.PluginTimeout` saying the plugin's threads were busy.
* :class:`RanPastDeadline`: the hook started and did not return within the
  deadline; it is still running on its thread.
* anything the hook raised, unchanged; a ``BaseException`` that is not an
  ``Exception`` (a plugin calling ``sys.exit``) arrives wrapped in
  :class:`HookRaisedBase`, so it never unwinds the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HookRaisedBase", "LaneStats", "NeverStarted", "PluginLane", "RanPastDeadline"]

log = logging.getLogger("levers9.plugins")


class NeverStarted(Exception):
    """The call waited ``waited`` seconds for one of the lane's ``threads`` threads and was withdrawn."""

    def __init__(self, waited: float, threads: int) -> None:
        super().__init__(f"no thread free after {waited:g} s (all {threads} busy)")
        self.waited = waited
        self.threads = threads


class RanPastDeadline(Exception):
    """The call started and was still running ``deadline`` seconds later."""

    def __init__(self, deadline: float) -> None:
        super().__init__(f"still running after {deadline:g} s")
        self.deadline = deadline


class HookRaisedBase(Exception):
    """The hook raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``...); ``original`` is it."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


class LaneStats:
    """A snapshot of one lane: its size, calls running, calls waiting for a thread."""

    __slots__ = ("queued", "running", "threads")

    def __init__(self, threads: int, running: int, queued: int) -> None:
        self.threads = threads
        self.running = running
        self.queued = queued

    def as_dict(self) -> dict[str, int]:
        return {"threads": self.threads, "running": self.running, "queued": self.queued}


class _Job:
    """One call: the function, where to report, and whether a thread or the caller claimed it first."""

    __slots__ = ("done", "fn", "lock", "loop", "started", "started_at", "state")

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.lock = threading.Lock()
        #: queued -> running (a thread took it) | withdrawn (the caller gave up first)
        self.state = "queued"
        self.started_at = 0.0
        self.started: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()

    def claim(self) -> bool:
        """Called by a thread: True when the job is still wanted; it is then running."""
        with self.lock:
            if self.state != "queued":
                return False
            self.state = "running"
            self.started_at = time.monotonic()
        self._report(self.started, None, None)
        return True

    def withdraw(self) -> bool:
        """Called by the caller: True when no thread took the job and none ever will."""
        with self.lock:
            if self.state != "queued":
                return False
            self.state = "withdrawn"
            return True

    def _report(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        def deliver() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(deliver)

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:  # the hook may raise anything; its caller decides what it means
            self._report(self.done, None, exc)
        except BaseException as exc:  # SystemExit in a hook must not reach the caller's loop as one
            self._report(self.done, None, HookRaisedBase(exc))
        else:
            self._report(self.done, result, None)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class PluginLane:
    """A bounded set of daemon threads running one plugin's hooks (see the module docstring)."""

    def __init__(self, plugin: str, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"plugin {plugin!r}: a lane needs at least 1 thread, got {threads}")
        self.plugin = plugin
        self.threads = threads
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._queued = 0
        self._closed = False

    def stats(self) -> LaneStats:
        with self._lock:
            return LaneStats(self.threads, self._running, self._queued)

    async def run(self, fn: Callable[[], Any], deadline: float) -> Any:
        """Run ``fn`` on one of this lane's threads: at most ``deadline`` s waiting, then ``deadline`` s running."""
        if self._closed:
            raise RuntimeError(f"plugin {self.plugin!r}: its threads were closed")
        job = _Job(fn, asyncio.get_running_loop())
        # A result or error that arrives after its caller gave up is dropped without asyncio's warning.
        job.done.add_done_callback(_consume)
        self._submit(job)
        queued_at = time.monotonic()
        try:
            await asyncio.wait({job.started, job.done}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._withdraw(job)  # cancelled while waiting: a call nobody awaits must not start
            raise
        if not job.started.done() and self._withdraw(job):
            raise NeverStarted(time.monotonic() - queued_at, self.threads)
        # Started (possibly in the instant between the wait and the withdrawal): its own deadline counts
        # from the moment the thread took it.
        if job.done.done():
            return job.done.result()
        left = deadline - (time.monotonic() - job.started_at)
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the answer and drops the caller's
        # cancellation when both arrive in one turn of the loop, and the caller goes on as if not cancelled
        timer = asyncio.timeout(max(left, 0.0))
        try:
            async with timer:
                return await asyncio.shield(job.done)
        except TimeoutError:
            if timer.expired():
                raise RanPastDeadline(deadline) from None
            raise  # the hook's own TimeoutError

    def _submit(self, job: _Job) -> None:
        with self._lock:
            self._queued += 1
            # One more thread when the calls waiting outnumber the threads waiting for calls.
            if self._queued > self._idle and len(self._workers) < self.threads:
                worker = threading.Thread(
                    target=self._work, name=f"levers9-hook-{self.plugin}-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                self._idle += 1
                worker.start()
        self._queue.put(job)

    def _withdraw(self, job: _Job) -> bool:
        if not job.withdraw():
            return False
        with self._lock:
            self._queued -= 1  # it stays in the queue until a thread pops and skips it
        return True

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if not job.claim():
                continue  # withdrawn by its caller, already uncounted
            with self._lock:
                self._queued -= 1
                self._idle -= 1
                self._running += 1
            try:
                job.run()
            except BaseException:  # never lose a thread to a delivery bug
                log.exception("plugin %r: a hook thread failed outside the hook", self.plugin)
            finally:
                with self._lock:
                    self._running -= 1
                    self._idle += 1

    def close(self) -> None:
        """Let idle threads exit and refuse new calls; threads inside a hook leave when it returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            count = len(self._workers)
        for _ in range(count):
            self._queue.put(None)
