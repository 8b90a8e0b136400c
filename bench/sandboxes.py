"""Sandboxes (issue 39): create to a first exec's result, an exec's round trip, and restore against cold start.

Each measurement is taken twice: through the worker's :class:`~levers9.worker.sandboxes.Sandboxes` in this
process (what the sandbox machinery costs: the warm pool's Launcher, the runner, its session), and through the
controlplane's REST API on a real ``levers9 up`` whose one local pool runs sandboxes (what a user sees: HTTP to
the controlplane, its relay through the worker's tunnel to the worker's sandbox server, and back).

1. Create to the first exec's result: a sandbox created, ``echo hi`` exec'd, until its output (checked: ``hi``)
   and its exit (0) are in. Against it, bare: the same bundle levers9's prepare makes for a sandbox (the
   ``host`` image, the same mounts, network namespace on the bridge, cgroup limits and runtime flags), but
   running ``sleep infinity`` instead of the runner: ``runsc run --detach`` (create and start) and then
   ``runsc exec`` of ``echo hi``, until its output is back; preparing that bundle (overlay mount, network
   namespace, config) is timed apart, and is inside levers9's figure. gVisor (the issue's target), and runc.
2. An exec's round trip on a warm sandbox: ``true`` exec'd and its output and exit read, one after another.
3. Restore against cold start, gVisor: a Python process that takes 5 s to load, then holds a random token and a
   count of the questions it was asked and answers each on an abstract unix socket. Cold = create (for
   snapshots) + start the process + its "ready" + one question answered (asked by a process exec'd in the
   sandbox). Restored = create from the snapshot + one question answered: the token must be the one before the
   snapshot and the count must go on from it (2: it was asked once before), or the run fails.

A run of each kind is made first and not counted (image unpacking, the runner's tree, imports). At the worker
level the parts of each path are timed (bench-only wrappers around the hooks and the runner client), so a
missed target can say what costs the time. Everything started is removed at the end, also on Ctrl-C.

Run: ``.venv/bin/python bench/sandboxes.py`` (as root; runc and runsc installed; ``--help`` for options).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import ipaddress
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from levers9.checkpoint.storage import LocalStorage
from levers9.engine.node import NodeSettings, bridge_for
from levers9.engine.oci import OciEngine
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import RuntimeContext
from levers9.worker.calls import SANDBOX_KIND, StubSpec
from levers9.worker.sandboxes import Sandbox, Sandboxes, SandboxSpec
from levers9.worker.warm.launch import container_id
from levers9.worker.warm.pool import WarmPool
from levers9.worker.warm.scaling import WarmContainer, WarmStub

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's tests package, for its fixtures
from tests.fixtures.levers9_up import Up, _processes_mentioning, _reap

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
WORKSPACE = "bench"
#: the process of the restore comparison: loads for 5 s, then holds its state and answers questions
APP = """
import secrets, socket, time
time.sleep(5)
token = secrets.token_hex(8)
asked = 0
server = socket.socket(socket.AF_UNIX)
server.bind("\\0l9-bench-app")
server.listen()
print("ready", token, flush=True)
while True:
    conn, _ = server.accept()
    asked += 1
    conn.sendall(f"{token} {asked}\\n".encode())
    conn.close()
