"""The ``levers9`` command.

Start-up time is a feature: ``levers9 --help`` must answer instantly even with
every plugin installed, so this module imports only typer and the light parts
of the core, and each command imports what it needs when it runs. A test
checks that no cloud or cluster SDK is imported by ``--help`` or ``plugins``.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    deploy_cmd,
    gpu_cmd,
    kubernetes_cmd,
    machine_cmd,
    offers_cmd,
    plugins_cmd,
    run_cmd,
    secret_cmd,
    server_cmd,
    volume_cmd,
    worker_image_cmd,
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
) -> None:
    """levers9: run containers on any compute, through provider and runtime plugins."""
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
app.add_typer(server_cmd.token_app, name="token")
app.add_typer(secret_cmd.app, name="secret")
app.add_typer(volume_cmd.app, name="volume")
volume_cmd.register(app)
app.add_typer(machine_cmd.app, name="machine")
app.command("machines")(machine_cmd.machines)
app.add_typer(cluster_cmd.app, name="cluster")
app.command("clusters")(cluster_cmd.clusters)
app.add_typer(agent_cmd.app, name="agent")
app.add_typer(worker_image_cmd.app, name="worker-image")
app.add_typer(kubernetes_cmd.app, name="kubernetes")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
