"""Local container images, unpacked once into a content-addressed layer cache.

There is no registry on a worker: images arrive as ``docker save`` tarballs, OCI
image layout directories or plain root filesystem directories, and the ``host``
image lets a function run on a bare machine from the host's own Python.

Layers are kept unpacked under ``<cache>/layers/sha256/<diff id>/`` so that every
container of an image, and every image sharing a layer, mounts the same copy as an
overlayfs lower directory. The diff id (sha256 of the uncompressed layer tar) is
the key because it is what image configs list, so a cached layer is found without
reading the image's blobs at all. Several workers may share one cache: a layer is
unpacked into a private temporary directory and renamed into place atomically.

Layer tarballs come from users, so unpacking never trusts a path: absolute names,
``..`` components, hard links out of the layer and writes through symlinks are
refused, and OCI whiteouts are turned into the overlayfs form the kernel honours
(a 0/0 character device, the ``trusted.overlay.opaque`` xattr).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from levers9.hooks.errors import Levers9Error

__all__ = ["HOST_REF", "HostBind", "ImageConfig", "ImageError", "ImageStore", "ResolvedImage"]

#: the ref of the image made of the host's own /usr and Python
HOST_REF = "host"

_ACCEPTED = (
    "accepted: the path of a `docker save` tarball (.tar or .tar.gz), an OCI image layout directory "
    "(with oci-layout and index.json), a root filesystem directory, or `host` (the host's own /usr and Python)"
)
_HOST_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# A docker image reference (optional registry host and port, lowercase path, tag or digest), to tell
# someone who passed `python:3.11` that it is not a path but a name no registry here can serve.
_REGISTRY_REF = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)

_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
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
# Extended attributes a layer may carry onto disk; trusted.* would let an image steer overlayfs itself.
_XATTR_ALLOWED = ("user.", "security.capability")


class ImageError(Levers9Error):
    """An image could not be found, read or unpacked; the message names the image and what is accepted."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config a container's process is started from."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class HostBind:
    """A host path the container sees read-only at ``target``; only the ``host`` image needs these."""

    source: str
    target: str


@dataclass(frozen=True)
class ResolvedImage:
    """An image ready to mount.

    ``layers`` is lowest (base) layer first, the order of the image manifest.
    Overlayfs wants the opposite: ``lowerdir=`` lists the topmost layer first, so
    pass ``":".join(map(str, reversed(layers)))``.
    """

    ref: str
    layers: tuple[Path, ...]
    config: ImageConfig
    binds: tuple[HostBind, ...] = ()


