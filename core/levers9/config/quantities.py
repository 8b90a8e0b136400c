"""Human-sized quantities in config: ``memory: 16GiB`` rather than ``memory_mib: 16384``."""

from __future__ import annotations

import re

_UNITS_MIB = {
    "": 1,  # a bare number is MiB
    "mi": 1,
    "mib": 1,
    "m": 1,
    "mb": 1,
    "gi": 1024,
    "gib": 1024,
    "g": 1024,
    "gb": 1024,
    "ti": 1024 * 1024,
    "tib": 1024 * 1024,
    "t": 1024 * 1024,
    "tb": 1024 * 1024,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_memory_mib(value: object) -> int:
    """Accept an int (MiB) or a string such as ``512MiB``, ``16GiB``, ``1.5Ti``; returns MiB."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 16GiB or a number of MiB, not a boolean")
    if isinstance(value, int | float):
        mib = float(value)
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS_MIB:
            raise ValueError(f"{value!r} is not a size; use a number of MiB or a string like 512MiB, 16GiB, 1TiB")
        mib = float(match.group(1)) * _UNITS_MIB[unit]
    else:
        raise ValueError(f"expected a size such as 16GiB, got {type(value).__name__}")
    if mib <= 0 or mib != int(mib):
        raise ValueError(f"{value!r} must be a positive whole number of MiB")
    return int(mib)
