"""The worker image: this levers9 version's worker as a Docker image, built offline and loaded with ``docker import``.

:func:`write_rootfs` writes the root filesystem tarball (planned by
:mod:`levers9.images.rootfs`: the running interpreter, levers9 with its
plugins and requirements, the libraries and tools they need); :func:`build`
imports it into a Docker daemon with :func:`import_changes` (the environment,
``CMD ["levers9", "worker"]``, no entrypoint, and the labels
:data:`VERSION_LABEL` and :data:`DIGEST_LABEL`). Invariants:

* **Offline.** No registry, no base image, no package download: only what is
  installed on this machine goes in.
* **Reused when nothing changed.** The digest label hashes the plan (every
  path, mode and link, each source file's size and mtime, the interpreter and
  the change lines). When the tag already names an image with the same digest,
  :func:`build` imports nothing and answers that image.
* **One version.** The default tag is ``levers9/worker:<version>``
  (:func:`default_tag`); the controlplane refuses a worker of another version
  at registration (:func:`levers9.services.fleet.check_worker_version`).

Failures raise :class:`~levers9.images.rootfs.ImageError` with what to do: the
installation lacks something (see :mod:`levers9.images.rootfs`), the Docker SDK
is not installed (``pip install 'docker>=7'``), Docker cannot be reached
(the host tried is named), or Docker refused the import (its message).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from levers9.__about__ import __version__
from levers9.images import rootfs
from levers9.images.rootfs import ImageError

if TYPE_CHECKING:
    import docker

__all__ = [
    "DIGEST_LABEL",
    "VERSION_LABEL",
    "BuildResult",
    "ImageError",
    "build",
    "build_image",
    "default_tag",
    "import_changes",
    "write_rootfs",
]

VERSION_LABEL = "levers9.version"
DIGEST_LABEL = "levers9.content-digest"
REPOSITORY = "levers9/worker"


def default_tag() -> str:
    """``levers9/worker:<this levers9 version>``."""
    return f"{REPOSITORY}:{__version__}"


def import_changes(version: str, digest: str | None = None) -> list[str]:
    """The Dockerfile lines ``docker import --change`` applies (the rootfs has no configuration of its own)."""
    changes = [
        f"ENV PATH={rootfs.PATH}",
        "ENV PYTHONDONTWRITEBYTECODE=1",
        "ENV LANG=C.UTF-8",
        f"ENV SSL_CERT_FILE=/{rootfs.CA_BUNDLE}",
        "WORKDIR /",
        "ENTRYPOINT []",
        'CMD ["levers9", "worker"]',
        f"LABEL {VERSION_LABEL}={version}",
    ]
    if digest is not None:
        changes.append(f"LABEL {DIGEST_LABEL}={digest}")
    return changes


def write_rootfs(out: BinaryIO, cache_dir: Path | None = None) -> None:
    """Write the worker's root filesystem as a tar archive to ``out`` (a file or a pipe; not closed)."""
    rootfs.write(rootfs.plan(), out, cache_dir)


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tag: str
    digest: str
    #: the image's size as Docker reports it
    size_bytes: int
    seconds: float
    #: an image with this tag and digest was there already: nothing was imported
    reused: bool


def _client(docker_host: str | None) -> docker.DockerClient:
    try:
        import docker
    except ImportError:
        raise ImageError("building the worker image needs the Docker SDK: pip install 'docker>=7'") from None
    where = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=where, timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot reach Docker at {where}: {exc}") from None
    return client


def _split(tag: str) -> tuple[str, str]:
    name, sep, version = tag.rpartition(":")
    if not sep or "/" in version:
        return tag, "latest"
    return name, version


def build_image(docker_host: str | None = None, tag: str | None = None, cache_dir: Path | None = None) -> BuildResult:
    """Build (or reuse) the worker image in the Docker at ``docker_host`` (default: $DOCKER_HOST, else the socket).

    ``cache_dir``: where compiled files are kept between builds (:func:`levers9.images.rootfs.default_cache_dir`).
    """
    import docker

    started = time.monotonic()
    tag = tag or default_tag()
    client = _client(docker_host)  # first: an unreachable Docker fails before any work
    try:
        entries = rootfs.plan()
        digest = rootfs.digest(entries, import_changes(__version__))
        try:
            image = client.images.get(tag)
        except docker.errors.ImageNotFound:
            image = None
        reused = image is not None and (image.labels or {}).get(DIGEST_LABEL) == digest
        if not reused:
            repository, version = _split(tag)
            with tempfile.TemporaryDirectory(prefix="levers9-worker-image-") as scratch:
                tarball = os.path.join(scratch, "rootfs.tar")
                with open(tarball, "wb") as out:
                    rootfs.write(entries, out, cache_dir)
                try:
                    client.api.import_image(
                        src=tarball, repository=repository, tag=version, changes=import_changes(__version__, digest)
                    )
                except docker.errors.APIError as exc:
                    raise ImageError(f"Docker refused to import the worker image {tag}: {exc}") from None
            image = client.images.get(tag)
        assert image is not None
        return BuildResult(
            image_id=image.id or "",
            tag=tag,
            digest=digest,
            size_bytes=int(image.attrs.get("Size") or 0),
            seconds=time.monotonic() - started,
            reused=reused,
        )
    finally:
        client.close()


def build(docker_host: str | None, tag: str | None) -> str:
    """Build (or reuse) the worker image; answers its image id."""
    return build_image(docker_host, tag).image_id
