"""``levers9 agent join`` and ``levers9 agent run``: the agent of a joined machine or of an attached cluster.

``join`` spends the join token ``levers9 machine create`` (or ``levers9
cluster join``) printed, from ``$LEVERS9_JOIN_TOKEN`` or ``--token-file``,
never the command line, where ``ps`` would show it, for the agent's
credential, keeps it, then runs the agent; run again where it already joined,
it runs with the kept credential and spends nothing. ``run`` runs from the
kept credential (what the service unit starts). Two modes:

* a machine's agent (the default): the workers are containers on Docker
  (``--docker-host``); the credential is ``<state dir>/agent.json`` (0600,
  ``--state-dir``);
* ``--kubernetes``: the agent runs in (or, with ``--kubeconfig``, beside) a
  cluster and the workers are Jobs in its namespace (``--namespace``, default
  the pod's own); the credential is the Secret ``levers9-agent-credential``
  there (:mod:`levers9.agent.k8s_credential`), so a restarted pod needs no new
  token. The API is reached with the pod's service account, or with
  ``--kubeconfig`` (else ``$KUBECONFIG``) and ``--context``.

Options of one mode given in the other are refused, naming them. Both run
until SIGTERM or SIGINT, which closes the stream and leaves every worker
running. Exit codes: 0 stopped by a signal; 2 a usage error (no token, an
unreadable CA, a plain-text address without ``--insecure``, no credential
kept, a credential file or Secret that is not what a join wrote, no namespace
outside a pod, an API that refuses the agent's service account); 3 the
controlplane refused the join token or the credential (used, expired,
revoked, the machine or cluster removed): join again with a new token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from levers9.agent.credentials import AgentCredential
    from levers9.agent.daemon import KubernetesMode
    from levers9.agent.k8s_credential import CredentialSecret

__all__ = ["JOIN_TOKEN_ENV", "app"]

JOIN_TOKEN_ENV = "LEVERS9_JOIN_TOKEN"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: a namespace's name (an RFC 1123 label)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

app = typer.Typer(
    help="The agent of a joined machine or an attached cluster: dials the controlplane and runs workers.",
    no_args_is_help=True,
)

_STATE_DIR = typer.Option(
    None,
    "--state-dir",
    help="Where agent.json is kept (default: $LEVERS9_AGENT_DIR, else /var/lib/levers9/agent "
    "as root, else ~/.levers9/agent).",
    file_okay=False,
)
_DOCKER_HOST = typer.Option(
    None, "--docker-host", help="The Docker daemon the workers run on (default: $DOCKER_HOST, else the local socket)."
)
_LOG_LEVEL = typer.Option("info", "--log-level", help="debug, info, warning or error.")
_KUBERNETES = typer.Option(
    False,
    "--kubernetes",
    help="Kubernetes mode: the workers are Jobs in the agent's namespace, the credential the "
    "Secret levers9-agent-credential there.",
)
_NAMESPACE_OPTION = typer.Option(
    None,
    "--namespace",
    help="Kubernetes mode: the namespace of the credential and the worker Jobs (default: the pod's own).",
)
_KUBECONFIG = typer.Option(
    None,
    "--kubeconfig",
    help="Kubernetes mode: reach the API with this kubeconfig (else $KUBECONFIG, else the pod's service account).",
    dir_okay=False,
)
_CONTEXT = typer.Option(None, "--context", help="Kubernetes mode: the kubeconfig's context (default: its current one).")
_ALLOW_PRIVILEGED = typer.Option(
    False,
    "--allow-privileged",
    help="Kubernetes mode: worker Jobs may run privileged containers (the runc and gvisor runtimes need it).",
)
_SHARE_NAMESPACE = typer.Option(
    False,
    "--share-namespace",
    help="Kubernetes mode: start even when the namespace holds another levers9 pool's "
    "worker Jobs (each acts on its own only).",
)
_POLL_S = typer.Option(
    None,
    "--poll-s",
    help="Seconds between looks for a changed inventory (default: 2 on Docker, 10 in Kubernetes mode).",
    show_default=False,
)


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


async def _run(credential: AgentCredential, stop: asyncio.Event, backend: _Backend) -> int:
    from levers9.agent.connection import InsecureRefused
    from levers9.agent.daemon import run_agent

    try:
        return await run_agent(
            credential, stop, docker_host=backend.docker_host, kubernetes=backend.kubernetes, poll_s=backend.poll_s
        )
    except InsecureRefused as exc:
        typer.echo(f"levers9 agent: {exc}", err=True)
        return 2


# ------------------------------------------------------------------------------------------ the two modes


@dataclass(frozen=True)
class _Backend:
    """Where the workers run: Docker (``kubernetes`` None) or Jobs in a namespace; ``poll_s`` None: the default."""

    docker_host: str | None = None
    kubernetes: KubernetesMode | None = None
    poll_s: float | None = None


def _backend(
    *,
    kubernetes: bool,
    namespace: str | None,
    kubeconfig: Path | None,
    context: str | None,
    allow_privileged: bool,
    state_dir: Path | None,
    docker_host: str | None,
    poll_s: float | None,
    share_namespace: bool = False,
) -> _Backend:
    """The options checked against the mode they belong to, as the backend they choose."""
    if poll_s is not None and not (poll_s > 0 and math.isfinite(poll_s)):  # NaN fails this too
        raise _fail(f"--poll-s must be a number of seconds above 0, got {poll_s}")
    if not kubernetes:
        given = [
            name
            for name, value in (
                ("--namespace", namespace),
                ("--kubeconfig", kubeconfig),
                ("--context", context),
                ("--allow-privileged", allow_privileged or None),
                ("--share-namespace", share_namespace or None),
            )
            if value is not None
        ]
        if given:
            raise _fail(f"Kubernetes mode's options ({', '.join(given)}) need --kubernetes: add it, or leave them out")
        return _Backend(docker_host=_docker_host(docker_host), poll_s=poll_s)
    from levers9.agent.daemon import KubernetesMode
    from levers9.agent.k8s_credential import SECRET_NAME, SERVICE_ACCOUNT_NAMESPACE, own_namespace

    given = [name for name, value in (("--state-dir", state_dir), ("--docker-host", docker_host)) if value is not None]
    if given:
        raise _fail(
            f"a machine's agent's options ({', '.join(given)}) do not apply in Kubernetes mode: there the workers "
            f"are Jobs and the credential is kept in Secret {SECRET_NAME} of the agent's namespace"
        )
    namespace = namespace if namespace is not None else own_namespace()
    if namespace is None:
        raise _fail(
            f"--namespace is needed: this process does not run in a pod ({SERVICE_ACCOUNT_NAMESPACE} does not "
            "exist), so name the namespace the agent keeps its credential and creates its worker Jobs in"
        )
    if not _NAMESPACE.match(namespace):
        raise _fail(
            f"--namespace {namespace!r} is not a namespace name: 1-63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return _Backend(
        kubernetes=KubernetesMode(
            namespace,
            api_client_factory=_api_client_factory(kubeconfig, context),
            allow_privileged=allow_privileged,
            share_namespace=share_namespace,
        ),
        poll_s=poll_s,
    )


def _api_client_factory(kubeconfig: Path | None, context: str | None) -> Callable[[], Any] | None:
    """None: the pod's service account; else the kubeconfig's (--kubeconfig, else $KUBECONFIG) client."""
    from functools import partial

    from levers9.agent.k8s_api import kubeconfig_client

    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise _fail(f"--kubeconfig {kubeconfig}: no such file")
        return partial(kubeconfig_client, str(kubeconfig), context)
    from_env = os.environ.get("KUBECONFIG", "").strip()
    if from_env:
        return partial(kubeconfig_client, from_env, context)
    if context is not None:
        raise _fail("--context names a context of a kubeconfig: give --kubeconfig FILE (or set $KUBECONFIG) too")
    return None


async def _k8s_credential(secret: CredentialSecret, stop: asyncio.Event) -> AgentCredential | None:
    """The credential the Secret holds; None when there is none. :raises typer.Exit: it cannot be read, or a stop
    signal came first."""
    from levers9.agent import credentials
    from levers9.agent.k8s_credential import SecretUnavailable, read_credential

    try:
        credential = await read_credential(secret, stop)
    except credentials.NotJoined:
        return None
    except (credentials.CredentialError, SecretUnavailable) as exc:
        raise _fail(str(exc)) from None
    if credential is None:
        raise typer.Exit(0)
    return credential


async def _k8s_keep(secret: CredentialSecret, credential: AgentCredential, stop: asyncio.Event) -> None:
    """Keep the new credential in the Secret. :raises typer.Exit: another pod joined meanwhile."""
    from levers9.agent import credentials
    from levers9.agent.k8s_credential import SecretUnavailable, keep_credential

    try:
        kept = await keep_credential(secret, credential, stop)
    except credentials.CredentialError as exc:
        raise _fail(str(exc)) from None
    except SecretUnavailable as exc:
        logging.getLogger(__name__).error(
            "joined as agent %s but could not keep its credential in %s: %s. This agent runs; if the pod restarts "
            "it needs a new join token (let the agent's service account create Secrets in namespace %s)",
            credential.agent_id,
            secret.name,
            exc,
            secret.namespace,
        )
        return
    if kept:
        typer.echo(f"joined as agent {credential.agent_id}; credential kept in {secret.name}", err=True)
    else:
        logging.getLogger(__name__).error(
            "stopped before agent %s's credential was kept in %s: the next start needs a new join token",
            credential.agent_id,
            secret.name,
        )


def _k8s_secret(backend: _Backend) -> CredentialSecret:
    from levers9.agent.k8s_api import in_cluster_client
    from levers9.agent.k8s_credential import CredentialSecret

    assert backend.kubernetes is not None
    mode = backend.kubernetes
    return CredentialSecret(mode.api_client_factory or in_cluster_client, mode.namespace)


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
    kubernetes: bool = _KUBERNETES,
    namespace: str | None = _NAMESPACE_OPTION,
    kubeconfig: Path | None = _KUBECONFIG,
    context: str | None = _CONTEXT,
    allow_privileged: bool = _ALLOW_PRIVILEGED,
    share_namespace: bool = _SHARE_NAMESPACE,
    poll_s: float | None = _POLL_S,
    log_level: str = _LOG_LEVEL,
) -> None:
    """Join with the token `levers9 machine create` (or `levers9 cluster join`) printed, keep the credential, then
    run the agent; an agent that joined already runs with its credential and spends no token."""
    from levers9.agent import credentials

    _logging(log_level)
    backend = _backend(
        kubernetes=kubernetes,
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
        allow_privileged=allow_privileged,
        state_dir=state_dir,
        docker_host=docker_host,
        poll_s=poll_s,
        share_namespace=share_namespace,
    )
    if backend.kubernetes is not None:
        secret = _k8s_secret(backend)

        async def in_kubernetes(stop: asyncio.Event) -> int:
            try:
                credential = await _k8s_credential(secret, stop)
                if credential is not None:
                    _already_joined(credential, secret.name)
                else:
                    joined = await _join(controlplane, _join_token(token_file), _ca_pem(ca, ca_b64), insecure, stop)
                    if isinstance(joined, int):
                        return joined
                    await _k8s_keep(secret, joined, stop)
                    credential = joined
            finally:
                secret.close()
            return await _run(credential, stop, backend)

        raise typer.Exit(asyncio.run(_until_signal(in_kubernetes)))

    directory = state_dir or credentials.default_state_dir()
    try:
        saved: AgentCredential | None = credentials.load(directory)
    except credentials.NotJoined:
        saved = None
    except credentials.CredentialError as exc:
        raise _fail(str(exc)) from None
    if saved is not None:
        _already_joined(saved, str(directory / credentials.CREDENTIAL_FILE))
        raise typer.Exit(asyncio.run(_until_signal(lambda stop: _run(saved, stop, backend))))
    token = _join_token(token_file)
    ca_pem = _ca_pem(ca, ca_b64)

    async def main(stop: asyncio.Event) -> int:
        joined = await _join(controlplane, token, ca_pem, insecure, stop)
        if isinstance(joined, int):
            return joined
        path = credentials.save(directory, joined)
        typer.echo(f"joined as agent {joined.agent_id}; credential kept in {path}", err=True)
        return await _run(joined, stop, backend)

    raise typer.Exit(asyncio.run(_until_signal(main)))


def _already_joined(saved: AgentCredential, where: str) -> None:
    os.environ.pop(JOIN_TOKEN_ENV, None)
    logging.getLogger(__name__).info(
        "this agent already joined as agent %s (%s): running it; the join token is not spent", saved.agent_id, where
    )


async def _join(
    controlplane: str, token: str, ca_pem: str | None, insecure: bool, stop: asyncio.Event
) -> AgentCredential | int:
    """The credential Join answered for ``token``, or the exit code: 0 stopped first, 2 plain text, 3 refused."""
    from levers9.agent.connection import CredentialRefused, InsecureRefused
    from levers9.agent.connection import join as join_controlplane
    from levers9.agent.daemon import EXIT_REFUSED

    try:
        credential = await join_controlplane(controlplane, token, ca_pem=ca_pem, insecure=insecure, stop=stop)
    except InsecureRefused as exc:
        typer.echo(f"levers9 agent: {exc}", err=True)
        return 2
    except CredentialRefused as exc:
        typer.echo(f"levers9 agent: {exc}", err=True)
        return EXIT_REFUSED
    return 0 if credential is None else credential


@app.command("run")
def run(
    state_dir: Path | None = _STATE_DIR,
    docker_host: str | None = _DOCKER_HOST,
    kubernetes: bool = _KUBERNETES,
    namespace: str | None = _NAMESPACE_OPTION,
    kubeconfig: Path | None = _KUBECONFIG,
    context: str | None = _CONTEXT,
    allow_privileged: bool = _ALLOW_PRIVILEGED,
    share_namespace: bool = _SHARE_NAMESPACE,
    poll_s: float | None = _POLL_S,
    log_level: str = _LOG_LEVEL,
) -> None:
    """Run the agent from the credential `levers9 agent join` kept (what the service unit runs)."""
    from levers9.agent import credentials

    _logging(log_level)
    backend = _backend(
        kubernetes=kubernetes,
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
        allow_privileged=allow_privileged,
        state_dir=state_dir,
        docker_host=docker_host,
        poll_s=poll_s,
        share_namespace=share_namespace,
    )
    if backend.kubernetes is not None:
        secret = _k8s_secret(backend)

        async def in_kubernetes(stop: asyncio.Event) -> int:
            try:
                saved = await _k8s_credential(secret, stop)
            finally:
                secret.close()
            if saved is None:
                raise _fail(
                    f"{secret.name} does not exist: this agent has not joined in namespace {secret.namespace}; run "
                    "`levers9 agent join --kubernetes` with the join token `levers9 cluster join` printed"
                )
            return await _run(saved, stop, backend)

        raise typer.Exit(asyncio.run(_until_signal(in_kubernetes)))
    directory = state_dir or credentials.default_state_dir()
    try:
        credential = credentials.load(directory)
    except credentials.CredentialError as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(asyncio.run(_until_signal(lambda stop: _run(credential, stop, backend))))
