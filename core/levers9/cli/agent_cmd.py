"""``levers9 agent join`` and ``levers9 agent run``: the agent a joined machine runs.

``join`` spends the join token ``levers9 machine create`` printed (from
``$LEVERS9_JOIN_TOKEN`` or ``--token-file``, never the command line, where
``ps`` would show it) for the agent's credential, keeps it in
``<state dir>/agent.json`` (0600), then runs the agent; run again on a machine
that already joined, it runs with the saved credential and spends nothing.
``run`` runs from the saved credential (what the service unit starts).

Both run until SIGTERM or SIGINT, which closes the stream and leaves every
worker container running. Exit codes: 0 stopped by a signal; 2 a usage error
(no token, an unreadable CA, a plain-text address without ``--insecure``, no
credential saved); 3 the controlplane refused the join token or the
credential (used, expired, revoked, the machine removed): join again with a
new token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from levers9.agent.credentials import AgentCredential

__all__ = ["JOIN_TOKEN_ENV", "app"]

JOIN_TOKEN_ENV = "LEVERS9_JOIN_TOKEN"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

app = typer.Typer(
    help="The agent of a joined machine: dials the controlplane and runs worker containers.", no_args_is_help=True
)

_STATE_DIR = typer.Option(
    None, "--state-dir", help="Where agent.json is kept (default: $LEVERS9_AGENT_DIR, else /var/lib/levers9/agent "
    "as root, else ~/.levers9/agent).", file_okay=False
)  # fmt: skip
_DOCKER_HOST = typer.Option(
    None, "--docker-host", help="The Docker daemon the workers run on (default: $DOCKER_HOST, else the local socket)."
)
_LOG_LEVEL = typer.Option("info", "--log-level", help="debug, info, warning or error.")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"levers9 agent: {message}", err=True)
    return typer.Exit(code)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=_LOG_FORMAT, stream=sys.stderr)


def _ca_pem(ca: Path | None, ca_b64: str | None) -> str | None:
    if ca is not None and ca_b64 is not None:
        raise _fail("give the controlplane's CA once: --ca FILE or --ca-b64 BASE64, not both")
    if ca is not None:
        try:
            text = ca.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(f"--ca {ca}: cannot read it: {exc}") from None
        where = f"--ca {ca}"
    elif ca_b64 is not None:
        try:
            text = base64.b64decode(ca_b64, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise _fail(f"--ca-b64 is not base64 of a PEM certificate: {exc}") from None
        where = "--ca-b64"
    else:
        return None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise _fail(f"{where} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return text


def _join_token(token_file: Path | None) -> str:
    token = os.environ.pop(JOIN_TOKEN_ENV, "").strip()
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise _fail(f"--token-file {token_file}: cannot read it: {exc.strerror}") from None
    if not token:
        raise _fail(
            f"no join token: set ${JOIN_TOKEN_ENV} (as the command `levers9 machine create` printed does) or pass "
            "--token-file FILE; the token is never taken from the command line"
        )
    return token


def _docker_host(docker_host: str | None) -> str | None:
    return docker_host or os.environ.get("DOCKER_HOST") or None


async def _until_signal(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main`` (a coroutine function taking the stop event) with SIGTERM/SIGINT setting that event."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await main(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _run(credential: AgentCredential, stop: asyncio.Event, docker_host: str | None) -> int:
    from levers9.agent.connection import InsecureRefused
    from levers9.agent.daemon import run_agent

    try:
        return await run_agent(credential, stop, docker_host=docker_host)
    except InsecureRefused as exc:
        typer.echo(f"levers9 agent: {exc}", err=True)
        return 2


@app.command("join")
def join(
    controlplane: str = typer.Option(
        ..., "--controlplane", help="The controlplane's agent address: grpcs://host:port."
    ),
    ca: Path | None = typer.Option(
        None, "--ca", help="PEM file of the CA the controlplane's certificate is signed by.", dir_okay=False
    ),
    ca_b64: str | None = typer.Option(None, "--ca-b64", help="The same CA, base64 of the PEM (the join command's)."),
    state_dir: Path | None = _STATE_DIR,
    docker_host: str | None = _DOCKER_HOST,
    insecure: bool = typer.Option(
        False, "--insecure", help="Allow a plain-text grpc:// controlplane (development only: no TLS, no verification)."
    ),
    token_file: Path | None = typer.Option(
        None, "--token-file", help=f"File holding the join token (else ${JOIN_TOKEN_ENV}).", dir_okay=False
    ),
    log_level: str = _LOG_LEVEL,
) -> None:
    """Join this machine with the token `levers9 machine create` printed, keep the credential, then run the agent."""
    from levers9.agent import credentials
    from levers9.agent.connection import CredentialRefused, InsecureRefused
    from levers9.agent.connection import join as join_controlplane
    from levers9.agent.daemon import EXIT_REFUSED

    _logging(log_level)
    directory = state_dir or credentials.default_state_dir()
    try:
        saved: AgentCredential | None = credentials.load(directory)
    except credentials.NotJoined:
        saved = None
    except credentials.CredentialError as exc:
        raise _fail(str(exc)) from None
    host = _docker_host(docker_host)
    if saved is not None:
        os.environ.pop(JOIN_TOKEN_ENV, None)
        logging.getLogger(__name__).info(
            "this machine already joined as agent %s (%s): running it; the join token is not spent",
            saved.agent_id, directory / credentials.CREDENTIAL_FILE,
        )  # fmt: skip
        raise typer.Exit(asyncio.run(_until_signal(lambda stop: _run(saved, stop, host))))
    token = _join_token(token_file)
    ca_pem = _ca_pem(ca, ca_b64)

    async def main(stop: asyncio.Event) -> int:
        try:
            credential = await join_controlplane(controlplane, token, ca_pem=ca_pem, insecure=insecure, stop=stop)
        except InsecureRefused as exc:
            typer.echo(f"levers9 agent: {exc}", err=True)
            return 2
        except CredentialRefused as exc:
            typer.echo(f"levers9 agent: {exc}", err=True)
            return EXIT_REFUSED
        if credential is None:
            return 0
        path = credentials.save(directory, credential)
        typer.echo(f"joined as agent {credential.agent_id}; credential kept in {path}", err=True)
        return await _run(credential, stop, host)

    raise typer.Exit(asyncio.run(_until_signal(main)))


@app.command("run")
def run(state_dir: Path | None = _STATE_DIR, docker_host: str | None = _DOCKER_HOST,
        log_level: str = _LOG_LEVEL) -> None:  # fmt: skip
    """Run the agent from the credential `levers9 agent join` saved (what the service unit runs)."""
    from levers9.agent import credentials

    _logging(log_level)
    directory = state_dir or credentials.default_state_dir()
    try:
        credential = credentials.load(directory)
    except credentials.CredentialError as exc:
        raise _fail(str(exc)) from None
    host = _docker_host(docker_host)
    raise typer.Exit(asyncio.run(_until_signal(lambda stop: _run(credential, stop, host))))
