"""The gVisor runtime: containers inside a user-space kernel, through the host's ``runsc``.

A pool names ``runtime: gvisor`` when it runs code it does not trust: the
container's system calls are served by gVisor's own kernel, so a kernel bug
reachable from the container is much less of a risk than under runc. gVisor can
also checkpoint a running sandbox by itself, without CRIU. The plugin is one
object, :data:`plugin`, a :class:`GvisorRuntime`: it declares the settings,
reports what this host's runsc can do, answers the checkpoint hooks for gVisor
containers, and runs containers through the container hooks of
:class:`levers9.engine.hooks.CapturingRuntime` on the engine :func:`engine` builds.

runsc changes quickly and distributions ship old builds (Debian 12 has a
2022-12 snapshot), so settings this build cannot honour are reported as the
runtime being unavailable, with the reason, rather than failing later when a
container starts:

* the ``systrap`` platform (gVisor's own default since 2023) is unknown to
  older builds, which offer ``ptrace`` and ``kvm`` only; the platforms are read
  from ``runsc help platforms`` (or, failing that, from the ``-platform``
  flag's description), never guessed from the version string. The default,
  ``auto``, takes systrap where the build has it and ptrace otherwise, so a
  pool works out of the box on both; a platform named explicitly is honoured
  or reported, never swapped;
* ``kvm`` also needs ``/dev/kvm`` to be readable and writable;
* ``nvproxy`` (GPU access) needs a build that has the ``-nvproxy`` flag. GPUs
  are reported only when ``nvproxy`` is set and supported.
* ``network: sandbox`` (gVisor's own network stack) is refused by older runsc
  builds on newer kernels: they decide "this is the root network namespace" by
  whether ``/proc/sys/net/core/rmem_default`` exists, and newer kernels show it
  in every namespace. ``auto`` (the default) therefore starts one probe sandbox
  per runsc build and uses ``sandbox`` when it works, else ``host``: the host
  kernel's stack, but still inside the container's own network namespace on
  the worker's bridge. The choice is logged once, and reported in the
  capabilities' ``notes`` (``levers9 check`` shows it). ``network: sandbox``
  named explicitly never falls back: where the probe fails, the runtime is
  reported unavailable with runsc's own words.
* **the root filesystem's writes** go to the container's overlay on the host,
  through gVisor's gofer: levers9 passes ``--overlay2 none`` where the build
  has the flag (builds since 2023 default to an overlay in the sandbox's
  memory), so what a container wrote is where the image builder reads it
  (``levers9_container_changes``) on every build. The 2022-12 build writes
  through by default.
* **seccomp**: a sandbox is always behind gVisor's own host-side filter, and
  the container's system calls are served by gVisor's kernel, not the
  host's. On top of that the OCI profile every container gets
  (:mod:`levers9.engine.seccomp`) is applied inside the sandbox where the
  build has ``-oci-seccomp`` (runsc ignores the profile otherwise); the
  ``notes`` say which. Capabilities are dropped as for runc
  (:mod:`levers9.engine.spec`), and containers cannot open connections to
  the host (:mod:`levers9.engine.host_guard`). levers9 adds no user
  namespace here: with network ``none`` or ``sandbox`` runsc itself runs the
  sandbox process (``runsc-sandbox``) as ``nobody`` in a user namespace of
  its own; with ``host`` (what ``auto`` falls back to where the sandbox stack
  fails) runsc keeps it root on the host, for the host stack's sake, behind
  its own seccomp filter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from levers9 import probe
from levers9.engine.hooks import CapturingRuntime
from levers9.engine.node import NodeSettings, bridge_for, images_for
from levers9.engine.oci import OciEngine, OciFlavor
from levers9.engine.seccomp import profile
from levers9.engine.spec import CGROUP_PARENT
from levers9.hooks.errors import InvalidRequest
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    CheckpointImage,
    CheckpointSupport,
    ContainerSpec,
    ContainerState,
    Isolation,
    PreparedContainer,
    RuntimeCapabilities,
    RuntimeContext,
)

__all__ = [
    "MECHANISM",
    "NAME",
    "PROBE_TIMEOUT",
    "GvisorRuntime",
    "GvisorSettings",
    "RunscInfo",
    "engine",
    "inspect_runsc",
    "parse_flag_platforms",
    "parse_help_platforms",
    "parse_version",
    "plugin",
    "resolve_platform",
    "sandbox_network_works",
]

#: the runtime name (the entry point name) this plugin serves
NAME = "gvisor"
#: how gVisor containers are checkpointed
MECHANISM = "runsc"
#: seconds each ``runsc`` query may take before runsc is reported unusable
PROBE_TIMEOUT = 10.0

KVM_DEVICE = "/dev/kvm"

Platform = Literal["auto", "systrap", "ptrace", "kvm"]
#: what ``auto`` picks, best first: systrap is faster than ptrace and needs no /dev/kvm
AUTO_PREFERENCE = ("systrap", "ptrace")

_VERSION = re.compile(r"^runsc version (\S+)", re.MULTILINE)
_PLATFORM_FLAG = re.compile(r"specifies which platform to use:\s*([^\n]*)")
_PLATFORM_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_NVPROXY_FLAG = re.compile(r"^\s*-nvproxy\b", re.MULTILINE)
_OCI_SECCOMP_FLAG = re.compile(r"^\s*-oci-seccomp\b", re.MULTILINE)
_OVERLAY2_FLAG = re.compile(r"^\s*-overlay2\b", re.MULTILINE)


class GvisorSettings(NodeSettings):
    """A pool's ``runtime_settings:`` for ``runtime: gvisor``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the runsc executable: a name looked up on PATH, or a path
    binary: str = Field("runsc", min_length=1)
    #: how the sandbox intercepts system calls (runsc ``--platform``); ``auto``: systrap, else ptrace
    platform: Platform = "auto"
    #: the sandbox's network (runsc ``--network``): gVisor's own stack, the host kernel's stack (still inside the
    #: container's own network namespace), none, or ``auto``: sandbox where this runsc can use it, else host
    network: Literal["auto", "sandbox", "host", "none"] = "auto"
    #: give containers the host's NVIDIA GPUs through gVisor's GPU proxy (runsc ``--nvproxy``)
    nvproxy: bool = False
    #: runsc's ``--root``, where it keeps container state; None keeps runsc's default
    root: str | None = None


