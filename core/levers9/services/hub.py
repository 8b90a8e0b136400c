"""Wake-ups between the parts of the controlplane: new work for a worker, a finished task, a cancellation.

A worker's session and a caller's watch may live on different replicas than
the scheduler that placed the task or the session that received its result.
Each event is therefore delivered to this replica's waiters at once and
published on one Redis channel for the others. Events only wake; the data
itself is always read from Redis or SQL, so a lost message costs at most a
poll interval, never a result.

A replica that finds itself the only listener (a publish reached no one but
itself) stops publishing wake-ups for work and finished tasks for
:data:`ALONE_RECHECK_S`, then publishes again and so learns of a replica that
joined. One controlplane thus saves a Redis round trip per call, and a
replica that joins misses wake-ups for at most that long (its pollers catch
up). Cancellations, serving events and revocations are always published.

A revoked token is announced to every replica (:func:`publish_revoked`, by
whatever revoked it, which ends its streams on its own replica itself): each
other replica's hub hands the token ids to :attr:`Hub.on_revoked`, which forgets
them and ends the streams they opened there
(:meth:`levers9.services.auth.Authenticator.revoked`). A notice lost is caught
by the open streams' own re-check (:mod:`levers9.services.revocation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Hub", "Watch", "publish_revoked"]

from levers9.state.redis.channel import listen

log = logging.getLogger(__name__)

#: seconds a replica that was the only listener publishes no wake-ups before it looks again
ALONE_RECHECK_S = 1.0
#: the kinds of event that only wake a poller elsewhere, and so may be left unpublished when no one listens
_WAKE_UPS = frozenset({"w", "t"})
#: the kind of event that announces revoked tokens (their ids)
_REVOKED = "r"


def _channel(prefix: str) -> str:
    return f"{prefix}events"


async def publish_revoked(redis: Redis, token_ids: Iterable[str], *, sender: str, prefix: str = "l9:") -> None:
    """Tell every replica's hub that these tokens were revoked (see the module docstring).

    ``sender``: the replica announcing it, whose own hub ignores the notice (it ended its streams itself).
    Raises what Redis raises: the caller decides whether a notice that did not go out matters.
    """
    ids = [token_id for token_id in token_ids if token_id]
    if ids:
        await redis.publish(_channel(prefix), f"{sender}|{_REVOKED}|{','.join(ids)}")


class Watch:
    """Task ids a caller waits on; ``ready`` receives the ids as they finish."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.ids = set(ids)
        #: (task id, its outcome when the finisher handed it over on this replica, else None: read it)
        self.ready: asyncio.Queue[list[tuple[str, Any]]] = asyncio.Queue()


