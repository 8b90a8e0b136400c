"""What the provider contract kit measures a provider's answers against, apart from the tests themselves.

* **GPU memory per GPU.** An offer's ``gpu_memory_mib`` is the memory of one
  GPU. The kit accepts the catalog's nominal figure
  (:data:`levers9.gpu.catalog.CATALOG`'s ``memory_mib``: 81920 MiB for an
  80 GB H100) or what the driver shows for that card (``nvidia-smi``'s
  ``memory.total``, which is a little less: 81559 MiB for the H100, 15360 MiB
  for a 16 GB T4; the recordings of :mod:`levers9.testing.recorded_gpus`, so
  the figure an offer may give is the one a booted machine of it reports),
  each within :data:`MEMORY_TOLERANCE` (1 %). A figure 2.3 % off either is refused, and
  so is the total of all the machine's GPUs given for one.
  :func:`memory_problem` says what is wrong, or None.
* **Secrets in the log.** :func:`captured_log` collects every record that
  reaches the root logger, at any level, while a block runs (the root logger
  is set to DEBUG meanwhile and restored after), so the kit can look for the
  join token in what the plugin logged. A record a logger of the plugin keeps
  from the root logger (``propagate = False``, or a level of its own above
  the record's) is not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from levers9.gpu.catalog import CATALOG
from levers9.hooks.types import GpuOffer
from levers9.testing.recorded_gpus import recorded_card

#: how far (as a fraction) an offer's per-GPU memory may lie from the catalog's or the driver's figure
MEMORY_TOLERANCE = 0.01


def accepted_memory(gpu: str) -> list[int]:
    """The per-GPU memory figures, in MiB, an offer of ``gpu`` (a canonical type) may give, each within the
    tolerance: the catalog's, then the driver's where the kit knows it."""
    nominal = CATALOG[gpu].memory_mib
    try:
        driver = recorded_card(gpu).memory_mib
    except ValueError:  # an AMD type, or one with no recording: nvidia-smi's figure is not known
        driver = nominal
    return [nominal] if driver == nominal else [nominal, driver]


def memory_problem(offer: GpuOffer) -> str | None:
    """Why ``offer``'s ``gpu_memory_mib`` is not the memory of one ``offer.gpu``, or None when it is."""
    given = offer.gpu_memory_mib
    accepted = accepted_memory(offer.gpu)
    if any(abs(given - figure) <= figure * MEMORY_TOLERANCE for figure in accepted):
        return None
    nominal = accepted[0]
    seen = f"the catalog says {nominal}" + (f" and nvidia-smi shows {accepted[1]}" if len(accepted) > 1 else "")
    hint = ""
    total = nominal * offer.gpu_count
    if offer.gpu_count > 1 and abs(given - total) <= total * MEMORY_TOLERANCE:
        hint = f"; that is the total of all {offer.gpu_count} GPUs, but gpu_memory_mib is the memory of one GPU"
    off = (given - nominal) / nominal * 100
    return (
        f"offer {offer.instance_type or offer.gpu} says {offer.gpu} has {given} MiB per GPU ({off:+.1f}% of the "
        f"catalog's figure); {seen}, and the kit accepts either within {MEMORY_TOLERANCE:.0%}{hint}. Give the "
        f"memory of one GPU as levers9.gpu.catalog.CATALOG[{offer.gpu!r}].memory_mib has it"
    )


class _Kept(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.NOTSET)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured_log() -> Iterator[list[logging.LogRecord]]:
    """Every log record that reaches the root logger while the block runs (see the module docstring)."""
    records: list[logging.LogRecord] = []
    root = logging.getLogger()
    handler = _Kept(records)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def formatted(record: logging.LogRecord) -> str:
    """A record as a handler would write it: its message, its exception and stack if any, and its logger's name."""
    return f"{record.name}: {logging.Formatter().format(record)}"
