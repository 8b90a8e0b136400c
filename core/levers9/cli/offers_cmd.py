"""``levers9 offers``: what every configured pool can start, with price and availability.

Each pool's provider is asked its ``levers9_gpu_offers`` (through
``Hooks.gpu_offers_for``, the call the planner makes, so a provider that fails
or hangs costs only its own pools), and the answers are listed one offer per
row: pool, provider, GPU, GPUs per machine, instance type, region, zone, spot,
price per hour, availability and the offer's ``details`` (a marketplace's
facts: ``cloud=secure, form_factor=sxm``), sorted by GPU, then price (offers
without a price last), then pool. Like ``levers9 check`` it runs from the config file,
not through a controlplane: the answer is what the providers say to these
credentials now, uncached.

Invariants, and what each failure means:

* ``--gpu`` takes any spelling :func:`levers9.gpu.normalize.normalize` knows
  (``h100-80gb``, ``NVIDIA H100 80GB HBM3``) and keeps the offers of that
  canonical type; pools of another GPU type are not asked. A name it does not
  know exits 2 with the closest catalog names.
* A pool whose provider failed (raised, returned the wrong type, timed out) or
  whose config does not resolve is listed after the offers with its error, and
  makes the exit status 1; the other pools' offers are still printed. A pool
  whose provider has no ``levers9_gpu_offers`` hook (it declares settings only)
  is listed with a note and is not a failure.
* ``--json`` prints one object per offer with the same keys for every row
  (``details`` an object, empty when the provider gave none), then one per
  pool without offers (``error`` or ``note`` set, offer fields null).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.check_cmd import PoolSet, load_pool_set, select_pools, with_plugins_started
from levers9.cli.output import Cell, Col, err, print_json, print_table

if TYPE_CHECKING:
    from levers9.hooks.types import GpuOffer, Pool

OFFER_KEYS = (
    "gpu",
    "gpu_count",
    "gpu_memory_mib",
    "instance_type",
    "region",
    "zone",
    "spot",
    "price_per_hour",
    "availability",
    "cpu_millicores",
    "memory_mib",
    "details",
    "key",
)


def offers(
    gpu: str | None = typer.Option(
        None, "--gpu", help="Only offers of this GPU type, in any spelling: H100, h100-80gb."
    ),
    pool: list[str] = typer.Option([], "--pool", help="Only this pool (repeatable)."),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The config file (default: $LEVERS9_CONFIG, else ~/.levers9/levers9.yaml).",
        dir_okay=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per offer, then failing pools."),
) -> None:
    """List the GPU machines every configured pool can start, by GPU and price; exit 1 if a pool's provider failed."""
    wanted = _canonical(gpu) if gpu is not None else None
    pool_set = load_pool_set(config)
    try:
        names = select_pools(pool_set, pool)
        # the hook facade logs (as a warning) each pool whose provider failed; this command prints each itself, once
        facade = logging.getLogger("levers9.plugins")
        level = facade.level
        facade.setLevel(logging.ERROR)
        try:
            rows, failed, notes = asyncio.run(_collect(pool_set, names, wanted))
        finally:
            facade.setLevel(level)
    finally:
        pool_set.close()
    if as_json:
        blank = dict.fromkeys(OFFER_KEYS)
        print_json(
            [{"pool": p.name, "provider": p.provider, **_offer_dict(o), "error": None, "note": None} for p, o in rows]
            + [{"pool": n, "provider": prov, **blank, "error": e, "note": None} for n, prov, e in failed]
            + [{"pool": n, "provider": prov, **blank, "error": None, "note": t} for n, prov, t in notes]
        )
    else:
        _print(rows)
        if not rows:
            err.print("no offers" + (f" of {wanted}" if wanted else ""), markup=False)
        for name, provider, note in notes:
            err.print(f"pool {name} ({provider}): {note}", markup=False)
        for name, provider, error in failed:
            err.print(f"pool {name} ({provider}) failed: {error}", markup=False)
    if failed:
        raise typer.Exit(1)


