"""Launch pacing: at most one ``POST /instance-operations/launch`` per API key per interval, without waiting.

The Cloud API reference (its introduction, "Requests to the
``/instance-operations/launch`` endpoint are limited to one request per 12
seconds, or five requests per minute"; other requests about one per second)
sets :data:`LAUNCH_INTERVAL_S`. Every pool that uses the same key against the
same API shares one clock, because the API counts per key, not per pool.

:meth:`LaunchPacer.reserve` never sleeps: a launch that comes too soon is told
how long to wait and the provider raises ``Throttled(retry_after=...)`` at once,
so the hook thread is free and the core schedules the retry (and other pools,
other hooks and other keys go on meanwhile). A reserved slot is spent whatever
the launch's outcome, as the API counts the request whatever it answers.

Invariant: thread-safe; one lock guards the clocks and is never held while
anything else happens. The clocks are keyed by an opaque key the caller
derives (a digest of the API key, never the key itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["LAUNCH_INTERVAL_S", "REQUEST_INTERVAL_S", "LaunchPacer"]

#: the documented launch limit: one launch request per 12 seconds per API key
LAUNCH_INTERVAL_S = 12.0
#: the documented general limit: about one request per second (the default wait after a 429 without Retry-After)
REQUEST_INTERVAL_S = 1.0


class LaunchPacer:
    """When each API key may launch next."""

    def __init__(self, interval_s: float = LAUNCH_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        #: seconds between two launches with one key; tests against a fake set it shorter
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}

    def reserve(self, key: Hashable) -> float:
        """Take the launch slot of ``key`` and return 0.0, or return the seconds left until it is free."""
        with self._lock:
            now = self._clock()
            last = self._last.get(key)
            if last is not None:
                left = last + self.interval_s - now
                if left > 0:
                    return left
            self._last[key] = now
            return 0.0
