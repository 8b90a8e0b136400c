"""A sandbox's filesystem made an image (the issue's ``create_image_from_filesystem``): the worker's side.

:func:`commit` turns a running sandbox's root filesystem, as it is now, into an OCI image in the
controlplane's registry: the layers of the image the sandbox runs (its base) and ONE new layer holding
what the sandbox changed (files added or changed; each file it deleted as an OCI whiteout
``.wh.NAME``, each directory it replaced whole with ``.wh..wh..opq``), the base's config (environment,
entrypoint, command, working directory, user, labels, its history) with the new layer's diff id and a
history entry naming the sandbox, pushed under the workspace's repository with the worker's own
registry credential. A sandbox created with the answered ref boots with those files (the worker pulls
it like any registry image: only the new layer is downloaded, the base's are in its cache).

How the changes are read: the runtime's ``levers9_container_changes`` hook writes the sandbox's
container's writable layer (its overlay's upper directory, nothing outside it; symlinks stored as
symlinks, never followed) as the layer tar. The sandbox keeps running: the engine behind ``runc`` and
``gvisor`` pauses the container (``runc pause`` freezes its cgroup, ``runsc pause`` stops its
sandbox's tasks) while the layer is written and resumes it after, so the layer is one moment's view
and no process sees more than a pause, which lasts while the uncompressed tar of the changes is written
(gzip and push come after it resumes; requests to the sandbox meanwhile wait, none fails). gVisor's containers keep their root filesystem's writes on the
host (the plugin runs runsc with ``--overlay2 none``: no memory-backed overlay), in that same upper
directory, so the same read holds for both.

The repository (the controlplane chooses it; a Blueprint's images go to
``<prefix>/<workspace id>/blueprints``): it must be a valid repository name and one of the sandbox's
workspace's, that is, one of its components before the last is the workspace id (lowercase), as the
controlplane's registry relay requires (:mod:`levers9.services.registry_access`, which also checks that
this worker may push there). The manifest is tagged ``<sandbox id>.<n>`` (its n-th commit), so the
registry keeps it; the answer pins it by digest.

The base: an image in a registry, pinned by digest, or an OCI image layout directory on the worker. A
base in the controlplane's registry (a Blueprint's, or one committed before) has its layers' blobs there
already: they are linked into the repository (a cross-repository mount, or nothing when it is the same
repository), never uploaded again. A base of another registry (read anonymously, as the worker pulled it)
has its blobs copied through the worker, and a layout's are uploaded from it, once: a later commit finds
them in the repository. A sandbox of the ``host`` image (the worker's own filesystem, for tests) has no
image to commit, and one of a tag, a docker save tarball or a root filesystem directory (no blobs to build
on) is refused too (:class:`CommitUnavailable` naming ``image``), as is a worker given no registry or a
runtime that cannot tell a container's changes.

Errors: :class:`CommitRefused` (a ``ValueError``: the repository; the message names the field),
:class:`CommitUnavailable` (this sandbox or worker cannot be committed, and why), :class:`CommitFailed`
(the runtime or the registry failed; the message has the cause; the sandbox runs on). The scratch
directory (the layer tar, its gzip) is removed whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from levers9.builder.layout import LAYER_GZIP, gzip_layer
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext
from levers9.registry.client import DOCKER_MANIFEST, OCI_MANIFEST, RegistryClient
from levers9.registry.errors import InvalidRefError
from levers9.registry.refs import ImageRef, check_repository, parse_ref
from levers9.worker.images import ImagePulls

__all__ = [
    "CHANGES_TIMEOUT_S",
    "CommitFailed",
    "CommitRefused",
    "CommitUnavailable",
    "CommittedImage",
    "check_repository_of",
    "commit",
    "commit_tag",
]

log = logging.getLogger(__name__)

#: seconds the runtime is given to write a sandbox's changes (the container is paused meanwhile)
CHANGES_TIMEOUT_S = 600.0
_DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


class CommitRefused(ValueError):
    """The request cannot be committed as asked (the repository); the message names the field."""


class CommitUnavailable(Exception):
    """This sandbox (its image) or this worker (no registry, a runtime that cannot tell changes) cannot commit."""


class CommitFailed(Exception):
    """Reading the sandbox's changes or pushing the image failed; the message has the cause."""


@dataclass(frozen=True)
class CommittedImage:
    """The image a commit pushed."""

    #: ``<registry host>/<repository>@sha256:<manifest digest>``: what a sandbox or a stub names to run it
    ref: str
    repository: str
    tag: str
    #: bytes of its config and layer blobs, as the registry stores them
    size_bytes: int
    #: its layers: the base's and the one new
    layers: int
    #: the new layer's diff id (sha256 of its uncompressed tar)
    diff_id: str

    def fields(self) -> dict[str, Any]:
        """What the worker's API answers."""
        return {"image": self.ref, "size_bytes": self.size_bytes, "layers": self.layers}


