"""``levers9 gpu``: the GPU catalog from the command line."""

from __future__ import annotations

from typing import Any

import typer

from levers9.cli.output import Col, print_json, print_table

app = typer.Typer(help="GPU types: normalise names, list the catalog.", no_args_is_help=True)


@app.command("normalize")
def normalize(
    names: list[str] = typer.Argument(..., help="GPU names as any tool prints them: 'NVIDIA H100 80GB HBM3'."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Map GPU names from nvidia-smi, Kubernetes labels or cloud catalogs to canonical types; exit 1 if any is unknown."""
    from levers9.gpu.catalog import CATALOG, suggest
    from levers9.gpu.normalize import normalize as to_canonical

    rows: list[dict[str, Any]] = []
    for name in names:
        canonical = to_canonical(name)
        rows.append(
            {
                "input": name,
                "canonical": canonical,
                "memory_mib": CATALOG[canonical].memory_mib if canonical else None,
                "suggestions": [] if canonical else suggest(name),
            }
        )
    if as_json:
        print_json(rows)
    else:
        for row in rows:
            if row["canonical"]:
                typer.echo(f"{row['input']}\t{row['canonical']}")
            else:
                hint = f"; closest: {', '.join(row['suggestions'])}" if row["suggestions"] else ""
                typer.echo(f"{row['input']}\tunknown GPU type{hint}", err=True)
    if any(row["canonical"] is None for row in rows):
        raise typer.Exit(1)


@app.command("list")
def list_types(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the canonical GPU types with their memory."""
    from levers9.gpu.catalog import CATALOG

    if as_json:
        print_json([{"name": t.name, "vendor": t.vendor, "memory_mib": t.memory_mib} for t in CATALOG.values()])
        return
    print_table(
        [Col("name"), Col("vendor"), Col("memory", justify="right")],
        ([t.name, t.vendor, f"{t.memory_mib // 1024} GiB"] for t in CATALOG.values()),
    )
