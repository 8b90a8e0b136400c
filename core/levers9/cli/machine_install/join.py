"""Joining a box over SSH: what ``levers9 machine create --ssh`` does on the machine it is given, step by step.

:func:`join_over_ssh` connects with paramiko (key file, or the SSH agent and
the default keys; through a bastion's ``direct-tcpip`` channel when a jump
host is given), then runs, each step echoed as it runs:

1. connect, the host key verified against known_hosts (refused when unknown
   and ``strict_host_key_checking``; accepted with a warning, and never
   saved, when not);
2. check the box (:mod:`levers9.cli.machine_install.checks`): sudo, Docker reachable,
   the NVIDIA Container Toolkit when it has GPUs, free disk in Docker's root,
   its architecture;
3. the agent software: a ``levers9`` of this version already on the box, else
   the worker image streamed over the SSH channel into ``docker import`` (once:
   a box whose Docker has the tag is not sent it again), the agent then
   running in a container of it; where the image cannot be sent, the
   controlplane's own wheel installed in a virtualenv on the box, its sha256
   checked (never ``levers9`` by name from a package index);
4. the join token written to a 0600 file in the agent's 0700 state directory,
   and the start script (:mod:`levers9.cli.machine_install.service`);
5. the service: systemd where it runs, else a supervisor loop that survives
   logout. Step 6, waiting until the agent shows joined, is the caller's.

Invariants: the join token travels only on a channel's stdin, never in a
command line (the box's ``ps`` shows those), never in the unit or the scripts,
and it is never echoed; its file is deleted by the start script as soon as the
agent has saved its credential. Every remote command runs under ``sudo -n``
when ``target.sudo``. Running it again on a joined box is safe: a joined box
whose service runs is left as it is (said so, :attr:`SshJoinResult.already_joined`);
a joined box whose service is down gets its service back without a new join; a box
whose credential was revoked (its machine removed) joins again with the new token.

Failures raise :class:`SshJoinError` whose message says which step failed
and what to install or fix. paramiko is imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import BinaryIO

from levers9.cli.machine_install import checks, service
from levers9.cli.machine_install.box import AgentLayout, default_layout
from levers9.cli.machine_install.remote import STEPS, SshJoinResult, SshTarget, connect

__all__ = ["join_over_ssh"]


def join_over_ssh(
    target: SshTarget,
    *,
    controlplane: str,
    join_token: str | None,
    ca_pem: str,
    docker_host: str | None = None,
    echo: Callable[[str], None] = print,
    image_tar: Callable[[BinaryIO], None] | None = None,
    image_tag: str | None = None,
    image_changes: Sequence[str] | None = None,
    agent_argv: Sequence[str] | None = None,
    layout: AgentLayout | None = None,
    min_free_gib: float = 5.0,
    is_live: Callable[[str], bool] | None = None,
    wheel: tuple[str, str] | None = None,
    python: str = "python3",
) -> SshJoinResult:
    """Check ``target``, install the agent there as a service and start it with ``join_token`` (steps 1 to 5).

    ``agent_argv`` stands for ``levers9`` on the box (tests use a stand-in); left out, a ``levers9`` of this
    version found there, else the worker image (``image_tar``/``image_tag``/``image_changes``, by default
    from :mod:`levers9.images.worker`) run with ``docker run``. ``layout`` says where the files go.
    ``is_live(agent_id)`` says whether the controlplane still has a machine: a box whose credential is of one it
    has not (removed) joins again with ``join_token`` (:func:`levers9.cli.machine_install.service.install`);
    ``join_token`` None: the box must be joined already. ``wheel`` (the controlplane's wheel: URL, sha256) is
    installed with the box's ``python`` when the worker image cannot be sent (:mod:`levers9.cli.machine_install.checks`).
    """
    where = target.where + (f" through {target.jump[0]}@{target.jump[1]}:{target.jump[2]}" if target.jump else "")
    echo(f"[1/{STEPS}] connecting to {where} ...")
    remote = connect(target, echo)
    try:
        echo(f"[1/{STEPS}] connecting to {where} ... ok")
        echo(f"[2/{STEPS}] checking the box ...")
        box = checks.check_box(remote, docker_host=docker_host, min_free_gib=min_free_gib)
        echo(f"[2/{STEPS}] checking the box ... ok: {box.summary()}")
        paths = layout or default_layout(box)
        echo(f"[3/{STEPS}] the agent software ...")
        software = checks.agent_software(
            remote,
            box,
            paths,
            agent_argv=agent_argv,
            image_tar=image_tar,
            image_tag=image_tag,
            image_changes=image_changes,
            echo=echo,
            wheel=wheel,
            ca_pem=ca_pem,
            python=python,
        )
        echo(f"[3/{STEPS}] the agent software ... ok: {software.how}")
        return service.install(
            remote,
            box,
            paths,
            software,
            controlplane=controlplane,
            join_token=join_token,
            ca_pem=ca_pem,
            echo=echo,
            is_live=is_live,
        )
    finally:
        remote.close()