def check_repository_of(repository: object, workspace_id: str) -> str:
    """``repository`` when it is a valid name of ``workspace_id``'s (see the module docstring); CommitRefused."""
    if not isinstance(repository, str) or not repository:
        raise CommitRefused(
            "repository is missing; give the workspace's repository the image goes to, such as "
            f"levers9/{workspace_id.lower()}/blueprints"
        )
    try:
        check_repository(repository)
    except InvalidRefError as exc:
        raise CommitRefused(str(exc)) from None
    if workspace_id.lower() not in repository.split("/")[:-1]:
        raise CommitRefused(
            f"repository {repository!r} is not one of workspace {workspace_id}'s; its repositories are "
            f"<prefix>/{workspace_id.lower()}/<name>"
        )
    return repository


async def commit(
    hooks: Hooks,
    runtime: RuntimeContext,
    images: ImagePulls | None,
    *,
    sandbox_id: str,
    container_id: str,
    image: str,
    repository: str,
    tag: str,
    scratch: Path,
) -> CommittedImage:
    """Commit the running container ``container_id`` of sandbox ``sandbox_id`` (see the module docstring)."""
    base = _base(image, images)
    assert images is not None  # _base refused a worker without a registry
    if not hooks.captures_changes(runtime):
        raise CommitUnavailable(
            f"runtime {runtime.name} cannot tell what a container changed, so a sandbox's filesystem cannot "
            "become an image on this worker; sandboxes of runc and gvisor pools can"
        )
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=f"commit-{sandbox_id}-", dir=scratch))
    try:
        tar = work / "changes.tar"
        try:
            await hooks.container_changes(runtime, container_id, str(tar), timeout=CHANGES_TIMEOUT_S)
        except (Levers9Error, TimeoutError) as exc:
            raise CommitFailed(f"reading the sandbox {sandbox_id}'s changes failed: {exc}") from exc
        return await asyncio.to_thread(
            _push,
            images,
            base,
            tar,
            work,
            sandbox_id=sandbox_id,
            repository=repository,
            tag=tag,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):  # another commit's may still be there
            scratch.rmdir()


def _base(image: str, images: ImagePulls | None) -> ImageRef | Path:
    """The sandbox's image: a registry ref pinned by digest, or an OCI layout directory on this worker;
    CommitUnavailable if it is neither (or the worker has no registry)."""
    if image == "host":
        raise CommitUnavailable(
            "image is 'host': a sandbox on the worker's own filesystem has no image to commit; create the "
            "sandbox from an image (a Blueprint's) to make its filesystem an image"
        )
    if images is None or not images.registry_host:
        raise CommitUnavailable(
            "this worker was given no registry (the controlplane's registry.url is unset), so it has nowhere to "
            "push a sandbox's image"
        )
    if image.startswith("/"):
        if (Path(image) / "oci-layout").is_file():
            return Path(image)
        raise CommitUnavailable(
            f"image is {image!r}, a path on the worker that is not an OCI image layout directory (a docker save "
            "tarball or a root filesystem has no blobs to make the new image on); give a layout directory or a "
            "registry image pinned by digest"
        )
    try:
        parsed = parse_ref(image)
    except InvalidRefError:
        parsed = None
    if parsed is None or parsed.digest is None:
        raise CommitUnavailable(
            f"image is {image!r}; a sandbox's filesystem becomes an image only when its image is in a registry, "
            f"pinned by digest (host[:port]/repository@sha256:...: a Blueprint's in {images.registry_host}, one "
            "committed before, or another registry's) or an OCI layout directory, whose layers it is made on"
        )
    return parsed


class _Origin:
    """Where the base's manifest, config and layer blobs are read: a registry, or a layout directory."""

    def __init__(self, image: str) -> None:
        self.image = image

    def manifest(self) -> tuple[bytes, str]:
        """The base's manifest and its media type."""
        raise NotImplementedError

    def blob(self, digest: str) -> bytes:
        """A small blob (the config), checked against its digest."""
        raise NotImplementedError

    def link(self, client: RegistryClient, repository: str, blob: dict[str, Any]) -> None:
        """Make the base's layer blob one of ``repository``'s (nothing when it is there already)."""
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what reading took."""


class _RegistryOrigin(_Origin):
    """A base in a registry: the controlplane's (its blobs are mounted) or another (they are copied)."""

    def __init__(self, images: ImagePulls, ref: ImageRef, ours: RegistryClient) -> None:
        super().__init__(str(ref))
        self.ref = ref
        self.same = ref.registry == images.registry_host
        self.client = ours if self.same else images.registry_client(ref.registry)

    def manifest(self) -> tuple[bytes, str]:
        assert self.ref.digest is not None  # _base checked
        data, media_type, _ = self.client.get_manifest(self.ref.repository, self.ref.digest)
        return data, media_type

    def blob(self, digest: str) -> bytes:
        return self.client.read_blob(self.ref.repository, digest)

    def link(self, client: RegistryClient, repository: str, blob: dict[str, Any]) -> None:
        digest, size = str(blob["digest"]), int(blob["size"])
        if client.has_blob(repository, digest):
            return
        if self.same and client.mount_blob(repository, digest, self.ref.repository):
            return
        with self.client.open_blob(self.ref.repository, digest) as stream:  # another registry, or no mounts
            client.push_blob(repository, digest, io.BufferedReader(stream, 1 << 20), size)

    def close(self) -> None:
        if not self.same:
            self.client.close()


