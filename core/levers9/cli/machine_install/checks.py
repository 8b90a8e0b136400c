"""Steps 2 and 3 of joining a box over SSH: checking the box, and the agent software it will run.

:func:`check_box` answers :class:`~levers9.cli.machine_install.box.BoxFacts` or raises
:class:`~levers9.cli.machine_install.remote.SshJoinError` naming what to install or fix:

* ``target.sudo`` and ``sudo -n true`` fails: passwordless sudo is needed;
* no ``docker`` command, or its daemon unreachable (at ``docker_host`` when
  given): Docker (``apt-get install -y docker.io``) and a running daemon;
* GPUs (``nvidia-smi -L`` lists some) but no ``nvidia`` runtime in ``docker
  info``: the NVIDIA Container Toolkit (``nvidia-container-toolkit``);
* less than ``min_free_gib`` free in Docker's root directory: says how much is.

:func:`agent_software` decides what runs the agent: a stand-in given by the
caller; else a ``levers9`` of this very version already on the box; else the
worker image, sent over the SSH channel into ``docker import`` unless the
box's Docker already has its tag, the agent then running in a container of it
(host network, the Docker socket and the state directory mounted). The image
is built on this machine, so its architecture must match the box's (checked
only when the image is needed). When the image cannot be sent (it cannot be
built here, or the box is of another architecture) and the controlplane gave
its wheel's URL and sha256, levers9 is installed from that wheel into a
virtualenv on the box (``<lib dir>/venv``, with the box's ``python3``): the
wheel is fetched there by :data:`levers9.wheel_fetch.FETCH_PROGRAM` trusting
the controlplane's CA, kept only when its sha256 matches, and that file
pip-installed (its third-party requirements from the index by their own
names; never ``levers9`` by name: another project owns it there).
"""

from __future__ import annotations

import platform
import re
import shlex
from collections.abc import Callable, Sequence
from typing import BinaryIO

from levers9.__about__ import __version__
from levers9.cli.machine_install.box import AgentLayout, AgentSoftware, BoxFacts, same_arch
from levers9.cli.machine_install.remote import STEPS, Remote, SshJoinError
from levers9.wheel_fetch import FETCH_PROGRAM

__all__ = ["ImageUnavailable", "agent_software", "check_box"]

_DEFAULT_SOCKET = "/var/run/docker.sock"
#: making the virtualenv, fetching the wheel and pip installing it (its requirements from the index) on the box
_PIP_TIMEOUT_S = 900.0
_INSTALL_DOCKER = "install Docker: apt-get install -y docker.io (or Docker Engine)"
#: how a box gets levers9 when the worker image cannot be sent: never by name from a package index, where the
#: name levers9 is another project's
_INSTALL_FROM_WHEEL = (
    f"install levers9 {__version__} on the box from the controlplane's own wheel (the command 'levers9 machine "
    "create --pool POOL' prints fetches it and checks its sha256; docs/agents.md), then run this again"
)
_INSTALL_TOOLKIT = (
    "install the NVIDIA Container Toolkit: apt-get install -y nvidia-container-toolkit && "
    "nvidia-ctk runtime configure --runtime=docker && systemctl restart docker"
)


def _facts(remote: Remote) -> dict[str, str]:
    done = remote.run(
        'echo "uid=$(id -u)"; echo "home=$HOME"; echo "arch=$(uname -m)"; '
        "if [ -d /run/systemd/system ]; then echo systemd=1; else echo systemd=0; fi"
    )
    if not done.ok:
        raise SshJoinError(f"[2/{STEPS}] cannot run commands on {remote.target.where}: {done.why()}")
    return dict(line.split("=", 1) for line in done.out.splitlines() if "=" in line)


def _check_sudo(remote: Remote) -> None:
    done = remote.run("true")
    if done.ok:
        return
    if "not found" in done.why() and "sudo" in done.why():
        raise SshJoinError(
            f"[2/{STEPS}] sudo is not installed on the box: install it (apt-get install -y sudo) or log in as root "
            f"(ssh user: root, sudo: false)"
        )
    user = remote.target.user
    raise SshJoinError(
        f"[2/{STEPS}] 'sudo -n true' failed for {user} on the box ({done.why()}): give {user} passwordless sudo "
        f"(a line '{user} ALL=(ALL) NOPASSWD:ALL' in /etc/sudoers.d/levers9) or log in as root"
    )


