"""`levers9 tasks | logs | pools | workers` against a real gRPC server, and the channel helpers they use.

The server is an in-process ``grpc.aio`` server on its own event loop thread,
serving fixed data through a small ControlPlane servicer that checks the bearer
token as the real one does. The CLI runs as a subprocess, as a user runs it, so
its own event loop and the server's never meet.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from levers9.cli.client_cmds import TASK_STATUSES, when
from levers9.proto.v1 import controlplane_pb2 as pb
from levers9.proto.v1 import controlplane_pb2_grpc
from levers9.sdk.channel import MAX_MESSAGE_BYTES, call_metadata, explain, open_channel, parse_target
from levers9.sdk.context import Context, save_context
from levers9.state.sql.records import TaskStatus
from tests.conftest import Result
from tests.fixtures.ports import free_port

TOKEN = "l9u_test-token"
NOW = time.time()
LOG = b"step 1\nstep 2\n\xff\xfe not utf-8\nprogress 50%"


class FakeControlPlane(controlplane_pb2_grpc.ControlPlaneServicer):
    """Fixed answers, and every request it saw, by method."""

    def __init__(self) -> None:
        self.requests: dict[str, list[Any]] = {}

    async def _enter(self, name: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.requests.setdefault(name, []).append(request)
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != f"Bearer {TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the token is unknown, revoked or expired")

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        await self._enter("ListTasks", request, context)
        return pb.ListTasksResponse(
            tasks=[
                pb.Task(
                    id="t-0002",
                    function="train.fit",
                    status="error",
                    attempts=2,
                    pool="h100",
                    gpu="H100",
                    worker_id="w-77",
                    error="CUDA out of memory\nTraceback (most recent call last): ...",
                    created_at=NOW - 30,
                    started_at=NOW - 20,
                    finished_at=NOW - 17.5,
                ),
                pb.Task(id="t-0001", function="train.prep", status="pending", attempts=0, created_at=NOW - 5),
            ]
        )

    async def StreamLogs(self, request: pb.StreamLogsRequest, context: Any) -> AsyncIterator[pb.LogChunk]:
        await self._enter("StreamLogs", request, context)
        if request.task_id != "t-0002":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {request.task_id!r}")
        for start in range(0, len(LOG), 7):
            yield pb.LogChunk(data=LOG[start : start + 7])

    async def ListPools(self, request: pb.ListPoolsRequest, context: Any) -> pb.ListPoolsResponse:
        await self._enter("ListPools", request, context)
        return pb.ListPoolsResponse(
            pools=[
                pb.PoolInfo(
                    name="h100",
                    provider="ec2",
                    runtime="runc",
                    gpu="H100",
                    gpu_count=8,
                    min_workers=0,
                    max_workers=4,
                    workers=1,
                    starting=1,
                    isolation="namespaces",
                ),
                pb.PoolInfo(
                    name="cpu",
                    provider="local",
                    runtime="process",
                    max_workers=2,
                    unavailable="quota exhausted in us-east-1",
                ),
            ]
        )

    async def ListWorkers(self, request: pb.ListWorkersRequest, context: Any) -> pb.ListWorkersResponse:
        await self._enter("ListWorkers", request, context)
        return pb.ListWorkersResponse(
            workers=[
                pb.WorkerSummary(
                    id="w-77",
                    pool="h100",
                    status="ready",
                    gpu="H100",
                    gpu_total=8,
                    gpu_free=6,
                    cpu_millicores=96000,
                    cpu_free=64500,
                    memory_mib=1048576,
                    memory_free=524288,
                    running=2,
                    machine_id="i-0abc",
                )
            ]
        )


@dataclass
class Server:
    address: str
    servicer: FakeControlPlane
    home: Path
    loop: asyncio.AbstractEventLoop = field(repr=False)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A ControlPlane server on its own loop thread, and a current context pointing at it."""
    with serving(FakeControlPlane(), tmp_path, monkeypatch) as running:
        yield running


