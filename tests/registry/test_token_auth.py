"""The bearer-token flow against a real docker-registry configured with ``auth.token``.

The token service is a small HTTP server here (as ghcr.io's or a Harbor's would
be): it checks HTTP basic credentials and answers a JWT signed with an EC key
whose certificate the registry trusts (``rootcertbundle``), granting the scope
asked for. The registry verifies the token itself, so the client's whole flow
is exercised: the 401 challenge, the token request with the challenge's realm,
service and scope, the retried request, the token kept for later requests.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from levers9.registry.client import RegistryAuth, RegistryClient, RegistryError, push_image
from tests.fixtures.registry import Registry, image_config, make_layer

SERVICE = "levers9-test-registry"
ISSUER = "levers9-test-issuer"
USER, PASSWORD = "ci", "token-pass"


@dataclass
class TokenService:
    url: str
    cert: Path
    #: the scope of every token request, in order
    scopes: list[str] = field(default_factory=list)


@pytest.fixture
def token_service(tmp_path: Path) -> Iterator[TokenService]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "levers9 test token issuer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = tmp_path / "token-cert.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    chain = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
    scopes: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.end_headers()
                return
            query = parse_qs(urlparse(self.path).query)
            scope = query.get("scope", [""])[0]
            scopes.append(scope)
            access = []
            if scope:
                kind, repo, actions = scope.split(":")
                access.append({"type": kind, "name": repo, "actions": actions.split(",")})
            claims = {
                "iss": ISSUER,
                "sub": USER,
                "aud": query.get("service", [""])[0],
                "iat": int(time.time()),
                "nbf": int(time.time()) - 10,
                "exp": int(time.time()) + 300,
                "jti": uuid.uuid4().hex,
                "access": access,
            }
            token = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": chain})
            body = json.dumps({"token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TokenService(f"http://127.0.0.1:{server.server_address[1]}/token", cert_file, scopes)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_bearer_tokens_are_fetched_from_the_realm_and_reused(
    registry_factory: Callable[..., Registry], token_service: TokenService, tmp_path: Path
) -> None:
    locked = registry_factory(
        {
            "token": {
                "realm": token_service.url,
                "service": SERVICE,
                "issuer": ISSUER,
                "rootcertbundle": str(token_service.cert),
            }
        }
    )
    layer = make_layer(tmp_path / "layer.tar.gz", {"etc/token": b"bearer\n"})
    config = image_config([layer])

    with RegistryClient(locked.url, auth=RegistryAuth(USER, PASSWORD)) as client:
        digest = push_image(client, "tests/bearer", "v1", [layer.spec()], config)
        pushed_with = client.tokens_fetched
        assert client.get_manifest("tests/bearer", "v1")[2] == digest
        with client.open_blob("tests/bearer", layer.digest) as stream:
            assert stream.read() == layer.path.read_bytes()
    # One token for the HEADs (pull), one for the uploads (pull,push), each kept: the pulls asked for none.
    assert pushed_with == 2
    assert client.tokens_fetched == pushed_with
    asked = [(scope.rsplit(":", 1)[0], set(scope.rsplit(":", 1)[1].split(","))) for scope in token_service.scopes]
    assert asked == [("repository:tests/bearer", {"pull"}), ("repository:tests/bearer", {"pull", "push"})]

    with RegistryClient(locked.url, auth=RegistryAuth(USER, "wrong")) as wrong:
        with pytest.raises(RegistryError, match=r"token service .* refused user 'ci'") as refused:
            wrong.get_manifest("tests/bearer", "v1")
        assert refused.value.code == "UNAUTHORIZED"

    with RegistryClient(locked.url) as anonymous, pytest.raises(RegistryError, match="refused an anonymous request"):
        anonymous.get_manifest("tests/bearer", "v1")
