"""The container pool runs functions in real containers (the process runtime, runc and gVisor), no mocks.

Each function a test runs is defined inside the test, so cloudpickle pickles
it by value: the runner inside the container cannot import this module.
Every test ends with the pool closed and a check that nothing it started is
left: no process, overlay mount, cgroup, network namespace, veth or directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import types
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.snapshot import Checkpointing, RecordStore
from levers9.checkpoint.storage import LocalStorage
from levers9.controlplane.grpc_worker import checkpoint_ref
from levers9.engine.network import netns_name
from levers9.engine.node import NodeSettings, bridge_for
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import GpuDevice, RuntimeContext
from levers9.proto.v1 import worker_pb2
from levers9.runner import frames
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.database import open_database
from levers9.state.sql.workspaces import WorkspaceStore
from levers9.worker.calls import Call, Outcome, StubSpec
from levers9.worker.warm.launch import HANDLER_DIR
from levers9.worker.warm.pool import WarmPool
from tests.fixtures.ports import free_port

RUNTIMES = ["process", "runc", "gvisor"]
ISOLATED = ["runc", "gvisor"]
TOOLS = {"runc": "runc", "gvisor": "runsc"}
INSTALL = "apt-get install -y runc runsc"
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
RUNTIME_PROCESSES = re.compile(r"runsc|runc |shim\.sh|levers9\.worker\.runner")


@dataclass
class World:
    pool: WarmPool
    ctx: RuntimeContext
    #: every stub id starts with it, so every container id starts with ``l9-<prefix>``
    prefix: str
    #: container ids seen while the test ran (their network namespaces must be gone at the end)
    seen: set[str] = field(default_factory=set)

    def stub(self, fn: Callable[..., Any], **kw: Any) -> StubSpec:
        fields: dict[str, Any] = {
            "image": "host",
            "python_version": PYTHON,
            "cpu_millicores": 1000,
            "memory_mib": 256,
            **kw,
        }
        name = getattr(fn, "__name__", "fn")
        stub_id = f"{self.prefix}{secrets.token_hex(2)}"
        return StubSpec(stub_id=stub_id, workspace_id="ws1", name=name, handler=cloudpickle.dumps(fn), **fields)

    async def call(self, stub: StubSpec, *args: Any, timeout_s: float = 0.0, **kw: Any) -> Outcome:
        call = Call(task_id=f"task-{secrets.token_hex(6)}", args=cloudpickle.dumps((args, kw)), timeout_s=timeout_s)
        return await self.pool.run(stub, call, on_started=self.seen.add)

    async def value(self, stub: StubSpec, *args: Any, **kw: Any) -> Any:
        outcome = await self.call(stub, *args, **kw)
        assert outcome.status == "complete", outcome.error
        return cloudpickle.loads(outcome.result)


def call_of(*args: Any, timeout_s: float = 0.0, **kw: Any) -> Call:
    return Call(task_id=f"task-{secrets.token_hex(6)}", args=cloudpickle.dumps((args, kw)), timeout_s=timeout_s)


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} not found on PATH ({os.environ.get('PATH', '')}); install it with: {INSTALL}")


def leftovers(world: World, tmp_path: Path, bridge: str | None) -> list[str]:
    found: list[str] = []
    state = Path(world.ctx.state_dir)
    for sub in ("containers", "runc", "runsc"):
        if (state / sub).is_dir() and any((state / sub).iterdir()):
            found.append(f"{state / sub}: {sorted(p.name for p in (state / sub).iterdir())}")
    if (tmp_path / "pool" / "handlers").exists():
        found.append("the handler files")
    found += [f"mount {line}" for line in Path("/proc/mounts").read_text().splitlines() if str(tmp_path) in line]
    found += [f"cgroup {cg}" for cg in Path("/sys/fs/cgroup").glob(f"*/levers9/l9-{world.prefix}*")]
    found += [f"process {p}" for p in our_processes(world.prefix, tmp_path)]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    found += [f"netns {netns_name(cid)} of {cid}" for cid in world.seen if netns_name(cid) in netns]
    if bridge is not None:
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
        found += [f"veth {line.split(':')[1].strip()}" for line in links.splitlines() if f"master {bridge}" in line]
    return found


def our_processes(prefix: str, tmp_path: Path) -> list[str]:
    """Runtime processes (runc, runsc, shims, runners) that belong to this test: by arguments, environment or cgroup."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    mine = []
    for line in ps.splitlines():
        pid, _, args = line.strip().partition(" ")
        if not RUNTIME_PROCESSES.search(args):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue  # gone since ps listed it
        if f"l9-{prefix}" in args + cgroup or str(tmp_path) in args + environ:
            mine.append(line.strip())
    return mine


