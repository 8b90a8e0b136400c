"""Joining a box over SSH: what ``levers9 machine create --ssh`` does on the machine it is given.

:func:`join_over_ssh` connects with paramiko (key file, or the SSH agent and
the default keys; through a bastion's ``direct-tcpip`` channel when a jump
host is given), then runs, each step echoed as it runs:

1. connect, the host key verified against known_hosts (refused when unknown
   and ``strict_host_key_checking``; accepted with a warning, and never
   saved, when not);
2. check the box (:mod:`levers9.agent.ssh_checks`): sudo, Docker reachable,
   the NVIDIA Container Toolkit when it has GPUs, free disk in Docker's root,
   its architecture;
3. the agent software: a ``levers9`` of this version already on the box, else
   the worker image streamed over the SSH channel into ``docker import`` (once:
   a box whose Docker has the tag is not sent it again), the agent then
   running in a container of it; where the image cannot be sent, the
   controlplane's own wheel installed in a virtualenv on the box, its sha256
   checked (never ``levers9`` by name from a package index);
4. the join token written to a 0600 file in the agent's 0700 state directory,
   and the start script (:mod:`levers9.agent.service_unit`);
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

import contextlib
import io
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from levers9.agent.service_unit import AgentLayout

__all__ = ["Remote", "SshJoinError", "SshJoinResult", "SshTarget", "connect", "join_over_ssh"]

STEPS = 6
_COMMAND_TIMEOUT_S = 120.0
_STREAM_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class SshTarget:
    """The box to join and how to reach it (the ``ssh`` block of the ``agent_machine`` settings)."""

    user: str
    host: str
    port: int = 22
    key_file: Path | None = None
    known_hosts_file: Path | None = None
    strict_host_key_checking: bool = True
    #: a bastion to go through: (user, host, port)
    jump: tuple[str, str, int] | None = None
    sudo: bool = False
    connect_timeout_s: float = 10.0

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


class SshJoinError(Exception):
    """A failed step; the message says which step and what to install or fix."""


@dataclass(frozen=True)
class SshJoinResult:
    """How the join went: ``already_joined`` when the box was joined and its agent running before this run."""

    already_joined: bool
    #: the agent id found in the box's credential when it was already joined (read on the box, nothing else)
    agent_id: str | None
    #: ``"systemd"`` or ``"supervisor"``
    service: str


@dataclass(frozen=True)
class Completed:
    """A remote command's exit status and output."""

    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        return (self.err.strip() or self.out.strip() or f"exit status {self.rc}")[-800:]


