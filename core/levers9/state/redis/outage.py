"""Redis not answering, said once per outage by each loop that retries through it.

When Redis restarts or Sentinel promotes a replica, every command fails for a
few seconds, and each loop that retries every second would log a traceback
every second. A loop keeps one :class:`Outage`: the first failure that means
"Redis does not answer" (:func:`unreachable`: a connection error, a timeout,
no primary from Sentinel) is one warning naming the loop and the error, the
failures after it are silent, and the first success after them is one line
saying Redis answers again and for how long it did not. A server going down
and coming back flaps (a stopping server still accepts a connection, a pooled
connection to the old process fails once after the new one answers), so an
outage that begins within :data:`QUIET_S` of the last warning belongs to the
same incident: it is logged at debug level only, its end too. Any other
exception is not an outage: the caller logs it with its traceback as before.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["QUIET_S", "Outage", "unreachable"]

#: an outage that begins this soon after a loop's last warning is the same incident: not warned of again
QUIET_S = 60.0


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis does not answer (Sentinel's "no primary" is a connection error too).

    An exception group counts when everything in it does (a task group whose tasks all lost Redis).
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(unreachable(e) for e in exc.exceptions)
    return isinstance(exc, (RedisConnectionError, RedisTimeoutError))


class Outage:
    """One loop's view of Redis being away: a warning when it stops answering, a line when it is back."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        #: when the current outage began (monotonic), None while Redis answers
        self._since: float | None = None
        #: when this loop last warned, and whether the current outage was warned of
        self._warned_at = -QUIET_S
        self._warned = False

    @property
    def down(self) -> bool:
        """The last attempt found Redis not answering, and none has succeeded since."""
        return self._since is not None

    def failed(self, exc: BaseException) -> bool:
        """Note a failed attempt: True when ``exc`` is Redis not answering (warned at the first of an outage
        only), False for anything else, which the caller reports itself."""
        if not unreachable(exc):
            return False
        if self._since is None:
            self._since = time.monotonic()
            self._warned = self._since - self._warned_at >= QUIET_S
            if self._warned:
                self._warned_at = self._since
            self._log.log(
                logging.WARNING if self._warned else logging.DEBUG,
                "%s: Redis does not answer: %s; retrying",
                self._what,
                _first_line(exc),
            )
        return True

    def answered(self) -> None:
        """Note a successful attempt: ends an outage, with one line saying so (at the level it began with)."""
        if self._since is not None:
            self._log.log(
                logging.WARNING if self._warned else logging.DEBUG,
                "%s: Redis answers again after %.1f s without it",
                self._what,
                time.monotonic() - self._since,
            )
            self._since = None


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300].rstrip('.')}" if text else type(exc).__name__