@dataclass(frozen=True)
class RunscInfo:
    """What one runsc build said about itself."""

    #: the resolved executable, or None when it was not found
    path: str | None
    #: the version, or None when runsc could not be run
    version: str | None
    #: why runsc cannot be used at all, or None when it ran
    problem: str | None
    #: the platforms this build offers (empty when unknown)
    platforms: tuple[str, ...] = ()
    #: whether this build has the ``-nvproxy`` flag (None when not asked)
    nvproxy: bool | None = None
    #: whether this build has the ``-oci-seccomp`` flag, applying the OCI seccomp profile in the sandbox
    oci_seccomp: bool | None = None
    #: whether this build has the ``-overlay2`` flag (newer builds default to a root overlay in memory)
    overlay2: bool | None = None


def parse_version(output: str) -> str | None:
    """The version ``runsc --version`` printed (``runsc version 0.0~20221219.0`` gives ``0.0~20221219.0``)."""
    match = _VERSION.search(output)
    return match.group(1) if match else None


def parse_help_platforms(output: str) -> tuple[str, ...]:
    """The platforms ``runsc help platforms`` lists, one name a line, sorted.

    runsc prints them in Go map order, which changes from run to run; sorting keeps
    messages that list them identical between two asks.
    """
    names = (line.strip() for line in output.splitlines())
    return tuple(sorted(name for name in names if _PLATFORM_NAME.match(name)))