"""
#: a question to it, from another process in the sandbox
ASK = """
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("\\0l9-bench-app")
print(s.makefile().readline().strip())
"""

#: the floor under an exec's round trip, measured inside the sandbox: a child started as the runner starts one
#: (pipes for stdout and stderr, a session of its own) and read to its end, without the runner or the worker
SPAWN = """
import statistics, subprocess, time
times = []
for _ in range(70):
    t0 = time.perf_counter()
    child = subprocess.Popen(
        ["true"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, close_fds=True,
    )
    child.communicate()
    times.append(time.perf_counter() - t0)
times = sorted(times[20:])
print(statistics.median(times), times[int(0.9 * (len(times) - 1))])
import os, sys
env = {**os.environ, "PYTHONPATH": "/opt/levers9/python"}  # where the runner's tree is mounted
for code in ("pass", "import levers9.runner.main, levers9.runner.sandbox"):
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        times.append(time.perf_counter() - t0)
    print(statistics.median(times))
"""

T = TypeVar("T")
#: the requests of an exec over REST
REST_STEPS = ["POST /sandboxes/ID/processes (started)", "GET .../processes/N/output (output and exit)"]
#: how a part inside another one is named
NESTED = "of which: "


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms"


def ms(value: float) -> str:
    return f"{value * 1000:.1f}"


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


# --------------------------------------------------------------------------- timing the parts


@dataclass
class Parts:
    """Durations of the named parts of a path, per run (bench-only wrappers record them while ``on``)."""

    on: bool = False
    runs: list[dict[str, float]] = field(default_factory=list)

    def begin(self) -> None:
        self.runs.append(defaultdict(float))
        self.on = True

    def end(self, total: float) -> None:
        self.on = False
        self.runs[-1]["total"] = total

    def add(self, name: str, seconds: float) -> None:
        if self.on:
            self.runs[-1][name] += seconds
            self.runs[-1][f"{name} #"] += 1

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Time ``owner.attribute`` (a coroutine function or a plain one) as part ``name``."""
        inner = getattr(owner, attribute)
        if asyncio.iscoroutinefunction(inner):

            @functools.wraps(inner)
            async def timed_async(*args: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await inner(*args, **kw)
                finally:
                    self.add(name, time.perf_counter() - t0)

            setattr(owner, attribute, timed_async)
        else:

            @functools.wraps(inner)
            def timed(*args: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return inner(*args, **kw)
                finally:
                    self.add(name, time.perf_counter() - t0)

            setattr(owner, attribute, timed)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def table(self, title: str, order: list[str]) -> list[str]:
        """Medians of each part over the runs, with what the named parts leave of the total (a part named
        ``of which: ...`` is inside the one above it, and not added again)."""
        lines = [f"| {title} | median | share | times done (median) |", "|--|--:|--:|--:|"]
        total = statistics.median(r["total"] for r in self.runs)
        for name in order:
            value = statistics.median(r.get(name, 0.0) for r in self.runs)
            count = statistics.median(r.get(f"{name} #", 0.0) for r in self.runs)
            shown = f"&nbsp;&nbsp;{name}" if name.startswith(NESTED) else name
            lines.append(f"| {shown} | {value * 1000:.0f} ms | {value / total:.0%} | {count:g} |")
        top = [n for n in order if not n.startswith(NESTED)]
        rest = statistics.median(r["total"] - sum(r.get(n, 0.0) for n in top) for r in self.runs)
        lines.append(f"| the rest (between the parts) | {rest * 1000:.0f} ms | {rest / total:.0%} | |")
        lines.append(f"| **total** | **{total * 1000:.0f} ms** | | |")
        return lines


# --------------------------------------------------------------------------- the worker's sandboxes


@dataclass
class Worker:
    """One worker's sandboxes on a runtime, as the worker builds them (its warm pool's launcher and client)."""

    name: str
    hooks: Hooks
    ctx: RuntimeContext
    pool: WarmPool
    sandboxes: Sandboxes
    parts: Parts
    bare_ids: list[str] = field(default_factory=list)
    #: median and p90 of a child's spawn to its end inside the sandbox (:data:`SPAWN`), seconds
    #: and the median start of the runner's Python, bare (``-c pass``) and with the runner's imports
    floor: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def engine_argv(self, cid: str) -> tuple[str, ...]:
        """The runtime binary with the global flags levers9 gives it for ``cid`` (root, platform, network)."""
        if self.name == "gvisor":
            from levers9_gvisor import engine
        else:
            from levers9.engine.runc import engine
        return engine(self.ctx)._argv(cid)

    async def create(self, **fields: Any) -> Sandbox:
        return await self.sandboxes.create(SandboxSpec(workspace_id=WORKSPACE, python_version=PYTHON, **fields))


def free_subnet() -> str:
    """A /24 of 10.199.0.0/16 that no route of this machine overlaps."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    taken = [ipaddress.ip_network(w, strict=False) for w in routes.split() if "/" in w and w[0].isdigit()]
    for _ in range(100):
        net = ipaddress.ip_network(f"10.199.{secrets.randbelow(250)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise RuntimeError("no free /24 in 10.199.0.0/16")


@contextlib.asynccontextmanager
async def worker(name: str, root: Path, storage: LocalStorage) -> Any:
    hooks = Hooks(load_plugins(PluginPolicy()))
    model = hooks.runtime_settings_model(name)
    assert model is not None
    settings = model(bridge=f"l9sb{secrets.token_hex(3)}", subnet=free_subnet(), image_cache=str(root / "images"))
    assert isinstance(settings, NodeSettings)
    ctx = RuntimeContext(name=name, settings=settings, state_dir=str(root / name))
    capabilities = await hooks.runtime_capabilities(ctx)
    pool = WarmPool(hooks, ctx, capabilities, state_dir=root / f"pool-{name}")
    sandboxes = Sandboxes(pool.launcher, pool.client, pool._ports, state_dir=pool.state_dir, storage=storage)
    parts = Parts()
    for attribute, part in (
        ("container_prepare", "prepare (overlay, network namespace, config)"),
        ("container_start", "start (shim and the runtime's create + start)"),
        ("restore", "restore (the runtime's restore)"),
    ):
        parts.wrap(hooks, attribute, part)
    parts.wrap(pool.client, "connect", "runner up and connected")
    parts.wrap(storage, "get_dir", "fetch the snapshot from storage")
    # inside the engine (it runs in the hooks' thread): the port forwarder, and the runtime's word after a restore
    engine_methods = {name: OciEngine.__dict__[name] for name in ("_forward", "_runtime_status", "_apply_changes")}
    parts.wrap(OciEngine, "_apply_changes", f"{NESTED}the snapshot's file changes unpacked into the overlay")
    parts.wrap(OciEngine, "_forward", f"{NESTED}the runner's port forwarder started (a host Python process)")
    parts.wrap(OciEngine, "_runtime_status", f"{NESTED}`runsc state` asked until it says running")
    w = Worker(name, hooks, ctx, pool, sandboxes, parts)
    try:
        yield w
    finally:
        for method, original in engine_methods.items():
            setattr(OciEngine, method, original)
        await sandboxes.close()
        for bare in w.bare_ids:
            subprocess.run([*w.engine_argv(bare), "delete", "--force", bare], capture_output=True, check=False)
        for cdir in (Path(ctx.state_dir) / "containers").glob("*"):
            with contextlib.suppress(Exception):
                await hooks.container_remove(ctx, cdir.name)
        await pool.close()
        bridge_for(settings).destroy()
        hooks.close()


async def echo_hi(sandbox: Sandbox) -> None:
    assert sandbox.session is not None
    process = await sandbox.session.exec("echo", "hi")
    out, err = await process.read_all()
    code = await process.wait()
    if (out, err, code) != (b"hi\n", b"", 0):
        raise AssertionError(f"echo hi gave {out!r}, {err!r}, exit {code}")


async def bare_once(w: Worker, root: Path) -> tuple[float, float, float]:
    """Prepare the sandbox's bundle with ``sleep infinity``, then run it bare and exec ``echo hi``:
    (prepare, run --detach, exec) in seconds."""
    stub = StubSpec(
        stub_id=f"bare{secrets.token_hex(4)}",
        workspace_id=WORKSPACE,
        name="bare",
        image="host",
        handler=b"",
        python_version=PYTHON,
        cpu_millicores=SandboxSpec.cpu_millicores,  # a sandbox's defaults, as levers9's side gets them
        memory_mib=SandboxSpec.memory_mib,
        kind=SANDBOX_KIND,
    )
    handler_dir = root / "bare-handlers" / stub.stub_id
    handler_dir.mkdir(parents=True)
    box = WarmContainer(cid=container_id(stub), port=0, token="-", gpus=[])
    launcher = w.pool.launcher
    spec = launcher.spec(WarmStub(key=stub.stub_id, spec=stub, handler_dir=handler_dir), box)
    # runc exec cannot join this bundle's network namespace from the container's user namespace (setns: EPERM),
    # so on runc the bare container runs echo hi itself, in the foreground
    foreground = w.name == "runc"
    command = ["echo", "hi"] if foreground else ["sleep", "infinity"]
    spec = spec.model_copy(update={"command": command, "ports": []})
    bare = f"{box.cid}-bare"
    try:
        t0 = time.perf_counter()
        prepared = await w.hooks.container_prepare(w.ctx, spec)
        prepare_s = time.perf_counter() - t0
        assert prepared.bundle_dir is not None
        argv = w.engine_argv(box.cid)
        w.bare_ids.append(bare)
        t0 = time.perf_counter()
        if foreground:
            done = subprocess.run(
                [*argv, "run", "--bundle", prepared.bundle_dir, bare], capture_output=True, check=False
            )
            t1 = time.perf_counter()
            if (done.returncode, done.stdout) != (0, b"hi\n"):
                raise AssertionError(f"bare run of echo hi gave {done.stdout!r}, {done.stderr!r}")
            return prepare_s, t1 - t0, 0.0
        subprocess.run(
            [*argv, "run", "--detach", "--bundle", prepared.bundle_dir, bare],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        t1 = time.perf_counter()
        done = subprocess.run([*argv, "exec", bare, "echo", "hi"], capture_output=True, check=False)
        t2 = time.perf_counter()
        if (done.returncode, done.stdout) != (0, b"hi\n"):
            raise AssertionError(f"bare exec of echo hi gave {done.stdout!r}, {done.stderr!r}")
        return prepare_s, t1 - t0, t2 - t1
    finally:
        subprocess.run([*w.engine_argv(box.cid), "delete", "--force", bare], capture_output=True, check=False)
        with contextlib.suppress(ValueError):
            w.bare_ids.remove(bare)
        await w.hooks.container_remove(w.ctx, box.cid)
        shutil.rmtree(handler_dir, ignore_errors=True)


def record_first_exec(
    times: dict[str, list[float]], bare: tuple[float, float, float], total: float, label: str
) -> None:
    """One run's figures: the bare (prepare, run, exec) beside levers9's create to first exec, all seconds."""
    prepare_s, run_s, exec_s = bare
    times["bare"].append(run_s + exec_s)
    times["bare run"].append(run_s)
    times["bare exec"].append(exec_s)
    times["prepare"].append(prepare_s)
    times["levers9"].append(total)
    log(
        f"  {label}: bare {(run_s + exec_s) * 1000:.0f} ms (+ prepare {prepare_s * 1000:.0f}), "
        f"levers9 {total * 1000:.0f} ms"
    )


async def worker_first_exec(w: Worker, root: Path, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for i in range(runs + 1):
        prepare_s, run_s, exec_s = await bare_once(w, root)
        w.parts.begin()
        t0 = time.perf_counter()
        sandbox = await w.create()
        with w.parts.part("exec echo hi to its output and exit"):
            await echo_hi(sandbox)
        total = time.perf_counter() - t0
        w.parts.end(total)
        await w.sandboxes.terminate(sandbox.id)
        if i == 0:  # the warm-up
            w.parts.runs.pop()
            continue
        record_first_exec(times, (prepare_s, run_s, exec_s), total, f"{w.name} worker run {i}")
    return times


async def until_warm(w: Worker, timeout_s: float = 120) -> None:
    """Wait until the worker holds a warm sandbox (started behind the last create)."""
    deadline = time.monotonic() + timeout_s
    while not w.sandboxes._warm:
        if time.monotonic() > deadline:
            raise AssertionError(f"no warm sandbox was ready within {timeout_s:g} s")
        await asyncio.sleep(0.02)


async def worker_first_exec_warm(w: Worker, root: Path, runs: int) -> dict[str, list[float]]:
    """As :func:`worker_first_exec`, with ``sandboxes_warm: 1``: each counted create finds a warm sandbox of its
    shape (started behind the create before it; the bare run goes first, then the wait for it)."""
    times: dict[str, list[float]] = defaultdict(list)
    w.sandboxes.warm = 1
    try:
        first = await w.create()  # its shape is what is kept warm
        await echo_hi(first)
        await w.sandboxes.terminate(first.id)
        for i in range(1, runs + 1):
            prepare_s, run_s, exec_s = await bare_once(w, root)
            await until_warm(w)
            waiting = {s.box.cid for s in w.sandboxes._warm}
            t0 = time.perf_counter()
            sandbox = await w.create()
            await echo_hi(sandbox)
            total = time.perf_counter() - t0
            if sandbox.box.cid not in waiting:
                raise AssertionError("the create did not take the warm sandbox")
            await w.sandboxes.terminate(sandbox.id)
            record_first_exec(times, (prepare_s, run_s, exec_s), total, f"{w.name} worker run {i}, warm")
    finally:
        w.sandboxes.warm = 0
    return times


async def worker_exec_rtt(w: Worker, count: int) -> list[float]:
    sandbox = await w.create()
    try:
        assert sandbox.session is not None
        times = []
        for i in range(count + 10):
            t0 = time.perf_counter()
            process = await sandbox.session.exec("true")
            out, err = await process.read_all()
            code = await process.wait()
            elapsed = time.perf_counter() - t0
            if (out, err, code) != (b"", b"", 0):
                raise AssertionError(f"true gave {out!r}, {err!r}, exit {code}")
            if i >= 10:
                times.append(elapsed)
        spawning = await sandbox.session.run_code(SPAWN)
        out, err = await spawning.read_all()
        if await spawning.wait() != 0:
            raise AssertionError(f"the spawn timing failed: {err.decode(errors='replace')}")
        median, high, python, runner = (float(x) for x in out.split())
        w.floor = (median, high, python, runner)
        return times
    finally:
        await w.sandboxes.terminate(sandbox.id)


async def ask(sandbox: Sandbox) -> tuple[str, int]:
    """The app's answer to one question: (its token, how many questions it has been asked)."""
    assert sandbox.session is not None
    process = await sandbox.session.run_code(ASK)
    out, err = await process.read_all()
    code = await process.wait()
    if code != 0:
        raise AssertionError(f"the question failed with exit {code}: {err.decode(errors='replace')}")
    token, asked = out.decode().split()
    return token, int(asked)


async def worker_restore(w: Worker, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    restore_parts = Parts()
    for i in range(runs + 1):
        t0 = time.perf_counter()
        cold = await w.create(snapshots=True)
        assert cold.session is not None
        app = await cold.session.run_code(APP)
        cold.processes[app.id] = app
        first = await asyncio.wait_for(anext(app.output().__aiter__()), 120)
        word, token = first.data.decode().split()
        assert word == "ready", first
        if await ask(cold) != (token, 1):
            raise AssertionError("the cold app did not answer with its token and 1")
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = await w.sandboxes.snapshot(cold.id, WORKSPACE)
        snapshot_s = time.perf_counter() - t0
        w.parts.begin()
        t0 = time.perf_counter()
        restored = await w.create(snapshot=snap)
        with w.parts.part("the question exec'd and answered"):
            answer = await ask(restored)
        restore_s = time.perf_counter() - t0
        w.parts.end(restore_s)
        if answer != (token, 2):
            raise AssertionError(f"the restored app answered {answer}, not ({token!r}, 2): its state was lost")
        if await ask(cold) != (token, 2):  # the original runs on, apart from the restored one
            raise AssertionError("the original app did not answer 2 after the snapshot")
        await w.sandboxes.terminate(cold.id)
        await w.sandboxes.terminate(restored.id)
        await w.sandboxes.delete_snapshot(snap.key, WORKSPACE)
        restore_parts.runs.append(w.parts.runs.pop())
        if i == 0:
            restore_parts.runs.pop()
            continue
        times["cold"].append(cold_s)
        times["restore"].append(restore_s)
        times["snapshot"].append(snapshot_s)
        times["size"].append(snap.size_bytes)
        log(
            f"  restore worker run {i}: cold {cold_s:.2f} s, restore {restore_s:.3f} s, snapshot {snapshot_s:.2f} s, "
            f"{snap.size_bytes / 1e6:.0f} MB"
        )
    w.parts.runs = restore_parts.runs
    return times


# --------------------------------------------------------------------------- REST on a levers9 up


@dataclass
class Rest:
    up: Up
    http: httpx.Client
    parts: Parts = field(default_factory=Parts)

    def __post_init__(self) -> None:
        for method, name in (
            ("create", "POST /sandboxes (created, running)"),
            ("start", "POST /sandboxes/ID/processes (started)"),
            ("output", "GET .../processes/N/output (output and exit)"),
        ):
            self.parts.wrap(self, method, name)

    def create(self, **body: Any) -> str:
        answer = self.http.post("/sandboxes", json={"timeout_s": 600, **body})
        if answer.status_code != 201:
            raise AssertionError(f"create: {answer.status_code} {answer.text}")
        sid: str = answer.json()["id"]
        return sid

    def start(self, sid: str, **body: Any) -> int:
        answer = self.http.post(f"/sandboxes/{sid}/processes", json=body)
        if answer.status_code != 201:
            raise AssertionError(f"exec: {answer.status_code} {answer.text}")
        number: int = answer.json()["process"]
        return number

    def output(self, sid: str, process: int) -> tuple[str, str, int | None]:
        out, err, code = "", "", None
        with self.http.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
            if stream.status_code != 200:
                raise AssertionError(f"output: {stream.status_code} {stream.read()!r}")
            for line in stream.iter_lines():
                item = json.loads(line)
                if "exit" in item:
                    code = item["exit"]
                elif item.get("stream") == "stdout":
                    out += item["data"]
                elif item.get("stream") == "stderr":
                    err += item["data"]
                else:
                    raise AssertionError(f"output: {item}")
        return out, err, code

    def first_line(self, sid: str, process: int) -> str:
        with self.http.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
            for line in stream.iter_lines():
                item = json.loads(line)
                if item.get("stream") != "stdout":
                    raise AssertionError(f"output: {item}")
                data: str = item["data"]
                return data
        raise AssertionError("the output ended before its first line")

    def ask(self, sid: str) -> tuple[str, int]:
        out, err, code = self.output(sid, self.start(sid, code=ASK))
        if code != 0:
            raise AssertionError(f"the question failed with exit {code}: {err}")
        token, asked = out.split()
        return token, int(asked)

    def delete(self, sid: str) -> None:
        self.http.delete(f"/sandboxes/{sid}")


@contextlib.contextmanager
def levers9_up(runtime: str, root: Path, *, warm: int = 0) -> Iterator[Rest]:
    home = root / f"up-{runtime}{'-warm' if warm else ''}"
    up = Up(home, runtime=runtime, min_workers=1, max_workers=1, cpu=4, sandboxes=4, sandboxes_warm=warm)
    http: httpx.Client | None = None
    try:
        up.start()
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{up.http_port}/api/v1",
            headers={"authorization": f"Bearer {up.token()}"},
            timeout=300,
        )
        yield Rest(up, http)
    finally:
        if http is not None:
            http.close()
        with contextlib.suppress(BaseException):
            up.stop()
        deadline = time.monotonic() + 15
        while _processes_mentioning(str(home)) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = _reap(home)
        if left:
            log(f"  killed what levers9 up ({runtime}) left running: {left}")


def rest_first_exec_warm(rest: Rest, runs: int) -> list[float]:
    """Create to first exec over REST on a pool with ``sandboxes_warm: 1``: a first create sets the shape kept
    warm; each counted one comes 3 s after the last (time for the worker to start the next warm sandbox)."""
    sid = rest.create()
    rest.output(sid, rest.start(sid, argv=["true"]))
    rest.delete(sid)
    times = []
    for i in range(1, runs + 1):
        time.sleep(3)
        t0 = time.perf_counter()
        sid = rest.create()
        out, err, code = rest.output(sid, rest.start(sid, argv=["echo", "hi"]))
        elapsed = time.perf_counter() - t0
        rest.delete(sid)
        if (out, err, code) != ("hi\n", "", 0):
            raise AssertionError(f"echo hi over REST gave {out!r}, {err!r}, exit {code}")
        times.append(elapsed)
        log(f"  REST run {i}, warm: {elapsed * 1000:.0f} ms")
    workers = "".join(log.read_text(errors="replace") for log in (rest.up.root / "state").rglob("*.log"))
    if "took warm container" not in workers:
        raise AssertionError("the worker's log says no create took a warm sandbox")
    return times


def rest_first_exec(rest: Rest, runs: int) -> list[float]:
    times = []
    for i in range(runs + 1):
        rest.parts.begin()
        t0 = time.perf_counter()
        sid = rest.create()
        out, err, code = rest.output(sid, rest.start(sid, argv=["echo", "hi"]))
        elapsed = time.perf_counter() - t0
        rest.parts.end(elapsed)
        rest.delete(sid)
        if (out, err, code) != ("hi\n", "", 0):
            raise AssertionError(f"echo hi over REST gave {out!r}, {err!r}, exit {code}")
        if not i:
            rest.parts.runs.pop()
        else:
            times.append(elapsed)
            log(f"  REST run {i}: {elapsed * 1000:.0f} ms")
    return times


def rest_exec_rtt(rest: Rest, count: int) -> list[float]:
    sid = rest.create()
    try:
        times = []
        for i in range(count + 10):
            rest.parts.begin()
            t0 = time.perf_counter()
            out, err, code = rest.output(sid, rest.start(sid, argv=["true"]))
            elapsed = time.perf_counter() - t0
            rest.parts.end(elapsed)
            if (out, err, code) != ("", "", 0):
                raise AssertionError(f"true over REST gave {out!r}, {err!r}, exit {code}")
            if i >= 10:
                times.append(elapsed)
            else:
                rest.parts.runs.pop()
        return times
    finally:
        rest.delete(sid)


def rest_exec_wait_rtt(rest: Rest, count: int) -> list[float]:
    """An exec's round trip in one request, as the SDK makes it: ``POST .../processes?wait=true``, its NDJSON
    answer read to the exit line (the process first, then its output)."""
    sid = rest.create()
    try:
        times = []
        for i in range(count + 10):
            t0 = time.perf_counter()
            with rest.http.stream("POST", f"/sandboxes/{sid}/processes?wait=true", json={"argv": ["true"]}) as answer:
                if answer.status_code != 201:
                    raise AssertionError(f"exec with wait: {answer.status_code} {answer.read()!r}")
                lines = [json.loads(line) for line in answer.iter_lines() if line]
            elapsed = time.perf_counter() - t0
            if "process" not in lines[0] or lines[-1] != {"exit": 0} or len(lines) != 2:
                raise AssertionError(f"true with wait over REST gave {lines}")
            if i >= 10:
                times.append(elapsed)
        return times
    finally:
        rest.delete(sid)


def rest_restore(rest: Rest, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for i in range(runs + 1):
        made: list[str] = []
        try:
            t0 = time.perf_counter()
            cold = rest.create(snapshots=True)
            made.append(cold)
            first = rest.first_line(cold, rest.start(cold, code=APP))
            word, token = first.split()
            assert word == "ready", first
            if rest.ask(cold) != (token, 1):
                raise AssertionError("the cold app did not answer with its token and 1")
            cold_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            taken = rest.http.post(f"/sandboxes/{cold}/snapshots")
            if taken.status_code != 201:
                raise AssertionError(f"snapshot: {taken.status_code} {taken.text}")
            snap = taken.json()["snapshot"]
            snapshot_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            restored = rest.create(snapshot=snap["id"])
            made.append(restored)
            answer = rest.ask(restored)
            restore_s = time.perf_counter() - t0
            if answer != (token, 2):
                raise AssertionError(f"the restored app answered {answer}, not ({token!r}, 2): its state was lost")
            rest.http.delete(f"/sandbox-snapshots/{snap['id']}")
        finally:
            for sid in made:
                rest.delete(sid)
        if i:
            times["cold"].append(cold_s)
            times["restore"].append(restore_s)
            times["snapshot"].append(snapshot_s)
            log(f"  restore REST run {i}: cold {cold_s:.2f} s, restore {restore_s:.3f} s, snapshot {snapshot_s:.2f} s")
    return times


# --------------------------------------------------------------------------- report


def machine() -> list[str]:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), platform.processor())
    memory_kib = int(
        next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    )
    os_name = next(
        (
            line.split("=", 1)[1].strip('"')
            for line in Path("/etc/os-release").read_text().splitlines()
            if line.startswith("PRETTY_NAME=")
        ),
        "?",
    )
    versions = []
    for tool in ("runsc", "runc"):
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()
        versions.append(out[0] if out else f"{tool}: missing")
    return [
        f"- Machine: {cpu}, {os.cpu_count()} cores, {memory_kib / 2**20:.0f} GiB, {os_name}, kernel "
        f"{platform.release()}, Python {platform.python_version()}; {'; '.join(versions)}",
    ]


def ratio_rows(kind: str, runtime: str, t: dict[str, list[float]]) -> str:
    bare, ours, prep = (statistics.median(t[k]) for k in ("bare", "levers9", "prepare"))
    if runtime == "runc":
        what = "`runc run` of `echo hi`: `runc exec` cannot join the bundle's network namespace"
    else:
        what = f"{median_ms(t['bare run'])} + {median_ms(t['bare exec'])}"
    return (
        f"| {runtime} | {kind} | {bare * 1000:.0f} ms ({what}) "
        f"| {prep * 1000:.0f} ms | {ours * 1000:.0f} ms | **{ours / bare:.2f}x** | {ours / (bare + prep):.2f}x |"
    )


async def run_worker_level(args: argparse.Namespace, root: Path, out: list[str]) -> None:
    storage = LocalStorage(root / "storage")
    rtt: dict[str, list[float]] = {}
    out += [
        "",
        f"Create to the first exec's result, worker level (`Sandboxes` in-process), median of {args.runs} runs:",
        "",
        "| runtime | path | bare: run --detach + exec | prepare (bare: not counted) | levers9 | levers9 / bare "
        "(target ≤ 1.2x) | levers9 / (bare + prepare) |",
        "|--|--|--:|--:|--:|--:|--:|",
    ]
    breakdowns: list[str] = []
    restore: dict[str, list[float]] | None = None
    for runtime in args.runtimes:
        async with worker(runtime, root, storage) as w:
            log(f"worker level, {runtime}: create to first exec")
            t = await worker_first_exec(w, root, args.runs)
            out.append(ratio_rows("worker, cold (a container started)", runtime, t))
            w.parts.on = False
            t = await worker_first_exec_warm(w, root, args.runs)
            out.append(ratio_rows("worker, warm (`sandboxes_warm: 1`)", runtime, t))
            breakdowns += [
                "",
                *w.parts.table(
                    f"{runtime}, worker level: where create to first exec goes",
                    [
                        "prepare (overlay, network namespace, config)",
                        "start (shim and the runtime's create + start)",
                        f"{NESTED}the runner's port forwarder started (a host Python process)",
                        "runner up and connected",
                        "exec echo hi to its output and exit",
                    ],
                ),
            ]
            log(f"worker level, {runtime}: exec round trip")
            rtt[f"{runtime}, worker level"] = await worker_exec_rtt(w, args.execs)
            args.results["floor"][runtime] = w.floor
            if runtime == "gvisor" and "restore" in args.only:
                log("worker level, gvisor: restore against cold start")
                w.parts.runs = []
                restore = await worker_restore(w, args.restores)
                breakdowns += [
                    "",
                    *w.parts.table(
                        "gVisor, worker level: where restore to the answer goes",
                        [
                            "fetch the snapshot from storage",
                            "prepare (overlay, network namespace, config)",
                            "restore (the runtime's restore)",
                            f"{NESTED}the snapshot's file changes unpacked into the overlay",
                            f"{NESTED}`runsc state` asked until it says running",
                            f"{NESTED}the runner's port forwarder started (a host Python process)",
                            "runner up and connected",
                            "the question exec'd and answered",
                        ],
                    ),
                ]
    args.breakdowns[:0] = breakdowns
    args.results["rtt"].update(rtt)
    if restore is not None:
        args.results["restore"]["worker level"] = restore


def run_rest_level(args: argparse.Namespace, root: Path, out: list[str]) -> None:
    for runtime in args.runtimes:
        log(f"REST on levers9 up, {runtime}")
        with levers9_up(runtime, root) as rest:
            steps = ["POST /sandboxes (created, running)", *REST_STEPS]
            if runtime == "gvisor" or args.rest_all:
                t = rest_first_exec(rest, args.runs)
                args.results["first"][runtime] = t
                args.breakdowns += ["", *rest.parts.table(f"{runtime}, REST: where create to first exec goes", steps)]
            rest.parts.runs = []
            args.results["rtt"][f"{runtime}, REST, two requests (start, then output)"] = rest_exec_rtt(rest, args.execs)
            args.results["rtt"][f"{runtime}, REST, one request (`?wait=true`, what the SDK sends)"] = (
                rest_exec_wait_rtt(rest, args.execs)
            )
            args.breakdowns += ["", *rest.parts.table(f"{runtime}, REST: where an exec's round trip goes", REST_STEPS)]
            if runtime == "gvisor" and "restore" in args.only:
                args.results["restore"]["REST"] = rest_restore(rest, args.restores)
        if runtime == "gvisor" or args.rest_all:
            log(f"REST on levers9 up, {runtime}, sandboxes_warm: 1")
            with levers9_up(runtime, root, warm=1) as rest:
                args.results["first"][f"{runtime}, warm (`sandboxes_warm: 1`)"] = rest_first_exec_warm(rest, args.runs)


def report(args: argparse.Namespace, out: list[str]) -> None:
    first: dict[str, list[float]] = args.results["first"]
    if first:
        out += ["", f"Create to the first exec's result through REST on `levers9 up`, median of {args.runs} runs:", ""]
        out += ["| runtime | REST: create, exec, output | min-max |", "|--|--:|--:|"]
        for runtime, t in first.items():
            out.append(f"| {runtime} | {median_ms(t)} | {min(t) * 1000:.0f}-{max(t) * 1000:.0f} ms |")
    rtt: dict[str, list[float]] = args.results["rtt"]
    if rtt:
        out += ["", f"Exec round trip of `true` on a warm sandbox ({args.execs} runs after 10 not counted):", ""]
        out += ["| runtime, path | median | p90 | target ≤ 5 ms |", "|--|--:|--:|--|"]
        for name, t in rtt.items():
            met = "met" if statistics.median(t) <= 0.005 else "**not met**"
            out.append(f"| {name} | {ms(statistics.median(t))} ms | {ms(p90(t))} ms | {met} |")
        for runtime, (median, high, _, _) in args.results["floor"].items():
            out.append(
                f"| {runtime}, inside: a child spawned and read to its end (50 runs) | {ms(median)} ms | {ms(high)} ms | |"
            )
    restore: dict[str, dict[str, list[float]]] = args.results["restore"]
    if restore:
        out += [
            "",
            f"gVisor, a process that loads for 5 s, median of {args.restores} runs (state checked after each):",
            "",
            "| path | cold: create, start, ready, answer | restored: create from snapshot, answer | speed-up "
            "(target ≥ 10x) | snapshot (it runs on) |",
            "|--|--:|--:|--:|--:|",
        ]
        for name, r in restore.items():
            cold, warm, snap = (statistics.median(r[k]) for k in ("cold", "restore", "snapshot"))
            out.append(f"| {name} | {cold:.2f} s | {warm:.3f} s | **{cold / warm:.1f}x** | {snap:.2f} s |")
        sizes = restore.get("worker level", {}).get("size")
        if sizes:
            out.append(f"\nSnapshot size (memory and files): {statistics.median(sizes) / 1e6:.0f} MB.")
    for runtime, (_, _, python, runner) in args.results["floor"].items():
        out.append(
            f"\n{runtime}, inside a sandbox: the runner's Python starts in {python * 1000:.0f} ms (`-c pass`), "
            f"{runner * 1000:.0f} ms with the runner's imports (median of 5)."
        )
    if args.breakdowns:
        out += [
            "",
            "Where the time goes (medians of the same runs; bench-only timers around each part):",
            *args.breakdowns,
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of create to first exec (median; default 5)")
    parser.add_argument("--execs", type=int, default=200, help="exec round trips (default 200)")
    parser.add_argument("--restores", type=int, default=5, help="runs of restore against cold (default 5)")
    parser.add_argument("--runtimes", default="gvisor,runc", help="comma-separated: gvisor,runc")
    parser.add_argument(
        "--only", default="worker,rest,restore", help="comma-separated parts: worker, rest, restore (default all)"
    )
    parser.add_argument("--rest-all", action="store_true", help="REST create to first exec on runc too")
    args = parser.parse_args()
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    args.only = set(args.only.split(","))
    args.results = {"first": {}, "rtt": {}, "restore": {}, "floor": {}}
    args.breakdowns = []
    if os.geteuid() != 0:
        sys.exit("bench/sandboxes.py runs containers: run it as root")
    root = Path(tempfile.mkdtemp(prefix="l9-bench-sb-"))
    started = datetime.datetime.now(datetime.UTC)
    out = [*machine(), f"- Date: {started:%Y-%m-%d %H:%M} UTC; 1-minute load average {load()} at the start"]
    try:
        if "worker" in args.only:
            asyncio.run(run_worker_level(args, root, out))
        if "rest" in args.only:
            run_rest_level(args, root, out)
        report(args, out)
        out.insert(2, f"- Ended: {datetime.datetime.now(datetime.UTC):%H:%M} UTC; load {load()} at the end")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(out))


if __name__ == "__main__":
    main()
