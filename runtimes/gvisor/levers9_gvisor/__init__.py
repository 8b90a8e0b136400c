"""The gVisor runtime: containers inside a user-space kernel, through the host's ``runsc``.

A pool names ``runtime: gvisor`` when it runs code it does not trust: the
container's system calls are served by gVisor's own kernel, so a kernel bug
reachable from the container is much less of a risk than under runc. gVisor can
also checkpoint a running sandbox by itself, without CRIU. This module declares
the settings, reports what this host's runsc can do, and answers the checkpoint
question for gVisor containers; running containers comes with the container hooks.

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
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from levers9 import probe
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import CheckpointSupport, Isolation, RuntimeCapabilities, RuntimeContext

__all__ = [
    "MECHANISM",
    "NAME",
    "PROBE_TIMEOUT",
    "GvisorSettings",
    "RunscInfo",
    "inspect_runsc",
    "levers9_checkpoint_support",
    "levers9_runtime_capabilities",
    "levers9_runtime_settings",
    "parse_flag_platforms",
    "parse_help_platforms",
    "parse_version",
    "resolve_platform",
    "settings_of",
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


class GvisorSettings(BaseModel):
    """A pool's ``runtime_settings:`` for ``runtime: gvisor``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the runsc executable: a name looked up on PATH, or a path
    binary: str = Field("runsc", min_length=1)
    #: how the sandbox intercepts system calls (runsc ``--platform``); ``auto``: systrap, else ptrace
    platform: Platform = "auto"
    #: the sandbox's network: gVisor's own stack, the host's stack, or none (runsc ``--network``)
    network: Literal["sandbox", "host", "none"] = "sandbox"
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


def settings_of(runtime: RuntimeContext) -> GvisorSettings:
    """The runtime's settings, or the defaults when the pool gave none."""
    if isinstance(runtime.settings, GvisorSettings):
        return runtime.settings
    if runtime.settings is None:
        return GvisorSettings()
    return GvisorSettings.model_validate(runtime.settings)


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
    return RunscInfo(path, version, None, platforms, nvproxy)


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


@hookimpl
def levers9_runtime_settings() -> type[GvisorSettings]:
    return GvisorSettings


@hookimpl
def levers9_runtime_capabilities(runtime: RuntimeContext) -> RuntimeCapabilities:
    settings = settings_of(runtime)
    info = inspect_runsc(settings.binary)
    problem = info.problem or _settings_problem(settings, info)
    if problem is not None:
        return RuntimeCapabilities(
            available=False,
            unavailable_reason=problem,
            isolation=Isolation.SANDBOX,
            checkpoint=False,
            checkpoint_reason=problem,
            version=info.version,
        )
    return RuntimeCapabilities(
        available=True,
        isolation=Isolation.SANDBOX,
        gpu=settings.nvproxy,
        checkpoint=True,
        version=info.version,
    )


@hookimpl
def levers9_checkpoint_support(runtime: RuntimeContext) -> CheckpointSupport | None:
    if runtime.name != NAME:
        return None
    settings = settings_of(runtime)
    info = inspect_runsc(settings.binary)
    # a sandbox that cannot start cannot be checkpointed either: same answer as the capabilities
    problem = info.problem or _settings_problem(settings, info)
    if problem is not None:
        return CheckpointSupport(available=False, reason=problem, mechanism=MECHANISM)
    return CheckpointSupport(
        available=True,
        reason=f"runsc {info.version} checkpoints and restores whole sandboxes itself",
        mechanism=MECHANISM,
    )
