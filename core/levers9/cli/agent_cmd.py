"""``levers9 agent``: the agent a joined machine runs (being built: issue 17)."""

from __future__ import annotations

import typer

__all__ = ["app"]

app = typer.Typer(
    help="The agent of a joined machine: dials the controlplane and runs worker containers.", no_args_is_help=True
)
