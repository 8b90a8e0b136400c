"""What a resolved image is, and the error every image module raises.

Holds the public image types (:class:`ResolvedImage`, :class:`ImageConfig`,
:class:`HostBind`, :class:`ImageError`, ``HOST_REF``) and the one sentence that
says which image refs are accepted, so every error names the same choices.

Invariants: these types are frozen values with no I/O; ``ResolvedImage.layers``
is lowest (base) layer first; every :class:`ImageError` message names the image
and, where the ref itself was wrong, what would be accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from levers9.hooks.errors import Levers9Error

__all__ = ["ACCEPTED", "HOST_REF", "HostBind", "ImageConfig", "ImageError", "ResolvedImage", "unknown_ref"]

#: the ref of the image made of the host's own /usr and Python
HOST_REF = "host"

#: what an image ref may be, appended to every error about a ref
ACCEPTED = (
    "accepted: the path of a `docker save` tarball (.tar or .tar.gz), an OCI image layout directory "
    "(with oci-layout and index.json), a root filesystem directory, or `host` (the host's own /usr and Python)"
)

# A docker image reference (optional registry host and port, lowercase path, tag or digest), to tell
# someone who passed `python:3.11` that it is not a path but a name no registry here can serve.
_REGISTRY_REF = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


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


def unknown_ref(ref: str, *, pulls: bool = False) -> ImageError:
    """The error for a ref that is no file or directory here; a registry name gets told how to bring it.

    ``pulls``: the store has a registry puller, which refused ``ref`` (it names no registry host).
    """
    looks_like_path = ref.startswith(("/", ".", "~")) or ref.endswith((".tar", ".tar.gz", ".tgz"))
    if not looks_like_path and _REGISTRY_REF.fullmatch(ref) and pulls:
        return ImageError(
            f"image {ref!r} is not a local file or directory, and as a registry ref it names no registry host; "
            "write host[:port]/repository[:tag][@sha256:<digest>] (levers9 never pulls from Docker Hub); "
            f"{ACCEPTED}"
        )
    if not looks_like_path and _REGISTRY_REF.fullmatch(ref):
        return ImageError(
            f"image {ref!r} is not a local file or directory; it looks like a registry name, but no registry "
            f"is reachable from here: on a machine that has it, run `docker save {ref} -o image.tar` and "
            f"pass that tarball's path instead; {ACCEPTED}"
        )
    return ImageError(f"image {ref!r}: no such file or directory; {ACCEPTED}")
