"""Sizes and CPU amounts as people write them: ``256Mi``, ``1Gi``, ``16GiB``, ``500m``, ``0.5``.

One parser for the operator's config (``memory: 16GiB``, ``limits.max_payload_bytes: 512MiB``)
and the SDK (``@levers9.function(memory="1Gi", cpu="500m")``), so both accept the
same spellings and refuse the same mistakes with the same words.

Invariants:

- Every size unit is binary: ``K``, ``Ki``, ``KB`` and ``KiB`` all mean 1024;
  ``M``/``Mi``/``MB``/``MiB`` 1024², and so on for ``G`` and ``T``. ``16GB`` is
  therefore 16 GiB, not 16 * 10**9 bytes: memory is sold and requested in binary
  sizes, and reading ``GB`` two ways in one file would be a trap. Every error
  message says so.
- A lowercase ``b`` (``1Gb``, ``512mb``) means bits in the usual reading and is
  refused rather than guessed.
- The prefix letter and the ``i`` may be either case (``16gi``, ``16Gi``);
  the byte sign is ``B`` or nothing.
- A bare number keeps the meaning its field always had: MiB for memory,
  bytes for byte limits, cores for CPU.
- Booleans are refused (``True`` is an ``int`` to Python, never a size to a person).

This module imports only the standard library: the SDK imports it on the user's
machine, and plugins import the config fields that use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = [
    "GIB",
    "KIB",
    "MIB",
    "SIZE_PATTERN",
    "TIB",
    "NotAQuantity",
    "NotAQuantityType",
    "format_bytes",
    "format_mib",
    "parse_bytes",
    "parse_cpu_millicores",
    "parse_memory_mib",
]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

_PREFIX = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}
#: what a size written as a string looks like, for JSON schemas (editors check config files with them)
SIZE_PATTERN = r"^\s*(\d+(\.\d*)?|\.\d+)\s*([kKmMgGtT][iI]?)?B?\s*$"
_SIZE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<prefix>[kKmMgGtT]?)(?P<i>[iI]?)(?P<b>[bB]?)\s*")
_CPU = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<milli>m?)\s*")

#: said in every size error, so no one has to guess how GB is read
_BINARY_NOTE = "K, M, G and T are 1024-based with or without i or B, so 16GB = 16GiB; a lowercase b would be bits"


class NotAQuantity(ValueError):
    """A value that is not a size or CPU amount, or one out of range; the message names the field."""


class NotAQuantityType(NotAQuantity, TypeError):
    """A value of a type no quantity is written as (a list, a boolean...)."""


def _label(field: str | None) -> str:
    return f"{field}: " if field else ""


def _scaled(value: object, unit: int, field: str | None, accepted: str) -> float:
    """``value`` in bytes, where a bare number counts ``unit`` bytes."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise NotAQuantityType(f"{_label(field)}{value!r} is not a quantity; {accepted}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise NotAQuantity(f"{_label(field)}{value!r} is not a quantity; {accepted}")
        return float(value) * unit
    match = _SIZE.fullmatch(value)
    if match is None or match["b"] == "b" or (match["i"] and not match["prefix"]):
        raise NotAQuantity(f"{_label(field)}{value!r} is not a quantity; {accepted} ({_BINARY_NOTE})")
    number = float(match["number"])
    if not (match["prefix"] or match["i"] or match["b"]):
        return number * unit
    return number * _PREFIX[match["prefix"].lower()]


def parse_memory_mib(value: object, *, field: str | None = None, minimum: int = 1, maximum: int | None = None) -> int:
    """A memory size in whole MiB: an int or float (MiB) or a string such as ``256Mi``, ``1Gi``, ``16GiB``."""
    accepted = "use MiB as a number (512) or a string like '256Mi', '1Gi', '16GiB'"
    size = _scaled(value, MIB, field, accepted)
    mib = size / MIB
    if mib != int(mib):
        raise NotAQuantity(f"{_label(field)}{value!r} is not a whole number of MiB; {accepted}")
    return _in_range(int(mib), minimum, maximum, field, value, format_mib)


def parse_bytes(value: object, *, field: str | None = None, minimum: int = 0, maximum: int | None = None) -> int:
    """A size in bytes: an int (bytes) or a string such as ``64KiB``, ``512MiB``, ``1GiB``."""
    accepted = "use a number of bytes or a string like '64KiB', '512MiB', '1GiB'"
    size = _scaled(value, 1, field, accepted)
    if size != int(size):
        raise NotAQuantity(f"{_label(field)}{value!r} is not a whole number of bytes; {accepted}")
    return _in_range(int(size), minimum, maximum, field, value, format_bytes)


def parse_cpu_millicores(
    value: object, *, field: str | None = "cpu", minimum: int = 1, maximum: int | None = None
) -> int:
    """CPU in millicores: a number of cores (``0.5``, ``2``) or a string ``'0.5'``, ``'2'``, ``'500m'``.

    A fraction of a millicore is rounded to the nearest whole one; the result
    must then lie in ``[minimum, maximum]``.
    """
    accepted = "use cores as a number (0.5, 2) or a string like '500m' (millicores), '0.5', '2'"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise NotAQuantityType(f"{_label(field)}{value!r} is not a CPU amount; {accepted}")
    if isinstance(value, str):
        match = _CPU.fullmatch(value)
        if match is None:
            raise NotAQuantity(f"{_label(field)}{value!r} is not a CPU amount; {accepted}")
        number = float(match["number"])
        millicores = number if match["milli"] else number * 1000
    else:
        if not math.isfinite(value):
            raise NotAQuantity(f"{_label(field)}{value!r} is not a CPU amount; {accepted}")
        millicores = float(value) * 1000
    return _in_range(round(millicores), minimum, maximum, field, value, _format_millicores)


def _in_range(
    amount: int, minimum: int, maximum: int | None, field: str | None, value: object, show: Callable[[int], str]
) -> int:
    if amount < minimum or (maximum is not None and amount > maximum):
        upper = f" and at most {show(maximum)}" if maximum is not None else ""
        raise NotAQuantity(f"{_label(field)}{value!r} is out of range; it must be at least {show(minimum)}{upper}")
    return amount


def format_bytes(amount: int) -> str:
    """``1073741824`` -> ``'1 GiB'``; sizes that are no whole binary unit keep their digits (``'1,000 bytes'``)."""
    for name, unit in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if amount >= unit and amount % unit == 0:
            return f"{amount // unit:,} {name}"
    return f"{amount:,} bytes"


def format_mib(amount: int) -> str:
    """A MiB count as a size: ``16384`` -> ``'16 GiB'``."""
    return format_bytes(amount * MIB)


def _format_millicores(amount: int) -> str:
    return f"{amount}m ({amount / 1000:g} cores)"
