"""Blueprint builds through levers9's build worker against ``docker build``, and starts from a built image.

Three measurements, one run, one machine, the two sides interleaved run by run:

1. Cold build: the same five steps on the same Debian bookworm base (Python 3.11): apt-get install
   jq, pip install six, a shell command, a COPY of a small local package, a last RUN line. The
   blueprint is written with the SDK (:class:`levers9.sdk.blueprint.Blueprint`); levers9 builds it as
   a build worker does (:meth:`levers9.worker.builds.BuildTasks.run` on a real build order: the base
   from the machine's base cache, :func:`levers9.builder.build.run_build` on runc, steps in
   containers on the worker's bridge behind the build's egress proxy, then the push). docker:
   ``docker build --no-cache`` of a Dockerfile with the same commands (the apt and pip scripts are
   the builder's own, :func:`levers9.builder.steps.step_script`) FROM the same base layer tar,
   ``docker import``-ed into a private dockerd (its own data root and socket, ``--bridge=none
   --iptables=false``, as ``tests/fixtures/dockerd.py`` starts it). No step is cached; the base is
   present on both sides.
2. Rebuild after a one-line change of the last step: levers9 with the steps its earlier builds
   reported passed in the order's ``cached``, as the controlplane sends them (the cached prefix of
   the keys), which the worker turns into ``cached`` for the builder; docker with its layer cache.
   The worker's push to the registry (an embedded ``docker-registry`` on loopback) is timed apart:
   docker build pushes nothing.
3. Container start from a cached image: the last image, pulled by digest as a worker pulls it
   (:class:`levers9.worker.images.ImagePulls`; its layers are in the node cache already), through the
   runc runtime plugin's hooks (prepare, then start until ``true`` is seen exited) against a bare
   ``runc run`` of an unpacked copy of the same layers (made once) with ``runc spec``'s config, and
   against a bare ``runc run`` of the bundle levers9 prepared (its config and global flags).

Where the time goes is measured on the same runs: the hooks, the egress proxy, the layer's capture,
gzip and unpacking, the layouts and the worker's own steps are wrapped with timers (microseconds of
overhead per call), and the gaps between them are named by their neighbours; the start's shim is
read from the ``exit.json`` it writes.

The differences that remain, by design: docker's RUN containers use the host's network
(``--network host``, the private dockerd has no bridge) while levers9's go through a bridge and its
egress proxy; docker here is the legacy builder (this machine's docker CLI has no buildx plugin, so
no BuildKit); the pip step's CA (the machine's own, which a Debian base lacks) is a read-only mount
for levers9 and a build argument written to a file and removed in the same RUN for docker. A build
that fails (the mirror behind apt and pip is a shared cache) is tried again, at most three times, and
reported.

Run: ``.venv/bin/python bench/blueprints.py`` (root; runc, docker.io, docker-registry, and the
machine's Debian mirror and pip index; ``--help`` for options). Everything it starts (dockerd, the
registry, containers, the bridge) is stopped and its directories removed at the end, on SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import functools
import inspect
import json
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import levers9.builder.build as build_module
import levers9.builder.steps as steps_module
import levers9.engine.cgroups as cgroups_module
import levers9.engine.oci as oci_module
import levers9.worker.builds as worker_builds
from levers9.blueprints.order import BUILD_KIND, write_order
from levers9.blueprints.spec import BuildSpec, keys
from levers9.builder.base import base_image
from levers9.builder.build import BaseImage
from levers9.builder.egress import EgressProxy
from levers9.builder.sources import PipSettings, pip_settings
from levers9.builder.steps import step_script
from levers9.engine.images import ImageStore
from levers9.engine.node import bridge_for
from levers9.engine.rootfs import mount_overlay, unmount
from levers9.engine.runc import engine as runc_engine
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerStatus, RuntimeContext
from levers9.registry.server import EmbeddedRegistry
from levers9.sdk.blueprint import Blueprint
from levers9.worker.builds import BuildTasks
from levers9.worker.calls import Call, StubSpec
from levers9.worker.images import ImagePulls
from tests.fixtures.dockerd import Dockerd, _start, _stop

T = TypeVar("T")

#: the shared Debian base cache of the tests (``tests/fixtures/debian_base.py``)
BASES = Path(os.environ.get("LEVERS9_TEST_BASES", "/var/tmp/levers9-test-bases"))
PYTHON = "3.11"
BASE_TAG = "l9bench/base:bookworm"
IMAGE_TAG = "l9bench/image:latest"
#: the pip step's CA inside docker's RUN (written and removed by that RUN)
DOCKER_CA = "/run/l9bench-ca.pem"
REPOSITORY = "bench/blueprint"


# ---------------------------------------------------------------------------------------------- timers


class Phases:
    """The phases of the current levers9 build, filled by the wrappers :func:`instrument` installs.

    Each phase is kept as a span (name, start, end); the time between two spans is a gap named by its two
    neighbours ("cached -> proxy_start"), so that what no wrapper covers is still placed on the timeline.
    """

    def __init__(self) -> None:
        self.on = False
        self.spans: list[tuple[str, float, float]] = []
        #: phases open now: one inside another is counted in the outer one only (a build runs one thing at a time)
        self.depth = 0

    def begin(self) -> float:
        self.spans.clear()
        self.on = True
        return time.perf_counter()

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        if self.depth:
            yield
            return
        self.depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.depth -= 1
            if self.on:
                self.spans.append((name, t0, time.perf_counter()))

    def seconds(self, t0: float, t1: float) -> dict[str, float]:
        """Seconds per phase and per gap between ``t0`` and ``t1`` (a phase or gap that recurs is summed)."""
        found: collections.defaultdict[str, float] = collections.defaultdict(float)
        before, at = "task start", t0
        for name, start, end in sorted(self.spans, key=lambda span: span[1]):
            found[f"{before} -> {name}"] += max(0.0, start - at)
            found[name] += end - start
            before, at = name, end
        found[f"{before} -> task end"] += max(0.0, t1 - at)
        return dict(found)


PHASES = Phases()


def _timed_async(name: str, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        with PHASES.timed(name):
            return await fn(*args, **kwargs)

    return wrapper


def _timed_sync(name: str, fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with PHASES.timed(name):
            return fn(*args, **kwargs)

    return wrapper


def _wrap(owner: object, attribute: str, phase: str) -> None:
    fn = getattr(owner, attribute)
    setattr(owner, attribute, (_timed_async if inspect.iscoroutinefunction(fn) else _timed_sync)(phase, fn))


def instrument(hooks: Hooks) -> None:
    """Wrap what a build step does with timers (see :data:`PROFILE_ROWS` for what each phase holds)."""
    for name in ("container_prepare", "container_start", "container_changes", "container_remove"):
        _wrap(hooks, name, name)
    for name in ("start", "close", "admit", "forget"):
        _wrap(EgressProxy, name, f"proxy_{name}")
    _wrap(steps_module.StepRunner, "_follow", "follow")
    _wrap(steps_module, "gzip_layer", "gzip")  # keep_layer's, looked up when called
    _wrap(steps_module, "write_layout", "step_layout")
    _wrap(build_module, "write_layout", "image_layout")
    _wrap(ImageStore, "add_layer", "unpack")
    _wrap(worker_builds, "read_order", "order_read")
    _wrap(worker_builds, "RegistryClient", "registry_client")  # its constructor: an httpx client, an SSL context
    _wrap(BuildTasks, "_base", "base")
    _wrap(BuildTasks, "_cached", "cached")
    _wrap(worker_builds, "_push", "push")


#: (phase, what it holds), in the order a step goes through them
PROFILE_ROWS = (
    ("order_read", "worker: the build order read (tar, JSON, keys checked)"),
    (
        "registry_client",
        "worker: the registry client made (`RegistryClient`: an httpx client, whose SSL context loads the CA bundle)",
    ),
    ("base", "worker: the base from the machine's base cache (`base_image`, `BaseImage.debian`: present, checked)"),
    ("cached", "worker: the order's cached steps looked up in the node cache"),
    ("proxy_start", "egress proxy started (the bridge ensured, host addresses read, listener)"),
    ("step_layout", "the step's image layout (manifest and config only)"),
    (
        "container_prepare",
        "container prepared (overlay of the layers, idmapped mounts for the user namespace, netns on the bridge)",
    ),
    ("proxy_admit", "the container's address admitted to the proxy (host-guard rule)"),
    ("container_start", "container started (shim, `runc run`; returns once the step runs or has ended)"),
    ("follow", "the step's state and output polled until it is seen exited"),
    ("proxy_forget", "its address forgotten by the proxy (host-guard rule removed)"),
    ("container_changes", "the upper directory captured as a layer tar"),
    ("container_remove", "container removed (runc delete, mounts, netns and veth, directories)"),
    ("gzip", "the layer gzipped as the registry's blob"),
    ("unpack", "the layer unpacked into the node cache"),
    ("image_layout", "the image's OCI layout written"),
    ("proxy_close", "egress proxy stopped"),
)


# -------------------------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """The blueprint and its Dockerfile twin, with the last RUN line as a parameter."""

    context: Path
    pip: PipSettings
    ca_pem: str

    def blueprint(self, last: str) -> tuple[BuildSpec, dict[str, bytes]]:
        """What the SDK sends: the spec and each copy step's tar by its digest."""
        here = Path.cwd()
        os.chdir(self.context)  # add_local_path globs relative to the current directory, as a user's script does
        try:
            bp = (
                Blueprint(python_version=PYTHON)
                .apt_install(["jq"])
                .add_python_packages(["six"])
                .add_commands(["echo built > /built"])
                .add_local_path("mypkg", "/opt/lib")
                .add_commands([last])
            )
            spec = bp.spec()
            contents = {digest: files.tar() for digest, files in bp.local_files().items()}
        finally:
            os.chdir(here)
        return spec, contents

    def dockerfile(self, last: str) -> str:
        spec, _ = self.blueprint(last)
        apt, pip, first_run = spec.steps[0], spec.steps[1], spec.steps[2]
        apt_script = step_script(apt, proxy_url=None).strip().replace("\n", "; ")
        env = {**self.pip.environment(), "PIP_CERT": DOCKER_CA}
        pip_env = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        pip_script = (
            f"printf '%s' \"$PIP_CA\" > {DOCKER_CA} && {pip_env} {step_script(pip, proxy_url=None)}; "
            f"rc=$?; rm -f {DOCKER_CA}; exit $rc"
        )
        return "\n".join(
            [
                f"FROM {BASE_TAG}",
                f"RUN {apt_script}",
                "ARG PIP_CA",
                f"RUN {pip_script}",
                f"RUN {first_run.args[0]}",
                "COPY mypkg /opt/lib/mypkg",
                f"RUN {last}",
                "",
            ]
        )


