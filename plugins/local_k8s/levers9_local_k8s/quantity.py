"""Kubernetes resource quantities (``500m``, ``4Gi``, ``1.5``, ``2e3``, ``8``) as exact numbers.

The API server's own grammar: a signed decimal number, then one suffix: the
binary ``Ki Mi Gi Ti Pi Ei`` (powers of 1024), the decimal ``n u m k M G T P E``
(``m`` is milli, ``M`` is mega), or a decimal exponent ``e``/``E`` followed by
an integer. Unlike :mod:`levers9.quantities` (what people write in levers9's
config, where every size unit is binary), ``4G`` here is 4·10⁹ as Kubernetes
reads it. Answers are :class:`fractions.Fraction`, so ``100m`` of CPU times 10
is exactly one core. Anything else raises ValueError naming the text.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["parse_quantity"]

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    if isinstance(text, int | float):
        return Fraction(str(text))
    found = _QUANTITY.match(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (like 500m, 4Gi, 2, 1.5, 1e3)")
    number, suffix = Fraction(found.group(1)), found.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])
