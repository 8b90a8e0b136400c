"""``levers9 sandbox list/create/exec/logs/kill/snapshots/delete-snapshot``: a workspace's sandboxes from the terminal.

Each command is the SDK's (:mod:`levers9.sdk.sandbox`) over the controlplane's REST API, so the context
needs its ``http`` field. ``exec ID -- CMD...`` starts ``CMD`` in the sandbox, copies its stdout and
stderr to this terminal's as the lines come, and exits with its exit code (128 + N when signal N ended
it; Ctrl-C sends it SIGTERM first). ``logs ID [PID]`` prints the output of the sandbox's processes (or of
one): the REST API hands a process's output out once, to one reader, so it shows what nobody has read
yet, and stops once nothing more came for :data:`LOGS_IDLE_S` (``--follow``: until the processes end).
Errors exit 1 with the controlplane's words; a command's usage errors exit 2.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from levers9.cli.client_cmds import context_option, when
from levers9.cli.output import Col, err, failed, out, print_json, print_table

if TYPE_CHECKING:
    from levers9.sdk.sandbox import SandboxInstance
    from levers9.sdk.sandbox_process import SandboxProcess

__all__ = ["LOGS_IDLE_S", "app"]

#: ``logs`` without ``--follow`` stops reading a running process once it wrote nothing for this long
LOGS_IDLE_S = 1.0

T = TypeVar("T")

app = typer.Typer(
    help="Sandboxes: containers driven from Python (levers9.Sandbox), listed, run in and ended from here.",
    no_args_is_help=True,
)


def _guarded(action: Callable[[], T]) -> T:
    """``action``'s result; the SDK's errors (refused, not found, unreachable, no context) exit 1, explained."""
    from levers9.hooks.errors import Levers9Error

    try:
        return action()
    except (Levers9Error, OSError, ValueError) as exc:
        raise failed(str(exc)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _sandbox(sandbox_id: str, context: str | None) -> SandboxInstance:
    import levers9

    return _guarded(lambda: levers9.Sandbox(context=context).connect(sandbox_id))


def _age(info: dict[str, Any], now: float) -> str:
    started = float(info.get("created_at") or 0)
    if not started:
        return "-"
    seconds = max(0.0, (float(info.get("ended_at") or 0) or now) - started)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


@app.command("list")
def list_(
    include_ended: bool = typer.Option(False, "--all", "-a", help="Ended sandboxes too."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: each sandbox's info as the REST API gives it."),
    context: str | None = context_option(),
) -> None:
    """List the workspace's sandboxes."""
    from levers9.sdk.sandbox import list_sandboxes

    found = _guarded(lambda: list_sandboxes(context, include_ended=include_ended))
    if as_json:
        print_json(found)
        return
    if not found:
        err.print("no sandboxes in this workspace (start one with levers9.Sandbox().create())", markup=False)
        return
    now = time.time()
    columns = [Col("id"), Col("name"), Col("pool"), Col("state"), Col("created"), Col("age", justify="right")]
    rows = (
        [
            str(s.get("id", "")),
            str(s.get("name") or "-"),
            str(s.get("pool") or "-"),
            str(s.get("state", "")) + (f" ({s['reason']})" if s.get("reason") else ""),
            when(float(s.get("created_at") or 0), now),
            _age(s, now),
        ]
        for s in found
    )
    print_table(columns, rows)


@app.command("create")
def create(
    image: str = typer.Option("host", "--image", help="An image ref, or host (the worker's own filesystem)."),
    cpu: str = typer.Option("1", "--cpu", help="Cores (0.5, 2) or millicores (500m)."),
    memory: str = typer.Option("128", "--memory", help="MiB (512) or a size (1Gi)."),
    timeout: float = typer.Option(600, "--timeout", help="Seconds it lives; -1 until killed."),
    name: str | None = typer.Option(None, "--name", help="A name to find it by in `sandbox list`."),
    pool: str | None = typer.Option(None, "--pool", help="The pool to run it on (default: the first with sandboxes)."),
    gpu: list[str] | None = typer.Option(
        None,
        "--gpu",
        help="A GPU type; repeat it for a preference (--gpu H100 --gpu A100-80), end with cpu to fall back.",
    ),
    gpu_count: int | None = typer.Option(None, "--gpu-count", help="GPUs it takes (1, 2, 4 or 8; 1 with --gpu)."),
    context: str | None = context_option(),
) -> None:
    """Start a sandbox and print its id (drive it with `sandbox exec`, or levers9.Sandbox().connect(ID))."""
    import levers9

    sandbox = _guarded(
        lambda: levers9.Sandbox(
            image=image,
            cpu=cpu,
            memory=memory,
            gpu=gpu or None,
            gpu_count=gpu_count,
            keep_warm_seconds=timeout,
            name=name,
            pool=pool,
            context=context,
        ).create()
    )
    out.print(sandbox.id, markup=False, highlight=False)


