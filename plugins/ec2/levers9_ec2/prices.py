"""On-demand prices of EC2's GPU instance types: a catalog shipped with the plugin, and how to rebuild it.

EC2's own API publishes no on-demand price (DescribeInstanceTypes has none),
so offers take theirs from ``prices.json`` next to this module: US dollars per
instance-hour, Linux, shared tenancy, per region and instance type. The file
says in its ``source`` and ``retrieved`` fields where its figures came from and
when. The shipped figures were read on 2026-12-02 from the public SkyPilot
catalog (``skypilot-org/skypilot-catalog``, ``catalogs/v7/aws/vms.csv`` at
commit ``001367d22a00``, its ``Price`` column, which that project fills from
the AWS Price List); only figures were copied, and only for the GPU types most
pools use (g4dn.xlarge, g5.12xlarge, p3.8xlarge, p3dn, p4d, p4de, p5, p5en) in
the regions that file prices them in. A type or region missing from the file
has no price (``None``): an offer without a price is still an offer, and a
refresh fills in every GPU type.

Refresh (needs network access to the AWS Price List, or a local copy)::

    python -m levers9_ec2.prices refresh [--source URL-OR-PATH] [--region R ...] [--out PATH]

reads the AWS Price List bulk offer file of each region, in its documented
format (``https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json``:
``products`` keyed by SKU, each with ``attributes``; ``terms.OnDemand[sku][offer term].priceDimensions[rate
code].pricePerUnit.USD``), keeps the products with an ``instanceType``, a
positive ``gpu`` count, ``operatingSystem`` Linux, ``tenancy`` Shared,
``preInstalledSw`` NA and ``capacitystatus`` Used, and writes the catalog
(default: over the shipped file). ``--source`` is a URL or a path, with
``{region}`` where the region goes (without it, one file for every region
asked). ``--region`` defaults to the regions already in the catalog. A region
whose file cannot be read fails the refresh and leaves the catalog as it was.
The real offer files are large (gigabytes for the big regions) and are read
whole into memory.

The file's form, and the invariants (read once per process; a malformed file
an error when first asked; a refresh that fails leaves the file as it was),
are :mod:`levers9.clouds.price_files`'.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from levers9.clouds.price_files import ShippedCatalog, read_source, write_catalog

__all__ = ["DEFAULT_SOURCE", "Catalog", "catalog", "main", "on_demand_price", "prices_from_offer_file", "refresh"]

DEFAULT_SOURCE = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
_WANTED = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}


class Catalog:
    """``prices[region][instance_type]`` in US dollars per hour, with where they came from."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        prices = data.get("prices")
        if not isinstance(prices, dict):
            raise ValueError("an EC2 price catalog needs a 'prices' mapping of region -> instance type -> USD/hour")
        self.source = str(data.get("source", ""))
        self.retrieved = str(data.get("retrieved", ""))
        self.prices: dict[str, dict[str, float]] = {
            str(region): {str(t): float(p) for t, p in types.items()} for region, types in prices.items()
        }

    def price(self, region: str, instance_type: str) -> float | None:
        return self.prices.get(region, {}).get(instance_type)


_shipped = ShippedCatalog("levers9_ec2", Catalog)


def catalog() -> Catalog:
    """The shipped catalog, read once."""
    return _shipped.get()


def on_demand_price(region: str, instance_type: str) -> float | None:
    """US dollars per hour of ``instance_type`` on demand in ``region``; None when the catalog has no figure."""
    return catalog().price(region, instance_type)


# --------------------------------------------------------------------------- refresh


def _positive(text: Any) -> bool:
    try:
        return float(str(text).split()[0]) > 0
    except (ValueError, IndexError):
        return False


def prices_from_offer_file(offer: Mapping[str, Any], region: str | None = None) -> dict[str, dict[str, float]]:
    """``{region: {instance type: USD/hour}}`` of the GPU types in one AWS Price List offer file.

    The region is the product's ``regionCode`` (or ``region``, when the file is known to be of one region and
    its products carry none).
    """
    products = offer.get("products") or {}
    on_demand = (offer.get("terms") or {}).get("OnDemand") or {}
    found: dict[str, dict[str, float]] = {}
    for sku, product in products.items():
        attributes = product.get("attributes") or {}
        instance_type = attributes.get("instanceType")
        if not instance_type or not _positive(attributes.get("gpu")):
            continue
        if any(attributes.get(key) != value for key, value in _WANTED.items()):
            continue
        where = attributes.get("regionCode") or region
        if not where:
            continue
        for term in (on_demand.get(sku) or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = (dimension.get("pricePerUnit") or {}).get("USD")
                if usd is not None and float(usd) > 0:
                    found.setdefault(where, {})[instance_type] = float(usd)
    return found


def refresh(source: str, regions: Iterable[str], out: Path) -> Catalog:
    """Rebuild the catalog at ``out`` from the offer files ``source`` names (see the module docstring)."""
    wanted = sorted(set(regions))
    prices: dict[str, dict[str, float]] = {}
    if "{region}" in source:
        for region in wanted:
            for where, types in prices_from_offer_file(
                read_source(source.format(region=region), timeout=600), region
            ).items():
                if where == region:
                    prices.setdefault(where, {}).update(types)
    else:
        found = prices_from_offer_file(read_source(source, timeout=600))
        prices = {r: t for r, t in found.items() if not wanted or r in wanted}
    return write_catalog(
        out,
        source=f"AWS Price List bulk offer files ({source}): on-demand, Linux, shared tenancy, capacity used",
        prices={r: dict(sorted(t.items())) for r, t in sorted(prices.items())},
        parse=Catalog,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m levers9_ec2.prices", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    again = commands.add_parser("refresh", help="rebuild the on-demand price catalog from the AWS Price List")
    again.add_argument("--source", default=DEFAULT_SOURCE, help="offer file URL or path; '{region}' is replaced")
    again.add_argument("--region", action="append", dest="regions", help="a region to price (repeat)")
    again.add_argument("--out", type=Path, help="where to write (default: the catalog shipped with the plugin)")
    args = parser.parse_args(argv)
    out = args.out or _shipped.path
    regions = args.regions or sorted(catalog().prices)
    try:
        result = refresh(args.source, regions, out)
    except (OSError, ValueError) as exc:
        print(f"refresh failed, {out} left as it was: {exc}", file=sys.stderr)
        return 1
    count = sum(len(t) for t in result.prices.values())
    print(f"wrote {count} prices in {len(result.prices)} regions to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
