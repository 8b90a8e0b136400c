"""Reading images as they arrive: OCI image layout directories and ``docker save`` tarballs.

An image's files are read through a :class:`Source` (a layout directory, an
open tarball, or a :class:`RemoteLayout` a registry :class:`Puller` gives, the
same three calls for each); :func:`read_archive` and
:func:`read_layout` turn one into an :class:`ImageManifest`: the config a
container starts from and the layer blobs to unpack, lowest first, with the
diff ids the config lists for them.

Invariants: nothing here writes to disk or unpacks a layer (that is
:mod:`levers9.engine.layers`, driven by :mod:`levers9.engine.images`); a path
named by an image's own metadata never leaves the image (absolute paths and
``..`` are refused); every blob read by digest is checked against it; only
sha256 digests, gzip or uncompressed layers and this machine's linux platform
are accepted, and anything else raises :class:`ImageError` naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from levers9.engine.image_types import ACCEPTED, ImageConfig, ImageError

__all__ = [
    "DirSource",
    "ImageManifest",
    "LayerBlob",
    "Puller",
    "RemoteLayout",
    "Source",
    "TarSource",
    "check_tarball",
    "read_archive",
    "read_layout",
]

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")

_MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
_LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
}
# Machine names as Python reports them, mapped to the architecture names OCI platforms use.
_OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm", "i686": "386"}


@dataclass(frozen=True)
class LayerBlob:
    name: str  # path inside the tarball or layout directory
    blob_digest: str | None = None  # sha256 hex of the (possibly compressed) blob, when the manifest gives one


@dataclass(frozen=True)
class ImageManifest:
    """What an image is made of: its config, its layer blobs (lowest first) and their diff ids, if listed."""

    config: ImageConfig
    layers: tuple[LayerBlob, ...]
    diff_ids: tuple[str, ...] | None


class Source(Protocol):
    """Where an image's files are: a layout directory or a tarball, read the same way."""

    def exists(self, name: str) -> bool: ...

    def read(self, name: str) -> bytes: ...

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...


class RemoteLayout(Source, Protocol):
    """An image read from elsewhere (a registry), shaped as an OCI layout so :func:`read_layout` reads it.

    It answers ``oci-layout``, an ``index.json`` naming the one manifest (or index) the ref
    resolved to, and ``blobs/sha256/<hex>`` for manifests, configs and layers, each checked
    against its digest. ``digest`` is that manifest's digest (``sha256:<hex>``): the image's
    identity, by which the store records it.
    """

    digest: str


class Puller(Protocol):
    """What resolves refs that name a registry; :class:`levers9.registry.pull.RegistryPuller` is one.

    The engine never imports the registry package: a worker gives its image store a puller.
    Its errors may be any :class:`~levers9.hooks.errors.Levers9Error`; the store reports them
    as an :class:`ImageError` naming the ref.
    """

    def accepts(self, ref: str) -> bool:
        """Whether ``ref`` is a registry ref this puller reads (not a path, not ``host``)."""
        ...

    def pinned(self, ref: str) -> str | None:
        """The manifest digest ``ref`` names itself (``...@sha256:<hex>``), known without any request."""
        ...

    def open(self, ref: str) -> contextlib.AbstractContextManager[RemoteLayout]:
        """The image ``ref`` names, its manifest fetched, ready to read."""
        ...


