"""``levers9 tasks``, ``logs``, ``cancel``, ``pools`` and ``workers``: what the controlplane of a context is doing.

These are thin clients of the ControlPlane service. gRPC is imported only when
a command runs, so ``levers9 --help`` does not pay for it. Every failure leaves
through :func:`explain` as one line on stderr and exit status 1: the person
reading it wants to know whether the controlplane is down or the token is wrong,
not a gRPC status dump.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from levers9.cli.output import Cell, Col, err, iso, out, print_json, print_table

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub
    from levers9.sdk.context import Context

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]

#: list calls answer from the database; a controlplane silent this long is stuck, not busy
UNARY_TIMEOUT_S = 30.0
#: every status a task can have (levers9.state.sql.records.TaskStatus, written out: the CLI starts without the
#: state package; tests/cli/test_client_cmds.py holds them equal)
TASK_STATUSES = ("pending", "running", "complete", "error", "cancelled", "timeout")
_STATUS_STYLE = {
    "pending": "yellow",
    "running": "cyan",
    "complete": "green",
    "error": "red",
    "cancelled": "dim",
    "expired": "dim",
}


def context_option() -> Any:
    """The ``-c/--context`` option every client command takes."""
    return typer.Option(
        None, "-c", "--context", help="Context to use (default: $LEVERS9_CONTEXT, else the current one)."
    )


def resolve_context(name: str | None) -> Context:
    """The context to use, or exit 1 with the reason (none configured, unknown name, broken file)."""
    from levers9.sdk.context import ContextError, current_context

    try:
        return current_context(name)
    except ContextError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None


def call(context: str | None, action: Callable[[ControlPlaneStub, Metadata], Awaitable[T]]) -> T:
    """Run ``action`` against the context's controlplane on a fresh event loop; gRPC errors exit 1, explained.

    Every replica of the context is dialled at once (:func:`levers9.sdk.dial.dial`); the first to answer
    runs the action, so a replica that is down costs no wait.
    """
    import asyncio

    import grpc.aio

    from levers9.sdk.channel import call_metadata, control_plane, explain
    from levers9.sdk.dial import Reached, dial, unreached_message

    ctx = resolve_context(context)
    tried: list[str] = []

    async def run() -> T:
        outcome = await dial(ctx, metadata=call_metadata(ctx))
        if not isinstance(outcome, Reached):
            tried.extend(f.target for f in sorted(outcome, key=lambda f: f.index))
            if any(f.fatal for f in outcome):
                err.print(f"error: {unreached_message(ctx, outcome)}", markup=False)
                raise typer.Exit(1)
            raise outcome[-1].error
        async with outcome.channel as channel:
            return await action(control_plane(channel), call_metadata(ctx))

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as exc:
        err.print(f"error: {explain(exc, ctx, tried or None)}", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def tasks(
    context: str | None = context_option(),
    status: str | None = typer.Option(None, "--status", help=f"Only tasks in this status: {', '.join(TASK_STATUSES)}."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, help="At most this many tasks, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per task."),
) -> None:
    """List the workspace's recent tasks."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    if status is not None and status not in TASK_STATUSES:
        err.print(f"error: unknown status {status!r} (one of {', '.join(TASK_STATUSES)})", markup=False)
        raise typer.Exit(2)

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.Task]:
        request = pb.ListTasksRequest(limit=limit, status=status or "")
        response: pb.ListTasksResponse = await stub.ListTasks(request, metadata=metadata, timeout=UNARY_TIMEOUT_S)
        return list(response.tasks)

    found = call(context, action)
    if as_json:
        print_json([_fields(t) for t in found])
        return
    if not found:
        err.print("no tasks" + (f" with status {status}" if status else ""), markup=False)
        return
    from rich.text import Text

    columns = [
        Col(c, justify="right" if c in ("attempts", "duration") else "left")
        for c in ("id", "function", "status", "attempts", "pool", "gpu", "worker", "created", "duration")
    ]
    columns.append(Col("error", wrap=True))
    now = time.time()
    print_table(
        columns,
        (
            [
                t.id,
                t.function or t.stub_id or "-",
                Text(t.status, style=_STATUS_STYLE.get(t.status, "")),
                str(t.attempts),
                t.pool or "-",
                t.gpu or "-",
                t.worker_id or "-",
                when(t.created_at, now),
                _duration(t.started_at, t.finished_at, now),
                Text(t.error.strip().splitlines()[0] if t.error.strip() else "", style="red"),
            ]
            for t in found
        ),
    )