def _check_docker(remote: Remote, docker_host: str | None, env: str) -> tuple[str, str, str]:
    done = remote.run(
        env + "command -v docker >/dev/null 2>&1 || exit 127; docker version --format '{{.Server.Version}}'"
    )
    where = docker_host or f"unix://{_DEFAULT_SOCKET}"
    if done.rc == 127:
        raise SshJoinError(f"[2/{STEPS}] Docker is not installed on the box (no docker command): {_INSTALL_DOCKER}")
    if not done.ok or not done.out.strip():
        fix = f"{_INSTALL_DOCKER}, and start it (systemctl start docker)"
        if "permission denied" in done.why().lower():
            fix += f"; or let {remote.target.user} use it (usermod -aG docker {remote.target.user}) or set sudo: true"
        raise SshJoinError(
            f"[2/{STEPS}] Docker is not reachable on the box at {where} ({done.why().rstrip('.')}): {fix}"
        )
    info = remote.run(env + "docker info --format '{{.DockerRootDir}}|{{json .Runtimes}}'")
    if not info.ok or "|" not in info.out:
        raise SshJoinError(f"[2/{STEPS}] 'docker info' failed on the box at {where}: {info.why()}")
    root, runtimes = info.out.strip().split("|", 1)
    return done.out.strip().splitlines()[-1], root, runtimes


def _free_gib(remote: Remote, root: str) -> float:
    done = remote.run(f"df -Pk {shlex.quote(root)} | awk 'NR==2 {{print $4}}'")
    try:
        return int(done.out.strip()) / (1024 * 1024)
    except ValueError:
        raise SshJoinError(f"[2/{STEPS}] cannot tell the free disk space in {root} on the box: {done.why()}") from None


def check_box(remote: Remote, *, docker_host: str | None, min_free_gib: float) -> BoxFacts:
    """Step 2: what the box is and has; :class:`SshJoinError` names what it lacks."""
    if remote.target.sudo:
        _check_sudo(remote)
    facts = _facts(remote)
    env = f"DOCKER_HOST={shlex.quote(docker_host)}; export DOCKER_HOST; " if docker_host else ""
    version, root, runtimes = _check_docker(remote, docker_host, env)
    notes: list[str] = []
    smi = remote.run("command -v nvidia-smi >/dev/null 2>&1 || exit 127; nvidia-smi -L")
    gpus = tuple(line.strip() for line in smi.out.splitlines() if line.startswith("GPU ")) if smi.ok else ()
    if smi.rc not in (0, 127):
        notes.append(f"nvidia-smi failed ({smi.why()}): no GPU will be offered until it works")
    if gpus and "nvidia" not in runtimes:
        raise SshJoinError(
            f"[2/{STEPS}] the box has {len(gpus)} GPU(s) but Docker has no 'nvidia' runtime (runtimes: {runtimes}): "
            f"{_INSTALL_TOOLKIT}"
        )
    free = _free_gib(remote, root)
    if free < min_free_gib:
        raise SshJoinError(
            f"[2/{STEPS}] only {free:.1f} GiB free in Docker's root {root} on the box; workers need at least "
            f"{min_free_gib:g} GiB: free some space (docker system prune) or move Docker's data-root"
        )
    try:
        uid = int(facts.get("uid", ""))
    except ValueError:
        raise SshJoinError(f"[2/{STEPS}] 'id -u' gave nothing usable on the box: {facts}") from None
    return BoxFacts(
        uid=uid,
        home=facts.get("home", ""),
        arch=facts.get("arch", "").strip(),
        systemd=facts.get("systemd") == "1",
        docker_host=docker_host,
        docker_version=version,
        docker_root=root,
        runtimes=runtimes,
        free_gib=free,
        gpus=gpus,
        notes=tuple(notes),
    )