@pytest.fixture(params=RUNTIMES)
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with _world(request.param, tmp_path) as w:
        yield w


@pytest.fixture(params=ISOLATED)
async def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with _world(request.param, tmp_path) as w:
        yield w


@pytest.fixture
async def on_process(tmp_path: Path) -> AsyncIterator[World]:
    async with _world("process", tmp_path) as w:
        yield w


@contextlib.asynccontextmanager
async def _world(name: str, tmp_path: Path, **pool_kw: Any) -> AsyncIterator[World]:
    if name in TOOLS:
        require(TOOLS[name])
    hooks = Hooks(load_plugins(PluginPolicy()))
    bridge: str | None = None
    settings: NodeSettings | None = None
    if name != "process":
        bridge = f"l9p{secrets.token_hex(5)}"
        subnet = f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24"
        model = hooks.runtime_settings_model(name)
        assert model is not None
        # the unpacked host image is shared by this session's tests
        made = model(bridge=bridge, subnet=subnet, image_cache=str(tmp_path.parent / "image-cache"))
        assert isinstance(made, NodeSettings)
        settings = made
    ctx = RuntimeContext(name=name, settings=settings, state_dir=str(tmp_path / name))
    capabilities = await hooks.runtime_capabilities(ctx)
    pool = WarmPool(hooks, ctx, capabilities, state_dir=tmp_path / "pool", **pool_kw)
    w = World(pool=pool, ctx=ctx, prefix=secrets.token_hex(4))
    watcher = asyncio.create_task(_watch(Path(ctx.state_dir) / "containers", w.seen))
    try:
        yield w
    finally:
        await pool.close()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        left = leftovers(w, tmp_path, bridge)
        if settings is not None:
            bridge_for(settings).destroy()
        hooks.close()
    assert not left, f"left behind after close(): {left}"


async def _watch(containers: Path, seen: set[str]) -> None:
    """Note every container the runtime records, including those no call ever reached."""
    while True:
        with contextlib.suppress(OSError):
            seen.update(p.name for p in containers.iterdir())
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------- results and errors


async def test_a_result_comes_back(world: World) -> None:
    def add(a: int, b: int, *, scale: int = 1) -> dict[str, int]:
        return {"sum": (a + b) * scale}

    started: list[str] = []
    outcome = await world.pool.run(world.stub(add), call_of(2, 3, scale=10), on_started=started.append)
    assert outcome.status == "complete", outcome.error
    assert cloudpickle.loads(outcome.result) == {"sum": 50}
    assert outcome.error is None
    assert len(started) == 1
    assert started[0].startswith(f"l9-{world.prefix}")


async def test_an_exception_comes_back_with_its_traceback(world: World) -> None:
    def divide_things(a: int, b: int) -> float:
        return a / b

    outcome = await world.call(world.stub(divide_things), 1, 0)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ZeroDivisionError"
    assert outcome.error.message == "division by zero"
    assert "in divide_things" in outcome.error.traceback
    assert outcome.error.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "levers9/runner/main.py" not in outcome.error.traceback  # only the user's frames
    assert isinstance(cloudpickle.loads(outcome.result), ZeroDivisionError)  # the caller may unpickle; never the worker


async def test_an_exception_that_cannot_be_pickled_still_reports(on_process: World) -> None:
    def fail() -> None:
        import threading

        class Locked(Exception):
            def __init__(self) -> None:
                super().__init__("holds a lock")
                self.lock = threading.Lock()

        raise Locked

    outcome = await on_process.call(on_process.stub(fail))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("Locked", "holds a lock")
    assert outcome.result == b""


async def test_a_result_that_cannot_be_pickled_is_an_error(on_process: World) -> None:
    def make_lock() -> Any:
        import threading

        return threading.Lock()

    outcome = await on_process.call(on_process.stub(make_lock))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "return value (lock) could not be pickled" in outcome.error.message


