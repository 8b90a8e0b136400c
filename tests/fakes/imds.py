"""A fake EC2 instance metadata service (IMDSv2) for many instances at once, signing identity documents as EC2 does.

On a real instance the metadata service answers at ``169.254.169.254`` for
that instance alone. Here one HTTP server serves every booted instance, each
under a path prefix of its own: the instance's endpoint is
``http://127.0.0.1:<port>/<instance id>`` (what the emulated boot puts in
``AWS_EC2_METADATA_SERVICE_ENDPOINT``), so ``<endpoint>/latest/...`` reaches
that instance's answers, as the real paths do.

What it speaks, as the EC2 documentation describes IMDSv2 with
``HttpTokens=required``:

* ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to
  21600) answers a session token; without the header, 400;
* ``GET /latest/dynamic/instance-identity/document`` and ``.../signature``
  with ``X-aws-ec2-metadata-token`` answer the document (pretty-printed JSON,
  as EC2 writes it) and the base64 RSA PKCS#1 v1.5 SHA-256 signature of its
  bytes (wrapped at 64 characters); a missing, unknown, expired or other
  instance's token is 401, as IMDSv1-style requests are;
* an instance it was not told about is 404.

The signing key is made per fake; :attr:`FakeImds.certificate_file` holds its
self-signed certificate, which a test gives the ec2 pool as
``identity_certificate_file`` (AWS's real certificates verify only AWS's
signatures). :meth:`FakeImds.sign` signs any text with that key, for tests
that forge or tamper.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tests.fakes import CloudInstance
from tests.fakes.local_server import LocalServer

__all__ = ["ACCOUNT_ID", "FakeImds", "identity_document", "make_signer"]

ACCOUNT_ID = "123456789012"


def make_signer(directory: Path, name: str = "imds") -> tuple[rsa.RSAPrivateKey, Path]:
    """A new RSA key and its self-signed certificate, written as ``<directory>/<name>-cert.pem``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"levers9 tests ({name})"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}-cert.pem"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key, path


def identity_document(instance: CloudInstance, *, account_id: str = ACCOUNT_ID) -> str:
    """The identity document EC2 would write for ``instance``, in its layout."""
    document: dict[str, Any] = {
        "accountId": account_id,
        "architecture": "x86_64",
        "availabilityZone": instance.zone or f"{instance.region}a",
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": "ami-0123456789abcdef0",
        "instanceId": instance.id,
        "instanceType": instance.instance_type,
        "kernelId": None,
        "pendingTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "privateIp": "10.0.0.10",
        "ramdiskId": None,
        "region": instance.region,
        "version": "2017-09-30",
    }
    return json.dumps(document, indent=2, separators=(",", " : "))


class FakeImds:
    """The metadata service of every instance :meth:`endpoint` was asked for (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.key, self.certificate_file = make_signer(directory)
        self._documents: dict[str, str] = {}
        self._tokens: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        #: every request: (method, path, status)
        self.requests: list[tuple[str, str, int]] = []
        self._server = LocalServer(self._handler(), name="fake-imds")
        self.port = self._server.port

    def sign(self, text: str) -> str:
        """The base64 signature of ``text`` with this service's key, as EC2's ``signature`` answers it."""
        raw = self.key.sign(text.encode(), padding.PKCS1v15(), hashes.SHA256())
        encoded = base64.b64encode(raw).decode()
        return "\n".join(encoded[i : i + 64] for i in range(0, len(encoded), 64))

    def endpoint(self, instance: CloudInstance) -> str:
        """The address of ``instance``'s metadata service; its document is written the first time."""
        with self._lock:
            self._documents.setdefault(instance.id, identity_document(instance))
        return f"http://127.0.0.1:{self.port}/{instance.id}"

    def platform(self, instance: CloudInstance) -> dict[str, str]:
        """What :class:`~levers9.testing.cloud_boot.CloudBooter` gives a booted instance's processes."""
        return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.endpoint(instance)}

    def document(self, instance_id: str) -> str:
        with self._lock:
            return self._documents[instance_id]

    def close(self) -> None:
        self._server.close()

    def _answer(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        instance_id, _, rest = path.lstrip("/").partition("/")
        rest = "/" + rest
        with self._lock:
            document = self._documents.get(instance_id)
            if document is None:
                return 404, "Not Found"
            if method == "PUT" and rest == "/latest/api/token":
                ttl = headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return 400, "Bad Request"
                token = secrets.token_urlsafe(32)
                self._tokens[token] = (instance_id, time.monotonic() + int(ttl))
                return 200, token
            if method != "GET":
                return 405, "Method Not Allowed"
            held = self._tokens.get(headers.get("X-aws-ec2-metadata-token") or "")
            if held is None or held[0] != instance_id or held[1] < time.monotonic():
                return 401, "Unauthorized"
        if rest == "/latest/dynamic/instance-identity/document":
            return 200, document
        if rest == "/latest/dynamic/instance-identity/signature":
            return 200, self.sign(document)
        return 404, "Not Found"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                status, body = imds._answer(method, self.path, self.headers)
                imds.requests.append((method, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def log_message(self, *args: object) -> None:
                pass

        return Handler
