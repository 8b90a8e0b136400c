"""Building a :class:`~levers9.sdk.blueprint.Blueprint` into an image through the controlplane, as the user watches.

:func:`build_image` sends the blueprint's build spec and the files its copy steps add
(``BuildImage``), prints the build's output as it comes (each step's progress line and its
commands' output), and returns the image ref a function's stub names: the registry's host, the
workspace's repository and the manifest digest. A workspace that built the same blueprint before is
answered at once, and within one client a blueprint is built once (its ref is kept by key).

Failures: a build that fails raises :class:`BuildFailed` with the builder's message (the step, its
command, its exit code and its last lines of output); a blueprint the controlplane refuses raises
:class:`~levers9.sdk.errors.InvalidFunction`, and a controlplane with no pool that builds images
:class:`~levers9.sdk.errors.ControlPlaneError`, each naming the fix.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

import grpc

from levers9.blueprints.spec import keys
from levers9.proto.v1 import controlplane_pb2
from levers9.sdk.client import Client, translate
from levers9.sdk.errors import BuildFailed

if TYPE_CHECKING:
    from levers9.sdk.blueprint import Blueprint

__all__ = ["build_image"]


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        out.write(text)
        out.flush()


async def build_image(client: Client, blueprint: Blueprint, *, out: TextIO | None = sys.stderr) -> str:
    """The ref of ``blueprint``'s image, built first where the workspace has not built it; see the module."""
    spec, files = blueprint._resolve()
    request = controlplane_pb2.BuildImageRequest(
        spec=spec.to_json(), contents={digest: local.tar() for digest, local in files.items()}
    )
    key = keys(spec)[-1]
    known = client.image_refs.get(key)
    if known is not None:
        return known
    short = key.removeprefix("sha256:")[:12]
    stub, _ = await client.connect()
    try:
        async for event in stub.BuildImage(request, metadata=client.metadata):
            client.reached()
            if event.kind == "started":
                _say(
                    out,
                    f"levers9: building image {short}: {event.steps} steps on its base, {event.steps_cached} "
                    f"built before ({event.text})\n",
                )
            elif event.kind == "log":
                _say(out, event.text)
            elif event.kind == "done":
                if not event.cached:
                    _say(out, f"levers9: image {short} built: {event.image}\n")
                client.image_refs[key] = event.image
                return str(event.image)
            elif event.kind == "failed":
                raise BuildFailed(f"building image {short} failed: {event.text}")
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, client.ctx) from None
    raise BuildFailed(f"building image {short}: the controlplane ended the build without its outcome")
