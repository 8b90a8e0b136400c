"""OCI shape prices: the shipped catalog, offers priced from it, and its refresh from Oracle's price list.

The price lists here are small, in the form Oracle's public products endpoint
answers (``items`` with ``displayName``, ``metricName`` and USD
``PAY_AS_YOU_GO`` prices), with products the refresh must leave out next to
those it must use. The refresh runs as an operator runs it
(``python -m levers9_oci.prices refresh``, a subprocess), reading a local path
and a local HTTP server (a thread), never the internet.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from levers9.hooks.types import Pool
from levers9_oci.prices import Catalog, catalog, prices_from_list
from levers9_oci.provider import OciProvider
from tests.fakes.local_server import LocalServer

MakePool = Callable[..., Pool]


def item(name: str, metric: str, usd: float, model: str = "PAY_AS_YOU_GO") -> dict[str, Any]:
    return {
        "partNumber": "B00000",
        "displayName": name,
        "metricName": metric,
        "serviceCategory": "Compute - GPU",
        "currencyCodeLocalizations": [
            {"currencyCode": "EUR", "prices": [{"model": model, "value": usd * 100}]},
            {"currencyCode": "USD", "prices": [{"model": model, "value": usd}]},
        ],
    }


PRICE_LIST = {
    "items": [
        item("Compute - GPU - H100", "GPU Per Hour", 10.0),
        item("Compute - GPU - A10", "GPU Per Hour", 2.0),
        item("Compute - GPU - A100 - 80 GB", "GPU Per Hour", 4.0),
        item("Compute - GPU - A100 - 40 GB", "GPU Per Hour", 3.05),
        item("Compute - GPU - L40S", "GPU Per Hour", 3.5, model="MONTHLY_COMMIT"),  # not pay as you go
        item("Compute - Standard - E5 - OCPU", "OCPU Per Hour", 0.03),  # not a GPU
        item("Compute - GPU - B200 - Preview", "Per Hour", 14.0),  # not priced per GPU
    ]
}


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "levers9_oci.prices", "refresh", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory served over HTTP on 127.0.0.1 (a thread), stopped at the end."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

    root = tmp_path / "lists"
    root.mkdir()
    server = LocalServer(functools.partial(Quiet, directory=str(root)), name="price-list")
    yield f"http://127.0.0.1:{server.port}", root
    server.close()


def test_the_shipped_catalog_says_where_it_came_from() -> None:
    shipped = catalog()
    assert "oracle-cloud-gpu-skus-pricing" in shipped.source
    assert shipped.retrieved == "2026-12-06"
    assert shipped.price("BM.GPU.H100.8") == 80.0
    assert shipped.price("VM.GPU.A10.1") == 1.27
    assert shipped.price("VM.Standard.E5.Flex") is None


def test_offers_carry_the_catalogs_price(provider: OciProvider, make_pool: MakePool) -> None:
    pool: Pool = make_pool(gpu="A10", gpu_count=1)
    offers = provider.levers9_gpu_offers(pool)
    assert offers
    assert {(o.instance_type, o.price_per_hour) for o in offers} == {("VM.GPU.A10.1", 1.27)}


def test_a_shapes_price_is_its_gpus_price_times_its_gpus() -> None:
    found = prices_from_list(PRICE_LIST)
    assert found == {
        "BM.GPU.H100.8": 80.0,
        "VM.GPU.A10.1": 2.0,
        "VM.GPU.A10.2": 4.0,
        "BM.GPU.A10.4": 8.0,
        "BM.GPU.A100-v2.8": 32.0,
        "BM.GPU4.8": 24.4,
    }


def test_refresh_from_a_local_path(tmp_path: Path) -> None:
    source = tmp_path / "products.json"
    source.write_text(json.dumps(PRICE_LIST))
    out = tmp_path / "prices.json"
    done = refresh("--source", str(source), "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = Catalog(json.loads(out.read_text()))
    assert written.prices["BM.GPU.H100.8"] == 80.0
    assert "Oracle's price list" in written.source
    assert str(source) in written.source
    assert written.retrieved


def test_refresh_over_http_and_a_failed_one_leaves_the_catalog_alone(served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    (root / "products.json").write_text(json.dumps(PRICE_LIST))
    out = tmp_path / "prices.json"
    done = refresh("--source", f"{url}/products.json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert Catalog(json.loads(out.read_text())).price("VM.GPU.A10.2") == 4.0
    before = out.read_text()
    (root / "cpu-only.json").write_text(json.dumps({"items": [PRICE_LIST["items"][5]]}))
    for source in (f"{url}/missing.json", f"{url}/cpu-only.json"):
        done = refresh("--source", source, "--out", str(out))
        assert done.returncode == 1, source
        assert "left as it was" in done.stderr
    assert out.read_text() == before
