"""Request metrics of the controlplane's listeners: a gRPC server interceptor and an ASGI middleware.

Both feed :class:`levers9.services.metrics.Metrics` (per-replica series, with
the ``replica`` label) and keep every label bounded:

- gRPC: ``method`` is the full method name of a registered service (calls to
  unknown methods are not counted: the server answers UNIMPLEMENTED without a
  handler), ``code`` is a ``grpc.StatusCode`` name. Every call is counted once,
  when it ends, with its final status. Only calls with a single response
  (unary-unary, stream-unary) are timed into ``levers9_grpc_request_seconds``:
  a streaming response (a worker's Session, a watch) lives as long as its
  client wants, and its length says nothing about how fast the server is.
- HTTP: ``route`` is the route template FastAPI matched (``/api/v1/tasks/{task_id}``),
  ``/<kind>/{name}`` for the gateway's fixed prefixes, or ``unmatched`` (a
  404 before routing): never a raw path. ``method`` is one of the standard
  HTTP methods or ``other``. The time observed is from the request's arrival
  to its response headers, so a long streamed body is not a slow request.

Observing never changes an answer: the wrapped handler's result or exception
passes through untouched.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from levers9.services.metrics import Metrics

__all__ = ["GATEWAY_PREFIXES", "GrpcMetricsInterceptor", "HttpMetricsMiddleware", "route_of"]

#: the gateway's first path segments (see levers9.gateway.routes); each is one route label
GATEWAY_PREFIXES = frozenset({"endpoint", "queue", "taskqueue", "job", "function", "box", "pod"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"

if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]


def _final_code(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException | None) -> str:
    """The status the client sees: what the handler set or aborted with, else OK, UNKNOWN or CANCELLED."""
    code: Any = None
    try:
        code = context.code()
    except Exception:  # an older grpc without ServicerContext.code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status.name
    if exc is None:
        return grpc.StatusCode.OK.name
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return grpc.StatusCode.CANCELLED.name
    return grpc.StatusCode.UNKNOWN.name


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every call by method and final status code, and times the ones with a single response."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        #: method -> (the handler the server gave, the observed one): generated handlers never change
        self._wrapped: dict[str, tuple[_Handler, _Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: _Handler) -> _Handler:
        timed = not handler.response_streaming
        behavior: Any
        make: Any
        if handler.unary_unary is not None:
            behavior, make = handler.unary_unary, grpc.unary_unary_rpc_method_handler
        elif handler.unary_stream is not None:
            behavior, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
        elif handler.stream_unary is not None:
            behavior, make = handler.stream_unary, grpc.stream_unary_rpc_method_handler
        else:
            behavior, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler
        if inspect.isasyncgenfunction(behavior):
            observed = self._generator(method, behavior)
        elif inspect.iscoroutinefunction(behavior):
            observed = self._coroutine(method, behavior, timed)
        else:
            return handler  # a synchronous handler: the aio server runs it elsewhere; left as it is
        wrapped: _Handler = make(
            observed, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
        return wrapped

    def _coroutine(self, method: str, behavior: Callable[..., Awaitable[Any]], timed: bool) -> Callable[..., Any]:
        metrics = self.metrics

        async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.monotonic()
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                metrics.grpc_answered(method, _final_code(context, exc), time.monotonic() - started if timed else None)
                raise
            metrics.grpc_answered(method, _final_code(context, None), time.monotonic() - started if timed else None)
            return response

        return observed

    def _generator(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        metrics = self.metrics

        async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException as exc:
                metrics.grpc_answered(method, _final_code(context, exc), None)
                raise
            metrics.grpc_answered(method, _final_code(context, None), None)

        return observed


def route_of(scope: Scope) -> str:
    """The bounded route label of an HTTP request whose app has run (FastAPI leaves its route in the scope)."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if isinstance(template, str) and template:
        return template
    path: str = scope.get("path", "")
    first = path[1:].partition("/")[0]
    if first in GATEWAY_PREFIXES:
        return f"/{first}/{{name}}"
    return UNMATCHED


class HttpMetricsMiddleware:
    """Wraps an ASGI app (the gateway, which fronts REST) and counts each HTTP request once it is answered."""

    def __init__(self, app: ASGIApp | Callable[..., Awaitable[None]], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        answered: list[float] = []
        status = 500  # what is counted if the app fails before answering

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                answered.append(time.monotonic())
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            method = scope.get("method", "")
            seconds = (answered[0] if answered else time.monotonic()) - started
            self.metrics.http_answered(route_of(scope), method if method in _METHODS else "other", status, seconds)
