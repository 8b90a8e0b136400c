"""On-demand prices of OCI's GPU shapes: a catalog shipped with the plugin, and how to rebuild it.

``ListShapes`` says nothing of price, so offers take theirs from ``prices.json``
next to this module: US dollars per instance-hour of each shape, pay as you go.
Oracle lists one price per shape for every commercial region, so the catalog is
keyed by shape alone. The file says in its ``source`` and ``retrieved`` fields
where its figures came from and when; a shape missing from it has no price
(``None``): an offer without a price is still an offer, tried after the priced
ones where prices decide.

Refresh (needs network access to Oracle's public price list, or a local copy)::

    python -m levers9_oci.prices refresh [--source URL-OR-PATH] [--out PATH]

reads the price list in the form Oracle's public products endpoint answers
(:data:`DEFAULT_SOURCE`: ``items``, each with ``displayName``, ``metricName`` and
``currencyCodeLocalizations[].prices[]`` of ``model`` ``PAY_AS_YOU_GO`` and a
``value``). OCI prices GPUs per GPU-hour, so a shape's price is the per-GPU
price of the one product whose ``displayName`` names its GPU
(:data:`SHAPE_GPUS`: every word given, case ignored; the product's metric
mentions GPUs) times the shape's GPU count. A shape no product names is left
out; a list that prices no shape at all fails the refresh and leaves the
catalog as it was.

The file's form, and the invariants (read once per process; a malformed file
an error when first asked; a refresh that fails leaves the file as it was),
are :mod:`levers9.clouds.price_files`'.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from levers9.clouds.price_files import ShippedCatalog, read_source, write_catalog

__all__ = [
    "DEFAULT_SOURCE",
    "SHAPE_GPUS",
    "Catalog",
    "catalog",
    "main",
    "on_demand_price",
    "prices_from_list",
    "refresh",
]

DEFAULT_SOURCE = "https://apexapps.oracle.com/pls/apex/cetools/api/v1/products/?currencyCode=USD"

#: shape -> (the words the price list's product for its GPU has in its name, GPUs in the shape)
SHAPE_GPUS: dict[str, tuple[tuple[str, ...], int]] = {
    "VM.GPU.A10.1": (("A10",), 1),
    "VM.GPU.A10.2": (("A10",), 2),
    "BM.GPU.A10.4": (("A10",), 4),
    "BM.GPU4.8": (("A100", "40"), 8),
    "BM.GPU.A100-v2.8": (("A100", "80"), 8),
    "BM.GPU.H100.8": (("H100",), 8),
    "BM.GPU.H200.8": (("H200",), 8),
    "BM.GPU.B200.8": (("B200",), 8),
    "BM.GPU.L40S.4": (("L40S",), 4),
    "BM.GPU.MI300X.8": (("MI300X",), 8),
}


class Catalog:
    """``prices[shape]`` in US dollars per instance-hour, with where they came from."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        prices = data.get("prices")
        if not isinstance(prices, dict):
            raise ValueError("an OCI price catalog needs a 'prices' mapping of shape -> USD/hour")
        self.source = str(data.get("source", ""))
        self.retrieved = str(data.get("retrieved", ""))
        self.prices: dict[str, float] = {str(shape): float(price) for shape, price in prices.items()}

    def price(self, shape: str) -> float | None:
        return self.prices.get(shape)


_shipped = ShippedCatalog("levers9_oci", Catalog)


def catalog() -> Catalog:
    """The shipped catalog, read once."""
    return _shipped.get()


def on_demand_price(shape: str) -> float | None:
    """US dollars per hour of ``shape`` pay as you go; None when the catalog has no figure."""
    return catalog().price(shape)


# --------------------------------------------------------------------------- refresh


def _words(text: str) -> set[str]:
    return {w for w in "".join(c if c.isalnum() else " " for c in text.upper()).split() if w}


def _pay_as_you_go(item: Mapping[str, Any]) -> float | None:
    for local in item.get("currencyCodeLocalizations") or []:
        if local.get("currencyCode") != "USD":
            continue
        for price in local.get("prices") or []:
            if price.get("model") == "PAY_AS_YOU_GO" and isinstance(price.get("value"), int | float):
                return float(price["value"])
    return None


def prices_from_list(price_list: Mapping[str, Any]) -> dict[str, float]:
    """``{shape: USD/hour}`` of the shapes in :data:`SHAPE_GPUS` one product of ``price_list`` prices."""
    per_gpu: list[tuple[set[str], float]] = []
    for item in price_list.get("items") or []:
        metric = str(item.get("metricName") or "").upper()
        value = _pay_as_you_go(item)
        if "GPU" not in metric or value is None or value <= 0:
            continue
        per_gpu.append((_words(str(item.get("displayName") or "")), value))
    found: dict[str, float] = {}
    for shape, (words, count) in SHAPE_GPUS.items():
        wanted = {w.upper() for w in words}
        matches = [value for name, value in per_gpu if wanted <= name]
        if len(matches) == 1:
            found[shape] = round(matches[0] * count, 6)
    return found


def refresh(source: str, out: Path) -> Catalog:
    """Rebuild the catalog at ``out`` from the price list at ``source`` (see the module docstring)."""
    prices = prices_from_list(read_source(source, timeout=120))
    if not prices:
        raise ValueError(f"the price list at {source} prices none of the shapes {', '.join(SHAPE_GPUS)}")
    return write_catalog(
        out,
        source=f"Oracle's price list ({source}): pay as you go, per GPU-hour times the shape's GPUs",
        prices=dict(sorted(prices.items())),
        parse=Catalog,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m levers9_oci.prices", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    again = commands.add_parser("refresh", help="rebuild the shape price catalog from Oracle's price list")
    again.add_argument("--source", default=DEFAULT_SOURCE, help="price list URL or path")
    again.add_argument("--out", type=Path, help="where to write (default: the catalog shipped with the plugin)")
    args = parser.parse_args(argv)
    out = args.out or _shipped.path
    try:
        result = refresh(args.source, out)
    except (OSError, ValueError) as exc:
        print(f"refresh failed, {out} left as it was: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(result.prices)} shape prices to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
