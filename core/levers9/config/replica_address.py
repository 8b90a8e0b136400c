"""What a replica's relay address (``listen.replica_address``, ``$LEVERS9_REPLICA_ADDRESS``) may be.

It is where the other replicas dial this one's gRPC listener to relay gateway
requests through the workers' tunnels it holds: ``HOST:PORT``, an IPv6 host
in brackets, the port 1-65535, no scheme. Anything else is refused where it
is given, naming the setting and the accepted form.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

__all__ = ["ReplicaAddress", "replica_address"]


def replica_address(value: str, name: str) -> str:
    """``value`` checked as the HOST:PORT other replicas dial; ValueError naming ``name`` otherwise."""
    host, sep, port = value.strip().rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or not host or bare_ipv6 or not port.isdigit() or not 0 < int(port) < 65536 or "/" in value:
        raise ValueError(
            f"{name} {value!r} is not an address; accepted: HOST:PORT with a port of 1-65535 (an IPv6 host in "
            "brackets), e.g. 10.0.0.5:1993 or [fd00::5]:1993"
        )
    return value.strip()


#: a pydantic field type for ``listen.replica_address``
ReplicaAddress = Annotated[str, AfterValidator(lambda value: replica_address(value, "listen.replica_address"))]