class ImageUnavailable(SshJoinError):
    """The worker image cannot be sent from here (it cannot be built, or the box is of another architecture)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        #: the reason alone, without what to do about it
        self.why = why


def _installed(remote: Remote) -> tuple[str, str] | None:
    done = remote.run(
        'for c in "$(command -v levers9 2>/dev/null)" "$HOME/.local/bin/levers9" /usr/local/bin/levers9; do '
        'if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; "$c" --version 2>/dev/null | head -n 1; exit 0; fi; '
        "done; exit 1"
    )
    lines = done.out.splitlines()
    if not done.ok or not lines:
        return None
    version = lines[1].split()[-1] if len(lines) > 1 and lines[1].split() else ""
    return lines[0], version


def _docker_run(box: BoxFacts, layout: AgentLayout, tag: str) -> tuple[str, ...]:
    host = box.docker_host
    docker: tuple[str, ...]
    if host is None or host.startswith("unix://"):
        socket = host.removeprefix("unix://") if host else _DEFAULT_SOCKET
        docker = ("-v", f"{socket}:/var/run/docker.sock", "-e", "DOCKER_HOST=unix:///var/run/docker.sock")
    else:
        docker = ("-e", f"DOCKER_HOST={host}")
    gpus = ("--gpus", "all") if box.gpus else ()
    state = layout.state_dir
    return (
        "docker",
        "run",
        "--rm",
        "--name",
        layout.container_name,
        "--network",
        "host",
        *docker,
        "-v",
        f"{state}:{state}",
        *gpus,
        "--entrypoint",
        "levers9",
        tag,
    )


def _ship_image(
    remote: Remote,
    box: BoxFacts,
    *,
    image_tar: Callable[[BinaryIO], None] | None,
    image_tag: str | None,
    image_changes: Sequence[str] | None,
    echo: Callable[[str], None],
) -> str:
    if image_tar is None or image_tag is None or image_changes is None:
        try:
            from levers9.images import worker
        except ImportError as exc:
            why = f"this levers9 cannot build the worker image ({exc})"
            raise ImageUnavailable(f"[3/{STEPS}] {why}: {_INSTALL_FROM_WHEEL}", why) from exc
        tag = image_tag or str(worker.default_tag())
        write: Callable[[BinaryIO], None] = image_tar or worker.write_rootfs
        changes = (
            list(image_changes) if image_changes is not None else [str(c) for c in worker.import_changes(__version__)]
        )
    else:
        tag, write, changes = image_tag, image_tar, list(image_changes)
    env = box.env()
    if remote.run(env + f"docker image inspect {shlex.quote(tag)} >/dev/null 2>&1").ok:
        echo(f"      the box's Docker has {tag} already: not sent again")
        return tag
    local = platform.machine()
    if not same_arch(box.arch, local):
        why = f"the box is {box.arch} but this machine is {local}: the worker image built here cannot run there"
        raise ImageUnavailable(f"[3/{STEPS}] {why}. {_INSTALL_FROM_WHEEL}", why)
    echo(f"      sending the worker image {tag} to the box (docker import over SSH) ...")
    flags = " ".join(f"--change {shlex.quote(change)}" for change in changes)
    try:
        done = remote.stream(env + f"docker import {flags} - {shlex.quote(tag)}", write)
    except SshJoinError:
        raise
    except Exception as exc:  # the image could not be written here (levers9.images.rootfs.ImageError says why)
        # docker import may have tagged what it got before the stream broke: an image that would be "not sent
        # again" next time, and could never run
        remote.run(env + f"docker rmi -f {shlex.quote(tag)} >/dev/null 2>&1; exit 0")
        why = f"the worker image {tag} could not be built here: {exc}"
        raise ImageUnavailable(f"[3/{STEPS}] {why}", why) from exc
    if not done.ok:
        raise SshJoinError(f"[3/{STEPS}] 'docker import' of {tag} failed on the box: {done.why()}")
    return tag


def _install_wheel(
    remote: Remote, layout: AgentLayout, wheel: tuple[str, str], *, ca_pem: str, python: str
) -> AgentSoftware:
    """levers9 from the controlplane's wheel into ``<lib dir>/venv`` on the box (see the module docstring)."""
    q = shlex.quote
    url, sha256 = wheel
    filename = url.rsplit("/", 1)[-1]
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", filename) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise SshJoinError(f"[3/{STEPS}] the controlplane's wheel {url!r} (sha256 {sha256!r}) is not a wheel's URL")
    lib, venv = layout.lib_dir, f"{layout.lib_dir}/venv"
    path, ca_file = f"{lib}/{filename}", f"{lib}/controlplane-ca.pem" if ca_pem else ""
    if ca_pem:
        done = remote.run(f"umask 077 && mkdir -p {q(lib)} && cat > {q(ca_file)}", stdin=ca_pem.encode())
        if not done.ok:
            raise SshJoinError(f"[3/{STEPS}] cannot write the controlplane's CA to {ca_file} on the box: {done.why()}")
    done = remote.run(
        f"command -v {q(python)} >/dev/null 2>&1 || exit 127; mkdir -p {q(lib)} && "
        f"{{ [ -x {q(venv)}/bin/python ] || {q(python)} -m venv {q(venv)}; }} && "
        f"{q(venv)}/bin/python -c {q(FETCH_PROGRAM)} {q(url)} {q(sha256)} {q(path)} {q(ca_file)} && "
        f"{q(venv)}/bin/python -m pip install --quiet {q(f'levers9[agent] @ file://{path}')} && "
        f"{q(venv)}/bin/levers9 --version",
        timeout=_PIP_TIMEOUT_S,
    )
    if done.rc == 127:
        raise SshJoinError(
            f"[3/{STEPS}] the worker image cannot be used and the box has no {python} to install levers9 with: "
            "install python3 and python3-venv (apt-get install -y python3-venv), then run this again"
        )
    if not done.ok:
        raise SshJoinError(
            f"[3/{STEPS}] installing levers9 from the controlplane's wheel {url} failed on the box: {done.why()}"
        )
    said = done.out.strip().splitlines()
    if not said or said[-1].split()[-1:] != [__version__]:
        raise SshJoinError(
            f"[3/{STEPS}] {venv}/bin/levers9 is not levers9 {__version__} after installing {url}: {done.why()}"
        )
    return AgentSoftware(
        (f"{venv}/bin/levers9",),
        f"levers9 {__version__} installed from the controlplane's wheel (sha256 {sha256[:12]}...) in {venv}",
    )


