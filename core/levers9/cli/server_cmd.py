"""``levers9 server``, ``levers9 worker``, ``levers9 up`` and ``levers9 token``: the commands that run levers9."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from levers9.config.load import LoadedConfig
    from levers9.controlplane.server import Listeners
    from levers9.state.sql.database import Database

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = ["server", "token_app", "up", "worker"]

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=_LOG_FORMAT, stream=sys.stderr)
    for noisy in ("uvicorn.access", "httpx", "aiosqlite", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _load(config: Path | None) -> LoadedConfig:
    from levers9.cli.output import err
    from levers9.config.load import ConfigError, load_config
    from levers9.hooks.errors import PluginLoadError

    try:
        return load_config(config)
    except (ConfigError, PluginLoadError) as exc:
        err.print(str(exc), markup=False)
        raise typer.Exit(2) from None


def _listeners(
    loaded: LoadedConfig, host: str | None, grpc_port: int | None, http_port: int | None, metrics_port: int | None
) -> Listeners:
    import dataclasses

    from levers9.controlplane.server import Listeners

    base = Listeners.from_config(loaded)
    return dataclasses.replace(
        base,
        host=host or base.host,
        grpc_port=base.grpc_port if grpc_port is None else grpc_port,
        http_port=base.http_port if http_port is None else http_port,
        metrics_port=base.metrics_port if metrics_port is None else metrics_port,
    )


_HOST = typer.Option(None, "--host", help="Address to bind (default: listen.host of the config).")
_GRPC = typer.Option(None, "--grpc-port", help="gRPC port (default: listen.grpc_port, 1993).")
_HTTP = typer.Option(None, "--http-port", help="HTTP port (default: listen.http_port, 1994).")
_METRICS = typer.Option(None, "--metrics-port", help="Metrics port (default: listen.metrics_port, 9090).")
_LEVEL = typer.Option("info", "--log-level", help="debug, info, warning or error.")
_REPLICA_NAME = typer.Option(
    None,
    "--replica-name",
    help="This replica's name, the same across restarts: its metrics' replica label and its name in the logs "
    "(default: listen.replica_name, else the host name). Replicas on one host need different names.",
)


def server(
    host: str | None = _HOST,
    grpc_port: int | None = _GRPC,
    http_port: int | None = _HTTP,
    metrics_port: int | None = _METRICS,
    log_level: str = _LEVEL,
    replica_name: str | None = _REPLICA_NAME,
) -> None:
    """Run the controlplane: gRPC, REST under /api/v1 and metrics, with the scheduler and pool controllers."""
    from levers9.config.replica_name import replica_name_problem
    from levers9.controlplane.server import serve

    problem = None if replica_name is None else replica_name_problem(replica_name)
    if problem is not None:
        typer.echo(f"levers9 server: --replica-name: {problem}", err=True)
        raise typer.Exit(2)
    _logging(log_level)
    loaded = _load(None)
    try:
        listeners = _listeners(loaded, host, grpc_port, http_port, metrics_port)
        asyncio.run(serve(loaded, listeners, replica_name=replica_name))
    except (Levers9Error, OSError) as exc:
        typer.echo(f"levers9 server: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        loaded.hooks.close()


def worker(
    controlplane: str | None = typer.Option(
        None,
        "--controlplane",
        help="grpc://HOST:PORT to dial, or every replica's, comma-separated "
        "($LEVERS9_CONTROLPLANE_URL); grpcs:// verifies with $LEVERS9_CONTROLPLANE_CA[_FILE], else the system CAs.",
    ),
    pool: str | None = typer.Option(None, "--pool", help="Pool to serve ($LEVERS9_POOL); a machine token implies it."),
    cpu: float | None = typer.Option(None, "--cpu", help="CPU cores to offer (default: what the pool says)."),
    memory: int | None = typer.Option(None, "--memory", help="MiB of memory to offer (default: what the pool says)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Where containers are prepared (removed at exit)."),
    cleanup: bool = typer.Option(
        False, "--cleanup", help="Only remove the containers and state a killed worker left in --state-dir, then exit."
    ),
    log_level: str = _LEVEL,
) -> None:
    """Run a worker: dial the controlplane, register, run calls through the pool's runtime.

    The token comes from the file named by $LEVERS9_TOKEN_FILE (read, then deleted) or from $LEVERS9_TOKEN,
    never an argument (arguments are visible in `ps`). A machine's token joins once: the worker then keeps
    the session credential it is given in its state directory, so a restarted worker registers again.
    """
    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import PluginPolicy, PluginSet
    from levers9.worker.credentials import forbid_dumping
    from levers9.worker.session import WorkerOptions, default_state_dir, main_entry, options_from_env

    forbid_dumping()  # before the token is read: the calls it runs must not read it through /proc or ptrace
    try:
        values = options_from_env(state_dir=state_dir)
    except ValueError as exc:
        typer.echo(f"levers9 worker: {exc}", err=True)
        raise typer.Exit(2) from None
    if cleanup:
        _cleanup(state_dir or values.get("state_dir"))
        return
    if controlplane:
        values["controlplane"] = controlplane
    if pool:
        values["pool"] = pool
    if cpu is not None:
        values["cpu_millicores"] = round(cpu * 1000)
    if memory is not None:
        values["memory_mib"] = memory
    if state_dir is not None:
        values["state_dir"] = state_dir
    missing = [
        var
        for name, var in (
            ("controlplane", "$LEVERS9_CONTROLPLANE_URL"),
            ("token", "$LEVERS9_TOKEN_FILE (or $LEVERS9_TOKEN)"),
        )
        if not values.get(name)
    ]
    if missing:
        typer.echo(f"levers9 worker: missing {' and '.join(missing)}; see `levers9 worker --help`", err=True)
        raise typer.Exit(2)
    from levers9.proto.target import TargetError, parse_targets

    try:
        parse_targets(values["controlplane"])
    except TargetError as exc:
        typer.echo(f"levers9 worker: --controlplane / $LEVERS9_CONTROLPLANE_URL: {exc}", err=True)
        raise typer.Exit(2) from None
    values.setdefault("state_dir", default_state_dir(values.get("machine_id", "")))
    options = WorkerOptions(**values)
    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    hooks = Hooks(plugins)
    try:
        code = main_entry(options, hooks)
    finally:
        hooks.close()
    raise typer.Exit(code)


def _with_variables(doc: str) -> str:
    """``doc`` (one line per paragraph) and the variables the worker reads: the list the boot scripts are held to."""
    from levers9.worker_variables import WORKER_VARIABLES

    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")]
    paragraphs.append("Environment (the worker reads these variables and no others):")
    paragraphs.extend(f"{name}: {text}" for name, text in WORKER_VARIABLES.items())
    return "\n\n".join(paragraphs)


worker.__doc__ = _with_variables(worker.__doc__ or "")


def _cleanup(state_dir: Path | None) -> None:
    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import PluginPolicy, PluginSet
    from levers9.worker.leftovers import remove_leftovers

    if state_dir is None:
        typer.echo("levers9 worker --cleanup needs --state-dir (or $LEVERS9_WORKER_STATE_DIR)", err=True)
        raise typer.Exit(2)
    _logging("info")
    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    hooks = Hooks(plugins)
    try:
        asyncio.run(remove_leftovers(hooks, Path(state_dir), delete=True))
    finally:
        hooks.close()


def up(
    host: str | None = _HOST,
    grpc_port: int | None = _GRPC,
    http_port: int | None = _HTTP,
    metrics_port: int | None = _METRICS,
    runtime: str = typer.Option(
        "auto",
        "--runtime",
        help="Runtime of the starter pool, when `up` writes the config: auto (runc, else gvisor, where they run "
        "here; else process), gvisor, runc or process.",
    ),
    context: str = typer.Option("local", "--context", help="Name of the context written to ~/.levers9/config."),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
    keep_machines: bool = typer.Option(
        False,
        "--keep-machines",
        help="At Ctrl-C leave the pools' machines running (local workers, cloud machines, Jobs), for the next "
        "`levers9 up` to find again, instead of terminating them.",
    ),
) -> None:
    """Start levers9 on this machine: the controlplane and a local pool, SQLite and embedded Redis.

    Writes a starter config (~/.levers9/levers9.yaml) when there is none, and a
    context with a token to ~/.levers9/config, then runs until Ctrl-C (or SIGTERM, or `levers9 down`),
    which terminates the machines of its pools (local workers, cloud machines,
    local_k8s Jobs) unless --keep-machines; workers on joined machines
    (agent_machine, attached_cluster) are left running and reconnect.
    """
    from levers9.cli.starter import starter_config, warn_unisolated
    from levers9.config.load import default_config_path

    _logging(log_level)
    _say("loading the config and the plugins ...")
    path = default_config_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        memory = max(512, min(8192, _memory_mib() // 2))
        text, note = starter_config(runtime)
        path.write_text(text.format(cpu=os.cpu_count() or 1, memory=memory))
        typer.echo(f"wrote a starter config: {path} ({note})")
    loaded = _load(path)
    warn_unisolated(loaded)
    listeners = _listeners(loaded, host, grpc_port, http_port, metrics_port)
    try:
        asyncio.run(_up(loaded, listeners, context, keep_machines=keep_machines))
    except (Levers9Error, OSError) as exc:
        typer.echo(f"levers9 up: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        loaded.hooks.close()


def _memory_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 4096


async def _up(loaded: LoadedConfig, listeners: Listeners, context_name: str, *, keep_machines: bool = False) -> None:
    import signal

    from levers9.cli import up_state
    from levers9.config.model import default_home
    from levers9.controlplane.server import SWITCH_INTERVAL_S, Server
    from levers9.sdk.context import Context, save_context

    sys.setswitchinterval(SWITCH_INTERVAL_S)  # this process is the controlplane's own (see serve)
    server = Server(loaded, listeners)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    home = default_home()
    try:
        await server.start(progress=lambda step: _say(f"{step} ..."))
        assert server.services is not None
        token, workspace, workspace_id, person_id = await _user_token(server.services, context_name)
        host = "127.0.0.1" if listeners.host in ("0.0.0.0", "::", "") else listeners.host
        http_url = f"{'https' if listeners.tls else 'http'}://{host}:{listeners.http_port}"
        path = save_context(
            Context(
                name=context_name,
                grpc=f"{'grpcs://' if listeners.tls else ''}{host}:{listeners.grpc_port}",
                http=http_url,
                token=token,
                workspace=workspace,
                # the CA that verifies this controlplane, for the SDK and CLI (none: the system trust store)
                ca_file=str(Path(listeners.tls.ca_file).expanduser().absolute())
                if listeners.tls is not None and listeners.tls.ca_file
                else "",
            )
        )
        pools = ", ".join(f"{s.name} ({s.pool.provider}/{s.pool.runtime})" for s in server.services.pools.values())
        typer.echo(
            f"levers9 is up: gRPC {host}:{listeners.grpc_port}, "
            f"HTTP {'https' if listeners.tls else 'http'}://{host}:{listeners.http_port}/api/v1, "
            f"metrics :{listeners.metrics_port}\n"
            f"pools: {pools or 'none'}\n"
            f"context {context_name!r} (workspace {workspace}) written to {path}\n"
            + await _sign_in_line(server.services, http_url, workspace_id, person_id)
            + "next: levers9 run examples/hello.py   (Ctrl-C here stops levers9 and "
            + ("leaves its machines running: --keep-machines)" if keep_machines else "terminates its machines)"),
            err=False,
        )
        sys.stdout.flush()
        up_state.record(home, f"{host}:{listeners.grpc_port}", http_url)  # for `levers9 down`
        await server.until_stopped(stop)
    finally:
        up_state.clear(home)
        try:
            if server.services is not None:
                from levers9.cli.up_machines import stop_or_keep_machines

                await stop_or_keep_machines(server.services, keep=keep_machines, say=_say)
        finally:
            await server.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _say(line: str) -> None:
    """One line of `up`'s shutdown on the terminal (stdout, flushed: the process is about to end)."""
    typer.echo(f"levers9 up: {line}")
    sys.stdout.flush()


