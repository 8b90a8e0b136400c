"""Exponential back-off, written once: how long to wait after the n-th failure in a row.

Every retry loop in levers9 (the scheduler's provisioning rounds, the worker's
reconnects and uploads, failed container starts in the worker and the gateway,
the SDK's watches) waits ``initial * 2 ** (failures - 1)``, capped at ``cap``;
loops that many processes run at once (reconnects after a controlplane restart)
add jitter so they do not all come back in the same instant. Standard library
only: the SDK and plugins import it too.
"""

from __future__ import annotations

import random

__all__ = ["Backoff", "delay_s"]

#: exponents above this would overflow a float long before any cap matters
_MAX_EXPONENT = 60


def delay_s(failures: int, *, initial_s: float, cap_s: float) -> float:
    """The wait after ``failures`` failures in a row (0 or 1: ``initial_s``), doubling, at most ``cap_s``."""
    exponent = min(max(failures - 1, 0), _MAX_EXPONENT)
    return float(min(cap_s, initial_s * 2**exponent))


class Backoff:
    """A retry loop's state: :meth:`next_s` after each failure, :meth:`reset` after a success.

    With ``jitter``, each wait is drawn from [0.5, 1.5) times the nominal one.
    """

    def __init__(self, *, initial_s: float, cap_s: float, jitter: bool = False) -> None:
        if initial_s <= 0 or cap_s < initial_s:
            raise ValueError(f"back-off needs 0 < initial_s <= cap_s, got initial_s={initial_s}, cap_s={cap_s}")
        self.initial_s = initial_s
        self.cap_s = cap_s
        self.jitter = jitter
        self.failures = 0

    def next_s(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        self.failures += 1
        wait = delay_s(self.failures, initial_s=self.initial_s, cap_s=self.cap_s)
        return wait * (0.5 + random.random()) if self.jitter else wait

    def reset(self) -> None:
        self.failures = 0