def parse_flag_platforms(output: str) -> tuple[str, ...]:
    """The platforms the ``-platform`` flag's description in ``runsc flags`` names.

    The description reads like ``specifies which platform to use: ptrace (default), kvm.``
    """
    match = _PLATFORM_FLAG.search(output)
    if not match:
        return ()
    names = []
    for item in match.group(1).split(","):
        name = re.sub(r"\(.*?\)", "", item).strip().rstrip(".").strip()
        if _PLATFORM_NAME.match(name):
            names.append(name)
    return tuple(names)


def inspect_runsc(binary: str, *, want_flags: bool = True) -> RunscInfo:
    """Ask runsc for its version and, with ``want_flags``, for its platforms and nvproxy flag."""
    path = probe.which(binary)
    if path is None:
        where = " on PATH" if "/" not in binary else ""
        return RunscInfo(None, None, f"runsc binary {binary!r} not found{where} (apt-get install -y runsc)")
    result = probe.run([path, "--version"], timeout=PROBE_TIMEOUT)
    if not result.ok:
        detail = "; ".join(result.output_lines()) or "no output"
        return RunscInfo(path, None, f"'{path} --version' failed with exit status {result.rc}: {detail}")
    version = parse_version(result.stdout)
    if version is None:
        first = (result.output_lines() or ["no output"])[0]
        return RunscInfo(path, None, f"{path} does not look like runsc: '--version' printed {first!r}")
    if not want_flags:
        return RunscInfo(path, version, None)

    platforms: tuple[str, ...] = ()
    listing = probe.run([path, "help", "platforms"], timeout=PROBE_TIMEOUT)
    if listing.ok:
        platforms = parse_help_platforms(listing.stdout)
    flags = probe.run([path, "flags"], timeout=PROBE_TIMEOUT)
    # runsc prints its flag list on stderr or stdout depending on the build
    flag_text = flags.stdout + "\n" + flags.stderr
    if not platforms:
        platforms = parse_flag_platforms(flag_text)
    nvproxy = bool(_NVPROXY_FLAG.search(flag_text)) if flags.ok else None
    oci_seccomp = bool(_OCI_SECCOMP_FLAG.search(flag_text)) if flags.ok else None
    overlay2 = bool(_OVERLAY2_FLAG.search(flag_text)) if flags.ok else None
    return RunscInfo(path, version, None, platforms, nvproxy, oci_seccomp, overlay2)


def resolve_platform(settings: GvisorSettings, info: RunscInfo) -> str | None:
    """The platform runsc will be started with, or None when ``auto`` finds none this build offers."""
    if settings.platform != "auto":
        return settings.platform
    return next((name for name in AUTO_PREFERENCE if name in info.platforms), None)


def _settings_problem(settings: GvisorSettings, info: RunscInfo) -> str | None:
    """Why this runsc cannot run containers with these settings, or None when it can."""
    if not info.platforms:
        return (
            f"could not tell which platforms runsc {info.version} supports "
            f"('runsc help platforms' and 'runsc flags' named none)"
        )
    platform = resolve_platform(settings, info)
    if platform is None:
        return (
            f"runsc {info.version} offers none of the platforms 'auto' chooses from "
            f"({', '.join(AUTO_PREFERENCE)}; it offers: {', '.join(info.platforms)}); set runtime_settings.platform"
        )
    if platform not in info.platforms:
        return (
            f"runsc {info.version} does not support platform {settings.platform!r} "
            f"(it offers: {', '.join(info.platforms)}); set runtime_settings.platform to one of those"
        )
    if platform == "kvm" and not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return f"platform 'kvm' needs {KVM_DEVICE} readable and writable, and it is not"
    if settings.nvproxy and not info.nvproxy:
        return f"nvproxy is set but runsc {info.version} has no -nvproxy flag (GPUs need a newer gVisor)"
    return None