async def _user_token(services: object, context_name: str) -> tuple[str, str, str, str]:
    """(token, workspace name, workspace id, person id) of `up`'s context: its person's token if it still works,
    else a new one. The person (owner@levers9.localhost) is made once, an owner of the default workspace."""
    from levers9.sdk.context import ContextError, current_context
    from levers9.services.core import Services

    assert isinstance(services, Services)
    from levers9.cli.starter import UP_WORKSPACE
    from levers9.dashboard.auth_signin import up_person

    workspace = await services.workspaces.get_or_create(UP_WORKSPACE)
    person = await up_person(services, workspace)
    try:
        existing = current_context(context_name)
        record = await services.tokens.verify(existing.token, kind="user") if existing.token else None
        if record is not None and record.workspace_id == workspace.id and record.user_id == person.id:
            return existing.token, workspace.name, workspace.id, person.id
    except ContextError:
        pass
    _, token = await services.tokens.issue(
        "user", workspace_id=workspace.id, subject=f"levers9 up ({context_name})", user_id=person.id
    )
    return token, workspace.name, workspace.id, person.id


async def _sign_in_line(services: object, http_url: str, workspace_id: str, person_id: str) -> str:
    """The banner's line with a one-time sign-in link to the dashboard (printed on the terminal only)."""
    from levers9.dashboard.auth_signin import make_link, ttl_words
    from levers9.services.core import Services

    assert isinstance(services, Services)
    base = services.config.auth.public_url or http_url
    link = await make_link(services, person_id, workspace_id, base)
    return f"dashboard: {link.url} (sign-in link, once, {ttl_words(services.config.auth.link_ttl_s)})\n"