async def test_an_async_function_runs_on_one_loop_for_the_container(world: World) -> None:
    async def loop_id(delay: float) -> int:
        await asyncio.sleep(delay)
        return id(asyncio.get_running_loop())

    stub = world.stub(loop_id)
    first = await world.value(stub, 0.01)
    second = await world.value(stub, 0.01)
    assert first == second
    assert world.pool.started_total == 1


async def test_secret_env_and_env_are_visible_inside(world: World) -> None:
    def read_env() -> tuple[str, str, str]:
        return os.environ["API_KEY"], os.environ["REGION"], os.environ["LEVERS9_RUNNER_TOKEN"]

    stub = world.stub(read_env, env={"REGION": "eu-1"}, secret_env={"API_KEY": "s3cr3t-value"})
    key, region, token = await world.value(stub)
    assert (key, region) == ("s3cr3t-value", "eu-1")
    assert len(token) >= 32
    assert "s3cr3t" not in repr(stub)


async def test_a_python_version_mismatch_is_a_clear_error(world: World) -> None:
    def nothing() -> None:
        return None

    outcome = await world.call(world.stub(nothing, python_version="3.7"))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "PythonVersionMismatch"
    assert f"the function was pickled with Python 3.7, this image runs {PYTHON}" in outcome.error.message


# --------------------------------------------------------------------------- sharing containers


async def test_200_calls_share_a_few_containers_and_come_back_in_order(world: World) -> None:
    def square(x: int) -> int:
        return x * x

    stub = world.stub(square)
    outcomes = await asyncio.gather(*(world.call(stub, i) for i in range(200)))
    assert [cloudpickle.loads(o.result) for o in outcomes] == [i * i for i in range(200)]
    assert world.pool.started_total <= 10, f"{world.pool.started_total} containers for 200 tiny calls"
    stats = world.pool.stats()
    assert stats["busy"] == stats["queued"] == 0
    assert stats["idle"] + stats["starting"] == world.pool.started_total  # a late start idles when up


async def test_a_container_keeps_the_functions_state_between_calls(on_process: World) -> None:
    counter = {"n": 0}

    def count() -> int:
        counter["n"] += 1
        return counter["n"]

    stub = on_process.stub(count)
    assert [await on_process.value(stub) for _ in range(3)] == [1, 2, 3]


async def test_each_stub_gets_its_own_containers(on_process: World) -> None:
    def pid() -> int:
        return os.getpid()

    a, b = on_process.stub(pid), on_process.stub(pid)
    assert await on_process.value(a) != await on_process.value(b)
    assert await on_process.value(a) == await on_process.value(a)


# --------------------------------------------------------------------------- output


async def test_print_output_arrives_through_on_log_while_the_call_runs(world: World) -> None:
    def chatty() -> str:
        import time

        print("first line")
        print("to stderr", file=sys.stderr)
        time.sleep(1.0)
        print("no newline at the end", end="")
        return "done"

    received: list[tuple[str, bytes, float]] = []
    call = call_of()
    outcome = await world.pool.run(
        world.stub(chatty), call, on_log=lambda task, data: received.append((task, data, time.monotonic()))
    )
    finished = time.monotonic()
    assert outcome.status == "complete", outcome.error
    assert {task for task, _, _ in received} == {call.task_id}
    text = b"".join(data for _, data, _ in received).decode()
    assert text == "first line\nto stderr\nno newline at the end"
    assert finished - received[0][2] > 0.5, "the first line came only with the result"


async def test_a_subprocess_handed_sys_stdout_writes_to_the_container_log(on_process: World) -> None:
    def shell_out() -> int:
        import subprocess

        return subprocess.run(["echo", "from a subprocess"], stdout=sys.stdout, check=True).returncode

    received: list[bytes] = []
    outcome = await on_process.pool.run(on_process.stub(shell_out), call_of(), on_log=lambda t, d: received.append(d))
    assert outcome.status == "complete", outcome.error
    assert cloudpickle.loads(outcome.result) == 0
    assert b"from a subprocess" not in b"".join(received)  # not captured: it wrote to the container's own output