def no_login() -> Any:
    """The embedded registry here asks for no login (the worker's would be its id and token)."""
    return None


def make_workload(root: Path) -> Workload:
    context = root / "context"
    (context / "mypkg").mkdir(parents=True)
    (context / "mypkg" / "__init__.py").write_text("VALUE = 'from the local package'\n")
    (context / "mypkg" / "util.py").write_text("def twice(x):\n    return 2 * x\n")
    # the machine's own CAs (a Debian base has only Debian's): small enough for a build argument
    ca = "".join(p.read_text() for p in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")))
    return Workload(context, pip_settings(), ca)


# ----------------------------------------------------------------------------------------- levers9 side


class Levers9BuildFailed(RuntimeError):
    """The worker answered a build task with an error (its message is the builder's)."""


@dataclass
class Levers9Side:
    hooks: Hooks
    runtime: RuntimeContext
    store: ImageStore
    tasks: BuildTasks
    registry: EmbeddedRegistry
    built: int = 0
    #: what the controlplane keeps per key: every step the builds so far reported
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def order(self, spec: BuildSpec, contents: dict[str, bytes], cached: dict[str, dict[str, Any]]) -> bytes:
        """The build order the controlplane would send: the cached prefix of the spec's keys, as it sends it."""
        all_keys = keys(spec)
        prefix: dict[str, dict[str, Any]] = {}
        for key in all_keys:
            if key not in cached:
                break
            prefix[key] = {k: cached[key][k] for k in ("op", "diff_id", "blob_digest", "size")}
        registry = {"url": self.registry.url, "repository": REPOSITORY, "tag": "latest", "tls_verify": True}
        return write_order(spec, all_keys, prefix, contents, registry=registry)

    async def build(self, spec: BuildSpec, contents: dict[str, bytes], cached: dict[str, dict[str, Any]]) -> Run:
        """One build task as a build worker runs it (:meth:`BuildTasks.run`: order in, build, push, report).

        ``Run.seconds`` is the task less its push, ``Run.push_s`` the push; ``Run.phases`` the build's phases.
        """
        self.built += 1
        stub = StubSpec(
            stub_id="bench-build",
            workspace_id="bench",
            name="build",
            image="host",
            handler=b"",
            python_version=PYTHON,
            cpu_millicores=2000,
            memory_mib=4096,
            kind=BUILD_KIND,
        )
        call = Call(task_id=f"build-{self.built}", args=self.order(spec, contents, cached))
        output: list[bytes] = []
        t0 = PHASES.begin()
        try:
            outcome = await self.tasks.run(stub, call, lambda _task, data: output.append(data))
        finally:
            PHASES.on = False
        t1 = time.perf_counter()
        total = t1 - t0
        if outcome.status != "complete":
            print(b"".join(output).decode(errors="replace")[-8000:], file=sys.stderr)
            assert outcome.error is not None
            raise Levers9BuildFailed(f"{outcome.error.type}: {outcome.error.message}")
        phases = PHASES.seconds(t0, t1)
        # the push and the task's end after it (its scratch directory removed, the report) are not the build's
        push_s = phases.pop("push") + sum(phases.pop(name) for name in list(phases) if name.startswith("push -> "))
        report = json.loads(outcome.result)
        made = {r["key"]: r for r in report["steps"]}
        lines = b"".join(output).decode(errors="replace").splitlines()
        ran = sum(1 for line in lines if re.match(r"step [1-9][0-9]*/[0-9]+ done", line))
        from_cache = sum(1 for line in lines if re.fullmatch(r"step [1-9][0-9]*/[0-9]+ cached", line))
        return Run(
            total - push_s,
            push_s,
            phases,
            {**cached, **made},
            ran=ran,
            cached=from_cache,
            digest=report["manifest_digest"],
        )


@dataclass
class Run:
    seconds: float
    push_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran: int = 0
    cached: int = 0
    #: the image's manifest digest (levers9)
    digest: str = ""


# ------------------------------------------------------------------------------------------ docker side


def docker_build(daemon: Dockerd, workload: Workload, last: str, *, no_cache: bool) -> Run:
    (workload.context / "Dockerfile").write_text(workload.dockerfile(last))
    argv = ["docker", "build", "--network", "host", "--build-arg", f"PIP_CA={workload.ca_pem}", "-t", IMAGE_TAG]
    if no_cache:
        argv.append("--no-cache")
    env = {**daemon.env, "DOCKER_BUILDKIT": "0"}
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [*argv, str(workload.context)], env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S - 10
        )
    except subprocess.TimeoutExpired as exc:
        raise DockerBuildFailed(f"docker build timed out after {exc.timeout:.0f} s") from None
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        print(done.stdout[-5000:], done.stderr[-3000:], file=sys.stderr)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DockerBuildFailed(f"docker build exited with {done.returncode}: {last}")
    # the legacy builder prints "Step N/M : INSTRUCTION ..." and, for a step taken from its cache, "Using cache"
    ran = cached = 0
    for step in done.stdout.split("Step ")[1:]:
        instruction = step.split(":", 1)[1].split()[0] if ":" in step else ""
        if instruction in ("RUN", "COPY"):
            if "Using cache" in step:
                cached += 1
            else:
                ran += 1
    return Run(seconds, ran=ran, cached=cached)


