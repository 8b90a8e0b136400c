"""How many connections each listener may hold, worked out from the descriptors the process may open.

Every connection costs the controlplane one file descriptor, and so do its SQL and Redis connections, the
gateway's connections to containers, its log files and its children's pipes. When a flood of connections
takes the last descriptor, nothing else can open one either (``accept`` fails with ``EMFILE`` on every
listener, the database cannot reconnect), so each listener is capped well below the process's
``RLIMIT_NOFILE``, and what the caps leave is the reserve for everything else.

:func:`plan` divides the limit: a reserve of a fifth (:data:`MIN_RESERVE` at least), the metrics listener's
small fixed cap, each HTTP listener's :data:`SLACK` (connections being evicted, not yet closed), and half
of the rest each to the HTTP and the gRPC listener (at most :data:`MAX_DERIVED` each). A cap the config
sets is taken as it is, and the other derived from what it leaves; caps that would leave less than
:data:`MIN_RESERVE` descriptors raise :class:`LimitsError` naming the keys, and so does a limit too low to
serve at all. :func:`raise_descriptor_limit` lifts the soft limit to the hard one first, so the plan starts
from the most the process may have.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from levers9.hooks.errors import Levers9Error

__all__ = [
    "MAX_DERIVED",
    "METRICS_CAP",
    "MIN_RESERVE",
    "SLACK",
    "Budget",
    "LimitsError",
    "plan",
    "raise_descriptor_limit",
]

#: the fewest descriptors left to everything that is not a listener's connection
MIN_RESERVE = 256
#: connections the metrics listener holds (Prometheus scrapes: a few at a time)
METRICS_CAP = 64
#: connections an HTTP listener may hold above its cap while evicted ones close (levers9.controlplane.listener)
SLACK = 64
#: the largest derived cap: past this many connections memory, not descriptors, is what runs out
MAX_DERIVED = 32_768
#: a derived per-client cap is this fraction of the cap in all, so that no one address holds the listener
PER_CLIENT_SHARE = 8
#: what an unlimited descriptor limit counts as (Linux's own ceiling, fs.nr_open, by default)
_UNLIMITED = 1 << 20
#: the smallest cap worth serving with: a limit that leaves less is refused
_MIN_CAP = 16


class LimitsError(Levers9Error):
    """The connection caps do not fit the process's descriptor limit; the message names the keys and the fix."""


@dataclass(frozen=True)
class Budget:
    """The connection caps of one controlplane process, within ``descriptors``."""

    #: the process's descriptor limit (soft ``RLIMIT_NOFILE``)
    descriptors: int
    #: connections the HTTP listener (REST, the gateway, health) holds at most
    http: int
    #: of those, from one client address at most; 0: no cap per address
    http_per_client: int
    #: connections the gRPC listener accepts at most
    grpc: int
    #: connections the metrics listener holds at most
    metrics: int = METRICS_CAP

    @property
    def reserve(self) -> int:
        """Descriptors left to everything else when every listener is full."""
        return self.descriptors - self.http - self.grpc - self.metrics - 2 * SLACK


def raise_descriptor_limit() -> int:
    """Lift the soft descriptor limit to the hard one (allowed to any process); the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY:
        return target
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft
        return target
    return soft


def plan(
    descriptors: int, *, http: int | None = None, http_per_client: int | None = None, grpc: int | None = None
) -> Budget:
    """The caps for a process that may open ``descriptors``; None: derived (see the module's docstring).

    Raises :class:`LimitsError` naming the ``listen.*`` keys when the caps leave under :data:`MIN_RESERVE` descriptors.
    """
    fixed = METRICS_CAP + 2 * SLACK
    usable = descriptors - max(MIN_RESERVE, descriptors // 5) - fixed
    if http is None or grpc is None:
        if usable // 2 < _MIN_CAP:
            raise LimitsError(
                f"this process may open only {descriptors} file descriptors (RLIMIT_NOFILE): too few to serve; "
                f"raise the limit (ulimit -n, systemd LimitNOFILE=) to at least {_least_limit()}"
            )
        share = min(MAX_DERIVED, usable // 2)
        if http is None and grpc is None:
            http = grpc = share
        elif http is None:
            assert grpc is not None
            http = min(MAX_DERIVED, max(_MIN_CAP, usable - grpc))
        else:
            grpc = min(MAX_DERIVED, max(_MIN_CAP, usable - http))
    if http_per_client is None:
        http_per_client = max(_MIN_CAP, http // PER_CLIENT_SHARE)
    budget = Budget(descriptors, http, http_per_client, grpc)
    if budget.reserve < MIN_RESERVE:
        raise LimitsError(
            f"listen.max_connections ({http}) and listen.grpc_max_connections ({grpc}) leave {budget.reserve} "
            f"of the {descriptors} file descriptors this process may open (RLIMIT_NOFILE) to everything else "
            f"(SQL, Redis, workers, files), under the {MIN_RESERVE} needed: lower them to at most "
            f"{descriptors - fixed - MIN_RESERVE} together, or raise the limit (ulimit -n, systemd LimitNOFILE=)"
        )
    return budget


def _least_limit() -> int:
    """The smallest descriptor limit :func:`plan` derives caps of :data:`_MIN_CAP` from."""
    limit = MIN_RESERVE + METRICS_CAP + 2 * SLACK + 2 * _MIN_CAP
    while limit - max(MIN_RESERVE, limit // 5) - METRICS_CAP - 2 * SLACK < 2 * _MIN_CAP:
        limit += 1
    return limit