def _copy(process: SandboxProcess, idle_timeout: float | None) -> None:
    """Write the process's lines to this terminal's stdout and stderr, as they come."""
    for stream, line in process.output(idle_timeout):
        sink = sys.stdout if stream == "stdout" else sys.stderr
        sink.write(line)
        sink.flush()


@app.command("exec")
def exec_(
    sandbox_id: str = typer.Argument(..., metavar="ID"),
    command: list[str] = typer.Argument(..., metavar="-- CMD...", help="The program and its arguments."),
    cwd: str | None = typer.Option(None, "--cwd", help="The directory to run it in (an absolute path)."),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=VALUE, added to its environment; repeatable."),
    context: str | None = context_option(),
) -> None:
    """Run a command in a sandbox, stream its output here, and exit with its exit code."""
    variables = {}
    for pair in env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise failed(f"--env {pair!r}: expected NAME=VALUE", 2)
        variables[key] = value
    sandbox = _sandbox(sandbox_id, context)
    process = _guarded(lambda: sandbox.process.exec(*command, cwd=cwd, env=variables or None))
    try:
        _guarded(lambda: _copy(process, None))
        code = _guarded(process.wait)
    except typer.Exit as stop:
        if stop.exit_code == 130:
            err.print(f"interrupted: sending SIGTERM to process {process.pid}", markup=False)
            _guarded(lambda: process.kill(signal.SIGTERM))
        raise
    raise typer.Exit(code if code >= 0 else 128 - code)


@app.command("logs")
def logs(
    sandbox_id: str = typer.Argument(..., metavar="ID"),
    pid: int | None = typer.Argument(None, metavar="[PID]", help="One process (its pid in the sandbox)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep reading until the processes end."),
    context: str | None = context_option(),
) -> None:
    """Print the output of the sandbox's processes that nobody has read yet (each process's output is read once)."""
    sandbox = _sandbox(sandbox_id, context)
    found = _guarded(sandbox.process.list_processes)
    if pid is not None:
        if pid not in found:
            known = ", ".join(str(p) for p in sorted(found)) or "none"
            raise failed(f"no process with pid {pid} in sandbox {sandbox_id} (its processes' pids: {known})")
        found = {pid: found[pid]}
    if not found:
        err.print(f"sandbox {sandbox_id} has run no processes", markup=False)
        return
    for number, process in sorted(found.items()):
        if len(found) > 1:
            err.print(f"==> process {number}: {' '.join(process.args)}", markup=False, highlight=False)
        idle = None if follow else LOGS_IDLE_S

        def copy(p: SandboxProcess = process, idle_timeout: float | None = idle) -> None:
            _copy(p, idle_timeout)

        _guarded(copy)


@app.command("kill")
def kill(sandbox_id: str = typer.Argument(..., metavar="ID"), context: str | None = context_option()) -> None:
    """End a sandbox and everything in it."""
    from levers9.sdk.sandbox import SandboxInstance
    from levers9.sdk.sandbox_http import transport_for

    def terminate() -> bool:
        http = transport_for(context)
        return SandboxInstance(http, {"id": sandbox_id}).terminate()

    if _guarded(terminate):
        out.print(f"terminated sandbox {sandbox_id}", markup=False, highlight=False)
    else:
        out.print(f"sandbox {sandbox_id} had ended already", markup=False, highlight=False)


@app.command("snapshots")
def snapshots(
    as_json: bool = typer.Option(False, "--json", help="Print JSON: each snapshot as the REST API gives it."),
    context: str | None = context_option(),
) -> None:
    """List the workspace's stored sandbox snapshots (taken with snapshot_memory())."""
    from levers9.sdk.sandbox import list_snapshots

    found = _guarded(lambda: list_snapshots(context))
    if as_json:
        print_json(found)
        return
    if not found:
        err.print("no sandbox snapshots in this workspace", markup=False)
        return
    now = time.time()
    columns = [Col("id"), Col("sandbox"), Col("pool"), Col("size", justify="right"), Col("created")]
    rows = (
        [
            str(s.get("id", "")),
            str(s.get("sandbox_id") or "-"),
            str(s.get("pool") or "-"),
            _size(int(s.get("size_bytes") or 0)),
            when(float(s.get("created_at") or 0), now),
        ]
        for s in found
    )
    print_table(columns, rows)


@app.command("delete-snapshot")
def delete_snapshot(
    snapshot_id: str = typer.Argument(..., metavar="SNAPSHOT"), context: str | None = context_option()
) -> None:
    """Delete a stored sandbox snapshot."""
    from levers9.sdk.sandbox import delete_snapshot as delete

    _guarded(lambda: delete(snapshot_id, context))
    out.print(f"deleted snapshot {snapshot_id}", markup=False, highlight=False)


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def register(root: Any) -> None:
    """Add the ``sandbox`` group to the top-level app."""
    root.add_typer(app, name="sandbox")