def docker_import_base(daemon: Dockerd, layer: Path, env: tuple[str, ...], cmd: tuple[str, ...]) -> None:
    changes = [a for e in env for a in ("--change", f"ENV {e}")] + ["--change", f"CMD {json.dumps(list(cmd))}"]
    daemon.cli("import", *changes, str(layer), BASE_TAG, timeout=600)


class DockerBuildFailed(RuntimeError):
    """``docker build`` exited non-zero or ran past :data:`BUILD_TIMEOUT_S`."""


#: the longest one build may take before it counts as failed (a cold one takes seconds here)
BUILD_TIMEOUT_S = 600.0
#: tries of one build before the benchmark gives up: the mirror behind apt and pip is a shared cache
TRIES = 3


async def tried(label: str, attempt: Callable[[], Awaitable[Run]], failures: list[str]) -> Run:
    """``attempt()`` until it succeeds, at most :data:`TRIES` times; each failure is noted in ``failures``."""
    for n in range(1, TRIES + 1):
        try:
            async with asyncio.timeout(BUILD_TIMEOUT_S):
                return await attempt()
        except (Levers9BuildFailed, DockerBuildFailed, TimeoutError) as exc:
            why = f"timed out after {BUILD_TIMEOUT_S:.0f} s" if isinstance(exc, TimeoutError) else str(exc)
            failures.append(f"{label}, try {n}: {why.splitlines()[0]}")
            say(f"  {failures[-1]}")
    raise RuntimeError(f"{label} failed {TRIES} times: {failures[-TRIES:]}")


