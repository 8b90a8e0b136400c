"""Removing what a worker that died without cleaning up left behind: its containers and its state.

Containers are started detached, so they outlive a worker that is killed
(SIGKILL, a crash, a host under memory pressure). Whoever starts the next
worker on the same state directory, or the provider that killed the old one,
calls :func:`remove_leftovers` so that nothing keeps running unaccounted for.
Each runtime says which containers it holds (``levers9_container_list``): the
worker does not know where or how a runtime keeps them.

A killed worker's sandboxes whose network was cut leave their rules in the host's firewall
(:func:`levers9.engine.host_guard.confine`), each naming a directory of the worker's state: those
under ``state_dir`` are removed once its containers are (a rule left would only hold a veth nothing
has any more, but the firewall is the host's, and stays as it was found).

A killed worker may also leave its volume mounts in its state directory: the
volumes' JuiceFS file system (every workspace's volumes) or a volume over
rclone, whose ``juicefs``/``rclone`` lives on in a session of its own. Deleting
the state directory through one would delete those volumes' files, so they are
unmounted first, and with anything still mounted below it the directory is
kept (an error in the log) rather than deleted through the mount.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from pydantic import BaseModel, ValidationError

from levers9.engine import host_guard
from levers9.engine.rootfs import mounts_under
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext
from levers9.volumes import juicefs, rclone

__all__ = ["remove_leftovers"]

log = logging.getLogger(__name__)


def _settings(hooks: Hooks, runtime: str) -> BaseModel | None:
    try:
        model = hooks.runtime_settings_model(runtime)
        return None if model is None else model()
    except (ValidationError, Exception):  # a runtime whose settings need values: remove with none
        return None


async def remove_leftovers(hooks: Hooks, state_dir: Path, *, delete: bool = False) -> int:
    """Remove every container found under ``state_dir`` (and the directory itself with ``delete``); how many."""
    runtimes = state_dir / "runtime"
    removed = 0
    if runtimes.is_dir():
        for runtime_dir in sorted(p for p in runtimes.iterdir() if p.is_dir()):
            name = runtime_dir.name
            if name not in hooks.runtimes():
                log.warning("runtime %r left state in %s, but no such runtime is installed", name, runtime_dir)
                continue
            context = RuntimeContext(name=name, settings=_settings(hooks, name), state_dir=str(runtime_dir))
            try:
                containers = await hooks.container_list(context)
            except Levers9Error as exc:
                log.warning("could not list the containers runtime %r left in %s: %s", name, runtime_dir, exc)
                continue
            for container in containers:
                try:
                    await hooks.container_remove(context, container)
                    removed += 1
                except Exception as exc:
                    log.warning("could not remove leftover container %s (%s): %s", container, name, exc)
    if removed:
        log.info("removed %d containers a previous worker left in %s", removed, state_dir)
    try:
        swept = await asyncio.to_thread(host_guard.sweep_confined, state_dir)
    except host_guard.HostGuardError as exc:
        log.warning("could not remove the network rules of sandboxes a previous worker left: %s", exc)
    else:
        if swept:
            log.info("removed the network rules of %s, left by a previous worker", ", ".join(c.label for c in swept))
    if delete:
        await asyncio.to_thread(_sweep_volume_mounts, state_dir)
        left = mounts_under(state_dir)
        if left:
            log.error(
                "not deleting %s: still mounted below it (%s); nothing is deleted through a mount",
                state_dir,
                ", ".join(map(str, left)),
            )
            return removed
        shutil.rmtree(state_dir, ignore_errors=True)
    return removed


def _sweep_volume_mounts(state_dir: Path) -> None:
    """Unmount the volume mounts a killed worker left below ``state_dir`` (rclone's, then JuiceFS's)."""
    try:
        swept = [str(point) for point in rclone.sweep(state_dir)]
    except rclone.RcloneError as exc:
        log.warning("%s", exc)
        swept = []
    swept += juicefs.sweep(state_dir)
    if swept:
        log.warning("unmounted %d volume mount(s) a killed worker left: %s", len(swept), ", ".join(swept))
