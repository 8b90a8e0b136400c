"""``levers9 worker-image build``: the worker container image, built offline (being built: issue 17)."""

from __future__ import annotations

import typer

__all__ = ["app"]

app = typer.Typer(help="The worker container image for this levers9 version.", no_args_is_help=True)
