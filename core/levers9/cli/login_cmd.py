"""``levers9 login``: sign the CLI in through the browser and save a context (RFC 8252 loopback, RFC 7636 PKCE).

How it goes:

1. the command listens on ``127.0.0.1`` on a port the system picks, and makes a random ``state`` and a PKCE
   verifier, of which only the S256 challenge leaves this process;
2. it opens (or, with ``--no-browser``, prints) ``URL/auth/cli/start?port=P&state=S&code_challenge=C&
   code_challenge_method=S256[&env=ENV]``; the person signs in to the dashboard if they are not yet and allows
   the CLI, and the dashboard sends the browser to ``http://127.0.0.1:P/callback?code=...&state=S``;
3. the command checks the state, then trades the code and the verifier for a token with
   ``POST URL/auth/cli/exchange``, and saves a context (``--name``) with the controlplane's addresses, the
   token, the workspace and the environment (and the controlplane's CA, when it names one).

Invariants: the token is never in a URL, on the screen or in a log (the callback carries a one-time code that is
useless without the verifier, which never leaves this process but in the exchange's body); the exchange is only
sent over HTTPS, or to a loopback address; a callback with another state is refused and waited past (it may
be someone else's page poking at the port); nothing is written until the exchange succeeded. Failures print one
line and exit 1 (the sign-in failed or timed out) or 2 (a bad option, no address to sign in to).
"""

from __future__ import annotations

import http.server
import os
import secrets
import socket
import ssl
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import typer

from levers9.addresses import is_loopback

__all__ = ["login"]

#: how long the command waits for the browser, by default
WAIT_S = 600.0

_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>levers9 login</title>
<link rel="icon" href="data:,"></head><body><h1>{title}</h1><p>{text}</p></body></html>"""


class _Callback:
    """What the browser brought back to the loopback port: the first callback with the right state."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.code: str | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        callback = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: the callback URL has the code
                return

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                if url.path != "/callback" or callback.done.is_set():
                    self._answer(404, "Not here", "This is levers9 login's callback; nothing else is served.")
                    return
                if query.get("state") != callback.state:
                    self._answer(400, "Not this sign-in", "This answer is not for the levers9 login waiting here.")
                    return
                if query.get("code"):
                    callback.code = query["code"]
                    self._answer(200, "levers9 login", "Back to the terminal: levers9 login finishes there.")
                else:
                    callback.error = query.get("error") or "the dashboard sent no code"
                    self._answer(200, "levers9 login", "The sign-in did not complete; the terminal says why.")
                callback.done.set()

            def _answer(self, status: int, title: str, text: str) -> None:
                body = _PAGE.format(title=title, text=text).encode()
                self.send_response(status)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.send_header("cache-control", "no-store")
                self.send_header("referrer-policy", "no-referrer")
                self.end_headers()
                self.wfile.write(body)

        return Handler


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"levers9 login: {message}", err=True)
    return typer.Exit(code)