class DirSource:
    def __init__(self, ref: str, root: Path) -> None:
        self.ref = ref
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root.joinpath(*_clean_parts(self.ref, name))

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def read(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except OSError as e:
            raise ImageError(f"image {self.ref!r}: cannot read {name}: {e.strerror}") from e

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        try:
            return open(self._path(name), "rb")
        except OSError as e:
            raise ImageError(f"image {self.ref!r}: cannot read {name}: {e.strerror}") from e


class TarSource:
    def __init__(self, ref: str, archive: tarfile.TarFile) -> None:
        self.ref = ref
        self.archive = archive
        try:
            members = archive.getmembers()
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise ImageError(f"image {ref!r}: the tarball is damaged ({e})") from e
        self.members = {"/".join(_clean_parts(ref, m.name, strict=False)): m for m in members}

    def exists(self, name: str) -> bool:
        return "/".join(_clean_parts(self.ref, name)) in self.members

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        member = self.members.get("/".join(_clean_parts(self.ref, name)))
        stream = self.archive.extractfile(member) if member is not None else None
        if stream is None:  # docker save links duplicate layers; extractfile follows those itself
            raise ImageError(f"image {self.ref!r}: the tarball has no file {name}")
        return stream

    def read(self, name: str) -> bytes:
        with self.open(name) as stream:
            return stream.read()


def check_tarball(ref: str, path: Path) -> None:
    """Raise :class:`ImageError` unless the file at ``path`` is a readable tar archive."""
    try:
        is_tar = tarfile.is_tarfile(path)
    except OSError as e:
        raise ImageError(f"image {ref!r} cannot be read: {e.strerror}; {ACCEPTED}") from e
    if not is_tar:
        raise ImageError(f"image {ref!r} is a file but not a tar archive; {ACCEPTED}")


def read_archive(ref: str, source: TarSource) -> ImageManifest:
    """The image in a tarball: a ``docker save`` one (manifest.json) or an OCI layout one (oci-layout, index.json)."""
    if source.exists("manifest.json"):
        return read_docker_manifest(ref, source)
    if source.exists("oci-layout") and source.exists("index.json"):
        return read_layout(ref, source)
    raise ImageError(
        f"image {ref!r} is a tar archive with neither manifest.json (docker save) nor oci-layout "
        f"and index.json (OCI layout); {ACCEPTED}"
    )


def read_docker_manifest(ref: str, source: Source) -> ImageManifest:
    manifest = _json(ref, source.read("manifest.json"), "manifest.json")
    if not isinstance(manifest, list) or not manifest:
        raise ImageError(f"image {ref!r}: manifest.json does not list an image")
    if len(manifest) > 1:
        tags = [tag for entry in manifest if isinstance(entry, dict) for tag in entry.get("RepoTags") or []]
        raise ImageError(
            f"image {ref!r} holds {len(manifest)} images ({', '.join(tags) or 'untagged'}); "
            "`docker save` one image per tarball"
        )
    entry = manifest[0]
    if not isinstance(entry, dict) or not isinstance(entry.get("Config"), str):
        raise ImageError(f"image {ref!r}: manifest.json has no Config")
    layer_names = entry.get("Layers") or []
    if not isinstance(layer_names, list) or not all(isinstance(name, str) for name in layer_names):
        raise ImageError(f"image {ref!r}: manifest.json's Layers is not a list of paths")
    config, diff_ids = _parse_config(ref, source.read(entry["Config"]))
    return ImageManifest(config=config, layers=tuple(LayerBlob(name=name) for name in layer_names), diff_ids=diff_ids)


def read_layout(ref: str, source: Source) -> ImageManifest:
    """The image in an OCI layout (a directory or a tarball of one), for this machine's platform."""
    index = _json(ref, source.read("index.json"), "index.json")
    manifest = _pick_manifest(ref, source, index, depth=0)
    config_desc = manifest.get("config")
    if not isinstance(config_desc, dict):
        raise ImageError(f"image {ref!r}: its manifest has no config")
    config, diff_ids = _parse_config(ref, _read_blob(ref, source, config_desc))
    layers: list[LayerBlob] = []
    for desc in manifest.get("layers") or []:
        if not isinstance(desc, dict):
            raise ImageError(f"image {ref!r}: its manifest lists a layer that is not a descriptor")
        media_type = str(desc.get("mediaType", ""))
        if "zstd" in media_type:
            raise ImageError(
                f"image {ref!r} has zstd-compressed layers ({media_type}), which are not supported; "
                "rebuild or save it with gzip or uncompressed layers"
            )
        if media_type not in _LAYER_TYPES:
            raise ImageError(f"image {ref!r} has a layer of unsupported media type {media_type!r}")
        hex_digest = _digest_hex(ref, desc.get("digest"))
        layers.append(LayerBlob(name=f"blobs/sha256/{hex_digest}", blob_digest=hex_digest))
    return ImageManifest(config=config, layers=tuple(layers), diff_ids=diff_ids)


def _pick_manifest(ref: str, source: Source, doc: Any, depth: int) -> dict[str, Any]:
    """Walk from an index down to one image manifest, choosing this machine's platform."""
    if depth > 4:
        raise ImageError(f"image {ref!r}: its indexes nest too deeply")
    if not isinstance(doc, dict):
        raise ImageError(f"image {ref!r}: an index or manifest is not a JSON object")
    if doc.get("mediaType") in _MANIFEST_TYPES or ("layers" in doc and "manifests" not in doc):
        return doc
    manifests = [m for m in doc.get("manifests") or [] if isinstance(m, dict)]
    if not manifests:
        raise ImageError(f"image {ref!r}: its index lists no manifest")
    chosen = manifests[0]
    if len(manifests) > 1:
        arch = _OCI_ARCH.get(platform.machine(), platform.machine())
        matching = [
            m
            for m in manifests
            if isinstance(m.get("platform"), dict)
            and m["platform"].get("os") == "linux"
            and m["platform"].get("architecture") == arch
        ]
        if not matching:
            found = sorted(
                {
                    f"{m['platform'].get('os')}/{m['platform'].get('architecture')}"
                    for m in manifests
                    if isinstance(m.get("platform"), dict)
                }
            )
            raise ImageError(
                f"image {ref!r} lists {len(manifests)} manifests and none for linux/{arch} "
                f"(platforms: {', '.join(found) or 'none given'})"
            )
        chosen = matching[0]
    child = _json(ref, _read_blob(ref, source, chosen), "manifest")
    return _pick_manifest(ref, source, child, depth + 1)


def _clean_parts(ref: str, name: str, *, strict: bool = True) -> list[str]:
    """Split a path named by an image's own metadata, refusing any that could leave the image."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if strict and (name.startswith("/") or ".." in parts):
        raise ImageError(f"image {ref!r} names a file outside itself: {name!r}")
    return parts


def _json(ref: str, raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ImageError(f"image {ref!r}: {what} is not valid JSON ({e})") from e


def _digest_hex(ref: str, digest: object) -> str:
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise ImageError(f"image {ref!r}: {digest!r} is not a sha256 digest (the only kind supported)")
    return match.group(1)


def _read_blob(ref: str, source: Source, desc: dict[str, Any]) -> bytes:
    hex_digest = _digest_hex(ref, desc.get("digest"))
    data = source.read(f"blobs/sha256/{hex_digest}")
    if hashlib.sha256(data).hexdigest() != hex_digest:
        raise ImageError(f"image {ref!r}: blob {hex_digest} does not match its digest")
    return data


def _parse_config(ref: str, raw: bytes) -> tuple[ImageConfig, tuple[str, ...] | None]:
    doc = _json(ref, raw, "the image config")
    if not isinstance(doc, dict):
        raise ImageError(f"image {ref!r}: the image config is not a JSON object")
    section = doc.get("config") or {}
    if not isinstance(section, dict):
        raise ImageError(f"image {ref!r}: the image config's config section is not an object")

    def strings(key: str) -> tuple[str, ...]:
        value = section.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ImageError(f"image {ref!r}: config {key} is not a list of strings")
        return tuple(value)

    def text(key: str) -> str | None:
        value = section.get(key)
        if value is not None and not isinstance(value, str):
            raise ImageError(f"image {ref!r}: config {key} is not a string")
        return value or None

    config = ImageConfig(
        env=strings("Env"),
        entrypoint=strings("Entrypoint"),
        cmd=strings("Cmd"),
        workdir=text("WorkingDir"),
        user=text("User"),
    )
    rootfs = doc.get("rootfs")
    raw_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if raw_ids is None:
        return config, None
    if not isinstance(raw_ids, list):
        raise ImageError(f"image {ref!r}: config rootfs.diff_ids is not a list")
    return config, tuple(_digest_hex(ref, d) for d in raw_ids)