async def test_a_handler_that_cannot_be_loaded_fails_every_call(on_process: World) -> None:
    stub = dataclasses.replace(on_process.stub(lambda: None), handler=b"not a pickle")
    for _ in range(2):
        outcome = await on_process.call(stub)
        assert outcome.status == "error"
        assert outcome.error is not None
        assert outcome.error.message.startswith("loading the function failed: ")
    assert on_process.pool.started_total == 1  # the container stays: the error is the function's, not its


# --------------------------------------------------------------------------- stopping calls


async def test_a_call_over_its_timeout_is_killed(world: World) -> None:
    def sleepy() -> None:
        import time

        time.sleep(600)

    stub = world.stub(sleepy)
    begun = time.monotonic()
    outcome = await world.call(stub, timeout_s=1.5)
    assert outcome.status == "timeout"
    assert outcome.error is not None
    assert outcome.error.type == "TimeoutError"
    assert "timeout of 1.5 s" in outcome.error.message
    assert time.monotonic() - begun < 30
    assert world.pool.stats()["idle"] == 0  # the container went with its call


async def test_cancel_kills_the_container_running_the_call(world: World) -> None:
    def forever() -> None:
        import time

        while True:
            time.sleep(0.1)

    started = asyncio.Event()
    call = call_of()
    running = asyncio.create_task(world.pool.run(world.stub(forever), call, on_started=lambda cid: started.set()))
    await asyncio.wait_for(started.wait(), 60)
    assert await world.pool.cancel(call.task_id)
    outcome = await running
    assert outcome.status == "cancelled"
    assert await world.pool.cancel(call.task_id) is False  # it is over
    assert await world.pool.cancel("no-such-task") is False


async def test_a_queued_call_is_cancelled_without_a_container(on_process: World) -> None:
    def slow() -> str:
        import time

        time.sleep(0.5)
        return "ran"

    stub = on_process.stub(slow)
    first = asyncio.create_task(on_process.call(stub))
    await asyncio.sleep(0)  # queued, its container starting
    call = call_of()
    second = asyncio.create_task(on_process.pool.run(stub, call))
    await asyncio.sleep(0)
    assert await on_process.pool.cancel(call.task_id)
    assert (await second).status == "cancelled"
    assert (await first).status == "complete"


async def test_a_caller_that_stops_waiting_cancels_its_call(on_process: World) -> None:
    def forever() -> None:
        import time

        time.sleep(600)

    started = asyncio.Event()
    run = asyncio.create_task(
        on_process.pool.run(on_process.stub(forever), call_of(), on_started=lambda cid: started.set())
    )
    await asyncio.wait_for(started.wait(), 60)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    deadline = time.monotonic() + 30
    while on_process.pool.stats()["busy"] or on_process.pool.stats()["stopping"]:
        assert time.monotonic() < deadline, on_process.pool.stats()
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- containers that die


async def test_a_container_that_dies_mid_call_is_reported_and_replaced(world: World) -> None:
    def crash(code: int) -> None:
        print("about to crash", flush=True)
        sys.stdout = sys.__stdout__  # so this goes to the container's own log
        print("last words", flush=True)
        os._exit(code)

    stub = world.stub(crash)
    outcome = await world.call(stub, 3)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ContainerExited"
    assert "exited with code 3" in outcome.error.message
    assert "last words" in outcome.error.message
    # the stub still works: a new container replaces the dead one
    outcome = await world.call(world.stub(lambda: "fine"))
    assert cloudpickle.loads(outcome.result) == "fine"


async def test_running_out_of_memory_is_reported(isolated: World) -> None:
    def hog() -> int:
        blocks = [bytearray(16 * 1024 * 1024) for _ in range(40)]
        return len(blocks)

    outcome = await isolated.call(isolated.stub(hog, memory_mib=128))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "OutOfMemory", outcome.error
    assert "128 MiB" in outcome.error.message


async def test_a_container_that_cannot_start_fails_the_call_with_its_output(world: World) -> None:
    def nothing() -> None:
        return None

    # the interpreter dies before the runner: it cannot find its standard library
    outcome = await world.call(world.stub(nothing, env={"PYTHONHOME": "/nonexistent"}))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ContainerStartFailed"
    assert "before its runner answered" in outcome.error.message
    assert "Fatal Python error" in outcome.error.message