def _address(url: str | None, context: str | None) -> tuple[str, str]:
    """(the dashboard's base URL, the CA file to verify it with) from ``--url`` or the current context."""
    from levers9.sdk.context import ContextError, current_context

    if url:
        ca_file = ""
    else:
        try:
            ctx = current_context(context)
        except ContextError as exc:
            raise _fail(f"{exc}; or name the controlplane with --url https://HOST", 2) from None
        if not ctx.http:
            raise _fail(f"context {ctx.name!r} has no http address: name the controlplane with --url https://HOST", 2)
        url, ca_file = ctx.http, ctx.ca_file
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"--url: {url!r} is not an address like https://levers9.example.com", 2)
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise _fail(
            f"--url: {url!r} is plain http: the sign-in's token would cross the network in clear; use https:// "
            "(plain http is only for a controlplane on this computer)",
            2,
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", "")), ca_file


def login(
    url: str | None = typer.Option(
        None, "--url", help="The dashboard's address (https://HOST); default: the current context's http address."
    ),
    name: str = typer.Option("default", "--name", help="The context to write (it becomes the current one)."),
    env: str = typer.Option("", "--env", help="The environment of the workspace the context acts in (default main)."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Print the sign-in URL instead of opening a browser."),
    timeout: float = typer.Option(WAIT_S, "--timeout", help="Seconds to wait for the sign-in in the browser."),
) -> None:
    """Sign in with the browser and save a context with a token of your own (the token is never shown)."""
    import webbrowser

    from levers9.dashboard.auth_codes import s256
    from levers9.sdk.context import Context, ContextError, save_context

    if not name.strip():
        raise _fail("--name: a context needs a name", 2)
    if not timeout > 0:
        raise _fail(f"--timeout: expected a number of seconds above 0, got {timeout}", 2)
    base, ca_file = _address(url, os.environ.get("LEVERS9_CONTEXT") or None)
    state = secrets.token_urlsafe(24)
    verifier = secrets.token_urlsafe(48)
    callback = _Callback(state)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), callback.handler())
    thread = threading.Thread(target=server.serve_forever, name="levers9 login callback", daemon=True)
    thread.start()
    try:
        query: dict[str, str] = {
            "port": str(server.server_address[1]),
            "state": state,
            "code_challenge": s256(verifier),
            "code_challenge_method": "S256",
        }
        if env.strip():
            query["env"] = env.strip().lower()
        start = f"{base}/auth/cli/start?{urllib.parse.urlencode(query)}"
        if no_browser or not webbrowser.open(start):
            typer.echo(f"open this URL in a browser to sign in:\n{start}")
        else:
            typer.echo(f"opened {base} in your browser: sign in there and allow the CLI")
        if not callback.done.wait(timeout):
            raise _fail(f"no sign-in came back within {timeout:g} s; run levers9 login again")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    if callback.code is None:
        raise _fail(f"the sign-in did not complete: {callback.error}")
    answer = _exchange(base, ca_file, callback.code, verifier)
    try:
        saved_ca = _save_ca(name, answer.get("ca_pem"))
        path = save_context(
            Context(
                name=name,
                grpc=str(answer["grpc"]),
                http=base,
                token=str(answer["token"]),
                workspace=str(answer.get("workspace", "")),
                environment="" if answer.get("environment") in (None, "", "main") else str(answer["environment"]),
                ca_file=saved_ca or ca_file,
            )
        )
    except (ContextError, KeyError, OSError) as exc:
        raise _fail(f"the context could not be written: {exc}") from None
    where = f", environment {answer['environment']}" if answer.get("environment") not in (None, "", "main") else ""
    typer.echo(
        f"signed in as {answer.get('email', '?')} in workspace {answer.get('workspace', '?')}{where} "
        f"({answer.get('role', '?')}); context {name!r} written to {path}"
    )


def _exchange(base: str, ca_file: str, code: str, verifier: str) -> dict[str, Any]:
    """The exchange's answer (token, workspace, environment, email, addresses); exits on a refusal."""
    import httpx

    verify: ssl.SSLContext | bool = True
    if ca_file:
        try:
            verify = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _fail(f"ca_file {ca_file}: {exc}") from None
    try:
        answer = httpx.post(
            f"{base}/auth/cli/exchange",
            json={"code": code, "code_verifier": verifier, "hostname": socket.gethostname()},
            verify=verify,
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach {base} to finish the sign-in ({type(exc).__name__})") from None
    try:
        body = answer.json()
    except ValueError:
        body = None
    if answer.status_code != 200 or not isinstance(body, dict) or not body.get("token") or not body.get("grpc"):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else f"HTTP {answer.status_code}"
        raise _fail(f"the sign-in code was not accepted: {message}")
    return body


def _save_ca(name: str, pem: object) -> str:
    """The controlplane's CA (PEM) written beside the context file, for the context's ca_file; "" without one."""
    if not isinstance(pem, str) or not pem.strip():
        return ""
    from levers9.config.model import default_home

    path = Path(default_home()) / f"ca-{''.join(c if c.isalnum() or c in '-_' else '_' for c in name)}.pem"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pem)
    return str(path)