class ImageStore:
    """Resolves image refs to unpacked layers under ``cache_dir``, shared safely by several processes."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)
        #: layers this store unpacked (rather than found in the cache), so callers and tests can see reuse
        self.layers_unpacked = 0

    def resolve(self, ref: str) -> ResolvedImage:
        if ref == HOST_REF:
            return self._resolve_host()
        if not ref.strip():
            raise ImageError(f"an empty image ref names no image; {_ACCEPTED}")
        path = Path(ref)
        if path.is_dir():
            if (path / "oci-layout").is_file():
                return self._from_layout(ref, _DirSource(ref, path))
            return ResolvedImage(ref=ref, layers=(path.resolve(),), config=ImageConfig())
        if path.is_file():
            return self._resolve_tarball(ref, path)
        raise _unknown(ref)

    # ------------------------------------------------------------------ tarballs

    def _resolve_tarball(self, ref: str, path: Path) -> ResolvedImage:
        st = path.stat()
        # Hashing a big tarball's layers is the slow part; an unchanged file resolves from this record.
        identity = json.dumps([str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino])
        record = self._dir("refs") / f"{hashlib.sha256(identity.encode()).hexdigest()}.json"
        cached = self._load_record(ref, record)
        if cached is not None:
            return cached
        try:
            is_tar = tarfile.is_tarfile(path)
        except OSError as e:
            raise ImageError(f"image {ref!r} cannot be read: {e.strerror}; {_ACCEPTED}") from e
        if not is_tar:
            raise ImageError(f"image {ref!r} is a file but not a tar archive; {_ACCEPTED}")
        with tarfile.open(path, "r:*") as archive:
            source = _TarSource(ref, archive)
            if source.exists("manifest.json"):
                image = self._from_docker_manifest(ref, source)
            elif source.exists("oci-layout") and source.exists("index.json"):
                image = self._from_layout(ref, source)
            else:
                raise ImageError(
                    f"image {ref!r} is a tar archive with neither manifest.json (docker save) nor oci-layout "
                    f"and index.json (OCI layout); {_ACCEPTED}"
                )
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
        _write_atomic(record, json.dumps(data).encode())

    def _from_docker_manifest(self, ref: str, source: _TarSource) -> ResolvedImage:
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
        layers = [_LayerBlob(name=name) for name in layer_names]
        return ResolvedImage(ref=ref, layers=self._materialize(ref, source, layers, diff_ids), config=config)

    # ------------------------------------------------------------------ OCI layouts

    def _from_layout(self, ref: str, source: _Source) -> ResolvedImage:
        index = _json(ref, source.read("index.json"), "index.json")
        manifest = self._pick_manifest(ref, source, index, depth=0)
        config_desc = manifest.get("config")
        if not isinstance(config_desc, dict):
            raise ImageError(f"image {ref!r}: its manifest has no config")
        config, diff_ids = _parse_config(ref, _read_blob(ref, source, config_desc))
        layers: list[_LayerBlob] = []
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
            layers.append(_LayerBlob(name=f"blobs/sha256/{hex_digest}", blob_digest=hex_digest))
        return ResolvedImage(ref=ref, layers=self._materialize(ref, source, layers, diff_ids), config=config)

    def _pick_manifest(self, ref: str, source: _Source, doc: Any, depth: int) -> dict[str, Any]:
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
        return self._pick_manifest(ref, source, child, depth + 1)

    # ------------------------------------------------------------------ layers

    def _materialize(
        self, ref: str, source: _Source, layers: Sequence[_LayerBlob], diff_ids: Sequence[str] | None
    ) -> tuple[Path, ...]:
        if diff_ids is not None and len(diff_ids) != len(layers):
            raise ImageError(f"image {ref!r}: its config lists {len(diff_ids)} diff ids for {len(layers)} layers")
        return tuple(
            self._layer(ref, source, i, layer, diff_ids[i] if diff_ids is not None else None)
            for i, layer in enumerate(layers)
        )

    def _layer(self, ref: str, source: _Source, index: int, layer: _LayerBlob, diff_id: str | None) -> Path:
        if diff_id is None:
            return self._unpack(ref, source, index, layer, None)
        target = self._layer_dir(diff_id)
        if target.is_dir():
            return target
        with self._lock(diff_id):  # several workers wanting one layer unpack it once
            if target.is_dir():
                return target
            return self._unpack(ref, source, index, layer, diff_id)

    def _unpack(self, ref: str, source: _Source, index: int, layer: _LayerBlob, diff_id: str | None) -> Path:
        what = f"image {ref!r} layer {index} ({layer.name})"
        scratch = Path(tempfile.mkdtemp(prefix="layer-", dir=self._dir("tmp")))
        try:
            with source.open(layer.name) as stream:
                got_diff, got_blob = _extract_layer(stream, scratch, what)
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

    # ------------------------------------------------------------------ the host image

    def _resolve_host(self) -> ResolvedImage:
        links, binds = _host_layout(Path("/"))
        for prefix in _python_prefixes():
            if any(prefix == b.target or prefix.startswith(b.target.rstrip("/") + "/") for b in binds):
                continue
            binds = [b for b in binds if not b.target.startswith(prefix + "/")]
            binds.append(HostBind(source=prefix, target=prefix))
        skeleton = self._host_skeleton(links, [b.target for b in binds])
        config = ImageConfig(env=(_HOST_PATH,), workdir="/")
        return ResolvedImage(ref=HOST_REF, layers=(skeleton,), config=config, binds=tuple(binds))

    def _host_skeleton(self, links: dict[str, str], mountpoints: Sequence[str]) -> Path:
        """The small root the host's binds are mounted on, keyed by its content so it is built once."""
        entries: list[tuple[str, str, int | str]] = [
            ("dir", name, 0o755) for name in ("proc", "sys", "dev", "etc", "run", "var", "home", "usr")
        ]
        entries += [("dir", "root", 0o700), ("dir", "tmp", 0o1777), ("dir", "var/tmp", 0o1777)]
        entries += [
            (
                "file",
                "etc/passwd",
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            ),
            ("file", "etc/group", "root:x:0:\nnogroup:x:65534:\n"),
            ("file", "etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ]
        with contextlib.suppress(OSError):
            entries.append(("file", "etc/resolv.conf", Path("/etc/resolv.conf").read_text()))
        entries += [("link", name, target) for name, target in sorted(links.items())]
        # Mount points exist in the layer so a read-only root (no upper layer) can still take the binds.
        known = {name for _, name, _ in entries}
        for target in mountpoints:
            parts = Path(target).relative_to("/").parts
            if parts and parts[0] in links:
                continue  # reached through a link into /usr, which is bound already; never mkdir through a link
            for depth in range(1, len(parts) + 1):
                rel = "/".join(parts[:depth])
                if rel not in known:
                    known.add(rel)
                    entries.append(("dir", rel, 0o755))
        key = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
        target_dir = self._dir("host") / key
        if target_dir.is_dir():
            return target_dir
        scratch = Path(tempfile.mkdtemp(prefix="host-", dir=self._dir("tmp")))
        try:
            scratch.chmod(0o755)
            for kind, rel, value in entries:
                path = scratch / rel
                if kind == "dir":
                    path.mkdir()
                    path.chmod(int(value))
                elif kind == "file":
                    path.write_text(str(value))
                    path.chmod(0o644)
                else:
                    path.symlink_to(str(value))
            try:
                os.rename(scratch, target_dir)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target_dir.is_dir():
                    raise
            return target_dir
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------- reading images


@dataclass(frozen=True)
class _LayerBlob:
    name: str  # path inside the tarball or layout directory
    blob_digest: str | None = None  # sha256 hex of the (possibly compressed) blob, when the manifest gives one


class _Source(Protocol):
    """Where an image's files are: a layout directory or a tarball, read the same way."""

    def exists(self, name: str) -> bool: ...

    def read(self, name: str) -> bytes: ...

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...


class _DirSource:
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


class _TarSource:
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


def _read_blob(ref: str, source: _Source, desc: dict[str, Any]) -> bytes:
    hex_digest = _digest_hex(ref, desc.get("digest"))
    data = source.read(f"blobs/sha256/{hex_digest}")
    if hashlib.sha256(data).hexdigest() != hex_digest:
        raise ImageError(f"image {ref!r}: blob {hex_digest} does not match its digest")
    return data


def _parse_config(ref: str, raw: bytes) -> tuple[ImageConfig, list[str] | None]:
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
    return config, [_digest_hex(ref, d) for d in raw_ids]


def _unknown(ref: str) -> ImageError:
    looks_like_path = ref.startswith(("/", ".", "~")) or ref.endswith((".tar", ".tar.gz", ".tgz"))
    if not looks_like_path and _REGISTRY_REF.fullmatch(ref):
        return ImageError(
            f"image {ref!r} is not a local file or directory; it looks like a registry name, but no registry "
            f"is reachable from here: on a machine that has it, run `docker save {ref} -o image.tar` and "
            f"pass that tarball's path instead; {_ACCEPTED}"
        )
    return ImageError(f"image {ref!r}: no such file or directory; {_ACCEPTED}")


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------- the host image


def _host_layout(root: Path) -> tuple[dict[str, str], list[HostBind]]:
    """What of ``root``'s top level the host image mirrors: links to recreate and directories to bind.

    On a usr-merged host ``/bin`` and friends are links into ``/usr``, which the
    skeleton copies; on an older host they are real directories, bound as they are.
    """
    links: dict[str, str] = {}
    binds = [HostBind(source=str(root / "usr"), target="/usr")]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = root / name
        if path.is_symlink():
            links[name] = os.readlink(path)
        elif path.is_dir():
            binds.append(HostBind(source=str(path), target=f"/{name}"))
    return links, binds


def _python_prefixes() -> list[str]:
    """The running Python's (and its venv's) install directories that /usr does not already hold."""
    prefixes: list[str] = []
    for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
        path = os.path.abspath(prefix)
        real = os.path.realpath(path)
        if path == "/" or real == "/" or any(p == "/usr" or p.startswith("/usr/") for p in (path, real)):
            continue
        prefixes.append(path)
    return prefixes


# ---------------------------------------------------------------------- unpacking a layer


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class _Hashing(io.RawIOBase):
    """Passes a stream through while hashing it, with bytes already read (``head``) put back in front."""

    def __init__(self, source: _Readable, head: bytes = b"") -> None:
        super().__init__()
        self._source = source
        self._head = head
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            data, self._head = self._head[: len(view)], self._head[len(view) :]
        else:
            data = self._source.read(len(view))
        view[: len(data)] = data
        self.sha256.update(data)
        return len(data)


def _drain(stream: IO[bytes]) -> None:
    while stream.read(1 << 20):
        pass


def _extract_layer(stream: IO[bytes], dest: Path, what: str) -> tuple[str, str]:
    """Unpack one layer blob into ``dest``; returns the sha256 of its tar stream and of the blob itself."""
    head = stream.read(4)
    if head.startswith(_ZSTD_MAGIC):
        raise ImageError(f"{what} is zstd-compressed, which is not supported; use gzip or uncompressed layers")
    blob = _Hashing(stream, head)
    blob_io = io.BufferedReader(blob, 1 << 20)
    tar_hash, tar_io = blob, blob_io
    if head.startswith(_GZIP_MAGIC):
        tar_hash = _Hashing(gzip.GzipFile(fileobj=blob_io, mode="rb"))
        tar_io = io.BufferedReader(tar_hash, 1 << 20)
    try:
        with tarfile.open(fileobj=tar_io, mode="r|") as tar:
            _Unpacker(dest, what).run(tar)
        _drain(tar_io)  # the digest covers the whole stream, padding after the last member included
        _drain(blob_io)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise ImageError(f"{what} could not be unpacked: {e}") from e
    return tar_hash.sha256.hexdigest(), blob.sha256.hexdigest()


class _Unpacker:
    """Writes a layer's members under ``root`` without ever following a path the layer itself made."""

    def __init__(self, root: Path, what: str) -> None:
        self.root = root
        self.what = what
        self.root.chmod(0o755)
        # Directory modes and times go on last: a read-only directory must still take its contents first.
        self.dirs: list[tuple[Path, tarfile.TarInfo]] = []
        self.preserve_owner = os.geteuid() == 0

    def run(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            self._member(tar, member)
        for path, member in reversed(self.dirs):
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, (member.mtime, member.mtime))

    def _refuse(self, name: str, why: str) -> ImageError:
        return ImageError(f"{self.what}: refused member {name!r}: {why}")

    def _parts(self, name: str) -> list[str]:
        if name.startswith("/"):
            raise self._refuse(name, "absolute paths are not allowed in a layer")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self._refuse(name, "'..' is not allowed in a layer path")
        return parts

    def _walk(self, name: str, parts: Sequence[str], *, create: bool) -> Path:
        """The directory ``parts`` name, checked component by component so no symlink is ever followed."""
        current = self.root
        for part in parts:
            current = current / part
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                if not create:
                    raise self._refuse(name, f"{'/'.join(parts)} does not exist in this layer") from None
                os.mkdir(current, 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise self._refuse(name, "its path goes through a symlink, which could lead out of the layer")
            if not stat.S_ISDIR(st.st_mode):
                raise self._refuse(name, "its parent is not a directory")
        return current

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = self._parts(member.name)
        if not parts:
            if member.isdir():
                self._owner(self.root, member)
                self.dirs.append((self.root, member))
            return
        parent = self._walk(member.name, parts[:-1], create=True)
        base = parts[-1]
        if base.startswith(".wh."):
            self._whiteout(member.name, parent, base)
            return
        path = parent / base
        if member.isdir():
            existing = _lstat(path)
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                _remove(path)
                os.mkdir(path, 0o700)
            self._owner(path, member)
            self._xattrs(path, member)
            self.dirs.append((path, member))
            return
        _remove(path)  # a later member replaces an earlier one of the same name
        if member.isreg():
            source = tar.extractfile(member)
            if source is None:
                raise self._refuse(member.name, "its content cannot be read")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out, source:
                shutil.copyfileobj(source, out, 1 << 20)
            self._owner(path, member)
            os.chmod(path, member.mode & 0o7777)  # after chown, which clears setuid bits
            self._xattrs(path, member)
            os.utime(path, (member.mtime, member.mtime))
        elif member.issym():
            # Symlinks may point anywhere: they are resolved inside the container's root, never here.
            os.symlink(member.linkname, path)
            self._owner(path, member)
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
        elif member.islnk():
            link_parts = self._parts(member.linkname)
            if not link_parts:
                raise self._refuse(member.name, "a hard link to the layer's root")
            target = self._walk(member.name, link_parts[:-1], create=False) / link_parts[-1]
            st = _lstat(target)
            if st is None or stat.S_ISDIR(st.st_mode):
                raise self._refuse(member.name, f"hard link to {member.linkname!r}, which is not a file in this layer")
            os.link(target, path, follow_symlinks=False)
        elif member.isfifo():
            os.mkfifo(path, 0o600)
            self._owner(path, member)
            os.chmod(path, member.mode & 0o7777)
        # Device nodes are skipped: a container gets its devices from the runtime, never from an image.

    def _whiteout(self, name: str, parent: Path, base: str) -> None:
        if base == ".wh..wh..opq":
            os.setxattr(parent, "trusted.overlay.opaque", b"y")
            return
        if base.startswith(".wh..wh."):
            return  # aufs bookkeeping (.wh..wh.plnk and such), meaningless to overlayfs
        hidden = base[len(".wh.") :]
        if hidden in ("", ".", ".."):
            raise self._refuse(name, "a whiteout of nothing")
        path = parent / hidden
        _remove(path)
        os.mknod(path, stat.S_IFCHR, os.makedev(0, 0))

    def _owner(self, path: Path, member: tarfile.TarInfo) -> None:
        if self.preserve_owner:
            os.lchown(path, member.uid, member.gid)

    def _xattrs(self, path: Path, member: tarfile.TarInfo) -> None:
        for key, value in member.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            attr = key[len("SCHILY.xattr.") :]
            if attr.startswith(_XATTR_ALLOWED):
                with contextlib.suppress(OSError):  # a filesystem without xattrs loses them, like docker's does
                    os.setxattr(path, attr, value.encode("utf-8", "surrogateescape"), follow_symlinks=False)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _remove(path: Path) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