class _ChannelRaw(io.RawIOBase):
    """A write-only raw stream onto an SSH channel's stdin."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._channel.sendall(view.tobytes())
        return len(view)


class Remote:
    """A connected SSH session to the box; every command through ``sh -c``, under ``sudo -n`` when asked."""

    def __init__(self, client: Any, target: SshTarget, extra: Sequence[Any] = ()) -> None:
        self._client = client
        self._extra = list(extra)  # the bastion's client, closed with this one
        self.target = target

    def close(self) -> None:
        for client in (self._client, *self._extra):
            client.close()

    def _command(self, script: str) -> str:
        wrapped = f"sh -c {shlex.quote(script)}"
        return f"sudo -n {wrapped}" if self.target.sudo else wrapped

    def _open(self, script: str, timeout: float) -> Any:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SshJoinError(f"the SSH connection to {self.target.where} was lost")
        channel = transport.open_session(timeout=timeout)
        channel.settimeout(timeout)
        channel.exec_command(self._command(script))
        return channel

    def run(self, script: str, *, stdin: bytes | None = None, timeout: float = _COMMAND_TIMEOUT_S) -> Completed:
        """Run ``script`` on the box; ``stdin`` (secrets go here, never in ``script``) is sent then closed."""
        channel = self._open(script, timeout)
        try:
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out = channel.makefile("rb").read()
            err = channel.makefile_stderr("rb").read()
            rc = channel.recv_exit_status()
        except TimeoutError as exc:
            raise SshJoinError(f"a command on {self.target.where} did not finish within {timeout:.0f} s") from exc
        finally:
            channel.close()
        return Completed(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(
        self, script: str, write: Callable[[BinaryIO], None], *, timeout: float = _STREAM_TIMEOUT_S
    ) -> Completed:
        """Run ``script`` with ``write(out)`` streaming its stdin (a worker image tarball, for instance)."""
        channel = self._open(script, timeout)
        try:
            out_stream = io.BufferedWriter(_ChannelRaw(channel), buffer_size=1 << 20)
            try:
                write(out_stream)
                out_stream.flush()
            except OSError as exc:  # the command ended early: its stderr says why
                err = channel.makefile_stderr("rb").read().decode(errors="replace")
                return Completed(channel.recv_exit_status() or 1, "", f"{err.strip()} ({exc})")
            except BaseException:  # nothing more to send: let the command end before anything else runs there
                _finish(channel)
                raise
            channel.shutdown_write()
            out = channel.makefile("rb").read()
            err_bytes = channel.makefile_stderr("rb").read()
            rc = channel.recv_exit_status()
        except TimeoutError as exc:
            raise SshJoinError(f"streaming to {self.target.where} did not finish within {timeout:.0f} s") from exc
        finally:
            channel.close()
        return Completed(rc, out.decode(errors="replace"), err_bytes.decode(errors="replace"))


def _finish(channel: Any, wait_s: float = 60.0) -> None:
    """End a command's input and wait (``wait_s`` at most) until it has exited; errors are the caller's to report."""
    with contextlib.suppress(Exception):
        channel.shutdown_write()
        deadline = time.monotonic() + wait_s
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.1)


def _known_hosts(target: SshTarget) -> Path:
    return target.known_hosts_file or Path.home() / ".ssh" / "known_hosts"


def _host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _client(
    user: str,
    host: str,
    port: int,
    target: SshTarget,
    echo: Callable[[str], None],
    *,
    sock: Any = None,
    role: str = "",
) -> Any:
    import paramiko

    where = f"{role}{user}@{host}:{port}"
    known = _known_hosts(target)
    client = paramiko.SSHClient()
    if known.exists():
        try:
            client.get_host_keys().load(str(known))
        except (OSError, paramiko.SSHException) as exc:
            raise SshJoinError(f"[1/{STEPS}] cannot read known_hosts file {known}: {exc}") from exc
    if target.strict_host_key_checking:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:

        class _WarnAndAccept(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
            """Accept an unknown host key for this connection only (never written to known_hosts)."""

            def missing_host_key(self, _client: Any, hostname: str, key: Any) -> None:
                echo(
                    f"      warning: the host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in "
                    f"{known} and was NOT verified (strict_host_key_checking is off)"
                )

        client.set_missing_host_key_policy(_WarnAndAccept())
    key_file = str(target.key_file) if target.key_file else None
    if key_file and not Path(key_file).is_file():
        raise SshJoinError(f"[1/{STEPS}] the key file {key_file} does not exist (key_file of the ssh settings)")
    entry = _host_entry(host, port)
    try:
        client.connect(
            host,
            port=port,
            username=user,
            key_filename=key_file,
            allow_agent=key_file is None,
            look_for_keys=key_file is None,
            timeout=target.connect_timeout_s,
            banner_timeout=target.connect_timeout_s,
            auth_timeout=target.connect_timeout_s,
            sock=sock,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise SshJoinError(
            f"[1/{STEPS}] the host key of {where} does not match the one in {known} (it sent "
            f"{exc.key.get_name()} {exc.key.fingerprint}): someone may be intercepting the connection, or the "
            f"box was reinstalled. If you trust the new key: ssh-keygen -R '{entry}' -f {known}, then "
            f"ssh-keyscan -p {port} {host} >> {known}"
        ) from exc
    except paramiko.AuthenticationException as exc:
        client.close()
        how = f"the key {key_file}" if key_file else "the SSH agent's keys and ~/.ssh/id_*"
        raise SshJoinError(
            f"[1/{STEPS}] authentication as {user} on {host}:{port} failed with {how}: add the public key to "
            f"~{user}/.ssh/authorized_keys on the box, or give key_file"
        ) from exc
    except paramiko.SSHException as exc:
        client.close()
        if "not found in known_hosts" in str(exc):
            raise SshJoinError(
                f"[1/{STEPS}] the host key of {where} is unknown: it is not in {known}. Check the key's "
                f"fingerprint with the box's owner, then add it: ssh-keyscan -p {port} {host} >> {known} "
                f"(or turn strict_host_key_checking off on a trusted network)"
            ) from exc
        raise SshJoinError(f"[1/{STEPS}] SSH to {where} failed: {exc}") from exc
    except TimeoutError as exc:
        client.close()
        raise SshJoinError(
            f"[1/{STEPS}] connecting to {where} timed out after {target.connect_timeout_s:g} s: is the host up and "
            f"the port open to this machine?"
        ) from exc
    except OSError as exc:  # refused, no route, unknown host name (NoValidConnectionsError is one)
        client.close()
        raise SshJoinError(
            f"[1/{STEPS}] cannot reach {where}: {exc.strerror or exc}; is sshd running there and the port open?"
        ) from exc
    return client


def connect(target: SshTarget, echo: Callable[[str], None] = print) -> Remote:
    """An SSH session to ``target`` (through its jump host when it has one); :class:`SshJoinError` says why not."""
    if target.jump is None:
        return Remote(_client(target.user, target.host, target.port, target, echo), target)
    jump_user, jump_host, jump_port = target.jump
    bastion = _client(jump_user, jump_host, jump_port, target, echo, role="bastion ")
    try:
        transport = bastion.get_transport()
        channel = transport.open_channel(
            "direct-tcpip", (target.host, target.port), ("127.0.0.1", 0), timeout=target.connect_timeout_s
        )
    except Exception as exc:
        bastion.close()
        raise SshJoinError(
            f"[1/{STEPS}] the bastion {jump_user}@{jump_host}:{jump_port} could not open a connection to "
            f"{target.host}:{target.port}: {exc} (does its sshd allow TCP forwarding, and can it reach the box?)"
        ) from exc
    try:
        client = _client(target.user, target.host, target.port, target, echo, sock=channel)
    except BaseException:
        bastion.close()
        raise
    return Remote(client, target, extra=[bastion])


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
    has not (removed) joins again with ``join_token`` (:func:`levers9.agent.service_unit.install`);
    ``join_token`` None: the box must be joined already. ``wheel`` (the controlplane's wheel: URL, sha256) is
    installed with the box's ``python`` when the worker image cannot be sent (:mod:`levers9.agent.ssh_checks`).
    """
    from levers9.agent import service_unit, ssh_checks

    where = target.where + (f" through {target.jump[0]}@{target.jump[1]}:{target.jump[2]}" if target.jump else "")
    echo(f"[1/{STEPS}] connecting to {where} ...")
    remote = connect(target, echo)
    try:
        echo(f"[1/{STEPS}] connecting to {where} ... ok")
        echo(f"[2/{STEPS}] checking the box ...")
        box = ssh_checks.check_box(remote, docker_host=docker_host, min_free_gib=min_free_gib)
        echo(f"[2/{STEPS}] checking the box ... ok: {box.summary()}")
        paths = layout or service_unit.default_layout(box)
        echo(f"[3/{STEPS}] the agent software ...")
        software = ssh_checks.agent_software(
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
        return service_unit.install(remote, box, paths, software, controlplane=controlplane, join_token=join_token,
                                    ca_pem=ca_pem, echo=echo, is_live=is_live)  # fmt: skip
    finally:
        remote.close()
