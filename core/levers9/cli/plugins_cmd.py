"""``levers9 plugins``: what is installed, what loaded, what each plugin implements, and what broke."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from levers9.cli.output import Cell, Col, err, print_json, print_table

if TYPE_CHECKING:
    from levers9.hooks.manager import PluginPolicy


def plugins(
    show_all: bool = typer.Option(False, "--all", help="Also list plugins the policy blocks."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per plugin."),
) -> None:
    """List installed plugins with their distribution, roles, hooks and load errors."""
    from rich.text import Text

    from levers9.hooks.errors import PluginLoadError
    from levers9.hooks.manager import PluginSet

    policy = _policy()
    plugin_set = PluginSet(policy)
    try:
        plugin_set.load_entry_points()
    except PluginLoadError as exc:
        err.print(f"[red]error:[/red] {exc}", markup=True)
        err.print("strict mode is on (LEVERS9_PLUGINS_STRICT or plugins.strict in config)")
        raise typer.Exit(1) from None
    records = [r for r in plugin_set.records.values() if show_all or r.status != "blocked"]
    records.sort(key=lambda r: (not r.builtin, r.name))
    if as_json:
        print_json([r.as_dict() for r in records])
        return
    rows: list[list[Cell]] = []
    for r in records:
        dist = f"{r.distribution or '?'} {r.version or ''}".strip()
        status = Text(r.status, style=_STATUS_STYLE.get(r.status, ""))
        # ", " between hook names: a terminal wraps the list there, never inside a name
        hooks = ", ".join(h.removeprefix("levers9_") for h in r.hooks) or "-"
        rows.append([r.name, dist, status, ", ".join(r.roles) or "-", hooks])
    print_table([Col("name"), Col("distribution"), Col("status"), Col("roles"), Col("hooks", wrap=True)], rows)
    for r in plugin_set.failures():
        err.print(f"[red]plugin {r.name!r} ({r.module}) failed to load:[/] {r.error}", markup=True)


_STATUS_STYLE = {"loaded": "green", "failed": "red", "blocked": "yellow"}


def _policy() -> PluginPolicy:
    """The plugin policy from config and environment; a broken config must not stop this command."""
    from levers9.config.load import ConfigError, default_config_path, read_config
    from levers9.hooks.manager import PluginPolicy

    path = default_config_path()
    if path.exists():
        try:
            config, _ = read_config(path)
        except ConfigError as exc:
            err.print(f"[yellow]warning:[/] ignoring the plugin policy of a config that does not load:\n{exc}")
        else:
            return PluginPolicy.from_env(
                allow=config.plugins.allow, block=config.plugins.block, strict=config.plugins.strict
            )
    return PluginPolicy.from_env()
