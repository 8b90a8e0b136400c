"""Reading a controlplane's gRPC address: what the SDK, the CLI and the worker dial, and whether over TLS.

An address is ``grpcs://host[:port]`` or ``https://...`` (TLS; no port means
443), ``grpc://host:port`` or ``http://...`` (plaintext), or a bare
``host:port`` (plaintext). Standard library only, so the worker can read its
controlplane's address without importing the SDK.
"""

from __future__ import annotations

__all__ = ["parse_target"]

_TLS_SCHEMES = ("grpcs://", "https://")
_PLAIN_SCHEMES = ("grpc://", "http://")


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


def _has_port(target: str) -> bool:
    if target.startswith("["):  # [v6::addr]:port
        return "]:" in target
    return ":" in target