# ------------------------------------------------------------------------------------------- the starts


def bare_bundle(store: ImageStore, image: str, dest: Path) -> Path:
    """A ``runc spec`` bundle whose rootfs is an unpacked copy of ``image``'s layers (an overlay, copied out)."""
    layers = list(store.resolve(image).layers)
    merged, upper, work, rootfs = dest / "merged", dest / "upper", dest / "work", dest / "bundle" / "rootfs"
    for d in (merged, upper, work, rootfs):
        d.mkdir(parents=True)
    mount_overlay(layers, upper, work, merged)
    try:
        subprocess.run(["cp", "-a", f"{merged}/.", str(rootfs)], check=True)
    finally:
        unmount(merged)
    bundle = dest / "bundle"
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["true"]
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


#: seconds of the parts of one container_start (see :func:`starts`)
START_PARTS: dict[str, float] = {}


def _wrap_plain(owner: object, attribute: str, name: str) -> None:
    fn = getattr(owner, attribute)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            START_PARTS[name] = START_PARTS.get(name, 0.0) + time.perf_counter() - t0

    setattr(owner, attribute, wrapper)


async def starts(
    side: Levers9Side, image: str, workdir: str, bundle: Path, runc_root: Path, runs: int
) -> dict[str, list[float]]:
    hooks, ctx = side.hooks, side.runtime
    parts = [
        "bare",
        "levers9",
        "prepare",
        "start",
        "start_hook",
        "exit_seen",
        "own_bundle",
        "cgroup",
        "spawn",
        "in_shim",
    ]
    times: dict[str, list[float]] = {name: [] for name in parts}
    # inside container_start (the engine's thread): the memory cgroup made, the shim spawned
    START_PARTS.clear()
    _wrap_plain(cgroups_module, "own_memory_cgroup", "cgroup")
    _wrap_plain(oci_module.OciEngine, "_spawn", "spawn")
    for i in range(runs):
        bare_id = f"l9bare-{secrets.token_hex(4)}"
        t0 = time.perf_counter()
        subprocess.run(
            ["runc", "--root", str(runc_root), "run", "--bundle", str(bundle), bare_id], check=True, capture_output=True
        )
        times["bare"].append(time.perf_counter() - t0)
        subprocess.run(
            ["runc", "--root", str(runc_root), "delete", "--force", bare_id], capture_output=True, check=False
        )
        cid = f"l9s-{secrets.token_hex(4)}"
        spec = ContainerSpec(container_id=cid, image=image, command=["true"], network="none", workdir=workdir)
        t0 = time.perf_counter()
        prepared = await hooks.container_prepare(ctx, spec)
        t1 = time.perf_counter()
        await hooks.container_start(ctx, prepared)
        t_running = time.perf_counter()
        while (await hooks.container_state(ctx, cid)).status is not ContainerStatus.EXITED:
            await asyncio.sleep(0.002)
        t2 = time.perf_counter()
        times["levers9"].append(t2 - t0)
        times["prepare"].append(t1 - t0)
        times["start"].append(t2 - t1)
        times["start_hook"].append(t_running - t1)
        times["exit_seen"].append(t2 - t_running)
        for name in ("cgroup", "spawn"):
            times[name].append(START_PARTS.pop(name, 0.0))
        # the shim writes child.pid as it starts runc and exit.json once runc's exit was read: the state's
        # times are those files' modification times (the kernel's coarse clock: a tick or so each)
        ended = await hooks.container_state(ctx, cid)
        assert ended.started_at is not None
        assert ended.finished_at is not None
        times["in_shim"].append((ended.finished_at - ended.started_at).total_seconds())
        await hooks.container_remove(ctx, cid)
        # where the difference lies: bare runc on the bundle levers9 prepared (its config: user namespace,
        # seccomp, cgroup limits, idmapped overlay), with the plugin's own global flags
        own = f"l9o-{secrets.token_hex(4)}"
        prepared = await hooks.container_prepare(ctx, spec.model_copy(update={"container_id": own}))
        argv = runc_engine(ctx)._argv(own)
        t0 = time.perf_counter()
        subprocess.run(
            [*argv, "run", "--bundle", str(prepared.bundle_dir), f"{own}-bare"], check=True, capture_output=True
        )
        times["own_bundle"].append(time.perf_counter() - t0)
        subprocess.run([*argv, "delete", "--force", f"{own}-bare"], capture_output=True, check=False)
        await hooks.container_remove(ctx, own)
        print(
            f"  start {i + 1}: bare runc {times['bare'][-1] * 1000:.0f} ms, levers9 {times['levers9'][-1] * 1000:.0f} ms "
            f"(prepare {times['prepare'][-1] * 1000:.0f} + start {times['start'][-1] * 1000:.0f}); bare runc of "
            f"levers9's bundle {times['own_bundle'][-1] * 1000:.0f} ms",
            file=sys.stderr,
        )
    return times


