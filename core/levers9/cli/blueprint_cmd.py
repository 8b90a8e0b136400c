"""``levers9 blueprint build FILE[::NAME]`` and ``levers9 blueprints``: building images ahead of time, and listing them.

``build`` imports FILE as ``levers9 run FILE::FUNCTION`` does and builds the blueprint named NAME
there: a :class:`~levers9.Blueprint`, or a function whose ``image=`` is one. Without NAME the file
must hold exactly one blueprint (directly or as a function's image); otherwise the error lists them.
The build's output streams to stderr, one progress line per step ("step 3/6 cached"), and the image
ref is printed on stdout, so ``REF=$(levers9 blueprint build app.py)`` works in scripts.

``blueprints`` lists the workspace's built images: key, size, steps, age, and the ref that runs it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.client_cmds import call, context_option, resolve_context
from levers9.cli.output import Col, err, print_json, print_table

if TYPE_CHECKING:
    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub
    from levers9.sdk.blueprint import Blueprint

__all__ = ["app", "blueprints"]

app = typer.Typer(help="Build images from blueprints ahead of their first call.", no_args_is_help=True)


def fail(message: str) -> None:
    err.print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(1)


def _found(module: Any) -> dict[str, Blueprint]:
    """The module's blueprints by name: its Blueprint objects, and its functions' ``image=`` blueprints."""
    from levers9.sdk.blueprint import Blueprint
    from levers9.sdk.functions import Function

    found: dict[str, Blueprint] = {}
    for name, value in vars(module).items():
        if isinstance(value, Blueprint):
            found[name] = value
        elif isinstance(value, Function) and value._blueprint is not None:
            found[name] = value._blueprint
    return found


@app.command("build")
def build(
    target: str = typer.Argument(..., metavar="FILE[::NAME]", help="The Python file, and the blueprint in it."),
    context: str | None = context_option(),
) -> None:
    """Build a blueprint's image now (steps built before are not run again); print its ref."""
    import os
    import sys

    from levers9.cli.run_cmd import import_file
    from levers9.sdk.builds import build_image
    from levers9.sdk.client import client_for
    from levers9.sdk.context import ENV_CONTEXT
    from levers9.sdk.errors import BuildFailed, ControlPlaneError

    file_text, _, name = target.rpartition("::") if "::" in target else (target, "", "")
    path = Path(file_text)
    if not path.is_file():
        fail(f"no such file: {file_text}")
    if context is not None:
        os.environ[ENV_CONTEXT] = resolve_context(context).name
    sys.path.insert(0, str(path.resolve().parent))
    try:
        module = import_file(path)
    except typer.Exit:
        raise
    except Exception as exc:
        fail(f"importing {path} failed: {type(exc).__name__}: {exc}")
    found = _found(module)
    if name:
        if name not in found:
            fail(f"{path} has no blueprint {name!r} (blueprints: {', '.join(sorted(found)) or 'none'})")
        blueprint = found[name]
    else:
        unique = {id(b): b for b in found.values()}
        if len(unique) != 1:
            listed = ", ".join(sorted(found)) or "none"
            fail(f"{path} holds {len(unique)} blueprints ({listed}); name one: {path}::NAME")
        (blueprint,) = unique.values()
    client = client_for(None)
    try:
        ref = client.run(build_image(client, blueprint))
    except (BuildFailed, ControlPlaneError, ValueError) as exc:
        fail(str(exc))
    print(ref)


def blueprints(
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per image."),
) -> None:
    """List the workspace's built images: key, size, steps, age, and the ref that runs each."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: tuple[tuple[str, str], ...]) -> list[pb.BuiltImage]:
        response: pb.ListImagesResponse = await stub.ListImages(pb.ListImagesRequest(), metadata=metadata, timeout=30)
        return list(response.images)

    found = call(context, action)
    if as_json:
        print_json(
            [
                {
                    "key": i.key,
                    "image": i.image,
                    "manifest_digest": i.manifest_digest,
                    "size_bytes": i.size_bytes,
                    "steps": i.steps,
                    "created_at": i.created_at,
                    "last_used_at": i.last_used_at,
                }
                for i in found
            ]
        )
        return
    if not found:
        err.print("no images built yet: `levers9 blueprint build FILE` builds one", markup=False)
        return
    columns = [
        Col("key"),
        Col("size", justify="right"),
        Col("steps", justify="right"),
        Col("age", justify="right"),
        Col("used", justify="right"),
        Col("image", wrap=True),
    ]
    now = time.time()
    rows = [
        [
            i.key.removeprefix("sha256:")[:12],
            _size(i.size_bytes),
            str(i.steps),
            _age(now - i.created_at),
            _age(now - i.last_used_at),
            i.image,
        ]
        for i in found
    ]
    print_table(columns, rows)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
