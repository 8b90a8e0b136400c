"""The deployable kinds: ``@levers9.endpoint`` (and ``asgi``), ``queue``, ``job`` and ``box``.

Each is :func:`~levers9.sdk.functions.function` with its own ``kind`` and,
for endpoints and boxes, serving options (scaling bounds, ports, how long a
request may wait for room); ``levers9 deploy`` registers them and the gateway
serves them.

Invariants: a kind takes every option :func:`function` takes, checked the same
way, and its own options are checked against the controlplane's bounds
(:func:`levers9.sdk.options.check_serving`) when the function is decorated; the
serving options are stored under ``config["serving"]`` only for kinds that have
any.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from levers9.sdk.functions import Function, function
from levers9.sdk.options import check_serving

__all__ = ["asgi", "box", "endpoint", "job", "queue"]

P = ParamSpec("P")
R = TypeVar("R")


def endpoint(
    _fn: Callable[P, R] | None = None,
    *,
    asgi: bool = False,
    public: bool = False,
    min_containers: int | None = None,
    max_containers: int | None = None,
    tasks_per_container: int | None = None,
    max_pending: int | None = None,
    start_timeout: float | None = None,
    **options: Any,
) -> Any:
    """An HTTP endpoint, served by the gateway at ``/endpoint/NAME/vN`` once deployed (``levers9 deploy``).

    By default the function is called per request with the JSON body as its
    arguments and its return value is the JSON response (a generator streams).
    ``asgi=True``: the function takes no arguments and returns an ASGI app
    (FastAPI, Starlette), which serves every path under the endpoint's URL.
    Containers scale with the requests in flight, ``tasks_per_container`` at a
    time each, between ``min_containers`` (default 0: scale to zero once idle
    for ``keep_warm`` seconds) and ``max_containers``. Up to ``max_pending``
    requests wait for room, each at most ``start_timeout`` seconds; more are
    answered 429, and a wait that runs out 504; ``timeout`` bounds how long a
    container may take to begin its answer (then 504). ``public=True`` lets
    anyone call it without a token. Other options are :func:`function`'s.
    """
    serving = {
        "interface": "asgi" if asgi else "function",
        "public": public,
        "min_containers": min_containers,
        "max_containers": max_containers,
        "tasks_per_container": tasks_per_container,
        "max_pending": max_pending,
        "start_timeout_s": start_timeout,
    }
    return _other_kind("endpoint", _fn, serving, options)


def asgi(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """``@levers9.endpoint(asgi=True)``: the function returns an ASGI app that the endpoint serves."""
    return endpoint(_fn, asgi=True, **options)


def queue(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """A queue consumer: ``POST /queue/NAME/vN`` with a JSON body enqueues a call and returns its task id.

    Each item is one call of the function (arguments as an endpoint's), retried
    up to ``retries`` times when it raises; containers start as items wait and
    stop after ``keep_warm`` idle seconds. The result is read at
    ``/queue/NAME/vN/tasks/ID``. Options are :func:`function`'s.
    """
    return _other_kind("queue", _fn, {}, options)


def job(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """A job: ``POST /job/NAME/vN`` starts a run with the JSON body as arguments and returns its task id."""
    return _other_kind("job", _fn, {}, options)


def box(
    _fn: Callable[P, R] | None = None,
    *,
    ports: Sequence[int],
    min_containers: int | None = None,
    max_containers: int | None = None,
    start_timeout: float | None = None,
    **options: Any,
) -> Any:
    """A long-running box: the function starts a server on ``ports`` and does not return.

    Once deployed, one container runs it (``min_containers``, default 1) and the
    gateway proxies ``/box/NAME/vN/PORT/...`` to its port ``PORT``. The box is
    ready when every port accepts connections.
    """
    serving = {
        "ports": list(ports),
        "min_containers": min_containers,
        "max_containers": max_containers,
        "start_timeout_s": start_timeout,
    }
    return _other_kind("box", _fn, serving, options)


def _other_kind(kind: str, fn: Callable[..., Any] | None, serving: dict[str, Any], options: dict[str, Any]) -> Any:
    def wrap(f: Callable[..., Any]) -> Function[Any, Any]:
        decorated: Function[Any, Any] = function(f, **options)
        check_serving(f.__qualname__, serving)
        decorated.config["kind"] = kind
        if serving:
            decorated.config["serving"] = serving
        return decorated

    return wrap(fn) if fn is not None else wrap
