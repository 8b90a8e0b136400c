"""A worker's registry images: pulled once into its runtime's cache, the credential sent only to its controlplane's
registry, and the cache kept under its size without evicting what the worker's functions use, nor during a build.

A real ``docker-registry`` (tests/fixtures/registry.py) with images pushed by the registry client; the worker's
own ImagePulls, as the session makes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from levers9.engine.images import ImageStore
from levers9.engine.node import NodeSettings
from levers9.hooks.types import RuntimeContext
from levers9.registry.auth import RegistryAuth
from levers9.registry.client import RegistryClient, push_image
from levers9.worker.images import ImagePullFailed, ImagePulls, names_registry
from tests.fixtures.registry import Registry, image_config, make_layer

MiB = 1024 * 1024


def _image(registry: Registry, tmp_path: Path, name: str) -> str:
    """A one-layer image of 1 MiB (random bytes: gzip cannot shrink it), pushed; its pinned ref."""
    import os

    layer = make_layer(tmp_path / f"{name}.tar.gz", {f"data/{name}": os.urandom(MiB)})
    with RegistryClient(registry.url) as client:
        digest = push_image(client, f"tests/{name}", "v1", [layer.spec()], image_config([layer]))
    return f"{registry.address}/tests/{name}@{digest}"


def _pulls(tmp_path: Path, registry: Registry, *, max_bytes: int, in_use: list[str], busy: list[bool]) -> ImagePulls:
    settings = NodeSettings(image_cache=str(tmp_path / "cache"), image_cache_max_bytes=max_bytes)
    runtime = RuntimeContext(name="runc", settings=settings, state_dir=str(tmp_path / "state"))
    return ImagePulls(
        runtime,
        registry_url=registry.url,
        credentials=lambda: RegistryAuth("wkr_1", "token"),
        in_use=lambda: in_use,
        busy=lambda: busy[0],
    )


def _cached(tmp_path: Path, ref: str) -> bool:
    try:
        ImageStore(tmp_path / "cache").resolve(ref)  # no puller: found only if pulled and still whole
    except Exception:
        return False
    return True


async def test_the_cache_stays_under_its_size_without_evicting_what_functions_use(
    registry: Registry, tmp_path: Path
) -> None:
    a, b, c = (_image(registry, tmp_path, n) for n in ("a", "b", "c"))
    in_use: list[str] = [a]
    busy = [False]
    pulls = _pulls(tmp_path, registry, max_bytes=int(2.5 * MiB), in_use=in_use, busy=busy)
    await pulls.ensure(a)
    await pulls.ensure(b)
    assert _cached(tmp_path, a)
    assert _cached(tmp_path, b)
    await pulls.ensure(c)  # 3 MiB > 2.5: b goes (least recently used, and no function uses it); a is in use
    assert [_cached(tmp_path, r) for r in (a, b, c)] == [True, False, True]
    # during a build nothing is evicted, whatever the size
    in_use.clear()
    busy[0] = True
    d = _image(registry, tmp_path, "d")
    await pulls.ensure(d)
    assert [_cached(tmp_path, r) for r in (a, c, d)] == [True, True, True]


async def test_only_pinned_registry_refs_are_pulled(registry: Registry, tmp_path: Path) -> None:
    pulls = _pulls(tmp_path, registry, max_bytes=0, in_use=[], busy=[False])
    await pulls.ensure("host")  # not a registry image: nothing to do
    await pulls.ensure("/srv/images/python.tar")
    assert not names_registry("host")
    with pytest.raises(ImagePullFailed, match="names a tag, not a digest"):
        await pulls.ensure(f"{registry.address}/tests/a:v1")
    with pytest.raises(ImagePullFailed, match="pulling image"):
        await pulls.ensure(f"{registry.address}/tests/none@sha256:{'0' * 64}")


async def test_an_evicted_layer_takes_the_blob_a_build_gzipped_of_it_along(registry: Registry, tmp_path: Path) -> None:
    """A build machine keeps a gzipped blob of each layer it made, to push it: the blob goes with its layer."""
    import io
    import os
    import tarfile

    from levers9.builder.layout import gzip_layer, gzipped

    a, b = (_image(registry, tmp_path, n) for n in ("a", "b"))
    pulls = _pulls(tmp_path, registry, max_bytes=int(1.5 * MiB), in_use=[], busy=[False])
    await pulls.ensure(a)
    store = ImageStore(tmp_path / "cache")
    tar = tmp_path / "step.tar"  # a step's layer as the builder captures it: unpacked into the cache, gzipped
    with tarfile.open(tar, "w") as archive:
        data = os.urandom(MiB)
        info = tarfile.TarInfo("step-output")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    built = gzip_layer(tar, store.cache_dir)
    store.add_layer(tar, built.diff_id)
    assert built.blob_path.exists()

    await pulls.ensure(b)  # 3 MiB > 1.5: a and the step's layer go (b was just pulled), the blob with its layer
    assert store.layer_path(built.diff_id) is None
    assert gzipped(built.diff_id, store.cache_dir) is None
    assert not built.blob_path.exists()