token_app = typer.Typer(help="Issue, list and revoke API tokens (needs the controlplane's database, so run it there).")


def _on_database(work: Callable[[Database], Awaitable[T]]) -> T:
    """``work`` on the controlplane's database (from the config file this machine's controlplane reads)."""
    from levers9.config.load import default_config_path, read_config
    from levers9.config.model import Config
    from levers9.state.sql.database import open_database

    path = default_config_path()
    cfg = read_config(path)[0] if path.exists() else None

    async def run() -> T:
        db = await open_database((cfg or Config()).database_url)
        try:
            return await work(db)
        finally:
            await db.close()

    return asyncio.run(run())


@token_app.command("create")
def token_create(
    workspace: str = typer.Option("default", "--workspace", "-w", help="Workspace the token acts in (made if new)."),
    kind: str = typer.Option("user", "--kind", help="user, or worker for a pool's manually started workers."),
    pool: str | None = typer.Option(None, "--pool", help="For --kind worker: the pool its workers serve."),
    ttl: float | None = typer.Option(None, "--ttl", help="Seconds until it expires (default: never)."),
    operator: bool = typer.Option(
        False, "--operator", help="An operator's user token: bound to no workspace; sees every pool and worker."
    ),
    role: str | None = typer.Option(
        None, "--role", help="For a workspace's user token: viewer, member or owner (default: owner)."
    ),
) -> None:
    """Print a new token (shown once; only its hash is stored). Its id, for `token revoke`, goes to stderr."""
    from levers9.state.sql.workspaces import MAX_TOKEN_TTL_S

    if kind not in ("user", "worker"):
        typer.echo(f"--kind must be user or worker, got {kind!r}", err=True)
        raise typer.Exit(2)
    if kind == "worker" and not pool:
        typer.echo("--kind worker needs --pool: a worker token serves one pool", err=True)
        raise typer.Exit(2)
    if operator and kind != "user":
        typer.echo("--operator makes a user token; it cannot be combined with --kind worker", err=True)
        raise typer.Exit(2)
    if ttl is not None and not 0 < ttl <= MAX_TOKEN_TTL_S:
        typer.echo(f"--ttl must be above 0 and at most {MAX_TOKEN_TTL_S} seconds (ten years), got {ttl}", err=True)
        raise typer.Exit(2)
    if role is not None and (role not in ("viewer", "member", "owner") or kind != "user" or operator):
        typer.echo(
            f"--role must be viewer, member or owner, for a workspace's user token (not --operator or --kind worker); "
            f"got {role!r}",
            err=True,
        )
        raise typer.Exit(2)

    async def issue(db: Database) -> tuple[str, str]:
        from levers9.state.sql.workspaces import TokenStore, WorkspaceStore

        if kind == "worker":
            record, token = await TokenStore(db).issue("worker", subject=pool, ttl_s=ttl)
        elif operator:
            record, token = await TokenStore(db).issue("user", subject="levers9 token create --operator", ttl_s=ttl)
        else:
            ws = await WorkspaceStore(db).get_or_create(workspace)
            record, token = await TokenStore(db).issue(
                "user", workspace_id=ws.id, subject="levers9 token create", ttl_s=ttl, role=role
            )
        return record.id, token

    token_id, token = _on_database(issue)
    typer.echo(f"token id: {token_id} (revoke it with `levers9 token revoke {token_id}`)", err=True)
    typer.echo(token)


