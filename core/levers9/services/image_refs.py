"""Which images a stub may name: the rule every stub's ``image`` is checked against when it is defined.

A stub's image is resolved on the worker that runs its containers, with the worker's privileges. So
a user may not name just any path there: ``image="/"`` on a runc pool would make the host's own root
filesystem the container's, with the controlplane's database and key in it. Accepted:

- ``host``: the worker's own Python (the ``process`` runtime, and runc/gVisor with the host's ``/usr``
  bound read-only);
- an image the workspace built, named by the controlplane's registry: ``<registry host>/<prefix>/<its own
  workspace id>/...@sha256:<digest>``; another workspace's repository is refused as if it did not exist;
- an image in another registry, pinned by digest (``host[:port]/path@sha256:<digest>``): a tag could name
  different images for two containers of one stub;
- a path on the workers (a ``docker save`` tarball, an OCI layout, a root filesystem) only under one of
  the directories the operator lists in ``images.local_dirs`` (none by default).

Invariants: the check is made on the text alone (no worker, file or registry is asked), and every
refusal is an :class:`~levers9.services.stubs.InvalidStub` naming ``image`` and what is accepted.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from levers9.blueprints.spec import BlueprintError, check_ref
from levers9.services.stubs import InvalidStub

__all__ = ["check_image"]

_ACCEPTED = (
    "accepted: 'host', a levers9.Blueprint (the SDK builds it), an image in a registry pinned by digest "
    "(host[:port]/path@sha256:<digest>), or a path under a directory the operator lists in images.local_dirs"
)


def check_image(
    image: str, workspace: str, *, registry_host: str | None, repository_prefix: str, local_dirs: Sequence[str]
) -> None:
    """Raise :class:`InvalidStub` unless a stub of ``workspace`` may name ``image`` (see the module docstring)."""
    if image == "host":
        return
    if image.startswith("/"):
        normal = posixpath.normpath(image)
        for allowed in local_dirs:
            root = posixpath.normpath(allowed)
            if normal == root or normal.startswith(root.rstrip("/") + "/"):
                return
        where = ", ".join(local_dirs) if local_dirs else "none are listed"
        raise InvalidStub(
            f"image: {image!r} is a path on the workers outside the directories the operator allows for images "
            f"(images.local_dirs: {where}); {_ACCEPTED}"
        )
    try:
        check_ref("image", image)
    except BlueprintError:
        raise InvalidStub(f"image: {image!r} is not an image this controlplane can run; {_ACCEPTED}") from None
    name, _, digest = image.partition("@")
    if not digest:
        raise InvalidStub(f"image: {image!r} names a tag; pin it by digest (@sha256:...): {_ACCEPTED}")
    host, _, repository = name.partition("/")
    if registry_host is not None and host == registry_host:
        own = f"{repository_prefix}/{workspace.lower()}/"
        if not repository.startswith(own):
            raise InvalidStub(f"image: {image!r} is not an image of this workspace; its images are under {host}/{own}")
