"""Layers as blobs, and images as OCI image layout directories.

A built layer exists twice on the build machine: unpacked in the node's image cache
(``<cache>/layers/sha256/<diff id>``, :class:`levers9.engine.images.ImageStore`), where containers mount
it, and as the gzip blob a registry stores, kept in ``<cache>/builder/blobs/sha256/<digest>``
(:func:`gzip_layer`). :func:`write_layout` writes an image as an OCI image layout directory
(``oci-layout``, ``index.json``, ``blobs/sha256/``: one manifest, its config, its layers) that
``skopeo inspect oci:DIR`` and :meth:`ImageStore.resolve` both read.

Invariants:

- a blob's file is named by the sha256 of its bytes and written whole (a temporary file renamed into
  place), so a reader never sees half of one, and two builds writing the same blob agree;
- gzip is deterministic: no file name and mtime 0 in the gzip header, one compression level, so the
  same layer tar always gives the same blob digest (:data:`GZIP_LEVEL`);
- configs and manifests are canonical JSON (sorted keys, no whitespace), so the same image gives the
  same digests;
- a layout names every layer the image has; a layer whose blob this machine lacks (a step cached by
  an earlier build on another machine) is listed by digest and left out of ``blobs/``: the layout then
  still resolves here from the node cache, and :attr:`Written.missing` names those blobs so whoever
  pushes it knows the registry must already hold them.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_TYPE",
    "GZIP_LEVEL",
    "INDEX_TYPE",
    "LAYER_GZIP",
    "LAYER_TAR",
    "MANIFEST_TYPE",
    "Layer",
    "Written",
    "blob_dir",
    "canonical",
    "forget_blobs",
    "gzip_layer",
    "write_layout",
]

LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
#: the gzip level of every layer blob (6: zlib's default; changing it changes every blob digest)
GZIP_LEVEL = 6
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """One layer of an image: its diff id, and its blob where this machine has one."""

    #: ``sha256:<hex>`` of the uncompressed tar
    diff_id: str
    #: ``sha256:<hex>`` of the blob a registry stores (gzip), when known
    blob_digest: str | None = None
    #: the blob on this machine, when it has it
    blob_path: Path | None = None
    blob_size: int | None = None
    media_type: str = LAYER_GZIP


@dataclass(frozen=True)
class Written:
    """What :func:`write_layout` wrote."""

    path: Path
    #: ``sha256:<hex>`` of the manifest: the image's digest
    manifest_digest: str
    manifest_size: int
    config_digest: str
    #: blob digests the layout lists but does not hold
    missing: tuple[str, ...]


def canonical(document: Any) -> bytes:
    """``document`` as canonical JSON bytes (sorted keys, no whitespace)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def blob_dir(cache_dir: Path) -> Path:
    """Where the build machine keeps layer blobs: ``<cache>/builder/blobs/sha256``."""
    path = cache_dir / "builder" / "blobs" / "sha256"
    path.mkdir(parents=True, exist_ok=True)
    return path