class _LayoutOrigin(_Origin):
    """A base in an OCI image layout directory on this worker: its blobs are uploaded from there."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.root = root

    def _path(self, digest: str) -> Path:
        match = _DIGEST.fullmatch(digest)
        if match is None:
            raise CommitFailed(f"image {self.image!r} names {digest!r}, which is not a sha256 digest")
        path = self.root / "blobs" / "sha256" / match.group(1)
        if not path.is_file():
            raise CommitFailed(f"image {self.image!r} lacks the blob {digest} its manifest names")
        return path

    def manifest(self) -> tuple[bytes, str]:
        index = json.loads((self.root / "index.json").read_bytes())
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise CommitUnavailable(f"image {self.image!r} is a layout of {len(manifests)} images, not of one")
        return self.blob(str(manifests[0]["digest"])), str(manifests[0].get("mediaType") or OCI_MANIFEST)

    def blob(self, digest: str) -> bytes:
        data = self._path(digest).read_bytes()
        if _sha256(data) != digest:
            raise CommitFailed(f"image {self.image!r}: the blob {digest} does not match its digest")
        return data

    def link(self, client: RegistryClient, repository: str, blob: dict[str, Any]) -> None:
        digest, size = str(blob["digest"]), int(blob["size"])
        path = self._path(digest)
        if not client.has_blob(repository, digest):
            client.push_blob(repository, digest, path, size)


def _push(
    images: ImagePulls,
    based_on: ImageRef | Path,
    tar: Path,
    work: Path,
    *,
    sandbox_id: str,
    repository: str,
    tag: str,
) -> CommittedImage:
    """Gzip the changes, link the base's blobs into ``repository``, push the new layer, config and manifest."""
    client = images.registry_client()
    origin = _LayoutOrigin(based_on) if isinstance(based_on, Path) else _RegistryOrigin(images, based_on, client)
    image = origin.image
    try:
        base_bytes, media_type = origin.manifest()
        base = json.loads(base_bytes)
        if media_type not in (OCI_MANIFEST, DOCKER_MANIFEST) or not isinstance(base.get("layers"), list):
            raise CommitUnavailable(f"image {image!r} is an index of several images ({media_type}), not one image")
        config = json.loads(origin.blob(base["config"]["digest"]))
        diff_ids = (config.get("rootfs") or {}).get("diff_ids")
        if not isinstance(diff_ids, list) or len(diff_ids) != len(base["layers"]):
            raise CommitFailed(f"image {image!r}: its config does not list one diff id for each of its layers")
        layer = gzip_layer(tar, work)
        blob_path, blob_digest, blob_size = layer.blob_path, layer.blob_digest, layer.blob_size
        if blob_path is None or blob_digest is None or blob_size is None:
            raise CommitFailed(f"gzipping the changes of sandbox {sandbox_id} gave no blob")
        for blob in base["layers"]:
            origin.link(client, repository, blob)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        config["created"] = now
        config["rootfs"] = {"type": "layers", "diff_ids": [*diff_ids, layer.diff_id]}
        config["history"] = [
            *(config.get("history") or []),
            {"created": now, "created_by": f"levers9: committed from sandbox {sandbox_id}"},
        ]
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_desc = {
            "mediaType": base["config"]["mediaType"],
            "digest": _sha256(config_bytes),
            "size": len(config_bytes),
        }
        layer_type = LAYER_GZIP if media_type == OCI_MANIFEST else _DOCKER_LAYER_GZIP
        new = {"mediaType": layer_type, "digest": blob_digest, "size": blob_size}
        client.push_blob(repository, blob_digest, blob_path, blob_size)
        client.push_blob(repository, config_desc["digest"], config_bytes, len(config_bytes))
        manifest = {**base, "config": config_desc, "layers": [*base["layers"], new]}
        manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
        pushed = client.push_manifest(repository, tag, manifest_bytes, media_type)
    except Levers9Error as exc:
        raise CommitFailed(f"pushing the image of sandbox {sandbox_id} to {repository} failed: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CommitFailed(f"image {image!r}: its manifest or config is not what an image's is: {exc!r}") from exc
    except OSError as exc:
        raise CommitFailed(f"reading the image of sandbox {sandbox_id} or its changes failed: {exc}") from exc
    finally:
        origin.close()
        client.close()
    size = len(config_bytes) + sum(int(b["size"]) for b in manifest["layers"])
    ref = f"{images.registry_host}/{repository}@{pushed}"
    log.info("sandbox %s committed as %s (%d layers, %d bytes)", sandbox_id, ref, len(manifest["layers"]), size)
    return CommittedImage(
        ref=ref, repository=repository, tag=tag, size_bytes=size, layers=len(manifest["layers"]), diff_id=layer.diff_id
    )


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def commit_tag(sandbox_id: str, count: int) -> str:
    """The tag of a sandbox's ``count``-th commit."""
    return f"{sandbox_id}.{count}"
