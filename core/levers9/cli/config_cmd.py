"""``levers9 config``: check a config file, and print its JSON Schema for editors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from levers9.cli.output import err, out, print_json

app = typer.Typer(help="Check the config file and print its schema.", no_args_is_help=True)


@app.command("check")
def check(
    file: Path | None = typer.Argument(
        None, help="The config file; default $LEVERS9_CONFIG or ~/.levers9/levers9.yaml."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON: one object per pool of a valid config (the verdict goes to stderr)."
    ),
) -> None:
    """Validate a config file against its schema and the installed plugins; exit 1 on any problem."""
    from levers9.config.load import ConfigError, default_config_path, load_config
    from levers9.hooks.errors import PluginLoadError

    path = file or default_config_path()
    try:
        loaded = load_config(path)
    except ConfigError as exc:
        err.print(str(exc), markup=False)
        raise typer.Exit(1) from None
    except PluginLoadError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None
    try:
        for record in loaded.plugins.failures():
            err.print(f"warning: plugin {record.name!r} failed to load: {record.error}", markup=False)
        # what the controlplane refuses at start: asking runtimes how they isolate may run their binaries
        import asyncio

        from levers9.services.isolation import builds_without_capture, shared_without_isolation

        issues = asyncio.run(shared_without_isolation(loaded)) + builds_without_capture(loaded)
        if issues:
            err.print(str(ConfigError(issues)), markup=False)
            raise typer.Exit(1)
        pools = loaded.pools
        if as_json:
            err.print(f"{path}: ok, {len(pools)} pool(s)", markup=False)
            print_json(
                [
                    {
                        "name": name,
                        "provider": pool.provider,
                        "runtime": pool.runtime,
                        "gpu": pool.gpu,
                        "gpu_count": pool.gpu_count,
                        "cpu": spec.cpu,
                        "memory_mib": spec.memory,
                        "min_workers": spec.min_workers,
                        "max_workers": spec.max_workers,
                    }
                    for name, pool in pools.items()
                    for spec in [loaded.config.pools[name]]
                ]
            )
            return
        out.print(f"{path}: ok, {len(pools)} pool(s)", markup=False)
        for name, pool in pools.items():
            gpu = f"{pool.gpu_count}x {pool.gpu}" if pool.gpu else "cpu"
            out.print(f"  {name}: provider {pool.provider}, runtime {pool.runtime}, {gpu}", markup=False)
    finally:
        loaded.hooks.close()


@app.command("schema")
def schema() -> None:
    """Print the config file's JSON Schema, with each installed provider's settings, for editors."""
    print_json(config_schema())


def config_schema() -> dict[str, Any]:
    """The config model's schema, with each pool's ``settings`` tied to its provider's own schema."""
    from levers9.config.model import Config
    from levers9.hooks.errors import Levers9Error
    from levers9.hooks.facade import Hooks
    from levers9.hooks.manager import load_plugins

    document = Config.model_json_schema()
    defs: dict[str, Any] = document.setdefault("$defs", {})
    hooks = Hooks(load_plugins())
    try:
        branches = []
        for kind, names, key in (
            ("provider", hooks.providers(), "settings"),
            ("runtime", hooks.runtimes(), "runtime_settings"),
        ):
            for name in names:
                try:
                    model = (
                        hooks.provider_settings_model(name)
                        if kind == "provider"
                        else hooks.runtime_settings_model(name)
                    )
                except Levers9Error as exc:
                    err.print(f"warning: {exc}", markup=False)
                    continue
                if model is None:
                    continue
                sub = _prefixed(model.model_json_schema(), name, defs)
                branches.append(
                    {
                        "if": {"properties": {kind: {"const": name}}, "required": [kind]},
                        "then": {"properties": {key: sub}},
                    }
                )
        pool = defs["PoolConfig"]
        pool["properties"]["provider"]["enum"] = hooks.providers()
        pool["properties"]["runtime"]["enum"] = hooks.runtimes()
        if branches:
            pool["allOf"] = branches
    finally:
        hooks.close()
    return document


def _prefixed(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Move a plugin schema's ``$defs`` into the document's, renamed so two plugins never collide."""
    local = schema.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (v.replace("#/$defs/", f"#/$defs/{prefix}.") if k == "$ref" and isinstance(v, str) else rewrite(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    for name, sub in local.items():
        defs[f"{prefix}.{name}"] = rewrite(sub)
    result: dict[str, Any] = rewrite(schema)
    return result
