"""A configured Redis with an ACL user, or over TLS: the right URL works, a wrong one is one clear error.

Real ``redis-server`` processes on free ports: one with the ``default`` user off and an ACL user ``alice``;
one serving TLS only, with a certificate of a throw-away CA, that wants client certificates. What
:func:`levers9.state.redis.connect.verify` (run by the controlplane at start) says must name the URL and
never its password.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from levers9.state.errors import StateError
from levers9.state.redis.connect import connect, verify
from tests.fixtures.ports import free_port
from tests.fixtures.redis import redis_server_process
from tests.fixtures.tls import Issued, TestCA, _key_pem, _name

pytestmark = pytest.mark.timeout(60)


async def test_an_acl_user_connects_and_a_wrong_password_is_one_clear_error(tmp_path: Path) -> None:
    port = free_port()
    config = f"port {port}\nuser default off\nuser alice on >s3cret-pw ~* &* +@all\n"
    with redis_server_process(tmp_path, config, {"port": port, "username": "alice", "password": "s3cret-pw"}):
        good = connect(f"redis://alice:s3cret-pw@127.0.0.1:{port}/0")
        try:
            await verify(good, f"redis://alice:s3cret-pw@127.0.0.1:{port}/0")
            await good.set("k", "v")
            assert await good.acl_whoami() == "alice"
        finally:
            await good.aclose()
        for url in (f"redis://alice:wrong-pw@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            with pytest.raises(StateError) as info:
                await verify(connect(url), url)
            text = str(info.value)
            assert "wrong-pw" not in text
            shown = url.replace(":wrong-pw@", ":***@")
            assert f"Redis at {shown}" in text, text
            assert "refused the credentials in state.redis_url" in text, text


def _client_certificate(ca: TestCA) -> Issued:
    """A client certificate (``clientAuth``) signed by ``ca``, as the server's ``tls-auth-clients yes`` asks."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("levers9 controlplane"))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    from cryptography.hazmat.primitives import serialization

    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial)


async def test_redis_over_tls_with_a_client_certificate(tmp_path: Path) -> None:
    ca = TestCA()
    ca_file = ca.write(tmp_path / "ca.pem")
    ca.issue().write(tmp_path / "server.pem", tmp_path / "server.key")
    _client_certificate(ca).write(tmp_path / "client.pem", tmp_path / "client.key")
    port = free_port()
    config = (
        f"port 0\ntls-port {port}\ntls-cert-file {tmp_path / 'server.pem'}\ntls-key-file {tmp_path / 'server.key'}\n"
        f"tls-ca-cert-file {ca_file}\ntls-auth-clients yes\n"
    )
    ping = {
        "port": port,
        "ssl": True,
        "ssl_ca_certs": str(ca_file),
        "ssl_certfile": str(tmp_path / "client.pem"),
        "ssl_keyfile": str(tmp_path / "client.key"),
    }
    with redis_server_process(tmp_path, config, ping):
        url = (
            f"rediss://127.0.0.1:{port}/0?ca_file={ca_file}&cert_file={tmp_path / 'client.pem'}"
            f"&key_file={tmp_path / 'client.key'}"
        )
        client = connect(url)
        try:
            await verify(client, url)
            await client.set("over", "tls")
            assert await client.get("over") == "tls"
        finally:
            await client.aclose()
        for bad, why in (
            (f"rediss://127.0.0.1:{port}/0?ca_file={ca_file}", "no client certificate"),
            (f"rediss://127.0.0.1:{port}/0", "the system trust store does not know the CA"),
            (f"redis://127.0.0.1:{port}/0", "plain text to a TLS port"),
        ):
            with pytest.raises(StateError) as info:
                await verify(connect(bad), bad)
            assert f"Redis at {bad} (state.redis_url) does not answer" in str(info.value), why
