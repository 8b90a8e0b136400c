"""``levers9 context``: the controlplanes this user can reach, and which one commands use.

Tokens are never printed: ``list`` says whether a context has one, which is what
a person debugging "unauthenticated" needs, without putting the secret on screen.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

from levers9.cli.output import Col, err, out, print_json, print_table

#: the default of --reconnect-s (levers9.sdk.context.DEFAULT_RECONNECT_S, not imported here: the CLI starts lazily)
DEFAULT_RECONNECT_S = 120.0

app = typer.Typer(help="Manage client contexts: which controlplane commands and the SDK talk to.", no_args_is_help=True)


@app.command("list")
def list_contexts(as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per context.")) -> None:
    """List the contexts; the current one is marked with '*'."""
    from levers9.sdk.context import ContextError, load_contexts

    try:
        contexts = load_contexts()
    except ContextError as exc:
        _fail(exc)
    rows = sorted(contexts.contexts.values(), key=lambda c: c.name)
    if as_json:
        print_json(
            [
                {
                    "name": c.name,
                    "current": c.name == contexts.current,
                    "grpc": c.grpc,
                    "http": c.http,
                    "workspace": c.workspace,
                    "token": bool(c.token),
                    "ca_file": c.ca_file,
                    "reconnect_s": c.reconnect_s,
                }
                for c in rows
            ]
        )
        return
    if not rows:
        err.print("no contexts: run `levers9 up` (one machine) or `levers9 context add ...`", markup=False)
        return
    print_table(
        [Col(c) for c in ("", "name", "grpc", "http", "workspace", "token")],
        (
            [
                "*" if c.name == contexts.current else "",
                c.name,
                c.grpc,
                c.http or "-",
                c.workspace or "-",
                "set" if c.token else "-",
            ]
            for c in rows
        ),
    )


@app.command("use")
def use(name: str = typer.Argument(..., help="The context to make current.")) -> None:
    """Make NAME the context that commands and the SDK use by default."""
    from levers9.sdk.context import ContextError, use_context

    try:
        ctx = use_context(name)
    except ContextError as exc:
        _fail(exc)
    out.print(f"using context {ctx.name!r} ({ctx.grpc})", markup=False)


@app.command("add")
def add(
    name: str = typer.Argument(..., help="A name for the controlplane, e.g. 'local' or 'team'."),
    grpc: str = typer.Option(
        ...,
        "--grpc",
        help="The controlplane's gRPC address: HOST:PORT, or grpcs://HOST[:PORT] for TLS; "
        "every replica's, comma-separated, when there are several.",
    ),
    token: str = typer.Option(..., "--token", help="The API token; '-' reads it from standard input."),
    http: str = typer.Option("", "--http", help="The controlplane's HTTP URL, e.g. http://127.0.0.1:1994."),
    workspace: str = typer.Option("", "--workspace", help="The token's workspace, for display."),
    environment: str = typer.Option(
        "", "--environment", "--env", help="The environment of the workspace to act in (default: main)."
    ),
    ca_file: str = typer.Option(
        "", "--ca-file", help="PEM CA bundle that verifies the controlplane's certificate (default: system CAs)."
    ),
    reconnect_s: float = typer.Option(
        DEFAULT_RECONNECT_S, "--reconnect-s", help="Seconds a call keeps trying to reach any replica before failing."
    ),
) -> None:
    """Add or replace a context and make it current."""
    from levers9.sdk.context import Context, ContextError, save_context

    if ca_file:
        ca_file = str(Path(ca_file).expanduser().resolve())  # the SDK may run from any directory

    if token == "-":
        # Keeps the token out of shell history and the process list.
        token = sys.stdin.readline().strip()
        if not token:
            err.print("error: no token on standard input", markup=False)
            raise typer.Exit(1)
    try:
        context = Context(
            name=name,
            grpc=grpc.strip(),
            http=http,
            token=token,
            workspace=workspace,
            environment=environment,
            ca_file=ca_file,
            reconnect_s=reconnect_s,
        )
        path = save_context(context)
    except ContextError as exc:
        _fail(exc)
    out.print(f"context {name!r} saved in {path}; it is now current", markup=False)


@app.command("show")
def show(
    name: str | None = typer.Argument(None, help="The context (default: the current one)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    offline: bool = typer.Option(False, "--offline", help="Do not ask the controlplane who the token acts as."),
) -> None:
    """The context commands use: its addresses, workspace, environment, and (asked of the controlplane) the role
    and person its token acts as. Never the token."""
    from levers9.sdk.context import ContextError, current_context

    try:
        ctx = current_context(name)
    except ContextError as exc:
        _fail(exc)
    shown: dict[str, object] = {
        "name": ctx.name,
        "grpc": ctx.grpc,
        "http": ctx.http or None,
        "workspace": ctx.workspace or None,
        "environment": ctx.environment or "main",
        "token": bool(ctx.token),
        "ca_file": ctx.ca_file or None,
    }
    if not offline and ctx.http and ctx.token:
        from levers9.cli.rest_client import Rest, RestFailed

        try:
            client = Rest(ctx)
            try:
                me = client.get("/me")
            finally:
                client.close()
            shown.update(workspace=me["workspace"], environment=me["environment"], role=me["role"])
            shown["person"] = me["email"] or None
        except RestFailed as exc:
            shown["server"] = f"not asked: {exc}"
    if as_json:
        print_json(shown)
        return
    for key, value in shown.items():
        text = ("yes" if value else "no") if key == "token" else ("-" if value is None else str(value))
        out.print(f"{key + ':':<13}{text}", markup=False, highlight=False)


@app.command("remove")
def remove(name: str = typer.Argument(..., help="The context to forget.")) -> None:
    """Forget a context; when it was current, no context is current until `levers9 context use`."""
    from levers9.sdk.context import ContextError, load_contexts, remove_context

    try:
        was_current = load_contexts().current == name
        remove_context(name)
    except ContextError as exc:
        _fail(exc)
    note = "; no context is current now (`levers9 context use NAME`)" if was_current else ""
    out.print(f"context {name!r} removed{note}", markup=False)


def _fail(exc: Exception) -> NoReturn:
    err.print(f"error: {exc}", markup=False)
    raise typer.Exit(1) from None
