"""TLS for the controlplane's listeners: ``listen.tls`` read, checked, and re-read when the files change.

:class:`ListenerTls` holds the certificate every listener serves (gRPC, HTTP
and metrics). It gives gRPC credentials (``grpc.dynamic_ssl_server_credentials``)
and one ``ssl.SSLContext`` for the uvicorn listeners; both pick up a renewed
certificate without a restart.

When a renewal is noticed: on new connections. gRPC asks its fetcher at every
TLS handshake, and the HTTP context's SNI callback (which OpenSSL runs for
every ClientHello, with or without a server name) does the same; both call
:meth:`ListenerTls.refresh`, which reads the two files at most once a second
and loads them only when their bytes differ from what is served (bytes, not
mtimes: a renewal within one clock tick, or one that keeps the sizes, still
counts). There is no timer: a certificate nobody connects to needs no reloading. The HTTP side never edits
a context that is in use: each generation of the files gets a fresh context,
and the callback moves each new connection onto the newest one.

Invariants: what is served is always a pair that loaded (the key matches the
certificate). A renewal that does not load (half-written files, a key that
does not match, not PEM) is logged as a warning naming the file and the
previous certificate stays in use; it is tried again when the files change
again. At start the same faults are a :class:`TlsError` naming the config key.

A key file readable by group or others only gets a warning (Kubernetes mounts
secrets 0644 unless told otherwise; refusing would break those deployments).

:func:`check_plaintext` holds the rule for plain text: without ``listen.tls``
the controlplane binds only loopback addresses, unless ``listen.plaintext``.
It runs at server start, not in the config model, because ``--host`` may
replace ``listen.host``.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from levers9.addresses import is_loopback
from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from levers9.config.model import TlsConfig

__all__ = ["CertPair", "ListenerTls", "TlsError", "check_plaintext", "is_loopback", "read_ca", "read_pair"]

log = logging.getLogger(__name__)

#: how often (at most) a handshake reads the files again
CHECK_EVERY_S = 1.0


class TlsError(Levers9Error):
    """A ``listen.tls`` file cannot be used, or plain text is not allowed here; the message names the key."""


@dataclass(frozen=True)
class CertPair:
    """One loaded generation of ``cert_file`` and ``key_file``: PEM bytes that match each other."""

    cert_pem: bytes
    key_pem: bytes
    #: the leaf certificate's serial number (what a client sees change on renewal)
    serial: int


def _read(key: str, path: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{key}: {path} does not exist") from None
    except OSError as exc:
        raise TlsError(f"{key}: cannot read {path}: {exc.strerror}") from None


def read_pair(tls: TlsConfig) -> CertPair:
    """Read and check ``cert_file`` and ``key_file``; :class:`TlsError` names the key at fault."""
    return _parse(tls, _read("listen.tls.cert_file", tls.cert_file), _read("listen.tls.key_file", tls.key_file))


def _parse(tls: TlsConfig, cert_pem: bytes, key_pem: bytes) -> CertPair:
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsError(
            f"listen.tls.cert_file: {tls.cert_file} is not a PEM certificate chain "
            "(expected '-----BEGIN CERTIFICATE-----' blocks, the server's certificate first)"
        ) from None
    if b"ENCRYPTED" in key_pem:
        raise TlsError(f"listen.tls.key_file: {tls.key_file} is encrypted; the server needs an unencrypted PEM key")
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise TlsError(
            f"listen.tls.key_file: {tls.key_file} is not a PEM private key "
            "(expected a '-----BEGIN PRIVATE KEY-----' or '-----BEGIN RSA/EC PRIVATE KEY-----' block)"
        ) from None
    leaf = chain[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.DER, public) != leaf.public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise TlsError(
            f"listen.tls.key_file: {tls.key_file} does not match the certificate in listen.tls.cert_file "
            f"({tls.cert_file}, {leaf.subject.rfc4514_string()}); give the key the certificate was issued for"
        )
    if leaf.not_valid_after_utc.timestamp() < time.time():
        log.warning(
            "listen.tls.cert_file: %s expired on %s; clients will refuse it", tls.cert_file, leaf.not_valid_after_utc
        )
    return CertPair(cert_pem, key_pem, leaf.serial_number)


def read_ca(tls: TlsConfig) -> str:
    """The PEM text of ``ca_file`` (empty when unset), checked to hold certificates."""
    if not tls.ca_file:
        return ""
    data = _read("listen.tls.ca_file", tls.ca_file)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsError(
            f"listen.tls.ca_file: {tls.ca_file} is not a PEM CA bundle (expected '-----BEGIN CERTIFICATE-----' blocks)"
        ) from None
    return data.decode("ascii")


def _warn_key_mode(tls: TlsConfig) -> None:
    try:
        mode = os.stat(Path(tls.key_file).expanduser()).st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "listen.tls.key_file: %s can be read by group or others (mode %04o); `chmod 600` it so only the "
            "controlplane reads its private key",
            tls.key_file,
            stat.S_IMODE(mode),
        )


class ListenerTls:
    """The certificate of every listener, re-read when its files change (see the module docstring)."""

    def __init__(
        self, tls: TlsConfig, *, check_every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = tls
        self._check_every_s = check_every_s
        self._clock = clock
        _warn_key_mode(tls)
        self._pair = read_pair(tls)
        #: PEM text of ``ca_file``, handed to the workers this controlplane starts ("" when unset)
        self.ca_pem = read_ca(tls)
        self._checked_at = clock()
        self._failed: tuple[bytes, bytes] | None = None
        self._lock = threading.Lock()  # gRPC's fetcher runs on gRPC's threads, the SNI callback on the loop
        self._grpc_sent: CertPair | None = None
        self._http: ssl.SSLContext | None = None
        self._http_current: ssl.SSLContext | None = None

    @property
    def pair(self) -> CertPair:
        return self._pair

    def refresh(self) -> CertPair:
        """The pair to serve now: re-read when the files changed since the last look (at most once a second).

        Never raises and never blocks on another thread's reload (that one's result is used next time).
        """
        now = self._clock()
        if now - self._checked_at < self._check_every_s or not self._lock.acquire(blocking=False):
            return self._pair
        try:
            self._checked_at = now
            try:
                files = (_read("cert_file", self.config.cert_file), _read("key_file", self.config.key_file))
            except TlsError:
                return self._pair  # a renewal between rename steps; looked at again next time
            if files in ((self._pair.cert_pem, self._pair.key_pem), self._failed):
                return self._pair
            try:
                pair = _parse(self.config, *files)
                context = self._context() if self._http is not None else None
            except (TlsError, ssl.SSLError, OSError) as exc:
                self._failed = files
                log.warning(
                    "the renewed TLS certificate does not load, still serving serial %x: %s", self._pair.serial, exc
                )
                return self._pair
            self._failed = None
            _warn_key_mode(self.config)
            if context is not None:
                self._http_current = context
            log.info("TLS certificate reloaded: serial %x replaces %x", pair.serial, self._pair.serial)
            self._pair = pair
            return pair
        finally:
            self._lock.release()

    # gRPC

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials whose fetcher hands gRPC each new pair (gRPC calls it at every handshake)."""
        self._grpc_sent = self._pair
        initial = grpc.ssl_server_certificate_configuration([(self._pair.key_pem, self._pair.cert_pem)])
        # gRPC takes None from the fetcher as "no change" (its stubs say otherwise)
        fetch: Callable[[], grpc.ServerCertificateConfiguration] = self._fetch  # type: ignore[assignment]
        return grpc.dynamic_ssl_server_credentials(initial, fetch)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            pair = self.refresh()
            if pair is self._grpc_sent:
                return None  # keep what gRPC has
            self._grpc_sent = pair
            return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])
        except Exception:  # an exception here would fail the handshake: serve what gRPC has
            log.exception("reloading the TLS certificate for gRPC failed")
            return None

    # HTTP (uvicorn)

    def ssl_context(self) -> ssl.SSLContext:
        """The context for the HTTP and metrics listeners; each connection is moved onto the newest files'."""
        if self._http is None:
            outer = self._context()
            outer.sni_callback = self._on_hello
            self._http = self._http_current = outer
        return self._http

    def _context(self) -> ssl.SSLContext:
        """A server context on the files as they are now (OpenSSL refuses a key that does not match)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        context.load_cert_chain(Path(self.config.cert_file).expanduser(), Path(self.config.key_file).expanduser())
        return context

    def _on_hello(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        try:
            self.refresh()
            current = self._http_current
            if current is not None and current is not context:
                connection.context = current
        except Exception:  # an exception here would fail the handshake: go on with the context it has
            log.exception("reloading the TLS certificate for HTTP failed")


def check_plaintext(host: str, tls: TlsConfig | None, plaintext: bool) -> None:
    """Refuse plain-text listeners on an address other machines can reach, unless ``listen.plaintext``."""
    if tls is not None or plaintext or is_loopback(host):
        return
    shown = host or "every interface"
    raise TlsError(
        f"listen.host is {shown}, which other machines can reach, and listen.tls is not set: tokens would "
        "cross the network in clear. Set listen.tls (cert_file, key_file) to serve TLS, or set "
        "listen.plaintext: true if the network is private end to end, or bind 127.0.0.1."
    )
