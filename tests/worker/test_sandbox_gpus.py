"""A worker's GPUs, shared by its warm pool and its sandboxes, in real runc containers.

The worker has two GPUs as GPU discovery reports them (index and uuid; this machine has no NVIDIA
device nodes, so the container gets none, and its ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``
are what says which GPUs it was given). One :class:`~levers9.worker.gpu_ledger.GpuLedger` accounts for
them: a sandbox's claim stops the pool's idle GPU container, never a busy one; a call waiting for a GPU
a sandbox holds starts when the sandbox ends; a sandbox asking for more than can be had is
``sandboxes_full`` at once (the controlplane asks the next worker).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from levers9.hooks.types import GpuDevice
from tests.worker.test_pool import PYTHON, _world, call_of
from tests.worker.test_sandboxes import Served, _error, served_on
from tests.worker.test_sandboxes import until as _until

GPUS = [
    GpuDevice(index=i, uuid=f"GPU-sandbox-test-{i}", model="NVIDIA H100 80GB HBM3", memory_mib=81559) for i in (0, 1)
]


async def _env(s: Served, sid: str, name: str) -> str:
    number = await s.exec(sid, argv=["/bin/sh", "-c", f'printf %s "${name}"'])
    lines = await s.output(sid, number)
    return "".join(line.get("data", "") for line in lines if line.get("stream") == "stdout")


async def test_a_sandbox_takes_the_pools_idle_gpus_and_a_waiting_call_gets_them_when_it_ends(tmp_path: Path) -> None:
    async with _world("runc", tmp_path, gpus=GPUS) as world, served_on(world, max_sandboxes=2) as s:

        def visible() -> str:
            return os.environ["NVIDIA_VISIBLE_DEVICES"]

        kept = world.stub(visible, gpu_count=1, keep_warm_s=600)
        assert await world.value(kept) == "GPU-sandbox-test-0"
        assert world.pool.gpu_ledger.free == 1  # the idle container keeps its GPU while it is kept warm

        created = await s.create(gpu_count=2)
        assert world.pool.gpu_ledger.free == 0
        assert await _env(s, created["id"], "NVIDIA_VISIBLE_DEVICES") == "GPU-sandbox-test-0,GPU-sandbox-test-1"
        assert await _env(s, created["id"], "CUDA_VISIBLE_DEVICES") == "0,1"
        assert not any(g.containers for g in world.pool._stubs.values())  # the idle one was stopped for it
        assert world.pool.stopped_for_room_total == 1

        waiting = asyncio.ensure_future(world.value(kept))
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        assert not done  # the sandbox holds both GPUs: the call waits for one

        answer = await s.http.delete(f"/sandboxes/{created['id']}")
        assert answer.status_code == 200, answer.text
        assert await asyncio.wait_for(waiting, 60) == "GPU-sandbox-test-0"


async def test_a_busy_call_keeps_its_gpu_and_a_sandbox_asking_too_much_is_full_at_once(tmp_path: Path) -> None:
    async with _world("runc", tmp_path, gpus=GPUS) as world, served_on(world, max_sandboxes=2) as s:

        def hold() -> None:
            import time

            time.sleep(600)  # busy until the test cancels it

        stub, call = world.stub(hold, gpu_count=1), call_of()
        busy = asyncio.ensure_future(world.pool.run(stub, call))
        # running, not only holding its GPU: a call cancelled while its container starts ends at once, and the
        # container then waits idle (and warm) with the GPU, which is not what this test is about
        await _until(lambda: world.pool.stats()["busy"] == 1)
        assert world.pool.gpu_ledger.free == 1

        for count, said in ((2, "1 of this worker's 2 are free"), (4, "this worker has 2")):
            answer = await s.http.post(
                "/sandboxes", json={"workspace_id": "ws1", "python_version": PYTHON, "gpu_count": count}
            )
            status, code, message = _error(answer)
            assert (status, code) == (503, "SandboxesFull"), message
            assert said in message
        assert not busy.done()  # never stopped for a sandbox

        one = await s.create(gpu_count=1)
        assert await _env(s, one["id"], "NVIDIA_VISIBLE_DEVICES") == "GPU-sandbox-test-1"
        assert not busy.done()
        assert await world.pool.cancel(call.task_id)
        assert (await busy).status == "cancelled"
        await _until(lambda: world.pool.gpu_ledger.free == 1)  # its container removed, the call's GPU is back
        assert world.pool.gpu_ledger.devices[1] not in world.pool.gpu_ledger._free  # the sandbox keeps its own

        answer = await s.http.post(
            "/sandboxes",
            json={"workspace_id": "ws1", "python_version": PYTHON, "gpu_count": 1, "snapshots": True},
        )
        status, code, message = _error(answer)
        assert (status, code) == (400, "BadRequest")
        assert "a sandbox with GPUs takes none" in message
