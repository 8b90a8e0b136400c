"""The distribution client against a real docker-registry: pushes, pulls, digests checked, errors, logins."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from levers9.registry.client import (
    OCI_MANIFEST,
    RegistryAuth,
    RegistryClient,
    RegistryError,
    push_image,
)
from tests.fixtures.ports import free_port
from tests.fixtures.registry import Layer, Registry, htpasswd_file, image_config, make_layer
from tests.fixtures.tls import TestCA


def _image(tmp_path: Path, text: bytes = b"hello\n") -> tuple[Layer, bytes]:
    layer = make_layer(tmp_path / "layer.tar.gz", {"etc/greeting": text})
    return layer, image_config([layer], cmd=["/bin/sh"])


def test_an_image_pushed_is_pulled_back_by_tag_and_by_digest(registry: Registry, tmp_path: Path) -> None:
    layer, config = _image(tmp_path)
    with RegistryClient(registry.url) as client:
        client.check()
        digest = push_image(client, "tests/client", "v1", [layer.spec()], config)

        by_tag, media_type, tag_digest = client.get_manifest("tests/client", "v1")
        by_digest, _, same = client.get_manifest("tests/client", digest)
        assert by_tag == by_digest
        assert tag_digest == same == digest == "sha256:" + hashlib.sha256(by_tag).hexdigest()
        assert media_type == OCI_MANIFEST
        manifest = json.loads(by_tag)
        assert [d["digest"] for d in manifest["layers"]] == [layer.digest]

        assert client.read_blob("tests/client", manifest["config"]["digest"]) == config
        with client.open_blob("tests/client", layer.digest) as stream:
            assert stream.read() == layer.path.read_bytes()
        assert "v1" in client.tags("tests/client")


def test_a_blob_the_registry_has_is_not_uploaded_again(registry: Registry, tmp_path: Path) -> None:
    layer, _ = _image(tmp_path, b"once\n")
    with RegistryClient(registry.url) as client:
        assert client.push_blob("tests/again", layer.digest, layer.path, layer.size) is True
        before = client.requests
        assert client.push_blob("tests/again", layer.digest, layer.path, layer.size) is False
        assert client.requests == before + 1  # the HEAD that found it, and nothing else
        # Another repository of the same registry gets it linked, not uploaded.
        assert client.mount_blob("tests/mounted", layer.digest, "tests/again") is True
        assert client.has_blob("tests/mounted", layer.digest)


def test_registry_errors_carry_its_code_and_name_what_failed(registry: Registry, tmp_path: Path) -> None:
    with RegistryClient(registry.url) as client:
        with pytest.raises(RegistryError) as missing:
            client.get_manifest("tests/nothing", "v9")
        assert (missing.value.code, missing.value.status) == ("MANIFEST_UNKNOWN", 404)
        assert missing.value.repository == "tests/nothing"
        assert f"registry {registry.address}, repository tests/nothing: get manifest v9 failed" in str(missing.value)

        with pytest.raises(RegistryError) as wrong:
            client.push_blob("tests/client", "sha256:" + "0" * 64, b"not that", 8)
        assert (wrong.value.code, wrong.value.status) == ("DIGEST_INVALID", 400)

        assert client.has_blob("tests/client", "sha256:" + "1" * 64) is False

    with RegistryClient(f"http://127.0.0.1:{free_port()}") as nobody:
        with pytest.raises(RegistryError, match="cannot reach it") as refused:
            nobody.check()
        assert refused.value.code is None
        assert refused.value.status is None


def test_a_tampered_blob_or_manifest_is_refused(registry: Registry, tmp_path: Path) -> None:
    layer, config = _image(tmp_path, b"trust me\n")
    with RegistryClient(registry.url) as client:
        digest = push_image(client, "tests/tampered", "v1", [layer.spec()], config)
        stored = registry.blob_file(layer.digest)
        original = stored.read_bytes()
        stored.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])  # same size, one byte changed
        with (
            pytest.raises(RegistryError, match="corrupt or was tampered with"),
            client.open_blob("tests/tampered", layer.digest) as stream,
        ):
            stream.read()

        manifest_file = registry.blob_file(digest)
        manifest_file.write_bytes(manifest_file.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion":2 '))
        with pytest.raises(RegistryError, match="not the one asked for"):
            client.get_manifest("tests/tampered", digest)


def test_htpasswd_basic_login(registry_factory: Callable[..., Registry], tmp_path: Path) -> None:
    users = htpasswd_file(tmp_path / "htpasswd", "builder", "s3cret")
    locked = registry_factory({"htpasswd": {"realm": "levers9-tests", "path": str(users)}})
    layer, config = _image(tmp_path, b"private\n")

    with RegistryClient(locked.url) as anonymous, pytest.raises(RegistryError, match="wants credentials") as caught:
        anonymous.check()
    assert (caught.value.code, caught.value.status) == ("UNAUTHORIZED", 401)

    with RegistryClient(locked.url, auth=RegistryAuth("builder", "wrong")) as wrong:
        with pytest.raises(RegistryError, match="refused the credentials") as refused:
            wrong.get_manifest("tests/private", "v1")
        assert refused.value.code == "UNAUTHORIZED"
        assert "wrong" not in str(refused.value)
        assert "wrong" not in repr(RegistryAuth("builder", "wrong"))

    with RegistryClient(locked.url, auth=RegistryAuth("builder", "s3cret")) as client:
        digest = push_image(client, "tests/private", "v1", [layer.spec()], config)
        assert client.get_manifest("tests/private", "v1")[2] == digest


def test_tls_is_verified_against_the_ca_bundle_given(registry_factory: Callable[..., Registry], tmp_path: Path) -> None:
    ca = TestCA("levers9 registry test CA")
    ca.issue().write(tmp_path / "server.pem", tmp_path / "server.key")
    secure = registry_factory(tls=(tmp_path / "server.pem", tmp_path / "server.key"))
    layer, config = _image(tmp_path, b"over tls\n")

    with RegistryClient(secure.url, verify=str(ca.write(tmp_path / "ca.pem"))) as client:
        digest = push_image(client, "tests/tls", "v1", [layer.spec()], config)
    with RegistryClient(secure.url) as system_cas, pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED"):
        system_cas.check()  # the machine's own CAs do not know this one
    with RegistryClient(secure.url, verify=False) as unchecked:
        assert unchecked.get_manifest("tests/tls", "v1")[2] == digest
    with pytest.raises(RegistryError, match=r"CA bundle .* cannot be read"):
        RegistryClient(secure.url, verify=str(tmp_path / "missing.pem"))


def test_clients_share_one_tls_context_per_ca_bundle_and_a_renewed_bundle_is_read_again(
    registry_factory: Callable[..., Registry], tmp_path: Path
) -> None:
    """A TLS context loads a whole trust store: it is made once per bundle, yet a bundle replaced on disk counts."""
    from levers9.registry.client import _ssl_context

    ca, other = TestCA("levers9 registry test CA"), TestCA("levers9 another test CA")
    ca.issue().write(tmp_path / "server.pem", tmp_path / "server.key")
    secure = registry_factory(tls=(tmp_path / "server.pem", tmp_path / "server.key"))
    bundle = ca.write(tmp_path / "ca.pem")

    assert _ssl_context(True) is _ssl_context(True)
    assert _ssl_context(str(bundle)) is _ssl_context(str(bundle))
    with RegistryClient(secure.url, verify=str(bundle)) as client:
        client.check()
    other.write(bundle)
    os.utime(bundle, (1_000_000, 1_000_000))  # a new modification time, whatever the clock's tick
    with (
        RegistryClient(secure.url, verify=str(bundle)) as client,
        pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.check()
