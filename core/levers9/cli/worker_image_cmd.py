"""``levers9 worker-image build``: the worker container image for this levers9 version, built offline.

The image is a root filesystem made from this machine's interpreter and
installed packages (:mod:`levers9.images.worker`), loaded with ``docker
import``: no registry, no base image. ``--output FILE`` (``-`` for standard
output) writes the tarball instead, for ``docker import`` on another box (the
``--ssh`` join pipes it there). Exit codes: 0 built or reused, 1 the image
cannot be built (the message says what to install or which Docker could not be
reached), 2 a bad option.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from levers9.cli.output import err, print_json

__all__ = ["app"]

app = typer.Typer(help="The worker container image for this levers9 version.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """The worker container image for this levers9 version."""


@app.command("build")
def build(
    tag: str | None = typer.Option(None, "--tag", help="Image tag (default: levers9/worker:<this version>)."),
    output: str | None = typer.Option(
        None, "--output", help="Write the root filesystem tarball to FILE ('-': standard output) instead of importing."
    ),
    docker_host: str | None = typer.Option(
        None, "--docker-host", help="Docker daemon to import into (default: $DOCKER_HOST, else the local socket)."
    ),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Where compiled files are kept between builds (default: ~/.cache/levers9/...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Build the worker image offline from this installation and load it into Docker (reused when unchanged)."""
    from levers9.__about__ import __version__
    from levers9.images import rootfs
    from levers9.images.worker import ImageError, build_image, default_tag, import_changes

    if output is not None and (tag or docker_host):
        typer.echo(
            "levers9 worker-image build: --output writes a tarball; --tag and --docker-host need no --output", err=True
        )
        raise typer.Exit(2)
    try:
        if output is not None:
            started = time.monotonic()
            entries = rootfs.plan()
            if output == "-":
                written = rootfs.write(entries, sys.stdout.buffer, cache_dir)
                sys.stdout.buffer.flush()
            else:
                with Path(output).open("wb") as out:
                    written = rootfs.write(entries, out, cache_dir)
            changes = import_changes(__version__, rootfs.digest(entries, import_changes(__version__)))
            seconds = time.monotonic() - started
            if as_json and output != "-":
                print_json(
                    {
                        "output": output,
                        "bytes": written,
                        "seconds": round(seconds, 1),
                        "changes": changes,
                        "tag": default_tag(),
                    }
                )
            else:
                err.print(
                    f"wrote the worker root filesystem ({written / 2**20:.0f} MiB of files) in {seconds:.1f} s; "
                    f"load it with: docker import {' '.join(_quoted(changes))} FILE {default_tag()}"
                )
            return
        result = build_image(docker_host, tag, cache_dir)
    except ImageError as exc:
        typer.echo(f"levers9 worker-image build: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json(
            {
                "image": result.tag,
                "id": result.image_id,
                "digest": result.digest,
                "size_bytes": result.size_bytes,
                "seconds": round(result.seconds, 1),
                "reused": result.reused,
            }
        )
        return
    what = "reused" if result.reused else "built"
    typer.echo(
        f"{what} {result.tag} ({result.image_id[:19]}, {result.size_bytes / 2**20:.0f} MiB) in {result.seconds:.1f} s"
    )


def _quoted(changes: list[str]) -> list[str]:
    import shlex

    return [f"--change {shlex.quote(c)}" for c in changes]