@token_app.command("revoke")
def token_revoke(
    token: str = typer.Argument(
        ..., metavar="TOKEN_ID", help="The token's id (tok_..., see `levers9 token list`), or the token itself."
    ),
) -> None:
    """Revoke a token: refused at once by a controlplane on this database, within 10 s by every replica."""
    from levers9.services.auth import CACHE_S

    async def revoke(db: Database) -> str | None:
        from levers9.state.sql.workspaces import TokenStore

        tokens = TokenStore(db)
        record = await tokens.get(token) if token.startswith("tok_") else await tokens.find(token)
        if record is None or not await tokens.revoke(record.id):
            return None
        return record.id

    revoked = _on_database(revoke)
    if revoked is None:
        typer.echo(f"no token {token!r} in this controlplane's database (see `levers9 token list`)", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {revoked}; controlplanes refuse it within {CACHE_S:g} s (their token cache)")


@token_app.command("list")
def token_list(
    workspace: str | None = typer.Option("default", "--workspace", "-w", help="The workspace whose tokens to list."),
    unbound: bool = typer.Option(
        False, "--unbound", help="Instead: the tokens bound to no workspace (operators', shared pools' machines)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per token."),
) -> None:
    """List tokens (never the tokens themselves: only their hashes are stored): ids, kinds, expiry, revocation."""
    from datetime import UTC, datetime

    async def listed(db: Database) -> list[dict[str, str | None]] | None:
        from levers9.state.sql.workspaces import TokenStore, WorkspaceStore

        workspace_id = None
        if not unbound:
            ws = await WorkspaceStore(db).by_name(workspace or "default")
            if ws is None:
                return None
            workspace_id = ws.id
        now = datetime.now(UTC)
        out = []
        for r in await TokenStore(db).list_for_workspace(workspace_id):
            if r.revoked_at is not None:
                state = "revoked"
            elif r.expires_at is not None and r.expires_at <= now:
                state = "expired"
            else:
                state = "active"
            out.append(
                {
                    "id": r.id,
                    "kind": r.kind.value,
                    "subject": r.subject,
                    "state": state,
                    "created_at": r.created_at.isoformat(),
                    "expires_at": r.expires_at.isoformat() if r.expires_at else None,
                    "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
                    "last_used_at": r.last_used_at.isoformat() if r.last_used_at else None,
                }
            )
        return out

    found = _on_database(listed)
    if found is None:
        typer.echo(f"no workspace named {workspace!r}", err=True)
        raise typer.Exit(1)
    from levers9.cli.output import Col, err, print_json, print_table

    if as_json:
        print_json(found)
        return
    if not found:
        err.print("no tokens" + (" bound to no workspace" if unbound else f" in workspace {workspace!r}"), markup=False)
        return
    print_table(
        [
            Col("id"),
            Col("kind"),
            Col("state"),
            Col("subject", wrap=True),
            Col("created"),
            Col("expires"),
            Col("last used"),
        ],
        (
            [
                t["id"] or "-",
                t["kind"] or "-",
                t["state"] or "-",
                t["subject"] or "-",
                t["created_at"] or "-",
                t["expires_at"] or "-",
                t["last_used_at"] or "-",
            ]
            for t in found
        ),
    )
