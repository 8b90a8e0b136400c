"""``levers9 dashboard``: open the dashboard, signed in, from a computer that has a context.

The command asks the controlplane of the current context (its ``http`` URL, with its token) for a one-time
sign-in link (``POST /api/v1/auth/links``) and opens it in the browser; ``--no-browser`` prints it instead. The
link signs in the person the context's token acts for, in its workspace, once and for a short while (the server's
``auth.link_ttl_s``): it is printed on the terminal only, never logged. A token that acts for no person is
refused by the server with the reason, which the command prints (exit 1); no context, or one without an HTTP
address, is exit 2.
"""

from __future__ import annotations

import ssl

import typer

__all__ = ["dashboard"]


def dashboard(
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the sign-in link instead of opening it."),
) -> None:
    """Open the dashboard in the browser, signed in with a one-time link for the current context's person."""
    import webbrowser

    import httpx

    from levers9.sdk.context import ContextError, current_context

    try:
        ctx = current_context()
    except ContextError as exc:
        typer.echo(f"levers9 dashboard: {exc}", err=True)
        raise typer.Exit(2) from None
    if not ctx.http.strip():
        typer.echo(
            f"levers9 dashboard: context {ctx.name!r} has no http address (the controlplane's HTTP URL); "
            "`levers9 up` and `levers9 login` write it",
            err=True,
        )
        raise typer.Exit(2)
    verify: ssl.SSLContext | bool = True
    if ctx.ca_file:
        try:
            verify = ssl.create_default_context(cafile=ctx.ca_file)
        except (OSError, ssl.SSLError) as exc:
            typer.echo(f"levers9 dashboard: context {ctx.name!r}: ca_file {ctx.ca_file}: {exc}", err=True)
            raise typer.Exit(2) from None
    url = f"{ctx.http.rstrip('/')}/api/v1/auth/links"
    try:
        answer = httpx.post(url, headers=dict(ctx.credentials()), verify=verify, timeout=30)
    except httpx.HTTPError as exc:
        typer.echo(f"levers9 dashboard: cannot reach the controlplane at {ctx.http} ({exc}); is it running?", err=True)
        raise typer.Exit(1) from None
    try:
        body = answer.json()
    except ValueError:
        body = None
    if answer.status_code != 201 or not isinstance(body, dict) or not isinstance(body.get("url"), str):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        typer.echo(f"levers9 dashboard: {message or f'HTTP {answer.status_code} from {url}'}", err=True)
        raise typer.Exit(1)
    link = str(body["url"])
    if no_browser or not webbrowser.open(link):
        typer.echo(f"open this link to sign in to the dashboard (it works once): {link}")
    else:
        typer.echo("opened the dashboard in your browser (a one-time sign-in link)")
