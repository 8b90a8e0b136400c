"""Reading a controlplane's gRPC address: what the SDK, the CLI and the worker dial, and whether over TLS.

An address is ``grpcs://host[:port]`` or ``https://...`` (TLS; no port means
443), ``grpc://host:port`` or ``http://...`` (plaintext), or a bare
``host:port`` (plaintext). Standard library only, so the worker can read its
controlplane's address without importing the SDK.

Several replicas are written as one comma-separated list
(``grpcs://a:1993, grpcs://b:1993``): :func:`parse_targets` reads it. Each
entry is one gRPC target; a single name that resolves to several addresses, or
a load balancer, is one entry (gRPC itself spreads over its addresses). The
list is refused (:class:`TargetError`, a ``ValueError``) when an entry is
empty, when two entries name the same ``host:port``, or when the entries do
not all agree on TLS; the message names the entry at fault.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TargetError", "parse_target", "parse_targets", "split_targets"]

_TLS_SCHEMES = ("grpcs://", "https://")
_PLAIN_SCHEMES = ("grpc://", "http://")


class TargetError(ValueError):
    """A list of controlplane addresses that cannot be used; the message names the entry and why."""


def parse_target(address: str) -> tuple[str, bool]:
    """``(host:port, tls)`` of a context's grpc address; a TLS address without a port means 443."""
    address = address.strip().rstrip("/")
    for scheme in _TLS_SCHEMES:
        if address.startswith(scheme):
            target = address.removeprefix(scheme)
            return (target if _has_port(target) else f"{target}:443"), True
    for scheme in _PLAIN_SCHEMES:
        if address.startswith(scheme):
            return address.removeprefix(scheme), False
    return address, False


def split_targets(addresses: str | Sequence[str]) -> list[str]:
    """The entries of a comma-separated list (or of a list of such strings), stripped, as written."""
    parts = [addresses] if isinstance(addresses, str) else list(addresses)
    return [entry.strip() for part in parts for entry in part.split(",")]


def parse_targets(addresses: str | Sequence[str]) -> tuple[list[str], bool]:
    """``([host:port, ...], tls)`` of a list of addresses, in the order given; raises :class:`TargetError`."""
    entries = split_targets(addresses)
    targets: list[str] = []
    tls_of_first: bool | None = None
    for position, entry in enumerate(entries, 1):
        if not entry:
            raise TargetError(
                f"address {position} of {len(entries)} is empty in {_shown(addresses)!r}: "
                "expected host:port, grpc://host:port or grpcs://host[:port], separated by commas"
            )
        target, tls = parse_target(entry)
        if not target or target.startswith(":"):
            raise TargetError(f"{entry!r} names no host: expected host:port, grpc://host:port or grpcs://host[:port]")
        if target in targets:
            raise TargetError(f"{entry!r} is listed twice (as {target}); list each replica once")
        if tls_of_first is None:
            tls_of_first = tls
        elif tls != tls_of_first:
            first = "TLS" if tls_of_first else "plain text"
            raise TargetError(
                f"{entry!r} is {'TLS' if tls else 'plain text'} but {entries[0]!r} is {first}: "
                "every replica of one controlplane is reached the same way (all grpcs:// or all grpc://)"
            )
        targets.append(target)
    return targets, bool(tls_of_first)


def _shown(addresses: str | Sequence[str]) -> str:
    return addresses if isinstance(addresses, str) else ",".join(addresses)


def _has_port(target: str) -> bool:
    if target.startswith("["):  # [v6::addr]:port
        return "]:" in target
    return ":" in target
