"""The TCP ports levers9 picks for its own servers: below the kernel's ephemeral range, in a range of their own.

The kernel hands ports of its ephemeral range (``ip_local_port_range``) to
every outgoing connection, so a port found free there can be taken between
the pick and the bind. levers9's servers that pick a port themselves (a
container's runner and HTTP server on the worker, the embedded image
registry) pick at random from :func:`picked_range`, the 20,000 ports just
below that range, and check the port binds. The ports below
:func:`picked_range` are left to whatever else picks explicitly on the same
machine (levers9's tests pick there), so such picks never race levers9's own.

Failures: :func:`pick` raises OSError when 200 random tries found no port that
binds; the caller says what it was picking for.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Container
from pathlib import Path

__all__ = ["ephemeral_low", "pick", "picked_range"]

#: how many ports below the ephemeral range levers9's servers pick from
SPAN = 20_000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def picked_range() -> range:
    """The ports levers9's own servers pick from."""
    low = ephemeral_low()
    return range(max(1024, low - SPAN), low)


def bindable(port: int, host: str = "0.0.0.0") -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def pick(host: str = "0.0.0.0", taken: Container[int] = ()) -> int:
    """A port of :func:`picked_range` that binds on ``host`` now and is not in ``taken``."""
    ports = picked_range()
    for _ in range(200):
        port = random.choice(ports)
        if port not in taken and bindable(port, host):
            return port
    raise OSError(f"no free TCP port in {ports.start}-{ports.stop - 1} on {host} after 200 tries")
