"""What ``nvidia-smi`` prints on a machine with GPUs of a catalog type: the GPUs of an emulated machine.

An emulated boot (:func:`levers9.testing.boot.emulated_boot`,
:class:`levers9.testing.cloud_boot.CloudBooter`) gives a machine GPUs by
putting an ``nvidia-smi`` on its ``PATH`` that prints the lines the real one
prints for ``--query-gpu=index,uuid,name,memory.total
--format=csv,noheader,nounits``; the worker's GPU discovery
(:mod:`levers9.discovery.nvidia_smi`) reads them as on the real machine.
:func:`nvidia_smi` gives those lines for ``count`` GPUs of any NVIDIA type in
:data:`levers9.gpu.catalog.CATALOG`, so a provider's tests boot machines with
the GPUs its offers promise without knowing levers9's own test data.

The cards are package data (``recorded_gpus.yaml`` beside this module): for
each, the name and ``memory.total`` nvidia-smi reports (a little under the
nominal size: 81559 MiB for an 80 GB H100), and where that figure comes from
(``published`` nvidia-smi outputs, or ``derived`` from the catalog where none
was found; the file says which).

Invariants: every NVIDIA type of the catalog has a card
(tests/testing/test_recorded_gpus.py fails on a type without one), and the
card's name reads back as that very type through levers9's own reading of
nvidia-smi names (:func:`levers9.gpu.normalize.from_nvidia_smi`), so a
booted worker reports the type the offer named. The lines are deterministic
for a given ``machine``: UUIDs are derived from it and the index, so two
machines never share a GPU's UUID and the same machine always shows the same.

Failures: an unknown or ambiguous type raises the catalog's
:class:`~levers9.gpu.catalog.UnknownGpuType` (a ``ValueError`` naming the
closest types); an AMD type, or a count below 1, raises ``ValueError`` saying
why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from levers9.gpu.catalog import CATALOG, canonical
from levers9.gpu.normalize import from_nvidia_smi

__all__ = ["RecordedCard", "nvidia_smi", "recorded_card"]

DATA = Path(__file__).with_name("recorded_gpus.yaml")
#: the namespace the GPUs' UUIDs are derived in (any fixed UUID would do; this one is levers9's own)
_UUIDS = uuid.UUID("5c0e6a1e-9b5f-4c39-8a2f-6d8e0b3f7a91")


@dataclass(frozen=True)
class RecordedCard:
    """One card as nvidia-smi reports it."""

    #: nvidia-smi's ``name`` (``NVIDIA H100 80GB HBM3``)
    name: str
    #: nvidia-smi's ``memory.total`` in MiB
    memory_mib: int
    #: ``published`` (seen in published nvidia-smi outputs) or ``derived`` (the catalog's nominal figure)
    source: str


@cache
def _cards() -> tuple[RecordedCard, ...]:
    raw = yaml.safe_load(DATA.read_text())
    return tuple(
        RecordedCard(name=str(c["name"]), memory_mib=int(c["memory_mib"]), source=str(c["source"]))
        for c in raw["cards"]
    )


def recorded_card(gpu: str) -> RecordedCard:
    """The card nvidia-smi shows for a GPU of type ``gpu`` (any spelling the catalog accepts).

    :raises UnknownGpuType: ``gpu`` is not a catalog type.
    :raises ValueError: the type is AMD's (nvidia-smi does not see it), or no card of the data file reads as it.
    """
    name = canonical(gpu)
    if CATALOG[name].vendor != "nvidia":
        raise ValueError(
            f"{name} is not an NVIDIA GPU ({CATALOG[name].vendor.upper()}'s): nvidia-smi does not see it, and levers9's worker "
            "discovers GPUs with nvidia-smi only, so a machine of it boots with no GPU levers9 can use"
        )
    for card in _cards():
        if from_nvidia_smi(card.name, card.memory_mib) == name:
            return card
    raise ValueError(
        f"no nvidia-smi recording reads as {name}: add its card (nvidia-smi's name and memory.total) to {DATA}"
    )


def nvidia_smi(gpu: str, count: int = 1, *, machine: str = "") -> str:
    """The lines ``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`` prints on
    a machine with ``count`` GPUs of type ``gpu``; pass it as an emulated boot's ``gpus``.

    ``machine`` (an instance id, say) seeds the GPUs' UUIDs: give each machine its own. Raises as
    :func:`recorded_card` does, and ``ValueError`` for a ``count`` below 1.
    """
    if count < 1:
        raise ValueError(f"count must be 1 or more GPUs, got {count} (a machine without GPUs has no nvidia-smi)")
    card = recorded_card(gpu)
    return "".join(
        f"{index}, GPU-{uuid.uuid5(_UUIDS, f'{machine}/{index}')}, {card.name}, {card.memory_mib}\n"
        for index in range(count)
    )