def _network_choice(
    runtime: RuntimeContext, settings: GvisorSettings, info: RunscInfo
) -> tuple[str | None, str, list[str]]:
    """(why the runtime is unavailable, the network containers get, notes) for settings runsc accepts.

    ``network: sandbox`` refuses where gVisor's own stack fails here, never falling back; ``auto`` says which
    stack it chose and why. Asks the probe sandbox of :func:`sandbox_network_works` (once per runsc build and
    platform), the same answer :func:`engine` acts on.
    """
    if settings.network not in ("auto", "sandbox") or info.path is None:
        return None, settings.network, []
    platform = resolve_platform(settings, info)
    assert platform is not None  # _settings_problem said so
    works, words = sandbox_network_works(runtime, info.path, platform)
    if works:
        return None, "sandbox", [f"network {settings.network!r}: gVisor's own network stack ('sandbox')"]
    if settings.network == "sandbox":
        problem = (
            f"network 'sandbox' is set, but runsc {info.version} cannot use its own network stack here ({words}); "
            "set runtime_settings.network to 'auto' or 'host' to use the host kernel's stack inside each "
            "container's own network namespace"
        )
        return problem, "sandbox", []
    return (
        None,
        "host",
        [
            f"network 'auto' uses 'host': the host kernel's network stack inside each container's own network "
            f"namespace, because runsc {info.version} cannot use its own stack here ({words})"
        ],
    )


log = logging.getLogger(__name__)

_INFO_CACHE: dict[tuple[str, float], RunscInfo] = {}
_NETWORK_CACHE: dict[tuple[str, str], tuple[bool, str]] = {}


def _info(binary: str) -> RunscInfo:
    """inspect_runsc, remembered per executable and its mtime: the container hooks ask on every call."""
    path = probe.which(binary)
    try:
        key = (path or binary, Path(path).stat().st_mtime if path else 0.0)
    except OSError:
        return inspect_runsc(binary)
    if key not in _INFO_CACHE:
        _INFO_CACHE[key] = inspect_runsc(binary)
    return _INFO_CACHE[key]


def engine(runtime: RuntimeContext) -> OciEngine:
    """The OCI engine driving this host's runsc with the pool's settings."""
    settings = GvisorSettings.of(runtime)
    info = _info(settings.binary)
    problem = info.problem or _settings_problem(settings, info)
    if problem is not None or info.path is None:
        raise InvalidRequest(f"gvisor cannot run containers here: {problem}")
    platform = resolve_platform(settings, info)
    assert platform is not None  # _settings_problem said so
    network = settings.network
    if network == "auto":
        works, _ = sandbox_network_works(runtime, info.path, platform)
        network = "sandbox" if works else "host"
    argv = [info.path, "--root", settings.root or str(Path(runtime.state_dir) / "runsc"), "--platform", platform]
    if settings.nvproxy:
        argv.append("--nvproxy")
    if info.oci_seccomp:
        argv.append("--oci-seccomp")  # the container's seccomp profile, enforced by gVisor's kernel
    if info.overlay2:
        # The root filesystem's writes go to the host's overlay (through the gofer), as on builds whose default
        # this is: newer builds keep them in an in-memory overlay inside the sandbox by default, where the
        # builder cannot read what a build step changed (levers9_container_changes)
        argv += ["--overlay2", "none"]
    # A checkpointed function container (no network) serves its worker over a unix socket it creates in
    # its signal directory, the one writable bind mount levers9 gives it; that needs "create".
    argv += ["--host-uds", "create"]
    # A container asking for no network gets a sandbox with none: the only way gVisor can checkpoint it
    # when its own network stack is unavailable (runsc cannot checkpoint a sandbox using the host's).
    flags: dict[str, tuple[str, ...]] = {
        "bridge": ("--network", network),
        "host": ("--network", "host"),
        "none": ("--network", "none"),
    }
    # runsc answers every refused call with EPERM, whatever the rule's errno: the profile without clone3's rule
    flavor = OciFlavor(NAME, tuple(argv), run=("run",), network_flags=flags, seccomp=profile(errno_ret=False))
    return OciEngine(flavor, Path(runtime.state_dir), images=images_for(runtime, settings), bridge=bridge_for(settings))


