"""Domain errors to gRPC status codes: the one table every servicer method goes through.

A servicer raises what the domain raises (NotFound, NoPoolOffers, InvalidStub...)
and the decorators here turn it into a status with the error's own message, so
the SDK can show the user exactly what the core said. Anything unexpected is
logged with its traceback and reported as INTERNAL without internals.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from levers9.gpu.catalog import UnknownGpuType
from levers9.hooks.errors import Levers9Error
from levers9.services.auth import PermissionDenied, Unauthenticated
from levers9.services.errors import NoPoolOffers
from levers9.services.revocation import ReplicaStopping
from levers9.services.stubs import InvalidStub
from levers9.state.errors import AlreadyExists, Conflict, DataDirectoryFull, InvalidTransition, NotFound

__all__ = ["STATUS_OF", "status_of", "streaming", "unary"]

log = logging.getLogger(__name__)

#: most specific first: the first matching class decides
STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    # the replica is stopping: the caller opens its stream again on another one
    (ReplicaStopping, grpc.StatusCode.UNAVAILABLE),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidTransition, grpc.StatusCode.FAILED_PRECONDITION),
    (Conflict, grpc.StatusCode.ABORTED),
    (NoPoolOffers, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidStub, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownGpuType, grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    # refused for want of room, not retried by the SDK as UNAVAILABLE would be: the caller reads why
    (DataDirectoryFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Levers9Error, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            return code
    return None


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception, method: str) -> None:
    code = status_of(exc)
    if code is None:
        log.exception("%s failed", method)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; the controlplane log has details")
    else:
        await context.abort(code, str(exc))


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
G = TypeVar("G", bound=Callable[..., AsyncIterator[Any]])


def unary(method: F) -> F:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await _abort(context, exc, method.__name__)

    return wrapper  # type: ignore[return-value]


def streaming(method: G) -> G:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await _abort(context, exc, method.__name__)

    return wrapper  # type: ignore[return-value]