#: what both images must hold: jq, six, the local package, the shell command's and the last line's files
CHECK = "jq --version && PYTHONPATH=/opt/lib python3 -c 'import six, mypkg.util; print(mypkg.util.twice(21))' && cat /built /last"


async def check_images(side: Levers9Side, daemon: Dockerd, image: str, workdir: str) -> tuple[str, str]:
    """The output of :data:`CHECK` in a container of each side's last image: they must be the same."""
    cid = f"l9c-{secrets.token_hex(4)}"
    spec = ContainerSpec(
        container_id=cid, image=image, command=["/bin/sh", "-c", CHECK], network="none", workdir=workdir
    )
    await side.hooks.container_start(side.runtime, await side.hooks.container_prepare(side.runtime, spec))
    while (state := await side.hooks.container_state(side.runtime, cid)).status is not ContainerStatus.EXITED:
        await asyncio.sleep(0.01)
    ours = (await side.hooks.container_logs(side.runtime, cid, 0)).data.decode()
    await side.hooks.container_remove(side.runtime, cid)
    if state.exit_code != 0:
        raise RuntimeError(f"the levers9 image fails the check ({state.exit_code}): {ours}")
    theirs = daemon.cli("run", "--rm", "--network", "none", IMAGE_TAG, "/bin/sh", "-c", CHECK).stdout
    return ours, theirs


