"""Whether a host name or address is reachable from this machine only (the standard library only).

One rule for every place that lets something through on loopback alone: plain HTTP to an identity provider or
the sign-in exchange, a listener without TLS. ``localhost``, any ``*.localhost`` name (RFC 6761 keeps them on the
machine), ``127.0.0.0/8`` and ``::1`` are loopback; any other name may resolve to any interface, so it is not.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