def sandbox_network_works(runtime: RuntimeContext, runsc: str, platform: str) -> tuple[bool, str]:
    """Whether this runsc can run a sandbox with its own network stack here, and runsc's words if not.

    Asked once per runsc build and platform (a probe sandbox running ``true`` in a fresh network
    namespace); the answer is logged, since ``auto`` then decides how containers are networked.
    """
    key = (runsc, platform)
    if key in _NETWORK_CACHE:
        return _NETWORK_CACHE[key]
    from levers9.engine.spec import oci_config

    image = images_for(runtime, GvisorSettings.of(runtime)).resolve("host")
    netns = f"l9p-{secrets.token_hex(5)}"
    probe_id = f"l9-probe-{secrets.token_hex(5)}"
    with tempfile.TemporaryDirectory(prefix="l9-runsc-probe-") as tmp:
        root, bundle = Path(tmp) / "root", Path(tmp) / "bundle"
        bundle.mkdir()
        spec = ContainerSpec(container_id=probe_id, image="host", command=["true"], memory_mib=256)
        config = oci_config(
            spec,
            rootfs=str(image.layers[-1]),
            image_env=image.config.env,
            binds=[(b.source, b.target) for b in image.binds],
            netns_path=f"/var/run/netns/{netns}",
        )
        config["root"]["readonly"] = True
        config["linux"].pop("cgroupsPath", None)
        (bundle / "config.json").write_text(json.dumps(config))
        subprocess.run(["ip", "netns", "add", netns], capture_output=True, timeout=30, check=False)
        try:
            done = subprocess.run(
                [
                    runsc,
                    "--root",
                    str(root),
                    "--platform",
                    platform,
                    "--network",
                    "sandbox",
                    "run",
                    "--bundle",
                    str(bundle),
                    probe_id,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            lines = (done.stderr or done.stdout).strip().splitlines()
            answer = (done.returncode == 0, lines[-1] if lines else f"exit status {done.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            answer = (False, str(exc))
        finally:
            remove_probe(runsc, root, probe_id, netns)
    if answer[0]:
        log.info("gvisor: runsc %s runs sandboxes with its own network stack here", runsc)
    else:
        log.warning(
            "gvisor: runsc %s cannot use its own network stack here (%s); network 'auto' uses 'host' "
            "inside each container's own network namespace",
            runsc,
            answer[1],
        )
    _NETWORK_CACHE[key] = answer
    return answer


def remove_probe(runsc: str, root: Path, probe_id: str, netns: str, *, timeout_s: float = 60) -> None:
    """Remove all the probe sandbox left, each step whatever the one before did.

    A probe that hung (runsc on the KVM platform did, here) leaves a sandbox that ``runsc delete`` may not end
    either; its processes (the sandbox and its gofer) are then killed by what names them: the network
    namespace they run in and the probe's id on their command lines. Then the namespace and the cgroups go.
    """
    try:
        subprocess.run(
            [runsc, "--root", str(root), "delete", "-force", probe_id],
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("gvisor: deleting probe sandbox %s failed (%s); killing its processes", probe_id, exc)
    killed = _probe_processes(probe_id, netns)
    for pid in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # a cgroup with a process still in it cannot be removed
    while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=30, check=False)
    _remove_probe_cgroups(probe_id)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it is in no cgroup any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _probe_processes(probe_id: str, netns: str) -> list[int]:
    """The processes in the probe's network namespace, those naming its id, and all their descendants (never
    this one)."""
    found: set[int] = set()
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30, check=False)
        found.update(int(word) for word in listed.stdout.split() if word.isdigit())
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if probe_id.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    grown = True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grown = bool(more)
    found.discard(os.getpid())
    return sorted(found)


def _remove_probe_cgroups(probe_id: str) -> None:
    """The cgroups runsc made for the probe (named by its id, the config naming none): delete leaves them."""
    root = Path("/sys/fs/cgroup")
    for directory in (root / probe_id, *(c / probe_id for c in root.iterdir() if c.is_dir())):
        with contextlib.suppress(OSError):
            directory.rmdir()


class GvisorRuntime(CapturingRuntime):
    """The ``gvisor`` plugin: settings, capabilities, container hooks on runsc's engine, and runsc's checkpoints."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = GvisorSettings

    def engine(self, runtime: RuntimeContext) -> OciEngine:
        return engine(runtime)

    def check(self, runtime: RuntimeContext, spec: ContainerSpec) -> None:
        settings = GvisorSettings.of(runtime)
        if spec.network == "host" and settings.network not in ("host", "auto"):
            raise InvalidRequest(
                f"container {spec.container_id} asks for the host network, but this pool's gVisor runs with "
                f"network {settings.network!r}; set runtime_settings.network: host for such pools"
            )
        if spec.gpus and not settings.nvproxy:
            raise InvalidRequest("GPUs under gVisor need runtime_settings.nvproxy: true (and a runsc with -nvproxy)")

    @hookimpl
    def levers9_runtime_capabilities(self, runtime: RuntimeContext) -> RuntimeCapabilities:
        settings = GvisorSettings.of(runtime)
        info = inspect_runsc(settings.binary)
        problem = info.problem or _settings_problem(settings, info)
        notes: list[str] = []
        if problem is None:
            problem, _, notes = _network_choice(runtime, settings, info)
        if problem is not None:
            return RuntimeCapabilities(
                available=False,
                unavailable_reason=problem,
                isolation=Isolation.SANDBOX,
                checkpoint=False,
                checkpoint_reason=problem,
                version=info.version,
            )
        if info.oci_seccomp:
            notes.append("seccomp: levers9's profile, applied inside the sandbox (-oci-seccomp)")
        else:
            notes.append(
                f"seccomp: runsc {info.version} has no -oci-seccomp flag, so levers9's profile is not applied inside "
                "the sandbox; gVisor's own kernel serves every call, behind gVisor's host-side filter"
            )
        return RuntimeCapabilities(
            available=True,
            isolation=Isolation.SANDBOX,
            gpu=settings.nvproxy,
            checkpoint=True,
            version=info.version,
            host_filesystem=False,
            host_network=False,
            cgroup_parent=CGROUP_PARENT,
            notes=notes,
        )

    @hookimpl
    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        if runtime.name != NAME:
            return None
        settings = GvisorSettings.of(runtime)
        info = inspect_runsc(settings.binary)
        # a sandbox that cannot start cannot be checkpointed either: same answer as the capabilities
        problem = info.problem or _settings_problem(settings, info)
        network: str = settings.network
        if problem is None:
            problem, network, _ = _network_choice(runtime, settings, info)
        if problem is not None:
            return CheckpointSupport(available=False, reason=problem, mechanism=MECHANISM)
        # runsc cannot checkpoint a sandbox on the host's stack; a container asking for no network gets none
        caveat = "; on the host's network stack here, only containers without a network" if network == "host" else ""
        return CheckpointSupport(
            available=True,
            reason=f"runsc {info.version} checkpoints and restores whole sandboxes itself{caveat}",
            mechanism=MECHANISM,
        )

    @hookimpl
    def levers9_checkpoint(self, runtime: RuntimeContext, container_id: str, image_dir: str) -> CheckpointImage | None:
        if runtime.name != NAME:
            return None
        return self.engine(runtime).checkpoint(container_id, image_dir)

    @hookimpl
    def levers9_restore(
        self, runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage
    ) -> ContainerState | None:
        if runtime.name != NAME:
            return None
        return self.engine(runtime).restore(container, image)


#: the plugin the entry point names
plugin = GvisorRuntime()