async def test_an_image_the_runtime_refuses_fails_the_call(on_process: World) -> None:
    outcome = await on_process.call(on_process.stub(lambda: None, image="/images/python.tar"))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.type == "ContainerStartFailed"
    assert "image '/images/python.tar'" in outcome.error.message


# --------------------------------------------------------------------------- idle containers and GPUs


async def test_reap_idle_stops_containers_idle_past_keep_warm(world: World) -> None:
    stub = world.stub(lambda: 1, keep_warm_s=0.5)
    assert await world.value(stub) == 1
    assert await world.pool.reap_idle() == 0
    await asyncio.sleep(0.6)
    assert await world.pool.reap_idle() == 1
    assert world.pool.stats()["idle"] == 0
    assert not any((Path(world.ctx.state_dir) / "containers").iterdir())
    assert await world.value(stub) == 1  # a new container on demand


async def test_gpus_are_never_shared(tmp_path: Path) -> None:
    gpus = [GpuDevice(index=i, uuid=f"GPU-test-{i}", model="test", memory_mib=1024) for i in range(2)]
    async with _world("process", tmp_path, gpus=gpus) as w:

        async def hold(seconds: float) -> tuple[str, float, float]:
            begun = time.time()
            await asyncio.sleep(seconds)
            return os.environ["CUDA_VISIBLE_DEVICES"], begun, time.time()

        # three functions, two GPUs, long keep-warm: the third waits for the first container to go idle,
        # which is then stopped to give it its GPU (not kept for its minute of keep-warm)
        stubs = [w.stub(hold, gpu_count=1, keep_warm_s=60) for _ in range(3)]
        held = await asyncio.gather(*(w.value(stub, 1.0) for stub in stubs))
        assert w.pool.stopped_for_room_total >= 1  # at least one idle holder was stopped for it
        assert {gpu for gpu, _, _ in held} == {"GPU-test-0", "GPU-test-1"}
        for gpu in ("GPU-test-0", "GPU-test-1"):
            spans = sorted((start, end) for g, start, end in held if g == gpu)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), f"{gpu} held twice: {spans}"
        # a function wanting both GPUs gets them once both idle holders are stopped
        assert (await w.value(w.stub(hold, gpu_count=2), 0))[0] == "GPU-test-0,GPU-test-1"
        too_many = await w.call(w.stub(hold, gpu_count=3), 0)
        assert too_many.error is not None
        assert too_many.error.type == "InsufficientGpus"
        assert (await w.value(w.stub(hold), 0))[0] == ""  # a function without GPUs sees none of them


async def test_a_runtime_with_the_process_runtimes_capabilities_is_treated_alike_whatever_its_name(
    tmp_path: Path,
) -> None:
    """No name check: a runtime called anything that reports host filesystem and network gets host paths."""
    from levers9_process import plugin as process

    plugins = load_plugins(PluginPolicy())
    hooks_of_process = [name for name in dir(process) if name.startswith("levers9_container_")]
    plain = types.SimpleNamespace(
        levers9_runtime_capabilities=process.levers9_runtime_capabilities,
        **{name: getattr(process, name) for name in hooks_of_process},
    )
    record = plugins.add("plain-processes", plain)
    assert record.status == "loaded", record.error
    hooks = Hooks(plugins)
    ctx = RuntimeContext(name="plain-processes", settings=None, state_dir=str(tmp_path / "plain"))
    capabilities = await hooks.runtime_capabilities(ctx)
    pool = WarmPool(hooks, ctx, capabilities, state_dir=tmp_path / "pool")
    try:
        w = World(pool=pool, ctx=ctx, prefix=secrets.token_hex(4))

        def where() -> tuple[str | None, str]:
            return os.environ.get("LEVERS9_RUNNER_HOST"), os.environ["LEVERS9_HANDLER_FILE"]

        host, handler = await w.value(w.stub(where))
        assert host == "127.0.0.1"
        # a host path, not the image's mount point: the worker's own file, or the copy a root worker's runtime
        # gives the call's user (nobody) in its private home (levers9.engine.process)
        assert not handler.startswith(HANDLER_DIR)
        assert handler.startswith(str(tmp_path / "pool" / "handlers")) or Path(handler).parent.name.startswith(
            "levers9-"
        ), handler
    finally:
        await pool.close()
        hooks.close()


