"""Long-lived streams end when their token is revoked: the open streams of one replica, by token.

A stream (a watch, a log stream, a worker's session) is authorized once, when
it opens; left alone, a token revoked later would keep it open for as long as
it lasts. Every such stream therefore holds a :class:`StreamGuard` from
:meth:`OpenStreams.open` for as long as it is open, and awaits what it streams
through :meth:`StreamGuard.wait` (or :meth:`StreamGuard.iterate`). It ends
with :class:`TokenRevoked` (gRPC ``UNAUTHENTICATED``, "token revoked") when

* the token's revocation is announced (:meth:`OpenStreams.end`): by whatever
  revoked it, on this replica at once, and through the event hub
  (:mod:`levers9.services.hub`) on the others; or
* the re-check finds the token no longer valid: every :data:`RECHECK_S`, while
  any stream is open, one question to the token store (one SQL query for all
  of this replica's open streams, :meth:`~levers9.state.sql.workspaces.TokenStore.invalid`)
  asks which of their tokens are revoked, expired or gone. That catches what no
  notice announces: a revocation made offline (``levers9 server token revoke``),
  a machine's tokens revoked at its termination, a notice lost between
  replicas, a token that expired.

So a revoked token's streams end at once where the notice arrives, and within
:data:`RECHECK_S` in any case. Nothing is read per message, and an open
stream costs no timer of its own.

How a stream is ended: the guard cancels the stream's task only while that
task awaits inside :meth:`StreamGuard.wait` (so the cancellation lands in the
stream's own code, where it becomes :class:`TokenRevoked`, and never in the
transport's code that sends a message); a stream that was sending at that
moment ends at its next :meth:`~StreamGuard.wait`. A cancellation of the task
from elsewhere (the caller went away) is left as it is.

The same way, every open lasting stream (not a transfer: see :meth:`OpenStreams.open`) of a
replica that is stopping ends at once
(:meth:`OpenStreams.stop`), with :class:`ReplicaStopping` (gRPC ``UNAVAILABLE``,
on which workers, agents and the SDK dial another replica) instead of waiting
for the gRPC listener's grace; a stream opened after that ends at its first
wait. A revoked token still ends its streams with :class:`TokenRevoked`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator
from typing import TypeVar

from levers9.cancelling import raise_if_cancelling
from levers9.services.auth_errors import Unauthenticated

__all__ = ["RECHECK_S", "OpenStreams", "ReplicaStopping", "StreamGuard", "TokenRevoked"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how often the tokens of this replica's open streams are checked against the token store
RECHECK_S = 10.0


class TokenRevoked(Unauthenticated):
    """The token a stream was opened with was revoked (or expired) while the stream was open."""

    def __init__(self, token_id: str) -> None:
        super().__init__(
            f"token revoked: token {token_id} was revoked or has expired since this stream opened; "
            "open it again with a valid token"
        )
        self.token_id = token_id


class ReplicaStopping(Exception):
    """The replica holding the stream is stopping: the other side opens it again on another replica."""

    def __init__(self) -> None:
        super().__init__("controlplane replica stopping; dial another replica")


class StreamGuard:
    """One open stream's hold on its token (see the module docstring); made by :meth:`OpenStreams.open`."""

    def __init__(self, token_id: str) -> None:
        self.token_id = token_id
        self.revoked = False
        #: the replica is stopping (:meth:`OpenStreams.stop`)
        self.stopping = False
        #: whether a stopping replica ends this stream (see :meth:`OpenStreams.open`)
        self.lasting = True
        #: the task awaiting inside :meth:`wait`, while it does
        self._waiting: asyncio.Task[object] | None = None
        #: whether this guard cancelled that task (and so owes it an uncancel)
        self._cut = False

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result; raises :class:`TokenRevoked` once the token is revoked, before or meanwhile,
        :class:`ReplicaStopping` once the replica stops."""
        if self.revoked or self.stopping:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never awaited: no "was never awaited" warning
            raise self._ended()
        task = self._waiting = asyncio.current_task()
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if not self._cut:
                raise
            self._settle(task)
            raise self._ended() from None
        finally:
            self._waiting = None
        if self._cut:  # the awaitable swallowed this guard's cancellation: still the end of the stream
            self._settle(task)
            raise self._ended()
        return result

    def _ended(self) -> Exception:
        """Why the stream ends: a revoked token before a stopping replica (its holder must not dial again)."""
        return TokenRevoked(self.token_id) if self.revoked else ReplicaStopping()

    def _settle(self, task: asyncio.Task[object] | None) -> None:
        """This guard's cancellation, and only it, became the revocation: the task is no longer being cancelled."""
        self._cut = False
        if task is not None:
            task.uncancel()

    async def iterate(self, source: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """``source``'s items until it ends or the token is revoked (:class:`TokenRevoked`); ``source`` is
        closed when this ends, however it ends."""
        try:
            while True:
                try:
                    item = await self.wait(anext(source))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    def cut(self) -> None:
        """The token is revoked: end the stream now if it is waiting, else at its next :meth:`wait`."""
        self.revoked = True
        self._cancel()

    def stop(self) -> None:
        """The replica is stopping: end the stream now if it is waiting, else at its next :meth:`wait`."""
        self.stopping = True
        self._cancel()

    def _cancel(self) -> None:
        if self._waiting is not None and not self._cut:
            self._cut = True
            self._waiting.cancel()


class OpenStreams:
    """This replica's open streams by token id, and the re-check of their tokens (see the module docstring).

    ``invalid``: which of the token ids given are no longer valid (revoked, expired or unknown).
    """

    def __init__(
        self, invalid: Callable[[Collection[str]], Awaitable[Collection[str]]], *, recheck_s: float = RECHECK_S
    ) -> None:
        self._invalid = invalid
        self.recheck_s = recheck_s
        self._by_token: dict[str, set[StreamGuard]] = {}
        #: the next re-check, while one is due (a timer: opening and closing streams creates no task)
        self._due: asyncio.TimerHandle | None = None
        #: the re-check under way, while one is
        self._checking: asyncio.Task[None] | None = None
        #: set by :meth:`stop`: streams opened from then on end at their first wait
        self.stopping = False

    def __len__(self) -> int:
        return sum(len(guards) for guards in self._by_token.values())

    @contextlib.contextmanager
    def open(self, token_id: str, *, lasting: bool = True) -> Iterator[StreamGuard]:
        """A guard for a stream opened with ``token_id``, held until the block ends.

        ``lasting``: the stream lasts until something ends it (a session, a tunnel, a watch), so a stopping
        replica ends it (:meth:`stop`); False for a transfer that ends by itself (an upload, a download, a
        build), which gets the gRPC listener's grace like any call in flight.
        """
        guard = StreamGuard(token_id)
        guard.lasting = lasting
        guard.stopping = self.stopping and lasting
        self._by_token.setdefault(token_id, set()).add(guard)
        self._schedule()
        try:
            yield guard
        finally:
            guards = self._by_token.get(token_id)
            if guards is not None:
                guards.discard(guard)
                if not guards:
                    del self._by_token[token_id]
            # a re-check still due finds nothing open and schedules no other

    def end(self, token_ids: Iterable[str]) -> int:
        """End the streams opened with ``token_ids`` (revoked); how many there were."""
        ended = 0
        for token_id in token_ids:
            for guard in self._by_token.get(token_id, ()):
                guard.cut()
                ended += 1
        return ended

    def stop(self) -> int:
        """The replica is stopping: end every open lasting stream (:class:`ReplicaStopping`), and those opened
        later at their first wait; how many were open."""
        self.stopping = True
        guards = [guard for guards in self._by_token.values() for guard in guards if guard.lasting]
        for guard in guards:
            guard.stop()
        return len(guards)

    async def check(self) -> int:
        """Ask the token store about every open stream's token once, and end those of invalid ones; how many."""
        if not self._by_token:
            return 0
        invalid = await self._invalid(list(self._by_token))
        ended = self.end(invalid)
        if ended:
            log.info("ended %d stream(s) whose token was revoked or expired: %s", ended, ", ".join(sorted(invalid)))
        return ended

    def _schedule(self) -> None:
        if self._due is None and self._checking is None:
            self._due = asyncio.get_running_loop().call_later(self.recheck_s, self._start_check)

    def _start_check(self) -> None:
        self._due = None
        if self._by_token:
            self._checking = asyncio.create_task(self._recheck(), name="open streams' tokens")

    async def _recheck(self) -> None:
        try:
            await self.check()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_if_cancelling(exc)
            log.warning(
                "open streams: could not re-check their tokens (%s: %s); trying again in %g s",
                type(exc).__name__,
                exc,
                self.recheck_s,
            )
        finally:
            self._checking = None
        if self._by_token:
            self._schedule()
