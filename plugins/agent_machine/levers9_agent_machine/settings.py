"""Pool settings of the ``agent_machine`` provider: machines joined to levers9, running workers in Docker.

A joined machine runs ``levers9 agent``, which dials the controlplane with a
token issued for it and runs worker containers when told to. ``levers9 machine
create`` installs that agent over SSH using the ``ssh`` block below. No
password or key material is ever a value here, only paths. Only pydantic,
:mod:`levers9.config.fields` and the standard library are imported; docker and
paramiko are imported by the code that uses them.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from levers9.config.fields import ImageRef, Port, pattern

_HOSTNAME_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")
_DOCKER_NETWORK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_host(value: str) -> str:
    """Accept an IPv4 or IPv6 address or an RFC 1123 host name."""
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        pass
    else:
        return value
    name = value.removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_HOSTNAME_LABEL.match(label) for label in labels):
        raise ValueError(f"{value!r} is not a host name or IP address")
    if labels[-1].isdigit():
        raise ValueError(f"{value!r} is neither a valid IP address nor a host name")
    return value


def _check_network(value: str) -> str:
    if value == "none" or value.startswith("container:"):
        raise ValueError(f"network mode {value!r} cannot work: the worker must reach the controlplane")
    if not _DOCKER_NETWORK.match(value):
        raise ValueError(f"{value!r} is not 'bridge', 'host' or the name of a Docker network")
    return value


def _none_word(value: Any) -> Any:
    """Let operators write ``gpu_runtime: none`` as well as ``null``."""
    return None if isinstance(value, str) and value.lower() == "none" else value


Host = Annotated[str, AfterValidator(check_host)]
LoginName = Annotated[str, pattern(_USER, "a valid login name", "ubuntu")]


class JumpHost(BaseModel):
    """A bastion the SSH connection goes through (like ``ssh -J user@host:port``)."""

    model_config = ConfigDict(extra="forbid")

    host: Host = Field(description="Bastion host name or IP address.")
    port: Port = Field(22, description="SSH port of the bastion.")
    user: LoginName | None = Field(
        None, description="Login on the bastion; left out, the same user as the target machine."
    )


class SshBootstrap(BaseModel):
    """How ``levers9 machine create HOST`` reaches a machine to install and start the agent."""

    model_config = ConfigDict(extra="forbid")

    user: LoginName = Field("root", description="Login user on the machine.")
    port: Port = Field(22, description="SSH port of the machine.")
    key_file: Path | None = Field(
        None,
        description="Path of the private key to log in with (a path, never the key); left out, the SSH agent "
        "and the default keys in ~/.ssh.",
    )
    known_hosts_file: Path | None = Field(
        None, description="known_hosts file to verify host keys against; left out, ~/.ssh/known_hosts."
    )
    strict_host_key_checking: bool = Field(
        True, description="Refuse machines whose host key is unknown. Turn off only on trusted networks."
    )
    jump: JumpHost | None = Field(
        None, description="Bastion to connect through, if the machine is not reachable directly."
    )
    sudo: bool = Field(
        False, description="Install with sudo (needed when user is not root); passwordless sudo is assumed."
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=300, description="SSH connect timeout in seconds.")


class AgentMachineSettings(BaseModel):
    """Settings of a pool of machines joined with ``levers9 machine create`` (or a manual agent install)."""

    model_config = ConfigDict(extra="forbid")

    worker_image: ImageRef = Field(
        description="Image of the levers9 worker the agent runs in Docker, for example "
        "'registry.example.com/levers9/worker:0.1.0'."
    )
    max_workers_per_machine: int = Field(
        1, ge=1, le=64, description="Most worker containers one joined machine runs for this pool at once."
    )
    docker_network_mode: Annotated[str, AfterValidator(_check_network)] = Field(
        "bridge",
        description="Network of the worker containers: 'bridge', 'host' or a user-defined Docker network.",
    )
    docker_host: str = Field(
        "unix:///var/run/docker.sock",
        pattern=r"^(unix|tcp|ssh|npipe)://.+$",
        description="Docker daemon the agent talks to on its machine.",
    )
    gpu_runtime: Annotated[Literal["nvidia"] | None, BeforeValidator(_none_word)] = Field(
        "nvidia",
        description="'nvidia': GPUs are handed to workers through the NVIDIA Container Toolkit (Docker GPU "
        "device requests); none: CPU-only machines.",
    )
    heartbeat_timeout_s: float = Field(
        60.0,
        ge=5,
        le=3600,
        description="An agent silent this long is considered gone; its workers are marked lost. Agents heartbeat "
        "every 30 s, so keep this at 60 or more.",
    )
    ssh: SshBootstrap = Field(
        default_factory=SshBootstrap,
        description="SSH settings 'levers9 machine create' uses to join machines.",
    )