@contextmanager
def serving(servicer: FakeControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """``servicer`` served on its own loop thread, and a current context pointing at it (for other test files too)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-test-server", daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        srv = grpc.aio.server()
        controlplane_pb2_grpc.add_ControlPlaneServicer_to_server(servicer, srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        return srv, port

    srv, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    # the `cli` fixture gives the subprocess this home
    home = tmp_path / "home"
    monkeypatch.setenv("LEVERS9_HOME", str(home))
    for key in ("LEVERS9_CONTEXT", "LEVERS9_TOKEN", "LEVERS9_GRPC"):
        monkeypatch.delenv(key, raising=False)
    address = f"127.0.0.1:{port}"
    save_context(Context(name="test", grpc=address, token=TOKEN))
    try:
        yield Server(address, servicer, home, loop)
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(None), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


Cli = Callable[..., Result]


def test_tasks_table(server: Server, cli: Cli) -> None:
    result = cli("tasks")  # piped: tab-separated, a header line first
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split("\t") == [
        "id",
        "function",
        "status",
        "attempts",
        "pool",
        "gpu",
        "worker",
        "created",
        "duration",
        "error",
    ]
    failed = next(r for r in rows if r.startswith("t-0002")).split("\t")
    created = when(NOW - 30, time.time())
    assert failed[:8] == ["t-0002", "train.fit", "error", "2", "h100", "H100", "w-77", created]
    assert failed[8:] == ["2.5s", "CUDA out of memory"], "only the error's first line"
    pending = next(r for r in rows if r.startswith("t-0001")).split("\t")
    assert pending[:8] == ["t-0001", "train.prep", "pending", "0", "-", "-", "-", when(NOW - 5, time.time())]
    assert pending[8:] == ["-", ""], "a task that has not started has no duration"
    assert "Traceback" not in result.stdout
    request = server.servicer.requests["ListTasks"][-1]
    assert (request.limit, request.status) == (50, "")


def test_tasks_json_with_filters(server: Server, cli: Cli) -> None:
    result = cli("tasks", "--status", "running", "--limit", "5", "--json")
    assert result.returncode == 0, result.stderr
    tasks = json.loads(result.stdout)
    assert [t["id"] for t in tasks] == ["t-0002", "t-0001"]
    assert tasks[0]["error"].startswith("CUDA out of memory\n")
    assert tasks[1]["worker_id"] == "", "every field is present, defaults included"
    request = server.servicer.requests["ListTasks"][-1]
    assert (request.limit, request.status) == (5, "running")


@pytest.mark.parametrize("status", [s.value for s in TaskStatus])
def test_tasks_takes_every_status_a_task_can_have(server: Server, cli: Cli, status: str) -> None:
    assert tuple(s.value for s in TaskStatus) == TASK_STATUSES
    result = cli("tasks", "--status", status, "--json")
    assert result.returncode == 0, result.stderr
    assert server.servicer.requests["ListTasks"][-1].status == status


def test_tasks_rejects_an_unknown_status(server: Server, cli: Cli) -> None:
    result = cli("tasks", "--status", "done")
    assert result.returncode == 2
    assert "unknown status 'done'" in result.stderr
    assert "complete" in result.stderr
    assert "ListTasks" not in server.servicer.requests


def test_logs_writes_the_raw_bytes(server: Server, tmp_path: Path) -> None:
    def logs(*argv: str) -> bytes:
        env = {**os.environ, "LEVERS9_HOME": str(server.home)}
        proc = subprocess.run(
            [sys.executable, "-m", "levers9.cli.main", "logs", *argv],
            capture_output=True,
            env=env,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert logs("t-0002", "--follow") == LOG
    request = server.servicer.requests["StreamLogs"][-1]
    assert (request.task_id, request.follow) == ("t-0002", True)
    assert logs("t-0002") == LOG
    assert server.servicer.requests["StreamLogs"][-1].follow is False


def test_logs_of_an_unknown_task(server: Server, cli: Cli) -> None:
    result = cli("logs", "t-9999")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: no task 't-9999'"


def test_pools_table_and_json(server: Server, cli: Cli) -> None:
    result = cli("pools")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    columns = ["name", "provider", "runtime", "isolation", "gpu", "workers", "starting", "min-max", "status"]
    assert header.split() == columns
    assert rows[0].split() == ["h100", "ec2", "runc", "namespaces", "8x", "H100", "1", "1", "0-4", "ok"]
    # a controlplane that does not say (an older one) is shown as unknown, never as isolated
    assert rows[1].split()[:8] == ["cpu", "local", "process", "unknown", "cpu", "0", "0", "0-2"]
    assert rows[1].rstrip().endswith("unavailable: quota exhausted in us-east-1")

    pools = json.loads(cli("pools", "--json").stdout)
    assert pools[0]["gpu_count"] == 8
    assert pools[1]["unavailable"] == "quota exhausted in us-east-1"


def test_workers_table_passes_the_pool(server: Server, cli: Cli) -> None:
    result = cli("workers", "--pool", "h100")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == [
        "id",
        "pool",
        "status",
        "gpu",
        "free",
        "cpu",
        "free",
        "memory",
        "free",
        "running",
        "machine",
    ]
    assert row.split() == ["w-77", "h100", "ready", "6/8", "H100", "64.5/96", "512.0/1024.0", "GiB", "2", "i-0abc"]
    assert server.servicer.requests["ListWorkers"][-1].pool == "h100"

    workers = json.loads(cli("workers", "--json").stdout)
    assert workers[0]["machine_id"] == "i-0abc"
    assert server.servicer.requests["ListWorkers"][-1].pool == ""


def test_wrong_token_gets_a_token_hint(server: Server, cli: Cli) -> None:
    save_context(Context(name="stale", grpc=server.address, token="revoked"))
    result = cli("pools")
    assert result.returncode == 1
    message = result.stderr.strip()
    assert message.startswith(
        f"error: the controlplane at {server.address} did not accept the token of context 'stale'"
    )
    assert "the token is unknown, revoked or expired" in message
    assert "levers9 context add stale" in message
    assert "revoked" in result.stderr
    assert "Traceback" not in result.stderr

    result = cli("pools", env={"LEVERS9_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr


def test_context_option_and_env_choose_the_context(server: Server, cli: Cli) -> None:
    save_context(Context(name="down", grpc=f"127.0.0.1:{free_port()}", token=TOKEN))
    assert cli("pools").returncode == 1
    assert cli("workers", "--context", "test").returncode == 0
    assert cli("tasks", env={"LEVERS9_CONTEXT": "test"}).returncode == 0
    result = cli("tasks", "-c", "nope")
    assert result.returncode == 1
    assert "unknown levers9 context 'nope'" in result.stderr
    assert "(known: down, test)" in result.stderr


def test_nothing_listening_is_explained(cli: Cli, tmp_path: Path) -> None:
    port = free_port()
    env = {"LEVERS9_HOME": str(tmp_path / "empty"), "LEVERS9_GRPC": f"127.0.0.1:{port}"}
    for argv in (["tasks"], ["logs", "t-1"]):  # a unary call and a stream
        result = cli(*argv, env=env)
        assert result.returncode == 1, argv
        first = result.stderr.splitlines()[0]
        assert first == (
            f"error: cannot reach the controlplane at 127.0.0.1:{port} (is `levers9 up` or `levers9 server` running?)"
        ), argv
        assert "Traceback" not in result.stderr


def test_no_context_at_all(cli: Cli) -> None:
    result = cli("tasks")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: no levers9 context: run `levers9 up` (one machine) or `levers9 context add ...`"
    )


@pytest.mark.parametrize("argv", [["--help"], ["tasks", "--help"], ["run", "--help"]])
def test_cli_start_does_not_import_grpc(argv: list[str], tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from levers9.cli.main import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('GRPC=' + repr(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc')) + '\\n')\n"
    )
    env = {**os.environ, "LEVERS9_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert "GRPC=[]" in proc.stderr.splitlines(), proc.stderr


# --- the channel helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "target", "tls"),
    [
        ("127.0.0.1:1993", "127.0.0.1:1993", False),
        ("grpc://cp:1993", "cp:1993", False),
        ("http://cp:1993/", "cp:1993", False),
        ("grpcs://cp.example.com", "cp.example.com:443", True),
        ("https://cp.example.com:8443", "cp.example.com:8443", True),
        ("grpcs://[::1]", "[::1]:443", True),
        ("grpcs://[::1]:9", "[::1]:9", True),
    ],
)
def test_parse_target(address: str, target: str, tls: bool) -> None:
    assert parse_target(address) == (target, tls)


def test_call_metadata() -> None:
    assert call_metadata(Context(name="a", grpc="h:1", token="abc")) == (("authorization", "Bearer abc"),)
    assert call_metadata(Context(name="a", grpc="h:1")) == ()


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def test_explain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEVERS9_TOKEN", raising=False)
    ctx = Context(name="team", grpc="grpcs://cp.example.com", token="t")
    assert explain(_rpc_error(grpc.StatusCode.UNAVAILABLE, ""), ctx) == (
        "cannot reach the controlplane at cp.example.com:443 (is `levers9 up` or `levers9 server` running?)"
    )
    assert explain(_rpc_error(grpc.StatusCode.UNAVAILABLE, "Connection refused"), ctx).endswith(
        "running?)\n  Connection refused"
    )
    unauthenticated = explain(_rpc_error(grpc.StatusCode.UNAUTHENTICATED, "expired"), ctx)
    assert "did not accept the token of context 'team': expired" in unauthenticated
    monkeypatch.setenv("LEVERS9_TOKEN", "x")
    assert "the token of $LEVERS9_TOKEN" in explain(_rpc_error(grpc.StatusCode.UNAUTHENTICATED, ""), ctx)
    assert explain(_rpc_error(grpc.StatusCode.NOT_FOUND, "no task 'x'"), ctx) == "no task 'x'"
    assert (
        explain(_rpc_error(grpc.StatusCode.INTERNAL, ""), ctx)
        == "the controlplane at cp.example.com:443 answered INTERNAL"
    )
    assert "did not answer in time" in explain(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, ""), ctx)


async def test_channel_carries_large_messages_and_the_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Above gRPC's 4 MiB default both ways, and the metadata the server checks."""
    big = b"x" * (8 * 1024 * 1024)

    class Big(FakeControlPlane):
        async def StreamLogs(self, request: pb.StreamLogsRequest, context: Any) -> AsyncIterator[pb.LogChunk]:
            await self._enter("StreamLogs", request, context)
            yield pb.LogChunk(data=big)

    srv = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    controlplane_pb2_grpc.add_ControlPlaneServicer_to_server(Big(), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        ctx = Context(name="t", grpc=f"127.0.0.1:{port}", token=TOKEN)
        async with open_channel(ctx) as channel:
            stub = controlplane_pb2_grpc.ControlPlaneStub(channel)
            chunks = [
                c
                async for c in stub.StreamLogs(pb.StreamLogsRequest(task_id=big.decode()), metadata=call_metadata(ctx))
            ]
        assert [len(c.data) for c in chunks] == [len(big)]
    finally:
        await srv.stop(None)


async def test_tls_channel_opens() -> None:
    """A TLS address gets a secure channel (with the system's roots); nothing to connect to, just no error."""
    async with open_channel(Context(name="t", grpc="grpcs://127.0.0.1:1")) as channel:
        assert channel is not None
