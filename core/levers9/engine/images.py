"""Container images, unpacked once into a content-addressed layer cache: the image store.

Images arrive as ``docker save`` tarballs, OCI image layout directories or plain
root filesystem directories, the ``host`` image lets a function run on a bare
machine from the host's own Python, and, when the store is given a
:class:`~levers9.engine.image_sources.Puller`, refs naming a registry
(``host:port/repository@sha256:...``) are pulled from it.
:class:`ImageStore` turns such a ref into a :class:`ResolvedImage`; the work is
split by what it touches:

- :mod:`levers9.engine.image_types`: the public types and :class:`ImageError`;
- :mod:`levers9.engine.image_sources`: reading layouts and tarballs (manifests, configs, blobs);
- :mod:`levers9.engine.layers`: unpacking one layer safely (whiteouts, path checks);
- :mod:`levers9.engine.host_image`: the ``host`` image;
- :mod:`levers9.engine.layer_cache`: last use and size of each layer, evicting the least recently used;
- :mod:`levers9.registry.pull` (given in, never imported here): reading a registry's manifests and blobs;
- this module: refs, the cache directories, records and locks.

Layers are kept unpacked under ``<cache>/layers/sha256/<diff id>/`` so that every
container of an image, and every image sharing a layer, mounts the same copy as an
overlayfs lower directory. The diff id (sha256 of the uncompressed layer tar) is
the key because it is what image configs list, so a cached layer is found without
reading the image's blobs at all. Several workers may share one cache: a layer is
unpacked into a private temporary directory and renamed into place atomically,
under a per-layer file lock so it is unpacked once; a tarball's resolution is
recorded under ``<cache>/refs/`` (keyed by its path, size, mtime and inode) and
written atomically, and a record whose layers were pruned is ignored.

A registry image is recorded under ``<cache>/refs/manifest-<hex>.json`` by its
manifest digest (the image's identity, whatever registry or tag named it): a
ref that pins that digest resolves from the record with no request at all (and
with no puller: a runtime's own store finds what the worker pulled before its
containers start), and a tag costs one manifest request to learn its digest.
Its layers go through the same diff-id cache, so a layer any earlier image brought is not downloaded
again (:attr:`ImageStore.layers_unpacked` counts the layers unpacked, which
for a registry image are the layers downloaded). Whatever the puller raises is
reported as an :class:`ImageError` naming the ref, the puller's error as its cause.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from levers9.engine.host_image import resolve_host
from levers9.engine.image_sources import (
    DirSource,
    ImageManifest,
    LayerBlob,
    Puller,
    Source,
    TarSource,
    check_tarball,
    read_archive,
    read_layout,
)
from levers9.engine.image_types import ACCEPTED, HOST_REF, HostBind, ImageConfig, ImageError, ResolvedImage, unknown_ref
from levers9.engine.layer_cache import PruneReport, mark_used, prune
from levers9.engine.layers import extract_layer
from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error

__all__ = ["HOST_REF", "HostBind", "ImageConfig", "ImageError", "ImageStore", "PruneReport", "ResolvedImage"]

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
#: a registry ref pinned by digest (``host/repo@sha256:<hex>``): resolved from its record with no puller
_PINNED = re.compile(r"/[^@]+@(sha256:[0-9a-f]{64})$")


class ImageStore:
    """Resolves image refs to unpacked layers under ``cache_dir``, shared safely by several processes."""

    def __init__(self, cache_dir: Path, *, puller: Puller | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        #: what reads refs that name a registry; without one such a ref is refused
        self.puller = puller
        #: layers this store unpacked (rather than found in the cache), so callers and tests can see reuse
        self.layers_unpacked = 0

    def resolve(self, ref: str) -> ResolvedImage:
        image = self._resolve(ref)
        mark_used(self.cache_dir, image.layers)
        return image

    def prune(self, max_bytes: int, in_use: Collection[Path] = ()) -> PruneReport:
        """Remove least recently used layers until the cache holds ``max_bytes`` or less.

        ``in_use``: layer directories (as :attr:`ResolvedImage.layers` names them) of containers that
        run or are about to start; they stay even when the cache is then still over (the report says
        by how much). See :mod:`levers9.engine.layer_cache`.
        """
        return prune(self.cache_dir, max_bytes, in_use, self._lock)

    def _resolve(self, ref: str) -> ResolvedImage:
        if ref == HOST_REF:
            return resolve_host(self._dir)
        if not ref.strip():
            raise ImageError(f"an empty image ref names no image; {ACCEPTED}")
        path = Path(ref)
        if path.is_dir():
            if (path / "oci-layout").is_file():
                layout = DirSource(ref, path)
                return self._image(ref, layout, read_layout(ref, layout))
            return ResolvedImage(ref=ref, layers=(path.resolve(),), config=ImageConfig())
        if path.is_file():
            return self._resolve_tarball(ref, path)
        pinned = _PINNED.search(ref) if not ref.startswith(("/", ".", "~")) else None
        if pinned is not None:  # pulled before (the worker pulls a stub's image before its containers start)
            cached = self._load_record(ref, self._manifest_record(ref, pinned.group(1)))
            if cached is not None:
                return cached
        if self.puller is not None and self.puller.accepts(ref):
            return self._pull(ref, self.puller)
        raise unknown_ref(ref, pulls=self.puller is not None)

    # ------------------------------------------------------------------ registry images

    def _pull(self, ref: str, puller: Puller) -> ResolvedImage:
        try:
            pinned = puller.pinned(ref)
            if pinned is not None:
                cached = self._load_record(ref, self._manifest_record(ref, pinned))
                if cached is not None:
                    return cached
            with puller.open(ref) as layout:
                record = self._manifest_record(ref, layout.digest)
                cached = self._load_record(ref, record)
                if cached is not None:
                    return cached
                image = self._image(ref, layout, read_layout(ref, layout))
        except ImageError:
            raise
        except Levers9Error as e:
            raise ImageError(f"image {ref!r} could not be pulled: {e}") from e
        self._save_record(record, image)
        return image

    def _manifest_record(self, ref: str, digest: str) -> Path:
        match = _DIGEST.fullmatch(digest)
        if match is None:
            raise ImageError(f"image {ref!r}: {digest!r} is not a sha256 digest (the only kind supported)")
        return self._dir("refs") / f"manifest-{match.group(1)}.json"

    # ------------------------------------------------------------------ layers the builder made

    def layer_path(self, diff_id: str) -> Path | None:
        """Where the layer ``diff_id`` (``sha256:<hex>`` or the hex) is unpacked in the cache; None when it is not."""
        target = self._dir("layers", "sha256") / _hex(diff_id)
        return target if target.is_dir() else None

    def add_layer(self, path: Path, diff_id: str) -> Path:
        """Unpack the layer tar (uncompressed or gzip) at ``path`` into the cache as ``diff_id``, unless it is there.

        How the builder keeps a layer it made: unpacked as an image's layers are (whiteouts in overlayfs
        form, paths checked), and refused with :class:`ImageError` when its content's sha256 is not ``diff_id``.
        """
        hex_id = _hex(diff_id)
        source = DirSource(str(path), path.parent)
        return self._layer(str(path), source, 0, LayerBlob(name=path.name), hex_id)

    # ------------------------------------------------------------------ tarballs and their records

    def _resolve_tarball(self, ref: str, path: Path) -> ResolvedImage:
        st = path.stat()
        # Hashing a big tarball's layers is the slow part; an unchanged file resolves from this record.
        identity = json.dumps([str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino])
        record = self._dir("refs") / f"{hashlib.sha256(identity.encode()).hexdigest()}.json"
        cached = self._load_record(ref, record)
        if cached is not None:
            return cached
        check_tarball(ref, path)
        with tarfile.open(path, "r:*") as archive:
            source = TarSource(ref, archive)
            image = self._image(ref, source, read_archive(ref, source))
        self._save_record(record, image)
        return image

    def _load_record(self, ref: str, record: Path) -> ResolvedImage | None:
        try:
            data = json.loads(record.read_text())
            layers = tuple(self._layer_dir(digest) for digest in data["layers"])
            saved = data["config"]
            config = ImageConfig(
                env=tuple(saved["env"]),
                entrypoint=tuple(saved["entrypoint"]),
                cmd=tuple(saved["cmd"]),
                workdir=saved["workdir"],
                user=saved["user"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all(layer.is_dir() for layer in layers):
            return None  # a layer was pruned from the cache: read the tarball again
        return ResolvedImage(ref=ref, layers=layers, config=config)

    def _save_record(self, record: Path, image: ResolvedImage) -> None:
        config = image.config
        data = {
            "layers": [layer.name for layer in image.layers],
            "config": {
                "env": list(config.env),
                "entrypoint": list(config.entrypoint),
                "cmd": list(config.cmd),
                "workdir": config.workdir,
                "user": config.user,
            },
        }
        write_atomic(record, json.dumps(data).encode(), mode=0o600)  # the mode mkstemp always gave it

    # ------------------------------------------------------------------ layers

    def _image(self, ref: str, source: Source, manifest: ImageManifest) -> ResolvedImage:
        """``manifest``'s image with every layer in the cache, read from ``source`` where it is not yet."""
        return ResolvedImage(
            ref=ref, layers=self._materialize(ref, source, manifest.layers, manifest.diff_ids), config=manifest.config
        )

    def _materialize(
        self, ref: str, source: Source, layers: Sequence[LayerBlob], diff_ids: Sequence[str] | None
    ) -> tuple[Path, ...]:
        if diff_ids is not None and len(diff_ids) != len(layers):
            raise ImageError(f"image {ref!r}: its config lists {len(diff_ids)} diff ids for {len(layers)} layers")
        return tuple(
            self._layer(ref, source, i, layer, diff_ids[i] if diff_ids is not None else None)
            for i, layer in enumerate(layers)
        )

    def _layer(self, ref: str, source: Source, index: int, layer: LayerBlob, diff_id: str | None) -> Path:
        if diff_id is None:
            return self._unpack(ref, source, index, layer, None)
        target = self._layer_dir(diff_id)
        if target.is_dir():
            return target
        with self._lock(diff_id):  # several workers wanting one layer unpack it once
            if target.is_dir():
                return target
            return self._unpack(ref, source, index, layer, diff_id)

    def _unpack(self, ref: str, source: Source, index: int, layer: LayerBlob, diff_id: str | None) -> Path:
        what = f"image {ref!r} layer {index} ({layer.name})"
        scratch = Path(tempfile.mkdtemp(prefix="layer-", dir=self._dir("tmp")))
        try:
            with source.open(layer.name) as stream:
                got_diff, got_blob = extract_layer(stream, scratch, what)
            self.layers_unpacked += 1
            if layer.blob_digest is not None and got_blob != layer.blob_digest:
                raise ImageError(f"{what}: the blob's sha256 is {got_blob}, not the {layer.blob_digest} its name says")
            if diff_id is not None and got_diff != diff_id:
                raise ImageError(
                    f"{what}: its uncompressed content has sha256 {got_diff} but the image config's "
                    f"rootfs.diff_ids says {diff_id}; the image is corrupt or was tampered with"
                )
            target = self._layer_dir(got_diff)
            try:
                os.rename(scratch, target)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
                    raise
                # Another process unpacked the same layer first; theirs is identical, keep it.
            return target
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)

    def _layer_dir(self, diff_id: str) -> Path:
        return self._dir("layers", "sha256") / diff_id

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        with open(self._dir("locks") / f"{name}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _dir(self, *parts: str) -> Path:
        path = self.cache_dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path


def _hex(diff_id: str) -> str:
    """The hex of a diff id given as ``sha256:<hex>`` or bare hex; ImageError for anything else."""
    hex_id = diff_id.removeprefix("sha256:")
    if len(hex_id) != 64 or any(c not in "0123456789abcdef" for c in hex_id):
        raise ImageError(f"{diff_id!r} is not a layer diff id: sha256:<64 lowercase hex>")
    return hex_id
