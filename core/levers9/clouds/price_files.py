"""Price catalogs a cloud plugin ships as a JSON file next to its code, and rebuilds from a public price list.

A cloud's own API often publishes no on-demand price, so a plugin reads its
offers' prices from a file in its package. Every such file is one JSON
object: ``source`` (where its figures came from), ``retrieved`` (the UTC date
they were read), ``currency`` (``USD``), ``unit`` (``instance-hour``) and
``prices``, whose shape is the plugin's own (per region and type, per
shape...); the plugin's parser checks it.

Invariants:

* a shipped catalog is read once per process (thread-safe, lazily, on the
  first price asked), and a malformed file is an error at that moment, not
  silently no prices;
* a refresh validates what it built with the same parser before writing,
  and replaces the file atomically: a refresh that fails leaves the catalog
  as it was, never half written.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["CATALOG_FILE", "ShippedCatalog", "read_source", "write_catalog"]

#: the catalog's file name in the plugin's package
CATALOG_FILE = "prices.json"

C = TypeVar("C")


class ShippedCatalog(Generic[C]):
    """The catalog file of ``package``, parsed by ``parse`` the first time it is asked for."""

    def __init__(self, package: str, parse: Callable[[Mapping[str, Any]], C], name: str = CATALOG_FILE) -> None:
        self.package = package
        self.name = name
        self._parse = parse
        self._lock = threading.Lock()
        self._loaded: C | None = None

    @property
    def path(self) -> Path:
        """Where the shipped file is (a refresh's default destination)."""
        return Path(str(resources.files(self.package).joinpath(self.name)))

    def get(self) -> C:
        """The parsed catalog, read once."""
        with self._lock:
            if self._loaded is None:
                text = resources.files(self.package).joinpath(self.name).read_text(encoding="utf-8")
                self._loaded = self._parse(json.loads(text))
            return self._loaded


def read_source(source: str, *, timeout: float) -> Any:
    """The JSON at ``source``: an ``http(s)://`` URL (downloaded within ``timeout`` seconds) or a file path."""
    if source.startswith(("http://", "https://")):
        import urllib.request  # only a refresh downloads; loading a plugin never does

        with urllib.request.urlopen(source, timeout=timeout) as response:
            return json.load(response)
    with open(source, encoding="utf-8") as file:
        return json.load(file)


def write_catalog(out: Path, *, source: str, prices: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], C]) -> C:
    """Write ``prices`` (read from ``source``, in words) as the catalog at ``out``, dated today; return it parsed.

    The data is parsed before anything is written, and the file replaced in one rename.
    """
    data = {
        "source": source,
        "retrieved": datetime.now(UTC).strftime("%Y-%m-%d"),
        "currency": "USD",
        "unit": "instance-hour",
        "prices": dict(prices),
    }
    result = parse(data)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)
    return result