def gzip_layer(tar: Path, cache_dir: Path) -> Layer:
    """The gzip blob of the layer tar ``tar`` in the machine's blob directory (made once per diff id).

    The diff id (the tar's sha256) is computed on the way; a record under ``<cache>/builder/gzip/``
    maps it to its blob, so a layer gzipped before (a base, a step rebuilt to the same bytes) is not
    compressed again.
    """
    blobs = blob_dir(cache_dir)
    records = cache_dir / "builder" / "gzip"
    records.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=".blob-", dir=blobs)
    tar_sha, blob_sha = hashlib.sha256(), hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as raw, open(tar, "rb") as source:
            out = _Hashing(raw, blob_sha)
            with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=GZIP_LEVEL) as zipped:
                while chunk := source.read(_CHUNK):
                    tar_sha.update(chunk)
                    zipped.write(chunk)
        diff_id = f"sha256:{tar_sha.hexdigest()}"
        target = blobs / blob_sha.hexdigest()
        os.replace(scratch, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        raise
    record = records / tar_sha.hexdigest()
    _write_whole(record, f"sha256:{blob_sha.hexdigest()}\n".encode())
    return Layer(
        diff_id=diff_id, blob_digest=f"sha256:{blob_sha.hexdigest()}", blob_path=target, blob_size=target.stat().st_size
    )


def forget_blobs(cache_dir: Path, diff_ids: Iterable[str]) -> int:
    """Delete the blobs :func:`gzip_layer` made of these layers, and their records; the bytes freed.

    Called when the node cache evicts the layers: a blob is kept only to push its layer, and a build
    that needs the layer again fetches or makes it anew, gzipping it again then.
    """
    freed = 0
    for diff_id in diff_ids:
        record = cache_dir / "builder" / "gzip" / diff_id.removeprefix("sha256:")
        try:
            digest = record.read_text().strip()
        except OSError:
            continue
        blob = cache_dir / "builder" / "blobs" / "sha256" / digest.removeprefix("sha256:")
        with contextlib.suppress(OSError):
            freed += blob.stat().st_size
            blob.unlink()
        record.unlink(missing_ok=True)
    return freed


def gzipped(diff_id: str, cache_dir: Path) -> Layer | None:
    """The blob :func:`gzip_layer` made of the layer ``diff_id`` before, if it is still there."""
    record = cache_dir / "builder" / "gzip" / diff_id.removeprefix("sha256:")
    try:
        digest = record.read_text().strip()
    except OSError:
        return None
    path = blob_dir(cache_dir) / digest.removeprefix("sha256:")
    if not digest.startswith("sha256:") or not path.is_file():
        return None
    return Layer(diff_id=diff_id, blob_digest=digest, blob_path=path, blob_size=path.stat().st_size)


class _Hashing:
    def __init__(self, out: Any, sha: Any) -> None:
        self._out = out
        self._sha = sha

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        written: int = self._out.write(data)
        return written

    def flush(self) -> None:
        self._out.flush()


def _write_whole(path: Path, data: bytes) -> None:
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        raise


def _put_blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    target = blobs / digest
    if not target.exists():
        _write_whole(target, data)
    return f"sha256:{digest}", len(data)


def _link_blob(blobs: Path, layer: Layer) -> bool:
    """Put the layer's blob into the layout (a hard link where it can, else a copy); False when there is none."""
    if layer.blob_digest is None or layer.blob_path is None or not layer.blob_path.is_file():
        return False
    target = blobs / layer.blob_digest.removeprefix("sha256:")
    if target.exists():
        return True
    try:
        os.link(layer.blob_path, target)
    except OSError:
        fd, scratch = tempfile.mkstemp(prefix=".blob-", dir=blobs)
        os.close(fd)
        try:
            shutil.copyfile(layer.blob_path, scratch)
            os.replace(scratch, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(scratch)
            raise
    return True


def write_layout(
    dest: Path,
    layers: Sequence[Layer],
    config: dict[str, Any],
    *,
    with_blobs: bool = True,
    ref_name: str | None = None,
) -> Written:
    """Write the image of ``layers`` (lowest first) and ``config`` as an OCI image layout at ``dest``.

    ``config`` is the image configuration (its ``rootfs.diff_ids`` are set here from ``layers``).
    ``with_blobs`` False writes only the manifest and config (a layout that resolves from the node cache
    alone: what a step's container is started from). ``ref_name``: the index's
    ``org.opencontainers.image.ref.name`` annotation, if any.
    """
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    document = dict(config)
    document["rootfs"] = {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}
    config_digest, config_size = _put_blob(blobs, canonical(document))
    descriptors = []
    missing = []
    for layer in layers:
        digest = layer.blob_digest or layer.diff_id
        media_type = layer.media_type if layer.blob_digest else LAYER_TAR
        descriptors.append({"mediaType": media_type, "digest": digest, "size": layer.blob_size or 0})
        if with_blobs and not _link_blob(blobs, layer):
            missing.append(digest)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
        "layers": descriptors,
    }
    manifest_digest, manifest_size = _put_blob(blobs, canonical(manifest))
    entry: dict[str, Any] = {"mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": manifest_size}
    if ref_name:
        entry["annotations"] = {"org.opencontainers.image.ref.name": ref_name}
    _write_whole(dest / "oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
    _write_whole(dest / "index.json", canonical({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [entry]}))
    return Written(
        path=dest,
        manifest_digest=manifest_digest,
        manifest_size=manifest_size,
        config_digest=config_digest,
        missing=tuple(missing),
    )