# ----------------------------------------------------------------------------------------------- report


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    versions = []
    for argv in (["runc", "--version"], ["dockerd", "--version"], ["docker", "--version"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()
        versions.append(out[0] if out else f"{argv[0]}: missing")
    os_name = platform.freedesktop_os_release().get("PRETTY_NAME", platform.system())
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {os_name}, kernel {platform.release()}; "
        f"{'; '.join(versions)}; Python {platform.python_version()}"
    )


def spread(values: list[float], unit: float = 1.0, fmt: str = "{:.2f}") -> str:
    """``median (min-max)`` in the unit."""
    med, lo, hi = statistics.median(values) / unit, min(values) / unit, max(values) / unit
    return f"{fmt.format(med)} ({fmt.format(lo)}-{fmt.format(hi)})"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def main(builds: int, rebuilds: int, runs: int) -> None:
    for tool, install in (("runc", "runc"), ("dockerd", "docker.io"), ("docker-registry", "docker-registry")):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y {install}")
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # SIGTERM cleans up as ^C does
    root = Path(tempfile.mkdtemp(prefix="l9-bench-bp-"))
    hooks = Hooks(load_plugins(PluginPolicy()))
    settings = hooks.runtime_settings_model("runc")
    assert settings is not None
    runtime = RuntimeContext(
        name="runc",
        settings=settings(bridge="l9bpbench", subnet="10.246.0.0/24", image_cache=str(root / "images")),
        state_dir=str(root / "runc"),
    )
    store = ImageStore(root / "images")
    registry = EmbeddedRegistry(root / "registry")
    daemon: Dockerd | None = None
    dockerd_root = root / "dockerd"
    dockerd_root.mkdir()
    tasks = BuildTasks(hooks, runtime, state_dir=root / "worker", credentials=lambda: None)
    tasks.base_cache = BASES  # the tests' shared base cache: the base is built once per machine
    side = Levers9Side(hooks, runtime, store, tasks, registry)
    workload = make_workload(root)
    try:
        say("setting up: the base (built into the shared cache when missing), dockerd, the registry")
        local = await asyncio.to_thread(base_image, PYTHON, BASES)
        await asyncio.to_thread(BaseImage.debian, local, store)  # present before anything is timed
        registry.start()
        daemon = _start(dockerd_root)
        dockerd = daemon
        docker_import_base(dockerd, local.path, local.env, local.cmd)
        instrument(hooks)
        failures: dict[str, list[str]] = {"levers9": [], "docker": []}
        loads = [os.getloadavg()[0]]

        cold: dict[str, list[Run]] = {"levers9": [], "docker": []}
        say(f"cold builds: {builds} each, interleaved (a first untimed one each warms both up)")
        for i in range(builds + 1):
            spec, contents = workload.blueprint("echo 0 > /last")
            ours = await tried(f"levers9 cold {i}", partial(side.build, spec, contents, {}), failures["levers9"])
            theirs = await tried(
                f"docker cold {i}",
                partial(asyncio.to_thread, docker_build, dockerd, workload, "echo 0 > /last", no_cache=True),
                failures["docker"],
            )
            if (ours.ran, ours.cached, theirs.ran, theirs.cached) != (5, 0, 5, 0):
                raise RuntimeError(
                    f"a cold build did not run its 5 steps: levers9 ran {ours.ran} with {ours.cached} "
                    f"cached, docker ran {theirs.ran} with {theirs.cached} cached"
                )
            side.records = ours.records
            say(
                f"  cold {i}{' (warm-up)' if i == 0 else ''}: levers9 {ours.seconds:.2f} s "
                f"(+ push {ours.push_s:.2f} s), docker {theirs.seconds:.2f} s"
            )
            if i:
                cold["levers9"].append(ours)
                cold["docker"].append(theirs)

        warm: dict[str, list[Run]] = {"levers9": [], "docker": []}
        say(f"rebuilds after changing the last line: {rebuilds} each, interleaved")
        for i in range(rebuilds + 1):
            line = f"echo {i + 1}-{secrets.token_hex(3)} > /last"
            spec, contents = workload.blueprint(line)
            ours = await tried(
                f"levers9 rebuild {i}", partial(side.build, spec, contents, side.records), failures["levers9"]
            )
            theirs = await tried(
                f"docker rebuild {i}",
                partial(asyncio.to_thread, docker_build, dockerd, workload, line, no_cache=False),
                failures["docker"],
            )
            if (ours.ran, ours.cached, theirs.ran, theirs.cached) != (1, 4, 1, 4):
                raise RuntimeError(
                    f"a rebuild ran other than its last step: levers9 ran {ours.ran} with "
                    f"{ours.cached} cached, docker ran {theirs.ran} with {theirs.cached} cached"
                )
            say(
                f"  rebuild {i}{' (warm-up)' if i == 0 else ''}: levers9 {ours.seconds * 1000:.0f} ms "
                f"(+ push {ours.push_s * 1000:.0f} ms), docker {theirs.seconds * 1000:.0f} ms"
            )
            if i:
                warm["levers9"].append(ours)
                warm["docker"].append(theirs)

        # the last image, pulled as a worker running a function of it pulls it (its layers are here already)
        image = f"{registry.address}/{REPOSITORY}@{warm['levers9'][-1].digest}"
        pulls = ImagePulls(runtime, registry_url=registry.url, credentials=no_login)
        await pulls.ensure(image)
        workdir = store.resolve(image).config.workdir or "/"
        ours_out, theirs_out = await check_images(side, dockerd, image, workdir)
        if ours_out != theirs_out:
            raise RuntimeError(f"the two images differ: levers9 {ours_out!r}, docker {theirs_out!r}")
        say(f"both images hold the same: {ours_out!r}")
        bundle = await asyncio.to_thread(bare_bundle, store, image, root / "bare")
        say(f"starts: {runs} each, interleaved")
        start = await starts(side, image, workdir, bundle, root / "runc-bare", runs)
        loads.append(os.getloadavg()[0])
    finally:
        PHASES.on = False
        for cid in await hooks.container_list(runtime):
            await hooks.container_remove(runtime, cid)
        if daemon is not None:
            _stop(daemon)
        registry.stop()
        bridge_for(runtime.settings).destroy()
        hooks.close()
        shutil.rmtree(root, ignore_errors=True)

    report(builds, rebuilds, runs, loads, failures, cold, warm, start)


def report(
    builds: int,
    rebuilds: int,
    runs: int,
    loads: list[float],
    failures: dict[str, list[str]],
    cold: dict[str, list[Run]],
    warm: dict[str, list[Run]],
    start: dict[str, list[float]],
) -> None:
    """The results as Markdown on stdout, for bench/RESULTS.md."""
    ms = functools.partial(spread, unit=1e-3, fmt="{:.0f}")
    print(f"- Machine: {machine()}")
    print(
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. Command: `.venv/bin/python "
        f"bench/blueprints.py --builds {builds} --rebuilds {rebuilds} --runs {runs}`; 1-minute load average "
        f"{loads[0]:.1f} at the first build, {loads[1]:.1f} after the last start"
    )
    for name, failed in failures.items():
        print(
            f"- {name} builds that failed and were tried again: {len(failed)}" + "".join(f"\n  - {f}" for f in failed)
        )
    print(
        "\n| measurement (median, min-max) | levers9 (runc) | docker build (legacy builder) | levers9 / docker | target |"
    )
    print("|--|--:|--:|--:|--|")
    c_ours, c_theirs = [r.seconds for r in cold["levers9"]], [r.seconds for r in cold["docker"]]
    w_ours, w_theirs = [r.seconds for r in warm["levers9"]], [r.seconds for r in warm["docker"]]
    c_ratio = statistics.median(c_ours) / statistics.median(c_theirs)
    w_ratio = statistics.median(w_ours) / statistics.median(w_theirs)
    print(f"| cold build, 5 steps, s ({builds} runs) | {spread(c_ours)} | {spread(c_theirs)} | {c_ratio:.2f}x | none |")
    print(
        f"| rebuild, last line changed, ms ({rebuilds} runs) | {ms(w_ours)} | {ms(w_theirs)} | {w_ratio:.2f}x | "
        f"≤ 1x: {'met' if w_ratio <= 1 else '**not met**'} |"
    )
    print(f"| the worker's push after a cold build, ms | {ms([r.push_s for r in cold['levers9']])} | (none) | | |")
    print(f"| the worker's push after a rebuild, ms | {ms([r.push_s for r in warm['levers9']])} | (none) | | |")

    s_ratio = statistics.median(start["levers9"]) / statistics.median(start["bare"])
    own_ratio = statistics.median(start["levers9"]) / statistics.median(start["own_bundle"])
    print(f"\n| start of `true` from a cached image, ms ({runs} runs; median, min-max) | time | levers9 / this |")
    print("|--|--:|--:|")
    print(f"| levers9: `container_prepare` + `container_start` until seen exited | {ms(start['levers9'])} | |")
    print(f"| &nbsp;&nbsp;of which prepare | {ms(start['prepare'])} | |")
    print(f"| &nbsp;&nbsp;of which start until exited | {ms(start['start'])} | |")
    print(
        f"| &nbsp;&nbsp;&nbsp;&nbsp;`container_start` (returns once the pid file names a live process) | "
        f"{ms(start['start_hook'])} | |"
    )
    print(f"| &nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;its memory cgroup made (cgroup v1) | {ms(start['cgroup'])} | |")
    print(f"| &nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;the shim spawned (`setsid --fork`) | {ms(start['spawn'])} | |")
    print(
        f"| &nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;in the shim, from `runc run` started to its exit read (the "
        f"times of child.pid and exit.json, the kernel's coarse clock) | {ms(start['in_shim'])} | |"
    )
    print(
        f"| &nbsp;&nbsp;&nbsp;&nbsp;then until `container_state` says exited (polled every 2 ms) | "
        f"{ms(start['exit_seen'])} | |"
    )
    print(
        f"| bare `runc run`, a copy of the same layers, `runc spec`'s config (target: ≤ 1.2x, "
        f"{'met' if s_ratio <= 1.2 else '**not met**'}) | {ms(start['bare'])} | {s_ratio:.2f}x |"
    )
    print(
        f"| bare `runc run` of the bundle levers9 prepared (its config and global flags) | {ms(start['own_bundle'])} | "
        f"{own_ratio:.2f}x |"
    )

    for label, runs_of in (("rebuild", warm["levers9"]), ("cold build", cold["levers9"])):
        profile(label, runs_of)


def profile(label: str, runs_of: list[Run]) -> None:
    """Where the build time of ``runs_of`` went: the phases, then the largest gaps between them (medians)."""
    total = statistics.median([r.seconds for r in runs_of])
    print(
        f"\nWhere a levers9 {label} spends its time, ms (median of {len(runs_of)}; the build only, up to the push):\n"
    )
    print("| phase | ms | share |")
    print("|--|--:|--:|")
    described = dict(PROFILE_ROWS)
    for name, what in PROFILE_ROWS:
        med = statistics.median([r.phases.get(name, 0.0) for r in runs_of])
        print(f"| {what} | {med * 1000:.0f} | {med / total:.0%} |")
    gaps = {name for r in runs_of for name in r.phases if name not in described}
    medians = sorted(((statistics.median([r.phases.get(g, 0.0) for r in runs_of]), g) for g in gaps), reverse=True)
    shown = [(med, g) for med, g in medians if med >= 0.002][:8]
    for med, gap in shown:
        print(f"| between phases: {gap.replace('->', '→')} | {med * 1000:.0f} | {med / total:.0%} |")
    rest = sum(med for med, g in medians if (med, g) not in shown)
    print(f"| between phases: the other gaps, each under 2 ms or fewer | {rest * 1000:.0f} | {rest / total:.0%} |")
    print(f"| **total** (medians of the rows need not add up to it) | **{total * 1000:.0f}** | |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=5, help="cold builds of each side (default 5)")
    parser.add_argument("--rebuilds", type=int, default=20, help="rebuilds of each side (default 20)")
    parser.add_argument("--runs", type=int, default=30, help="container starts of each side (default 30)")
    args = parser.parse_args()
    asyncio.run(main(args.builds, args.rebuilds, args.runs))
