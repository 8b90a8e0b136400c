"""The on-demand price catalog: the shipped file, and its refresh from AWS Price List offer files.

The offer files here are small, written in the Price List's documented bulk
format (``products`` by SKU with ``attributes``; ``terms.OnDemand`` by SKU,
offer term and rate code, ``pricePerUnit.USD``), with products the refresh
must leave out next to the one it must keep. The refresh runs as an operator
runs it (``python -m levers9_ec2.prices refresh``, a subprocess), reading a
local path and a local HTTP server (a thread), never the internet.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from levers9_ec2.prices import Catalog, catalog, prices_from_offer_file
from tests.fakes.local_server import LocalServer

GPU_LINUX = {
    "instanceType": "p5.48xlarge",
    "gpu": "8",
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


def offer_file(region: str, usd: str) -> dict[str, Any]:
    """An offer file of ``region``: one product to keep (p5.48xlarge at ``usd``) and five to leave out."""
    products = {
        "KEEP": {**GPU_LINUX, "regionCode": region},
        "WINDOWS": {**GPU_LINUX, "regionCode": region, "operatingSystem": "Windows"},
        "DEDICATED": {**GPU_LINUX, "regionCode": region, "tenancy": "Dedicated"},
        "RESERVED": {**GPU_LINUX, "regionCode": region, "capacitystatus": "UnusedCapacityReservation"},
        "SQL": {**GPU_LINUX, "regionCode": region, "preInstalledSw": "SQL Std"},
        "CPU": {**GPU_LINUX, "regionCode": region, "instanceType": "m7i.large", "gpu": "0"},
    }
    terms = {
        sku: {
            f"{sku}.JRTCKXETXF": {
                "offerTermCode": "JRTCKXETXF",
                "sku": sku,
                "priceDimensions": {
                    f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                        "unit": "Hrs",
                        "pricePerUnit": {"USD": "999.0000000000" if sku != "KEEP" else usd},
                    }
                },
            }
        }
        for sku in products
    }
    return {
        "formatVersion": "v1.0",
        "offerCode": "AmazonEC2",
        "products": {
            sku: {"sku": sku, "productFamily": "Compute Instance", "attributes": attributes}
            for sku, attributes in products.items()
        },
        "terms": {"OnDemand": terms},
    }


def write_offers(root: Path, prices: dict[str, str]) -> None:
    for region, usd in prices.items():
        (root / region).mkdir(parents=True)
        (root / region / "index.json").write_text(json.dumps(offer_file(region, usd)))


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "levers9_ec2.prices", "refresh", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory served over HTTP on 127.0.0.1 (a thread), stopped at the end."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

    root = tmp_path / "offers"
    root.mkdir()
    server = LocalServer(functools.partial(Quiet, directory=str(root)), name="offer-files")
    yield f"http://127.0.0.1:{server.port}", root
    server.close()


def test_the_shipped_catalog_says_where_it_came_from() -> None:
    shipped = catalog()
    assert "skypilot-catalog" in shipped.source
    assert shipped.retrieved
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        assert shipped.prices[region], region
    assert shipped.price("us-east-1", "p5.48xlarge") == 98.32
    assert shipped.price("us-east-1", "no.such-type") is None
    assert shipped.price("xx-nowhere-1", "p5.48xlarge") is None


def test_only_linux_shared_on_demand_gpu_products_are_kept() -> None:
    found = prices_from_offer_file(offer_file("eu-west-1", "110.5000000000"))
    assert found == {"eu-west-1": {"p5.48xlarge": 110.5}}


def test_refresh_from_a_local_path(tmp_path: Path) -> None:
    write_offers(tmp_path, {"us-east-1": "98.3200000000", "eu-west-1": "110.5000000000"})
    out = tmp_path / "prices.json"
    done = refresh(
        "--source",
        str(tmp_path / "{region}" / "index.json"),
        "--region",
        "us-east-1",
        "--region",
        "eu-west-1",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    written = Catalog(json.loads(out.read_text()))
    assert written.prices == {"eu-west-1": {"p5.48xlarge": 110.5}, "us-east-1": {"p5.48xlarge": 98.32}}
    assert "AWS Price List" in written.source
    assert written.retrieved


def test_refresh_over_http(served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    write_offers(root, {"us-west-2": "97.0000000000"})
    out = tmp_path / "prices.json"
    done = refresh("--source", f"{url}/{{region}}/index.json", "--region", "us-west-2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert Catalog(json.loads(out.read_text())).prices == {"us-west-2": {"p5.48xlarge": 97.0}}


def test_a_failed_refresh_leaves_the_catalog_alone(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    out = tmp_path / "prices.json"
    out.write_text('{"prices": {}}')
    done = refresh("--source", f"{url}/{{region}}/index.json", "--region", "us-west-2", "--out", str(out))
    assert done.returncode == 1
    assert "left as it was" in done.stderr
    assert out.read_text() == '{"prices": {}}'
