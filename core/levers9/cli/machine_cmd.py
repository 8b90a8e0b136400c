"""``levers9 machine create|remove`` and ``levers9 machines``: joined machines (being built: issue 17)."""

from __future__ import annotations

import typer

__all__ = ["app", "machines"]

app = typer.Typer(help="Join machines to levers9 and remove them.", no_args_is_help=True)


def machines() -> None:
    """List joined machines."""
    raise typer.Exit(1)
