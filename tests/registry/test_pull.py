"""Pulling registry images into the node's layer cache: ImageStore with a RegistryPuller, and pruning it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from levers9.engine.images import ImageError, ImageStore
from levers9.registry.client import DOCKER_MANIFEST_LIST, RegistryClient, push_image
from levers9.registry.pull import RegistryPuller, default_base_url
from tests.fixtures.registry import Layer, Registry, image_config, make_layer


def _push(
    registry: Registry, tmp_path: Path, repo: str, contents: list[bytes], tag: str = "v1"
) -> tuple[str, list[Layer]]:
    layers = [
        make_layer(tmp_path / f"{repo.replace('/', '_')}-{i}.tar.gz", {f"data/{i}": c}) for i, c in enumerate(contents)
    ]
    with RegistryClient(registry.url) as client:
        digest = push_image(
            client, repo, tag, [layer.spec() for layer in layers], image_config(layers, cmd=["/bin/sh"])
        )
    return digest, layers


def test_a_registry_ref_resolves_into_the_cache_and_a_second_resolve_asks_nothing(
    registry: Registry, tmp_path: Path
) -> None:
    digest, layers = _push(registry, tmp_path, "tests/pull", [b"base\n", b"top\n"])
    puller = RegistryPuller()
    store = ImageStore(tmp_path / "cache", puller=puller)
    ref = f"{registry.address}/tests/pull@{digest}"

    image = store.resolve(ref)
    assert [p.name for p in image.layers] == [layer.diff_id.removeprefix("sha256:") for layer in layers]
    assert all(p.parent == tmp_path / "cache/layers/sha256" for p in image.layers)
    assert (image.layers[0] / "data/0").read_bytes() == b"base\n"
    assert (image.layers[1] / "data/1").read_bytes() == b"top\n"
    assert image.config.cmd == ("/bin/sh",)
    assert (store.layers_unpacked, puller.layers_downloaded) == (2, 2)

    client = puller.client(registry.address)
    asked = client.requests
    again = store.resolve(ref)
    assert again.layers == image.layers
    assert client.requests == asked  # recorded by its digest: no request at all
    assert (store.layers_unpacked, puller.layers_downloaded) == (2, 2)

    # A fresh store on the same cache (another worker process) finds the record too.
    other = RegistryPuller()
    assert ImageStore(tmp_path / "cache", puller=other).resolve(ref).layers == image.layers
    assert other.client(registry.address).requests == 0
    # And one with no puller at all (a runtime's own store, after the worker pulled the image)
    assert ImageStore(tmp_path / "cache").resolve(ref).layers == image.layers
    with pytest.raises(ImageError, match="no registry is reachable"):  # never pulled: nothing to resolve from
        ImageStore(tmp_path / "other-cache").resolve(ref)
    puller.close()
    other.close()


def test_a_tag_costs_one_manifest_request_and_shared_layers_are_not_downloaded_again(
    registry: Registry, tmp_path: Path
) -> None:
    _, base = _push(registry, tmp_path, "tests/shared-a", [b"shared base\n"])
    digest_b, _ = _push(registry, tmp_path, "tests/shared-b", [b"shared base\n", b"only in b\n"])
    puller = RegistryPuller()
    store = ImageStore(tmp_path / "cache", puller=puller)
    store.resolve(f"{registry.address}/tests/shared-a:v1")
    assert puller.layers_downloaded == 1

    image = store.resolve(f"{registry.address}/tests/shared-b:v1")
    assert puller.layers_downloaded == 2  # the shared base came from the cache
    assert image.layers[0].name == base[0].diff_id.removeprefix("sha256:")

    client = puller.client(registry.address)
    asked = client.requests
    store.resolve(f"{registry.address}/tests/shared-b:v1")
    assert client.requests == asked + 1  # the tag's manifest, to learn its digest; then the record
    assert puller.layers_downloaded == 2
    assert store.resolve(f"{registry.address}/tests/shared-b@{digest_b}").layers == image.layers
    assert client.requests == asked + 1
    puller.close()


def test_an_index_is_followed_to_this_machines_platform(registry: Registry, tmp_path: Path) -> None:
    digest, layers = _push(registry, tmp_path, "tests/multi", [b"linux\n"])
    other, _ = _push(registry, tmp_path, "tests/multi", [b"not for here\n"], tag="other")
    with RegistryClient(registry.url) as client:
        manifest, media_type, _ = client.get_manifest("tests/multi", digest)
        arch = json.loads(client.read_blob("tests/multi", json.loads(manifest)["config"]["digest"]))["architecture"]
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": DOCKER_MANIFEST_LIST,
                "manifests": [
                    {
                        "mediaType": media_type,
                        "digest": other,
                        "size": len(client.get_manifest("tests/multi", other)[0]),
                        "platform": {"os": "linux", "architecture": "s390x" if arch != "s390x" else "ppc64le"},
                    },
                    {
                        "mediaType": media_type,
                        "digest": digest,
                        "size": len(manifest),
                        "platform": {"os": "linux", "architecture": arch},
                    },
                ],
            }
        ).encode()
        index_digest = client.push_manifest("tests/multi", "multi", index, DOCKER_MANIFEST_LIST)
    with RegistryPuller() as puller:
        store = ImageStore(tmp_path / "cache", puller=puller)
        image = store.resolve(f"{registry.address}/tests/multi:multi")
        assert [p.name for p in image.layers] == [layers[0].diff_id.removeprefix("sha256:")]
        assert puller.layers_downloaded == 1
        assert (tmp_path / f"cache/refs/manifest-{index_digest.removeprefix('sha256:')}.json").is_file()


def test_failures_are_image_errors_naming_the_ref(registry: Registry, tmp_path: Path) -> None:
    digest, layers = _push(registry, tmp_path, "tests/broken", [b"will be tampered\n"])
    with RegistryPuller() as puller:
        store = ImageStore(tmp_path / "cache", puller=puller)
        with pytest.raises(ImageError, match=r"could not be pulled.*MANIFEST_UNKNOWN"):
            store.resolve(f"{registry.address}/tests/broken:nope")
        with pytest.raises(ImageError, match=r"names no registry host.*never pulls from Docker Hub"):
            store.resolve("python:3.11")

        stored = registry.blob_file(layers[0].digest)
        original = stored.read_bytes()
        stored.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        try:
            with pytest.raises(ImageError, match="tampered with"):
                store.resolve(f"{registry.address}/tests/broken@{digest}")
        finally:
            stored.write_bytes(original)
        assert not list((tmp_path / "cache/layers/sha256").iterdir())  # nothing of it was kept
        assert not list((tmp_path / "cache/tmp").iterdir())


def test_plain_http_only_for_loopback_and_named_registries() -> None:
    assert default_base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert default_base_url("127.8.9.1:5000") == "http://127.8.9.1:5000"
    assert default_base_url("localhost:5000") == "http://localhost:5000"
    assert default_base_url("[::1]:5000") == "http://[::1]:5000"
    assert default_base_url("ghcr.io") == "https://ghcr.io"
    assert default_base_url("10.0.0.5:5000") == "https://10.0.0.5:5000"
    assert default_base_url("10.0.0.5:5000", insecure={"10.0.0.5:5000"}) == "http://10.0.0.5:5000"


def _age(cache: Path, layer: Path, seconds_ago: float) -> None:
    stamp = cache / "used" / layer.name
    when = stamp.stat().st_mtime - seconds_ago
    os.utime(stamp, (when, when))


def test_prune_evicts_least_recently_used_layers_by_size_and_keeps_those_in_use(
    registry: Registry, tmp_path: Path
) -> None:
    big = os.urandom(300_000)  # random: gzip cannot shrink it, and the unpacked file takes its size on disk
    digests = {}
    for name in ("old", "mid", "new"):
        digests[name], _ = _push(registry, tmp_path, f"tests/prune-{name}", [name.encode() + big])
    cache = tmp_path / "cache"
    with RegistryPuller() as puller:
        store = ImageStore(cache, puller=puller)
        images = {name: store.resolve(f"{registry.address}/tests/prune-{name}@{d}") for name, d in digests.items()}
        _age(cache, images["old"].layers[0], 300)
        _age(cache, images["mid"].layers[0], 200)
        _age(cache, images["new"].layers[0], 100)

        # Room for two layers: the least recently used one goes, and only it.
        report = store.prune(700_000)
        assert report.removed == (images["old"].layers[0].name,)
        assert report.bytes_before > report.bytes_after
        assert report.bytes_after <= 700_000
        assert not images["old"].layers[0].exists()
        assert images["mid"].layers[0].is_dir()
        assert images["new"].layers[0].is_dir()

        # Room for nothing, but "mid" runs: everything else goes, "mid" stays, the report says it is over.
        report = store.prune(0, in_use=images["mid"].layers)
        assert report.removed == (images["new"].layers[0].name,)
        assert images["mid"].layers[0].is_dir()
        assert report.bytes_after == report.bytes_in_use > 0

        # An evicted image resolves again by downloading its layer again (its record went with the layer).
        downloaded = puller.layers_downloaded
        assert (store.resolve(f"{registry.address}/tests/prune-old@{digests['old']}").layers[0] / "data/0").is_file()
        assert puller.layers_downloaded == downloaded + 1

    with pytest.raises(ValueError, match="max_bytes must be 0 or more"):
        store.prune(-1)