# --------------------------------------------------------------------------- closing


async def test_close_stops_busy_idle_and_starting_containers(world: World) -> None:
    def sleepy() -> None:
        import time

        time.sleep(600)

    stub = world.stub(sleepy)
    await world.value(world.stub(lambda: 0))  # one idle container
    started = asyncio.Event()
    busy = asyncio.create_task(world.pool.run(stub, call_of(), on_started=lambda cid: started.set()))
    await asyncio.wait_for(started.wait(), 60)
    starting = asyncio.create_task(world.call(world.stub(sleepy)))
    await asyncio.sleep(0.01)
    await world.pool.close()
    assert (await busy).status == "cancelled"
    assert (await starting).status == "cancelled"
    assert world.pool.stats() == {"starting": 0, "idle": 0, "busy": 0, "stopping": 0, "queued": 0}
    with pytest.raises(RuntimeError, match="closed"):
        await world.call(stub)
    # the fixture checks that nothing is left behind


# --------------------------------------------------------------------------- the runner itself


async def test_the_runner_drops_connections_without_the_token(tmp_path: Path) -> None:
    handler = tmp_path / "handler.pkl"
    handler.write_bytes(cloudpickle.dumps(lambda: "hi"))
    port = free_port()
    env = {
        **os.environ,
        "LEVERS9_RUNNER_PORT": str(port),
        "LEVERS9_RUNNER_TOKEN": "right-token",
        "LEVERS9_HANDLER_FILE": str(handler),
        "LEVERS9_PYTHON_VERSION": PYTHON,
        "LEVERS9_RUNNER_HOST": "127.0.0.1",
    }
    proc = subprocess.Popen([sys.executable, "-m", "levers9.runner"], env=env)
    try:
        reader, writer = await _connect(port)
        await frames.write_frame(writer, "hello", token="wrong-token")
        with pytest.raises(asyncio.IncompleteReadError):
            await frames.read_frame(reader)
        writer.close()
        reader, writer = await _connect(port)  # still listening for the real worker
        await frames.write_frame(writer, "hello", token="right-token")
        ready = await frames.read_frame(reader)
        assert (ready.kind, ready.text("python")) == ("ready", PYTHON)
        await frames.write_frame(writer, "call", cloudpickle.dumps(((), {})), task_id="t1")
        result = await frames.read_frame(reader)
        assert (result.kind, result.text("status"), cloudpickle.loads(result.payload)) == ("result", "complete", "hi")
        writer.close()
        assert await asyncio.to_thread(proc.wait, 10) == 0  # the worker hung up: the runner ends
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    deadline = time.monotonic() + 30
    while True:
        try:
            return await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_frames_over_the_limit_are_refused() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(frames.encode("result", b"x" * 100, task_id="t"))
    with pytest.raises(frames.ProtocolError, match="over the limit"):
        await frames.read_frame(reader, max_payload=10)
    reader = asyncio.StreamReader()
    reader.feed_data(frames.encode("log", b"ok", task_id="t"))
    frame = await frames.read_frame(reader)
    assert (frame.kind, frame.text("task_id"), frame.payload) == ("log", "t", b"ok")
    with pytest.raises(frames.ProtocolError, match="expected a string"):
        frame.text("missing")


