"""Request metrics: the gRPC interceptor on a real grpc.aio server, the HTTP middleware on the real REST app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from levers9.controlplane.http import create_http_app
from levers9.controlplane.observe import GrpcMetricsInterceptor, HttpMetricsMiddleware
from levers9.services.metrics import Metrics
from tests.controlplane.conftest import Api, bearer

SERVICE = "test.Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request


async def _missing(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    return b""


async def _broken(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    raise RuntimeError("a bug in the handler")


async def _stream(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
    for i in range(3):
        yield request + bytes([i])


async def _session(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def _handlers() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Missing": grpc.unary_unary_rpc_method_handler(_missing),
            "Broken": grpc.unary_unary_rpc_method_handler(_broken),
            "Stream": grpc.unary_stream_rpc_method_handler(_stream),
            "Session": grpc.stream_stream_rpc_method_handler(_session),
        },
    )


def _method(kind: Any, name: str) -> Any:
    """A client callable of the test service (raw bytes in and out, so untyped)."""
    return kind(f"/{SERVICE}/{name}")


@pytest.fixture
async def grpc_target() -> AsyncIterator[tuple[Metrics, grpc.aio.Channel]]:
    metrics = Metrics(replica="r1")
    server = grpc.aio.server(interceptors=[GrpcMetricsInterceptor(metrics)])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield metrics, channel
    finally:
        await channel.close()
        await server.stop(None)


async def test_grpc_calls_are_counted_by_method_and_final_code(grpc_target: tuple[Metrics, grpc.aio.Channel]) -> None:
    metrics, channel = grpc_target
    echo = _method(channel.unary_unary, "Echo")
    assert await echo(b"hi") == b"hi"
    assert await echo(b"again") == b"again"
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await _method(channel.unary_unary, "Missing")(b"x")
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as broken:
        await _method(channel.unary_unary, "Broken")(b"x")
    assert broken.value.code() is grpc.StatusCode.UNKNOWN
    items = [item async for item in _method(channel.unary_stream, "Stream")(b"s")]
    assert items == [b"s\x00", b"s\x01", b"s\x02"]
    session = _method(channel.stream_stream, "Session")()
    await session.write(b"one")
    assert await session.read() == b"one"
    await session.done_writing()
    assert await session.read() is grpc.aio.EOF
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await _method(channel.unary_unary, "NoSuchMethod")(b"x")
    assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED

    sample = metrics.registry.get_sample_value

    def calls(method: str, code: str) -> float | None:
        return sample("levers9_grpc_requests_total", {"replica": "r1", "method": f"/{SERVICE}/{method}", "code": code})

    def timed(method: str) -> float | None:
        return sample("levers9_grpc_request_seconds_count", {"replica": "r1", "method": f"/{SERVICE}/{method}"})

    assert calls("Echo", "OK") == 2
    assert calls("Missing", "NOT_FOUND") == 1
    assert calls("Broken", "UNKNOWN") == 1
    assert calls("Stream", "OK") == 1  # a stream is one call, counted when it ends
    assert calls("Session", "OK") == 1
    assert (timed("Echo"), timed("Missing"), timed("Broken")) == (2, 1, 1)
    # streaming responses are counted but never timed: their length is the client's choice
    assert (timed("Stream"), timed("Session")) == (None, None)
    # a method no service registers is not a series (the label stays bounded)
    assert calls("NoSuchMethod", "UNIMPLEMENTED") is None


async def test_http_requests_are_labelled_by_route_template_never_by_raw_path(api: Api) -> None:
    metrics = Metrics(replica="r1")
    app = HttpMetricsMiddleware(create_http_app(api.services, metrics=metrics), metrics)
    a, token = await api.user("team-a")
    await api.submit(a, "task-1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://levers9.test") as client:
        assert (await client.get("/api/v1/tasks/task-1", headers=bearer(token))).status_code == 200
        assert (await client.get("/api/v1/tasks/task-nope", headers=bearer(token))).status_code == 404
        assert (await client.get("/api/v1/tasks/task-other", headers=bearer(token))).status_code == 404
        assert (await client.get("/no/such/path/x123")).status_code == 404
        assert (await client.get("/endpoint/greet/some/path")).status_code == 404

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "levers9_http_requests_total"
    }
    route = "/api/v1/tasks/{task_id}"
    assert samples == {
        ("levers9_http_requests_total", (("method", "GET"), ("replica", "r1"), ("route", route), ("status", "200"))): 1,
        ("levers9_http_requests_total", (("method", "GET"), ("replica", "r1"), ("route", route), ("status", "404"))): 2,
        (
            "levers9_http_requests_total",
            (("method", "GET"), ("replica", "r1"), ("route", "unmatched"), ("status", "404")),
        ): 1,
        (
            "levers9_http_requests_total",
            (("method", "GET"), ("replica", "r1"), ("route", "/endpoint/{name}"), ("status", "404")),
        ): 1,
    }
    assert (
        metrics.registry.get_sample_value("levers9_http_request_seconds_count", {"replica": "r1", "route": route}) == 3
    )