def _canonical(name: str) -> str:
    from levers9.gpu.catalog import suggest
    from levers9.gpu.normalize import normalize

    canonical = normalize(name)
    if canonical is None:
        close = suggest(name)
        hint = f"; closest: {', '.join(close)}" if close else "; `levers9 gpu list` shows the catalog"
        err.print(f"error: --gpu {name!r} is not a GPU type levers9 knows{hint}", markup=False)
        raise typer.Exit(2)
    return canonical


async def _collect(
    pool_set: PoolSet, names: list[str], wanted: str | None
) -> tuple[list[tuple[Pool, GpuOffer]], list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(offer rows sorted, failed pools with their error, pools with a note), each pool at most once."""
    failed: list[tuple[str, str, str]] = []
    notes: list[tuple[str, str, str]] = []
    asked: list[Pool] = []
    for name in names:
        pool = pool_set.pools.get(name)
        provider = pool_set.written[name][0]
        if pool is None:
            failed.append((name, provider, pool_set.problems.get(name, "the pool did not resolve")))
        elif wanted is not None and pool.gpu not in (None, wanted):
            continue  # a pool of another GPU type offers none of these
        elif pool_set.plugins.impl(pool.provider, "levers9_gpu_offers") is None:
            notes.append((name, provider, f"no offers: provider {provider!r} has no levers9_gpu_offers hook"))
        else:
            asked.append(pool)
    answers = await with_plugins_started(pool_set, lambda: pool_set.hooks.gpu_offers_for(asked))
    rows: list[tuple[Pool, GpuOffer]] = []
    for pool in asked:
        if pool.name in answers.answers:
            rows += [(pool, offer) for offer in answers.answers[pool.name] if wanted is None or offer.gpu == wanted]
            continue
        prefix = f"pool {pool.name!r}: "
        errors = [f.error.removeprefix(prefix) for f in answers.failures if f.error.startswith(prefix)]
        failed.append((pool.name, pool.provider, errors[0] if errors else "levers9_gpu_offers gave no answer"))
    rows.sort(key=_order)
    failed.sort(key=lambda f: names.index(f[0]))  # config order, whichever step failed
    return rows, failed, notes


def _order(row: tuple[Pool, GpuOffer]) -> tuple[Any, ...]:
    pool, offer = row
    price = offer.price_per_hour
    return (offer.gpu, price is None, price or 0.0, pool.name, offer.instance_type or "", offer.zone or "")


def _offer_dict(offer: GpuOffer) -> dict[str, Any]:
    data = offer.model_dump(mode="json")
    return {key: (offer.key if key == "key" else data.get(key)) for key in OFFER_KEYS}


def _print(rows: list[tuple[Pool, GpuOffer]]) -> None:
    from rich.text import Text

    style = {"available": "green", "limited": "yellow", "unavailable": "red"}
    table: list[list[Cell]] = []
    for pool, o in rows:
        price = f"{o.price_per_hour:.2f}" if o.price_per_hour is not None else "-"
        availability = Text(o.availability.value, style=style.get(o.availability.value, ""))
        table.append(
            [
                pool.name,
                pool.provider,
                o.gpu,
                str(o.gpu_count),
                o.instance_type or "-",
                o.region or "-",
                o.zone or "-",
                "yes" if o.spot else "no",
                price,
                availability,
                ", ".join(f"{name}={value}" for name, value in o.details.items()) or "-",
            ]
        )
    columns = [
        Col("pool"),
        Col("provider"),
        Col("gpu"),
        Col("count", justify="right"),
        Col("instance type"),
        Col("region"),
        Col("zone"),
        Col("spot"),
        Col("price/h", justify="right"),
        Col("availability"),
        Col("details", wrap=True),
    ]
    if rows:
        print_table(columns, table)