def agent_software(
    remote: Remote,
    box: BoxFacts,
    layout: AgentLayout,
    *,
    agent_argv: Sequence[str] | None,
    image_tar: Callable[[BinaryIO], None] | None,
    image_tag: str | None,
    image_changes: Sequence[str] | None,
    echo: Callable[[str], None],
    wheel: tuple[str, str] | None = None,
    ca_pem: str = "",
    python: str = "python3",
) -> AgentSoftware:
    """Step 3: the command that stands for ``levers9`` on the box, the worker image shipped if needed, else the
    controlplane's ``wheel`` (URL, sha256) installed with the box's ``python``."""
    if agent_argv is not None:
        return AgentSoftware(tuple(agent_argv), f"the agent command given: {shlex.join(agent_argv)}")
    found = _installed(remote)
    if found is not None and found[1] == __version__:
        return AgentSoftware((found[0],), f"levers9 {__version__} is installed at {found[0]}")
    if found is not None:
        echo(
            f"      {found[0]} is levers9 {found[1] or '(unknown version)'}, not {__version__}: using the worker image"
        )
    try:
        tag = _ship_image(remote, box, image_tar=image_tar, image_tag=image_tag, image_changes=image_changes, echo=echo)
    except ImageUnavailable as exc:
        if wheel is None:
            raise
        echo(f"      {exc.why}: installing levers9 from the controlplane's wheel instead (its sha256 checked) ...")
        return _install_wheel(remote, layout, wheel, ca_pem=ca_pem, python=python)
    return AgentSoftware(
        _docker_run(box, layout, tag), f"the agent runs in a container of {tag}", layout.container_name
    )
