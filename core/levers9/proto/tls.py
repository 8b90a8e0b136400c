"""The CA certificates a gRPC client trusts when it dials a controlplane over TLS.

The SDK, the CLI and the worker all verify the controlplane's certificate the
same way: with the PEM bundle they were given (a context's ``ca_file``, the
worker's ``LEVERS9_CONTROLPLANE_CA``), else with the system's trust store, so a
controlplane behind a company CA installed on the machine works like any HTTPS
site. Standard library only (the worker imports it).
"""

from __future__ import annotations

import os
import ssl

__all__ = ["UNTRUSTED_MARKERS", "certificate_untrusted", "read_ca_file", "system_roots"]

# Where Linux distributions keep the system CA bundle, for when Python's own default is absent.
_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)

#: what gRPC's transport says when the server's certificate chain did not verify against the roots
UNTRUSTED_MARKERS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "Cert verify failed")


def system_roots() -> bytes | None:
    """The system's CA certificates; ``None`` falls back to the roots gRPC ships.

    ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` still overrides gRPC's own.
    """
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, *_CA_BUNDLES):
        if candidate and os.path.isfile(candidate):
            try:
                with open(candidate, "rb") as handle:
                    return handle.read()
            except OSError:
                continue
    return None


def read_ca_file(path: str, setting: str) -> bytes:
    """The PEM bundle at ``path``; ValueError naming ``setting`` when it cannot be read or holds no certificate."""
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read the CA bundle {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError(f"{setting}: {path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")
    return data


def certificate_untrusted(details: str) -> bool:
    """Whether a gRPC error's details say the server's certificate was not trusted."""
    return any(marker in details for marker in UNTRUSTED_MARKERS)
