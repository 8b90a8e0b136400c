"""What the steps of ``machine create --ssh`` hand each other: the box's facts, the agent software, the paths.

:class:`BoxFacts` is what step 2 (:mod:`levers9.cli.machine_install.checks`) found
on the box; :class:`AgentSoftware` what step 3 chose to run ``levers9`` there;
:class:`AgentLayout` where steps 3 to 5 (:mod:`levers9.cli.machine_install.service`)
put the agent's files, system paths as root and everything under ``~/.levers9``
otherwise (:func:`default_layout`). They are plain frozen values with no I/O, kept
apart so that each step imports them and no step imports another's module back.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["AgentLayout", "AgentSoftware", "BoxFacts", "default_layout", "same_arch"]

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


def same_arch(a: str, b: str) -> bool:
    """Whether two ``uname -m`` style names are one architecture (``arm64`` is ``aarch64``)."""
    return _ARCH_ALIASES.get(a, a) == _ARCH_ALIASES.get(b, b)


@dataclass(frozen=True)
class BoxFacts:
    """What step 2 found on the box."""

    uid: int
    home: str
    arch: str
    systemd: bool
    docker_host: str | None
    docker_version: str
    docker_root: str
    runtimes: str
    free_gib: float
    gpus: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def env(self) -> str:
        """Shell lines that point ``docker`` at the box's daemon."""
        if self.docker_host is None:
            return ""
        return f"DOCKER_HOST={shlex.quote(self.docker_host)}; export DOCKER_HOST; "

    def summary(self) -> str:
        gpus = f"{len(self.gpus)} GPU(s), nvidia runtime" if self.gpus else "no GPU"
        text = f"{self.arch}, Docker {self.docker_version}, {gpus}, {self.free_gib:.1f} GiB free in {self.docker_root}"
        return "; ".join([text, *self.notes])


@dataclass(frozen=True)
class AgentSoftware:
    """What runs ``levers9`` on the box: ``argv`` stands for the ``levers9`` command."""

    argv: tuple[str, ...]
    how: str
    #: the agent's container name when it runs in the worker image
    container: str | None = None


@dataclass(frozen=True)
class AgentLayout:
    """Where the agent's files are on the box, and how it is supervised."""

    state_dir: str = "/var/lib/levers9/agent"
    lib_dir: str = "/usr/local/lib/levers9"
    log_file: str = "/var/log/levers9-agent.log"
    pid_file: str = "/run/levers9-agent.pid"
    unit_name: str = "levers9-agent"
    container_name: str = "levers9-agent"
    #: ``auto``: systemd where it runs and we are root, else the supervisor
    service: Literal["auto", "systemd", "supervisor"] = "auto"

    @property
    def token_file(self) -> str:
        return f"{self.state_dir}/join-token"

    @property
    def credential(self) -> str:
        return f"{self.state_dir}/agent.json"

    @property
    def replaced_credential(self) -> str:
        """Where a credential the controlplane revoked is moved when the box joins again."""
        return f"{self.state_dir}/agent.json.replaced"

    @property
    def start_script(self) -> str:
        return f"{self.lib_dir}/agent-start"

    @property
    def supervisor_script(self) -> str:
        return f"{self.lib_dir}/agent-supervise"

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.unit_name}.service"


def default_layout(box: BoxFacts) -> AgentLayout:
    """System paths as root, else everything under the login user's ``~/.levers9``."""
    if box.uid == 0:
        return AgentLayout()
    base = f"{box.home.rstrip('/')}/.levers9"
    return AgentLayout(
        state_dir=f"{base}/agent",
        lib_dir=f"{base}/lib",
        log_file=f"{base}/agent.log",
        pid_file=f"{base}/agent-supervise.pid",
        service="supervisor",
    )
