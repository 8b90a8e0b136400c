"""``Function.map``: one call per input, many in flight, results handed back in input order.

:func:`map_calls` streams inputs in: calls are submitted in batches on one
``SubmitAndWatch`` stream per batch, at most ``concurrency`` unfinished at
once, and their outcomes are yielded in input order as they arrive, with an
optional progress bar on stderr.

Invariants: a huge input is never queued whole (a batch is cut at
``_BATCH`` calls or :data:`levers9.payloads.BATCH_BYTES`, and the next batch
goes only once the previous one is stored, so calls are queued in input order
and a refused submit stops the map before more is sent); the async side runs
on the client's event loop thread and hands results to the caller's thread
through a queue; leaving the iterator early cancels every watch.
"""

from __future__ import annotations

import asyncio
import queue as queues
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from levers9.payloads import BATCH_BYTES
from levers9.proto.v1 import controlplane_pb2
from levers9.sdk.calls import incoming, outcome, outgoing, submit_and_watch
from levers9.sdk.client import Client

__all__ = ["DEFAULT_MAP_CONCURRENCY", "input_count", "map_calls"]

#: calls sent per Submit
_BATCH = 500
#: calls of one map in flight at once, by default
DEFAULT_MAP_CONCURRENCY = 2000


def map_calls(
    client: Client,
    stub_id: Callable[[], Awaitable[str]],
    payloads: Iterator[bytes],
    *,
    concurrency: int,
    return_exceptions: bool,
    progress: tuple[int | None, str] | None,
    source: str | None,
) -> Iterator[Any]:
    """Run one call per payload; yield their values (or, with ``return_exceptions``, what they raised) in order.

    ``stub_id`` registers the function when first awaited; ``progress`` is (total, name) for a progress bar,
    or None for none; ``source`` is the function's file, to restore in remote tracebacks.
    """
    results: queues.Queue[tuple[int, Any]] = queues.Queue()
    done = object()

    async def produce() -> None:
        try:
            async for index, event in _stream(client, stub_id, payloads, concurrency):
                results.put((index, event))
        except BaseException as exc:  # handed to the consuming thread
            results.put((-1, exc))
        finally:
            results.put((-2, done))

    future = asyncio.run_coroutine_threadsafe(produce(), client._loop)
    bar = _Progress(*progress) if progress is not None else None
    buffered: dict[int, controlplane_pb2.TaskEvent] = {}
    next_index = 0
    try:
        while True:
            index, item = results.get()
            if index == -2:
                break
            if index == -1:
                raise item
            buffered[index] = item
            if bar is not None:
                bar.advance()
            while next_index in buffered:
                event = buffered.pop(next_index)
                next_index += 1
                if return_exceptions:
                    try:
                        yield outcome(event, source)
                    except Exception as exc:
                        yield exc
                else:
                    yield outcome(event, source)
    finally:
        future.cancel()
        if bar is not None:
            bar.close()


def _stream(
    client: Client, stub_id: Callable[[], Awaitable[str]], payloads: Iterator[bytes], concurrency: int
) -> AsyncIterator[tuple[int, controlplane_pb2.TaskEvent]]:
    """Submit in batches, keep at most ``concurrency`` unfinished, yield (input index, outcome) as they finish."""
    return _Window(client, stub_id, payloads, concurrency).events()


class _Window:
    """One map's calls in flight: a submitter that sends batches while there is room, a watcher per batch that
    frees a slot and queues the outcome as each call finishes, and :meth:`events`, which hands them on."""

    def __init__(
        self, client: Client, stub_id: Callable[[], Awaitable[str]], payloads: Iterator[bytes], concurrency: int
    ) -> None:
        self.client = client
        self.stub_id = stub_id
        self.payloads = payloads
        self.concurrency = concurrency
        self.results: asyncio.Queue[tuple[int, controlplane_pb2.TaskEvent] | BaseException] = asyncio.Queue()
        self.slots = asyncio.Semaphore(concurrency)
        self.watchers: list[asyncio.Task[None]] = []
        #: calls stored so far (their input indexes are 0 .. submitted - 1)
        self.submitted = 0
        # Once the first window is out, calls go in chunks of a quarter window as results free room:
        # one Submit and one Watch per chunk, not per call, while the window stays mostly full.
        self.chunk = max(1, min(_BATCH, concurrency // 4))

    async def events(self) -> AsyncIterator[tuple[int, controlplane_pb2.TaskEvent]]:
        """(input index, outcome) as calls finish; raises what submitting or watching raised; leaving it early
        cancels the submitter and every watch."""
        submitter = asyncio.create_task(self._submit_all())
        finished = 0
        try:
            while True:
                if submitter.done() and finished == self.submitted:
                    submitter.result()
                    return
                if submitter.done():
                    submitter.result()  # raises what submitting raised
                    item = await self.results.get()
                else:
                    getter = asyncio.create_task(self.results.get())
                    await asyncio.wait({getter, submitter}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    item = getter.result()
                if isinstance(item, BaseException):
                    raise item
                finished += 1
                yield item
        finally:
            submitter.cancel()
            for w in self.watchers:
                w.cancel()

    async def _watch(self, batch: list[bytes], first: int, accepted: asyncio.Future[list[str]]) -> None:
        """Submit ``batch`` (its calls are inputs ``first`` on) and queue each call's outcome as it finishes."""
        index: dict[str, int] = {}
        try:
            async for event in submit_and_watch(self.client, await self.stub_id(), batch, accepted):
                if not index:
                    index = {task_id: first + i for i, task_id in enumerate(accepted.result())}
                if event.task_id in index:
                    self.slots.release()
                    await self.results.put((index.pop(event.task_id), await incoming(self.client, event)))
        except asyncio.CancelledError:
            accepted.cancel()
            raise
        except BaseException as exc:
            if accepted.done():
                await self.results.put(exc)
            else:  # the submit itself failed: the submitter raises it
                accepted.set_exception(exc)

    async def _submit_all(self) -> None:
        """Take a slot per input and send the inputs in batches, each once the one before it is stored."""
        batch: list[bytes] = []
        batch_bytes = 0
        exhausted = False
        while not exhausted:
            await self.slots.acquire()
            payload = next(self.payloads, None)
            if payload is None:
                self.slots.release()
                exhausted = True
            else:
                payload = await outgoing(self.client, payload)  # a big one goes ahead of its call, as a blob
                batch.append(payload)
                batch_bytes += len(payload)
            first_window = self.submitted + len(batch) <= self.concurrency
            # a batch is one message: cut it by size too, well under what a channel accepts
            full = len(batch) >= (_BATCH if first_window else self.chunk) or batch_bytes >= BATCH_BYTES
            if batch and (exhausted or full or (first_window and self.slots.locked())):
                accepted: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
                self.watchers.append(asyncio.create_task(self._watch(batch, self.submitted, accepted)))
                # the next batch goes once this one is stored: calls are queued in input order, and a
                # refused submit (no pool can run it) stops the map before more is sent
                self.submitted += len(await accepted)
                batch, batch_bytes = [], 0


def input_count(iterables: Sequence[Iterable[Any]]) -> int | None:
    """How many calls ``zip(*iterables)`` makes, when every iterable knows its length."""
    lengths = [len(i) for i in iterables if hasattr(i, "__len__")]  # type: ignore[arg-type]
    return min(lengths) if lengths and len(lengths) == len(iterables) else None


class _Progress:
    def __init__(self, total: int | None, name: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn(f"{name}.map"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
        )
        self._task = self._progress.add_task(name, total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
