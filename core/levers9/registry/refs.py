"""Image refs that name a registry: ``host[:port]/repository[:tag][@sha256:<64 hex>]``.

:func:`parse_ref` splits a ref into an :class:`ImageRef`, following the
distribution reference grammar: the first path component is the registry host
when it has a ``.`` or a ``:`` or is ``localhost`` (``[::1]:5000`` too);
repository components are lowercase letters and digits joined by ``.``, ``_``,
``__`` or dashes; a tag is at most 128 word characters, dots and dashes; the
only digest algorithm accepted is sha256.

Invariant: a ref without a registry host (``python:3.11``, ``library/debian``)
is refused, never completed to Docker Hub: levers9 pulls only from registries
its operator names, and nothing here reaches Docker Hub. Every refusal is an
:class:`~levers9.registry.errors.InvalidRefError` (a :class:`ValueError`) naming the ref, the part that is wrong and the form accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from levers9.registry.errors import InvalidRefError

__all__ = ["DIGEST", "FORM", "ImageRef", "check_digest", "check_repository", "parse_ref"]

#: what a ref must look like, appended to every refusal
FORM = "write host[:port]/repository[:tag][@sha256:<64 hex digits>], e.g. 127.0.0.1:5000/team/app:v1"

#: a content digest, the only algorithm accepted
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(
    r"(?:(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
_MAX_NAME = 255


@dataclass(frozen=True)
class ImageRef:
    """A parsed ref: ``registry`` is ``host[:port]``; ``tag`` and ``digest`` may each be absent."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What to ask the registry's manifests endpoint for: the digest, else the tag, else ``latest``."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return (
            f"{self.registry}/{self.repository}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def check_digest(digest: str, what: str = "digest") -> str:
    """``digest`` when it is ``sha256:<64 lowercase hex>``; an :class:`InvalidRefError` naming ``what`` otherwise."""
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise InvalidRefError(f"{what} {digest!r} is not a sha256 digest; accepted: sha256:<64 lowercase hex digits>")
    return digest


def check_repository(repository: str) -> str:
    """``repository`` when the distribution grammar accepts it; an :class:`InvalidRefError` saying what would be."""
    if not isinstance(repository, str) or not _REPOSITORY.fullmatch(repository) or len(repository) > _MAX_NAME:
        raise InvalidRefError(
            f"repository {repository!r} is not a valid repository name; accepted: lowercase letters and digits, "
            "components joined by '.', '_', '__' or '-', separated by '/', at most 255 characters"
        )
    return repository


def parse_ref(ref: str) -> ImageRef:
    """Split ``ref``; raises :class:`InvalidRefError` naming what is wrong (see the module docstring)."""
    if not isinstance(ref, str) or not ref.strip():
        raise InvalidRefError(f"an empty image ref names no image; {FORM}")
    rest, digest = ref, None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        check_digest(digest, f"image ref {ref!r}: its digest")
    host, slash, path = rest.partition("/")
    if not slash or not (("." in host or ":" in host or host == "localhost") and _HOST.fullmatch(host)):
        raise InvalidRefError(
            f"image ref {ref!r} names no registry host (its first component must be a host, with a '.' or a "
            f"port, or localhost); levers9 never pulls from Docker Hub; {FORM}"
        )
    tag = None
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon > last_slash:
        path, tag = path[:colon], path[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise InvalidRefError(
                f"image ref {ref!r}: tag {tag!r} is not valid; accepted: up to 128 letters, digits, '_', '.' "
                f"and '-', not starting with '.' or '-'; {FORM}"
            )
    try:
        check_repository(path)
    except InvalidRefError as e:
        raise InvalidRefError(f"image ref {ref!r}: {e}; {FORM}") from None
    if len(host) + 1 + len(path) > _MAX_NAME:
        raise InvalidRefError(f"image ref {ref!r}: its name is over {_MAX_NAME} characters; {FORM}")
    return ImageRef(registry=host, repository=path, tag=tag, digest=digest)
