"""Warm sandboxes: started before they are asked for, taken by the next create of the same shape, in real runc.

A worker whose pool keeps ``sandboxes_warm`` keeps that many sandboxes started (their runner up, nothing run in
them) of the shape last asked on it; a create of exactly that shape takes one (its variables and secrets are
set in the runner then, never in the container's own environment), and another is started behind it. A
shape that differs, or anything fixed when a container starts (network rules, ports, volumes, GPUs,
snapshots), starts its own. The world's leftover check (tests/worker/test_pool.py) runs at the end of each.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from levers9.worker.sandboxes import Sandboxes
from levers9.worker.warm.sandbox_client import SandboxError
from tests.worker.test_pool import _world
from tests.worker.test_sandboxes import Served, served_on
from tests.worker.test_sandboxes import until as _until


def _warm(sandboxes: Sandboxes) -> list[str]:
    """The container ids of the warm sandboxes waiting now."""
    return [sandbox.box.cid for sandbox in sandboxes._warm]


async def _sh(s: Served, sid: str, script: str) -> str:
    number = await s.exec(sid, argv=["/bin/sh", "-c", script])
    lines = await s.output(sid, number)
    assert lines[-1] == {"exit": 0}, lines
    return "".join(line.get("data", "") for line in lines if line.get("stream") == "stdout")


async def test_the_next_create_of_a_shape_takes_a_warm_sandbox_with_its_own_variables(tmp_path: Path) -> None:
    async with _world("runc", tmp_path) as world, served_on(world, max_sandboxes=2, warm=1) as s:
        sandboxes = s.sandboxes
        assert _warm(sandboxes) == []  # nothing is known to keep warm before a create
        first = await s.create(env={"WHO": "first"}, memory_mib=256)
        await _until(lambda: len(_warm(sandboxes)) == 1)  # started behind it, of its shape
        [waiting] = _warm(sandboxes)
        world.seen.add(waiting)

        second = await s.create(env={"WHO": "second"}, secrets={"TOKEN": "s3cret"}, memory_mib=256)
        assert second["container_id"] == waiting  # taken, not started
        assert await _sh(s, second["id"], 'printf %s "$WHO:$TOKEN"') == "second:s3cret"
        assert "s3cret" not in await _sh(s, second["id"], "cat /proc/1/environ | tr '\\0' '\\n'")
        assert await _sh(s, first["id"], 'printf %s "$WHO"') == "first"
        await _until(lambda: len(_warm(sandboxes)) == 1)  # and another behind it
        world.seen.update(_warm(sandboxes))
        assert len(sandboxes._live) == 2  # warm ones are not counted as the worker's sandboxes

        # a bad configure is refused by the runner, naming the field (the worker never sends one)
        [spare] = sandboxes._warm
        assert spare.session is not None
        with pytest.raises(SandboxError, match="configure: env must map strings to strings"):
            await spare.session._request("configure", env={"A": 1}, parse=lambda frame: None)


async def test_another_shape_or_network_rules_start_their_own_and_a_dead_warm_one_is_passed_over(
    tmp_path: Path,
) -> None:
    async with _world("runc", tmp_path) as world, served_on(world, max_sandboxes=4, warm=1) as s:
        sandboxes = s.sandboxes
        first = await s.create(memory_mib=256)
        await _until(lambda: len(_warm(sandboxes)) == 1)
        [small] = _warm(sandboxes)
        world.seen.add(small)

        bigger = await s.create(memory_mib=512)  # another shape: its own container, and the warm one changes
        assert bigger["container_id"] != small
        await _until(lambda: len(_warm(sandboxes)) == 1 and _warm(sandboxes)[0] != small)
        [larger] = _warm(sandboxes)
        world.seen.add(larger)

        confined = await s.create(memory_mib=512, block_network=True)  # its rules come before its container
        assert confined["container_id"] != larger
        assert _warm(sandboxes) == [larger]

        # the warm container dies while it waits: the next create starts its own, and a new one is warmed
        [waiting] = sandboxes._warm
        assert waiting.session is not None
        await s.sandboxes.launcher.stop(waiting.box, hung_up=False)
        await _until(lambda: waiting.session is not None and waiting.session.gone is not None)
        fresh = await s.create(memory_mib=512)
        assert fresh["container_id"] != larger
        assert await _sh(s, fresh["id"], "echo up") == "up\n"
        await _until(lambda: len(_warm(sandboxes)) == 1 and _warm(sandboxes)[0] != larger)
        world.seen.update(_warm(sandboxes))
        for made in (first, bigger, confined, fresh):
            world.seen.add(str(made["container_id"]))