async def test_the_runner_can_wait_for_go_and_serve_on_a_unix_socket(tmp_path: Path) -> None:
    """A container to be checkpointed: loaded, it says ready, waits for go, then serves the token go gives."""
    from levers9.runner import main as runner
    from levers9.sdk import lifecycle

    assert lifecycle.READY_ENV == runner.ENV_READY  # levers9.ready() signals what the runner and worker wait for
    handler = tmp_path / "handler.pkl"
    handler.write_bytes(cloudpickle.dumps(lambda: "hi"))
    signals = tmp_path / "run"
    signals.mkdir()
    env = {
        **os.environ,
        "LEVERS9_RUNNER_SOCKET": str(signals / "runner.sock"),
        "LEVERS9_RUNNER_TOKEN": "old-token",
        "LEVERS9_HANDLER_FILE": str(handler),
        "LEVERS9_PYTHON_VERSION": PYTHON,
        "LEVERS9_READY_FILE": str(signals / "ready"),
        "LEVERS9_GO_FILE": str(signals / "go"),
    }
    proc = subprocess.Popen([sys.executable, "-m", "levers9.runner"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (signals / "ready").exists():
            assert time.monotonic() < deadline, "the runner never said it was ready"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert not (signals / "runner.sock").exists()  # nothing open while it may be checkpointed
        (signals / "go").write_text("new-token")
        while not (signals / "runner.sock").exists():
            assert time.monotonic() < deadline, "the runner never listened after go"
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_unix_connection(str(signals / "runner.sock"))
        await frames.write_frame(writer, "hello", token="old-token")  # the token of the environment no longer
        with pytest.raises(asyncio.IncompleteReadError):
            await frames.read_frame(reader)
        writer.close()
        reader, writer = await asyncio.open_unix_connection(str(signals / "runner.sock"))
        await frames.write_frame(writer, "hello", token="new-token")
        assert (await frames.read_frame(reader)).kind == "ready"
        await frames.write_frame(writer, "call", cloudpickle.dumps(((), {})), task_id="t1")
        result = await frames.read_frame(reader)
        assert cloudpickle.loads(result.payload) == "hi"
        writer.close()
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


@contextlib.asynccontextmanager
async def _checkpointing(tmp_path: Path) -> AsyncIterator[tuple[Checkpointing, CheckpointStore, str]]:
    """Checkpointing as a worker has it, its records kept in a real database (as the controlplane keeps them)."""
    db = await open_database(f"sqlite:///{tmp_path / 'levers9.db'}")
    store = CheckpointStore(db)
    workspace = await WorkspaceStore(db).create("ws")

    async def record(request: worker_pb2.RecordCheckpointRequest) -> worker_pb2.CheckpointRef:
        if request.checkpoint_id:
            made = await store.set_status(
                request.checkpoint_id,
                request.status,
                path=request.path or None,
                size_bytes=request.size_bytes or None,
                error=request.error or None,
            )
        else:
            made = await store.create(workspace.id, request.runtime, stub_id=None, gpu=request.gpu or None)
        return checkpoint_ref(made)

    checkpointing = Checkpointing(
        store=RecordStore(record),
        storage=LocalStorage(tmp_path / "storage"),
        cache=NodeCache(tmp_path / "cache", 1 << 30),
    )
    try:
        yield checkpointing, store, workspace.id
    finally:
        await db.close()


async def test_a_runtime_that_cannot_checkpoint_runs_checkpointed_stubs_cold(tmp_path: Path) -> None:
    """runc checkpoints through CRIU, which does not work on this kernel: the call still runs, cold."""
    async with (
        _checkpointing(tmp_path) as (checkpointing, store, workspace),
        _world("runc", tmp_path, checkpointing=checkpointing) as w,
    ):
        stub = w.stub(lambda: os.getpid(), checkpoint_enabled=True)
        assert isinstance(await w.value(stub), int)
        assert checkpointing.taken == set()
        assert await store.list(workspace) == []


async def test_a_corrupted_checkpoint_starts_the_container_cold_and_is_marked(tmp_path: Path) -> None:
    async with (
        _checkpointing(tmp_path) as (checkpointing, store, workspace),
        _world("gvisor", tmp_path, checkpointing=checkpointing) as w,
    ):
        stub = w.stub(lambda: "served", checkpoint_enabled=True)
        # a stored image that is not a checkpoint at all
        made = await store.create(workspace, "gvisor")
        junk = tmp_path / "junk"
        junk.mkdir()
        (junk / "checkpoint.img").write_bytes(b"not a checkpoint")
        size = checkpointing.storage.put_dir(f"ws/{made.id}", junk)
        record = await store.set_status(made.id, "available", path=f"ws/{made.id}", size_bytes=size)
        checkpointing.latest[stub.stub_id] = record
        checkpointing.taken.add(stub.stub_id)  # no new checkpoint: this test is about the restore
        assert await w.value(stub) == "served"
        after = await store.get(made.id)
        assert after is not None
        assert after.status == "restore_failed"
        assert after.error
        assert stub.stub_id not in checkpointing.latest
