"""Step 1 of ``machine create --ssh``: the SSH session to the box, and the errors and results every step shares.

:func:`connect` connects with paramiko (key file, or the SSH agent and the
default keys; through a bastion's ``direct-tcpip`` channel when a jump host is
given) and verifies the host key against known_hosts (refused when unknown and
``strict_host_key_checking``; accepted with a warning, and never saved, when
not). :class:`Remote` runs each command through ``sh -c``, under ``sudo -n``
when ``target.sudo``. A failed step raises :class:`SshJoinError`, whose message
says which step failed and what to install or fix. paramiko is imported inside
functions.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["STEPS", "Completed", "Remote", "SshJoinError", "SshJoinResult", "SshTarget", "connect"]

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
