"""Human-sized quantities in config: ``memory: 16GiB`` rather than ``memory_mib: 16384``.

The parsing lives in :mod:`levers9.quantities`, shared with the SDK so a size
means the same in a config file and in ``@levers9.function(memory=...)``.
"""

from __future__ import annotations

from levers9.quantities import format_bytes, parse_bytes, parse_memory_mib

__all__ = ["format_bytes", "parse_bytes", "parse_memory_mib"]
