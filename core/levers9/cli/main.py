"""The ``levers9`` command.

Start-up time is a feature: ``levers9 --help`` must answer instantly even with
every plugin installed, so this module imports only typer and the light parts
of the core, and each command imports what it needs when it runs. A test
checks that no cloud or cluster SDK is imported by ``--help`` or ``plugins``.

**Global options anywhere.** ``-c/--context NAME``, ``-e/--env NAME`` (the
environment to act in) and ``--config FILE`` may
stand before or after the subcommand (``levers9 -c prod tasks`` and
``levers9 tasks -c prod``; ``levers9 --config F server`` and ``levers9
server --config F``): :func:`global_options_first` moves either to the front
when the subcommand has no option of that name itself (``check --config``,
``up --context`` keep their own meaning), and never past ``--`` nor out of
the arguments of a command that hands unknown options on (``levers9 run
app.py --config x`` leaves ``--config x`` to the app). Before the
subcommand, ``-c`` sets ``$LEVERS9_CONTEXT``, which every client command reads.

**gRPC's own log lines.** gRPC's C core prints INFO lines on stderr for every
failed TLS handshake it retries, a dozen before the one clear line a command
prints; a client command therefore sets ``GRPC_VERBOSITY=ERROR`` before gRPC
is imported, unless it is set already (``GRPC_VERBOSITY=INFO levers9 ...`` shows
them again). The daemons (``server``, ``up``, ``worker``, ``agent``) keep them,
and so do the processes they start. Errors are still printed, and every failure a command reports
comes from the call's own status.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from levers9.__about__ import __version__
from levers9.cli import (
    agent_cmd,
    blueprint_cmd,
    check_cmd,
    client_cmds,
    cluster_cmd,
    config_cmd,
    context_cmd,
    dashboard_cmd,
    deploy_cmd,
    down_cmd,
    gpu_cmd,
    kubernetes_cmd,
    login_cmd,
    machine_cmd,
    offers_cmd,
    plugins_cmd,
    run_cmd,
    sandbox_cmd,
    secret_cmd,
    server_cmd,
    volume_cmd,
    worker_image_cmd,
    workspace_cmd,
)

app = typer.Typer(
    name="levers9",
    help="levers9: run containers on any compute, through provider and runtime plugins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"levers9 {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Config file for every command (default: $LEVERS9_CONFIG, else ~/.levers9/levers9.yaml).",
        dir_okay=False,
    ),
    context: str | None = typer.Option(
        None,
        "-c",
        "--context",
        help="Context of the client commands (default: $LEVERS9_CONTEXT, else the current one).",
    ),
    environment: str | None = typer.Option(
        None,
        "-e",
        "--env",
        "--environment",
        help="Environment of the workspace to act in (default: $LEVERS9_ENVIRONMENT, else the context's, else main).",
    ),
) -> None:
    """levers9: run containers on any compute, through provider and runtime plugins."""
    if context is not None:
        os.environ["LEVERS9_CONTEXT"] = context
    if environment is not None:
        os.environ["LEVERS9_ENVIRONMENT"] = environment
    if config is not None:
        # Commands find the config through the environment, so workers and agents
        # started from this process inherit the same choice.
        os.environ["LEVERS9_CONFIG"] = str(config)


app.command("plugins")(plugins_cmd.plugins)
app.add_typer(config_cmd.app, name="config")
app.command("check")(check_cmd.check)
app.command("offers")(offers_cmd.offers)
app.add_typer(gpu_cmd.app, name="gpu")
app.add_typer(context_cmd.app, name="context")
app.add_typer(workspace_cmd.workspace_app, name="workspace")
app.add_typer(workspace_cmd.environment_app, name="environment")
app.command("tasks")(client_cmds.tasks)
app.command("logs")(client_cmds.logs)
app.command("cancel")(client_cmds.cancel)
app.command("pools")(client_cmds.pools)
app.command("workers")(client_cmds.workers)
app.command("run", context_settings=run_cmd.CONTEXT_SETTINGS)(run_cmd.run)
app.add_typer(blueprint_cmd.app, name="blueprint")
app.command("blueprints")(blueprint_cmd.blueprints)
app.command("deploy")(deploy_cmd.deploy)
app.command("deployments")(deploy_cmd.deployments)
app.command("stop")(deploy_cmd.stop)
app.command("server")(server_cmd.server)
app.command("worker")(server_cmd.worker)
app.command("up")(server_cmd.up)
app.command("down")(down_cmd.down)
app.command("login")(login_cmd.login)
app.command("dashboard")(dashboard_cmd.dashboard)
app.add_typer(server_cmd.token_app, name="token")
app.add_typer(secret_cmd.app, name="secret")
app.add_typer(volume_cmd.app, name="volume")
volume_cmd.register(app)
sandbox_cmd.register(app)
app.add_typer(machine_cmd.app, name="machine")
app.command("machines")(machine_cmd.machines)
app.add_typer(cluster_cmd.app, name="cluster")
app.command("clusters")(cluster_cmd.clusters)
app.add_typer(agent_cmd.app, name="agent")
app.add_typer(worker_image_cmd.app, name="worker-image")
app.add_typer(kubernetes_cmd.app, name="kubernetes")


#: the global options that may also stand after the subcommand, and whether each takes a value
_GLOBAL_OPTIONS = {"--config": True, "-c": True, "--context": True, "-e": True, "--env": True, "--environment": True}


def global_options_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with the global options found after the subcommand moved before it (see the module's doc)."""
    args = list(argv)
    command: Any = typer.main.get_command(app)  # typer's own click; a group has .commands
    position = 0
    while position < len(args) and hasattr(command, "commands"):  # walk down to the subcommand
        token = args[position]
        if token == "--":
            return args
        if token.startswith("-"):
            position += 2 if _GLOBAL_OPTIONS.get(token) else 1
            continue
        sub = command.commands.get(token)
        if sub is None:
            return args  # click will say it is unknown
        command, position = sub, position + 1
    if hasattr(command, "commands") or command.context_settings.get("ignore_unknown_options"):
        return args
    own = {name for param in command.params for name in param.opts}
    moved: list[str] = []
    kept = args[:position]
    rest = args[position:]
    index = 0
    while index < len(rest):
        token = rest[index]
        if token == "--":
            kept.extend(rest[index:])
            break
        name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        if name in _GLOBAL_OPTIONS and name not in own:
            joined = token != name  # --config=FILE, -cNAME
            moved.extend(rest[index : index + (1 if joined else 2)])
            index += 1 if joined else 2
            continue
        kept.append(token)
        index += 1
    return moved + kept


#: the commands that run a daemon: they keep gRPC's own lines (a server's log of failed client handshakes is how
#: an operator finds a client with the wrong CA), and so do the workers and agents they start
_DAEMONS = frozenset({"server", "up", "worker", "agent"})


def _subcommand(args: Sequence[str]) -> str:
    """The first word of ``args`` that is not an option or an option's value."""
    position = 0
    while position < len(args):
        token = args[position]
        if not token.startswith("-"):
            return token
        position += 2 if _GLOBAL_OPTIONS.get(token) else 1
    return ""


def main() -> None:
    args = global_options_first(sys.argv[1:])
    if _subcommand(args) not in _DAEMONS:  # before anything imports grpc (see the module's doc)
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    app(args=args)


if __name__ == "__main__":
    main()