class Hub:
    def __init__(self, redis: Redis, *, prefix: str = "l9:", name: str) -> None:
        self._redis = redis
        self._channel = _channel(prefix)
        self._name = name
        self._work: dict[str, asyncio.Event] = {}
        self._cancels: dict[str, asyncio.Queue[str]] = {}
        self._watches: dict[str, set[Watch]] = defaultdict(set)
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        #: until when no other replica listens, as far as the last publish showed (monotonic seconds)
        self._alone_until = 0.0
        #: the gateway: told what other replicas' workers reported about serving containers (a JSON text)
        self.on_serving: Callable[[str], None] | None = None
        #: told the ids of tokens another replica revoked (the data plane sets it: the authenticator's)
        self.on_revoked: Callable[[list[str]], object] | None = None

    async def start(self) -> None:
        self._listener = asyncio.create_task(self._listen(), name="hub listener")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None

    # ------------------------------------------------------------------ workers

    def attach_worker(self, worker_id: str) -> tuple[asyncio.Event, asyncio.Queue[str]]:
        """The event set when work is placed on ``worker_id`` and the queue its cancellations arrive on."""
        event = self._work.setdefault(worker_id, asyncio.Event())
        cancels = self._cancels.setdefault(worker_id, asyncio.Queue())
        event.set()  # look once at once: work may have been placed before the session attached
        return event, cancels

    def detach_worker(self, worker_id: str) -> None:
        self._work.pop(worker_id, None)
        self._cancels.pop(worker_id, None)

    async def placed(self, worker_ids: Iterable[str]) -> None:
        ids = set(worker_ids)
        remote = [w for w in ids if not self._wake_worker(w)]
        if remote:
            await self._publish("w", remote)

    async def cancel(self, worker_id: str, task_id: str) -> None:
        if not self._cancel_local(worker_id, task_id):
            await self._publish("c", [f"{worker_id}/{task_id}"])

    def _cancel_local(self, worker_id: str, task_id: str) -> bool:
        queue = self._cancels.get(worker_id)
        if queue is None:
            return False
        queue.put_nowait(task_id)
        self._wake_worker(worker_id)  # the session waits on one event for work and cancellations alike
        return True

    def _wake_worker(self, worker_id: str) -> bool:
        event = self._work.get(worker_id)
        if event is None:
            return False
        event.set()
        return True

    # ------------------------------------------------------------------ tasks

    def watch(self, ids: Iterable[str]) -> Watch:
        w = Watch(ids)
        for task_id in w.ids:
            self._watches[task_id].add(w)
        return w

    def unwatch(self, w: Watch) -> None:
        for task_id in w.ids:
            waiting = self._watches.get(task_id)
            if waiting is not None:
                waiting.discard(w)
                if not waiting:
                    del self._watches[task_id]

    async def finished(self, task_ids: Iterable[str], outcomes: Mapping[str, Any] | None = None) -> None:
        """Tasks finished: wake their watchers here (with ``outcomes`` when given) and on other replicas."""
        ids = list(task_ids)
        if not ids:
            return
        self._deliver(ids, outcomes)
        await self._publish("t", ids)

    def deliver(self, outcomes: Mapping[str, Any]) -> None:
        """Hand outcomes to this replica's watchers only (before they are stored; see ``finished``)."""
        self._deliver(outcomes, outcomes)

    def _deliver(self, ids: Iterable[str], outcomes: Mapping[str, Any] | None = None) -> None:
        by_watch: dict[Watch, list[tuple[str, Any]]] = defaultdict(list)
        for task_id in ids:
            for w in self._watches.get(task_id, ()):
                by_watch[w].append((task_id, outcomes.get(task_id) if outcomes else None))
        for w, found in by_watch.items():
            w.ready.put_nowait(found)

    # ------------------------------------------------------------------ serving containers

    async def serving(self, payload: str) -> None:
        """Tell the other replicas about a serving container (ready, or ended): the one that started it acts."""
        await self._publish("s", [payload])

    # ------------------------------------------------------------------ between replicas

    async def _publish(self, kind: str, items: list[str]) -> None:
        wake_up = kind in _WAKE_UPS
        if wake_up and time.monotonic() < self._alone_until:
            return
        try:
            receivers = await self._redis.publish(self._channel, f"{self._name}|{kind}|{','.join(items)}")
        except Exception as exc:  # a wake-up is an optimisation; pollers catch up
            log.warning("could not publish %s event: %s", kind, exc)
            return
        # only this replica's own listener heard it: nobody else to wake for a while (see the module's docstring)
        alone = self._subscribed.is_set() and int(receivers) <= 1
        self._alone_until = time.monotonic() + ALONE_RECHECK_S if alone and wake_up else 0.0

    async def _listen(self) -> None:
        await listen(self._redis, self._channel, self._on_message, what="event", subscribed=self._subscribed)

    def _on_message(self, data: str) -> None:
        sender, _, rest = data.partition("|")
        kind, _, payload = rest.partition("|")
        if sender == self._name or not payload:
            return
        if kind == "s":
            if self.on_serving is not None:
                try:
                    self.on_serving(payload)
                except Exception:
                    log.exception("a serving event from %s could not be handled", sender)
            return
        items = payload.split(",")
        if kind == _REVOKED:
            if self.on_revoked is not None:
                try:
                    self.on_revoked(items)
                except Exception:
                    log.exception("a revocation from %s could not be handled", sender)
        elif kind == "w":
            for worker_id in items:
                self._wake_worker(worker_id)
        elif kind == "t":
            self._deliver(items)
        elif kind == "c":
            for item in items:
                worker_id, _, task_id = item.partition("/")
                self._cancel_local(worker_id, task_id)