def logs(
    task_id: str = typer.Argument(..., metavar="TASK", help="The task's id (see `levers9 tasks`)."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing while the task runs."),
    context: str | None = context_option(),
) -> None:
    """Print a task's output, as the task wrote it."""
    import os

    from levers9.proto.v1 import controlplane_pb2 as pb

    # Bytes, not text: the output is the task's, in whatever encoding it wrote, and a
    # partial line (a progress bar) must show up as soon as it arrives.
    sink = sys.stdout.buffer

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> None:
        stream = stub.StreamLogs(pb.StreamLogsRequest(task_id=task_id, follow=follow), metadata=metadata)
        async for chunk in stream:
            sink.write(chunk.data)
            sink.flush()

    try:
        call(context, action)
    except BrokenPipeError:
        # `levers9 logs T | head`: the reader has what it wanted. Point stdout at /dev/null so
        # the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None


def cancel(
    task_id: str = typer.Argument(..., metavar="TASK", help="The task's id (see `levers9 tasks`)."),
    context: str | None = context_option(),
) -> None:
    """Cancel a task: its worker ends it, with every process it started."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> bool:
        response: pb.CancelTaskResponse = await stub.CancelTask(
            pb.CancelTaskRequest(task_id=task_id), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return response.cancelled

    if call(context, action):
        out.print(f"cancelled {task_id}", markup=False, highlight=False)
    else:
        # not an error: the task ended before the cancel arrived, and keeps the status it ended with
        err.print(f"{task_id} had already finished; nothing to cancel", markup=False, highlight=False)


def pools(
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per pool."),
) -> None:
    """List the controlplane's pools, how isolated their calls are, their workers and why any is unavailable."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.PoolInfo]:
        response: pb.ListPoolsResponse = await stub.ListPools(
            pb.ListPoolsRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.pools)

    found = call(context, action)
    if as_json:
        print_json([_fields(p) for p in found])
        return
    if not found:
        err.print("no pools: the controlplane's config defines none", markup=False)
        return
    from rich.text import Text

    columns = [
        Col(c, justify="right" if c in ("workers", "starting") else "left")
        for c in ("name", "provider", "runtime", "isolation", "gpu", "workers", "starting", "min-max")
    ]
    columns.append(Col("status", wrap=True))
    rows: list[list[Cell]] = []
    for p in found:
        # "none": the pool's calls run as plain processes on the worker's host, with nothing between them
        isolation = p.isolation or "unknown"
        rows.append(
            [
                p.name,
                p.provider,
                p.runtime,
                Text(isolation, style="red" if isolation.startswith("none") else ""),
                f"{p.gpu_count}x {p.gpu}" if p.gpu else "cpu",
                str(p.workers),
                str(p.starting),
                f"{p.min_workers}-{p.max_workers}",
                Text(f"unavailable: {p.unavailable}", style="yellow") if p.unavailable else Text("ok", style="green"),
            ]
        )
    print_table(columns, rows)


def workers(
    pool: str | None = typer.Option(None, "--pool", "-p", help="Only this pool's workers."),
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per worker."),
) -> None:
    """List the workers, with the GPUs, CPU and memory each has free."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.WorkerSummary]:
        response: pb.ListWorkersResponse = await stub.ListWorkers(
            pb.ListWorkersRequest(pool=pool or ""), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.workers)

    found = call(context, action)
    if as_json:
        print_json([_fields(w) for w in found])
        return
    if not found:
        err.print("no workers" + (f" in pool {pool}" if pool else ""), markup=False)
        return
    from rich.text import Text

    columns = [
        Col(c, justify="right" if c == "running" else "left")
        for c in ("id", "pool", "status", "gpu free", "cpu free", "memory free", "running", "machine")
    ]
    print_table(
        columns,
        (
            [
                w.id,
                w.pool,
                Text(w.status, style="green" if w.status == "ready" else ""),
                f"{w.gpu_free}/{w.gpu_total} {w.gpu}" if w.gpu_total else "-",
                f"{w.cpu_free / 1000:g}/{w.cpu_millicores / 1000:g}",
                f"{w.memory_free / 1024:.1f}/{w.memory_mib / 1024:.1f} GiB",
                str(w.running),
                w.machine_id or "-",
            ]
            for w in found
        ),
    )


def _fields(message: Message) -> dict[str, Any]:
    """Every field of a flat message, defaults included, under its proto name: stable keys for scripts.

    Times (``*_at``, epoch seconds on the wire) become ISO 8601 in UTC, ``null`` when not yet.
    """
    fields: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        fields[f.name] = iso(value) if f.name.endswith("_at") and isinstance(value, float) else value
    return fields


def when(epoch: float, now: float) -> str:
    """A timestamp short enough for a table: the time alone when it is today."""
    if not epoch:
        return "-"
    moment = time.localtime(epoch)
    if time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%Y-%m-%d %H:%M", moment)


def _duration(started: float, finished: float, now: float) -> str:
    """How long the task ran, or has been running; ``-`` before it starts."""
    if not started:
        return "-"
    seconds = max(0.0, (finished or now) - started)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
