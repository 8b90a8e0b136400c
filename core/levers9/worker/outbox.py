"""The worker's outbox: what it has to say up its session, batched into messages no channel refuses.

Task starts, results and output are queued here and go up together: a busy
worker sends at most one message per :data:`BATCH_S`, and starts and output
wait up to :data:`LESS_URGENT_S` for a result to travel with. Each message
carries at most about ``BATCH_BYTES`` of results and of output (a message a
channel refuses would end the session, and again after every reconnect).
Results of the last :data:`RESEND_WINDOW_S` are kept to be re-sent after a
reconnect (storing a result is idempotent); a cancelled task's result is
dropped and never sent nor re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from levers9.payloads import BATCH_BYTES
from levers9.proto.v1 import common_pb2, worker_pb2
from levers9.worker.calls import Serving

__all__ = ["BATCH_S", "LESS_URGENT_S", "RESEND_WINDOW_S", "Outbox"]

M = TypeVar("M", common_pb2.TaskResult, worker_pb2.TaskLog)

#: the shortest time between two messages of a busy worker
BATCH_S = 0.002
#: how long a start or a call's output may wait for a result to travel with
LESS_URGENT_S = 0.05
#: results re-sent after a reconnect; storing is idempotent and a late duplicate is ignored
RESEND_WINDOW_S = 120.0


class Outbox:
    """What the worker has to say, batched: one message carries every result ready within a few ms."""

    def __init__(self) -> None:
        self.started: list[worker_pb2.TaskStarted] = []
        self.results: list[common_pb2.TaskResult] = []
        self.logs: list[worker_pb2.TaskLog] = []
        #: sandboxes that ended here since the last message
        self.sandboxes_ended: list[str] = []
        self.draining = False
        self.wake = asyncio.Event()
        self._soon_handle: asyncio.TimerHandle | None = None
        self.recent: deque[tuple[float, common_pb2.TaskResult]] = deque()

    def started_task(self, task_id: str, container_id: str) -> None:
        self.started.append(worker_pb2.TaskStarted(task_id=task_id, container_id=container_id))
        self._soon()

    def serving(self, task_id: str, serving: Serving) -> None:
        """A container serves: requests wait on this in the gateway, so it goes out at once."""
        self.started.append(
            worker_pb2.TaskStarted(
                task_id=task_id, container_id=serving.container_id, address=serving.address, ports=serving.ports
            )
        )
        self.wake.set()

    def _soon(self) -> None:
        """Send within LESS_URGENT_S: starts and output are worth a message of their own only if no result
        takes them along first, and a message sent for them would hold up the result of a short call."""
        if self._soon_handle is None:
            self._soon_handle = asyncio.get_running_loop().call_later(LESS_URGENT_S, self._wake_now)

    def _wake_now(self) -> None:
        self._soon_handle = None
        self.wake.set()

    def result(self, message: common_pb2.TaskResult) -> None:
        self.results.append(message)
        now = time.monotonic()
        self.recent.append((now, message))
        while self.recent and now - self.recent[0][0] > RESEND_WINDOW_S:
            self.recent.popleft()
        self.wake.set()

    def sandbox_ended(self, sandbox_id: str) -> None:
        self.sandboxes_ended.append(sandbox_id)
        self._soon()

    def log(self, task_id: str, data: bytes) -> None:
        self.logs.append(worker_pb2.TaskLog(task_id=task_id, data=data))
        self._soon()

    def drop(self, task_id: str) -> None:
        """Forget a cancelled task's result: it is neither sent nor re-sent."""
        self.results = [m for m in self.results if m.task_id != task_id]
        self.recent = deque((at, m) for at, m in self.recent if m.task_id != task_id)

    def undelivered(self) -> list[str]:
        """Task ids whose results are queued or were sent within the re-send window (so may not be stored)."""
        return list(dict.fromkeys([*(m.task_id for m in self.results), *(m.task_id for _, m in self.recent)]))

    def resend_recent(self) -> None:
        pending = {id(m) for m in self.results}
        self.results.extend(m for _, m in self.recent if id(m) not in pending)
        self.wake.set()

    async def messages(
        self, keepalive_s: float, stop: asyncio.Event, first: worker_pb2.WorkerMessage | None = None
    ) -> AsyncIterator[worker_pb2.WorkerMessage]:
        """The session's messages until ``stop``; ``first`` (what the session announces) before any other."""
        if first is not None:
            yield first
        last_keepalive = 0.0
        last_sent = 0.0
        sent_draining = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), keepalive_s)
            self.wake.clear()
            # A busy worker sends at most one message per BATCH_S, so a burst of results travels
            # together; an idle one sends at once (after a turn of the loop, for what finished with it).
            await asyncio.sleep(max(0.0, last_sent + BATCH_S - time.monotonic()))
            now = time.monotonic()
            # each message carries at most about BATCH_BYTES of results and of output: never one a channel
            # refuses, which would end the session, and again after every reconnect
            results, logs = _budget(self.results, _result_bytes), _budget(self.logs, _log_bytes)
            message = worker_pb2.WorkerMessage(
                started=self.started,
                results=self.results[:results],
                logs=self.logs[:logs],
                keepalive=now - last_keepalive >= keepalive_s * 0.9,
                draining=self.draining and not sent_draining,
                sandboxes_ended=self.sandboxes_ended,
            )
            self.started, self.results, self.logs = [], self.results[results:], self.logs[logs:]
            self.sandboxes_ended = []
            if self.results or self.logs:
                self.wake.set()
            if message.keepalive:
                last_keepalive = now
            sent_draining = sent_draining or message.draining
            if message.ByteSize():
                last_sent = now
                yield message
        # the session is ending: whatever is still here goes out before the stream closes
        while self.started or self.results or self.logs or self.sandboxes_ended:
            results, logs = _budget(self.results, _result_bytes), _budget(self.logs, _log_bytes)
            last = worker_pb2.WorkerMessage(
                started=self.started,
                results=self.results[:results],
                logs=self.logs[:logs],
                sandboxes_ended=self.sandboxes_ended,
            )
            self.started, self.results, self.logs = [], self.results[results:], self.logs[logs:]
            self.sandboxes_ended = []
            yield last


def _result_bytes(message: common_pb2.TaskResult) -> int:
    return len(message.result) + len(message.error.message) + len(message.error.traceback) + 64


def _log_bytes(message: worker_pb2.TaskLog) -> int:
    return len(message.data) + 64


def _budget(items: Sequence[M], size: Callable[[M], int]) -> int:
    """How many of ``items`` (at least one) fit in BATCH_BYTES, and at most 2,000 of them."""
    total = 0
    for i, item in enumerate(items[:2000]):
        total += size(item)
        if total > BATCH_BYTES and i:
            return i
    return min(len(items), 2000)
