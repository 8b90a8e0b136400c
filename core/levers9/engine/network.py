"""Container networking on a worker: one network namespace per container, a bridge, and forwarded ports.

Each container gets a named network namespace (``/var/run/netns/l9-<hash>``) that the OCI spec
joins by path, so runc and runsc never create networking themselves and a crashed runtime leaves
nothing the worker cannot find again. The namespace is wired to a per-worker Linux bridge with a
veth pair and gets an address from a private subnet; the bridge holds the subnet's first address
and is the namespace's default gateway.

The bridge's MAC address is set, derived from its name (:func:`bridge_mac`): a bridge left to pick its
own takes the lowest MAC of its ports, so removing one container's veth could change it under the others,
whose cached neighbour entry for the gateway then points nowhere: their packets to the host are dropped
for seconds, or until the host next sends them something (seen as a sandbox's process whose end was
never reported).
Likewise an address is given again once its container is gone, and the host's neighbour entry for it
still names the old MAC (reachable for up to half a minute): the host's packets to the new container
went to the old one's MAC, and a runner took 40 s to answer. Attaching flushes the entry.

Nothing here touches ``net.ipv4.ip_forward`` or adds NAT: containers on one bridge talk over the
bridge (layer 2), and the host reaches them through the bridge's route, so nothing needs routing between
interfaces. Containers get no way out to other networks, and no way in to the host either: the gateway
address is the host's own, so every service the host listens on at ``0.0.0.0`` would be reachable there
(and at any other address of the host, which Linux answers on every interface). Nothing a container
legitimately does dials the host: the worker connects to the runner inside the container (through the
forwarded port below), and the gateway's tunnel connects to a serving container's address. So the
bridge is guarded (:mod:`levers9.engine.host_guard`) before any container is attached to it: the host
accepts from the bridge only packets of connections it opened itself, refuses new TCP connections with
a reset, drops the rest, and has IPv6 off on the bridge. This is a rule in the host's ``INPUT`` chain,
not in each container's namespace, because gVisor's own network stack sends through a packet socket that
a namespace's ``OUTPUT`` chain never sees; and it fails closed: where ``iptables`` is missing or refuses,
:meth:`Bridge.ensure` raises and no container is attached. A firewall manager that later rebuilds the
host's ``INPUT`` chain drops the jump until the next :meth:`Bridge.ensure` (every container start) puts
it back first in line.

Each namespace lets its processes bind ports below 1024 (``net.ipv4.ip_unprivileged_port_start`` 0):
the namespace is the container's alone, and the root of a container in a user namespace has no
privilege over a namespace the host made, so it could not bind port 80 otherwise.

Ports are published with a userspace TCP forwarder rather than DNAT rules, because iptables and
nftables cannot be relied on where workers run; it runs in-process (:class:`PortForward`) or as a
standalone process (:func:`forwarder_command`) for runtime plugins, which keep no state between calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from levers9.engine.host_guard import HostGuardError, guard, unguard
from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error

__all__ = [
    "Attachment",
    "Bridge",
    "NetworkError",
    "PortForward",
    "bridge_mac",
    "close_server",
    "forwarder_command",
    "main",
]

log = logging.getLogger(__name__)

#: where ``ip netns`` keeps its namespaces; the path is what the OCI spec refers to
NETNS_DIR = Path("/var/run/netns")
#: the kernel's limit on interface names (IFNAMSIZ less the terminating NUL)
IFNAME_MAX = 15
#: the container-side end of the veth pair, named inside its own namespace where it cannot clash
CONTAINER_IFNAME = "eth0"
#: long enough for a loaded machine, short enough that a wedged ``ip`` does not hang a worker
IP_TIMEOUT_S = 30.0
#: ports from this one up may be bound without privilege; set to 0 inside every container's namespace
UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
#: how long the forwarder waits for the container to accept before dropping the client
CONNECT_TIMEOUT_S = 10.0
_STATE_SUFFIX = ".json"
_LOCK_NAME = ".lock"


class NetworkError(Levers9Error):
    """Setting up or tearing down container networking failed; the message carries the command's own output."""


@dataclass(frozen=True)
class Attachment:
    """One container's place on the bridge, as recorded in the state directory."""

    container_id: str
    netns_path: str
    ip: str
    gateway: str
    prefix_len: int
    veth_host: str
    #: the directory of the container's record in its runtime's state; gone while still attached, the
    #: container's worker was killed and its state removed, and :meth:`Bridge.sweep` detaches it
    owner: str | None = None

    @property
    def netns_name(self) -> str:
        """The name ``ip netns`` knows the namespace by (``ip -n NAME ...``)."""
        return Path(self.netns_path).name


def _digest(container_id: str) -> str:
    return hashlib.sha256(container_id.encode()).hexdigest()


def netns_name(container_id: str) -> str:
    """The namespace name for a container: derived, so cleanup can find it without any state."""
    return f"l9-{_digest(container_id)[:12]}"


def veth_name(container_id: str) -> str:
    """The host-side interface name: a hash, because container ids do not fit in 15 characters."""
    return f"l9h{_digest(container_id)[:10]}"


def _ip_binary() -> str:
    # /usr/sbin is missing from PATH in some service environments, yet that is where Debian puts ip.
    found = shutil.which("ip") or next(
        (str(p) for p in (Path("/usr/sbin/ip"), Path("/sbin/ip"), Path("/usr/bin/ip")) if p.exists()), None
    )
    if found is None:
        raise NetworkError("the `ip` command (iproute2) is not installed: apt-get install -y iproute2")
    return found


def _run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [_ip_binary(), *args]
    shown = shlex.join(["ip", *args])
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise NetworkError(f"`{shown}` did not finish within {IP_TIMEOUT_S:.0f}s") from exc
    except OSError as exc:
        raise NetworkError(f"`{shown}` could not be started: {exc}") from exc
    if check and proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip()) or "no output"
        raise NetworkError(f"`{shown}` failed with exit status {proc.returncode}: {output}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    proc = _run_ip("-j", *args)
    try:
        data = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as exc:
        raise NetworkError(
            f"`ip -j {shlex.join(args)}` printed something that is not JSON: {proc.stdout[:200]!r}"
        ) from exc
    if not isinstance(data, list):
        raise NetworkError(f"`ip -j {shlex.join(args)}` printed {type(data).__name__}, expected a list")
    return [item for item in data if isinstance(item, dict)]


def bridge_mac(name: str) -> str:
    """The MAC address of the bridge ``name``: locally administered, unicast, the same on every ensure."""
    digest = bytearray(hashlib.sha256(f"levers9-bridge:{name}".encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in digest)


def _link(name: str, netns: str | None = None) -> dict[str, Any] | None:
    """The interface's details, or None when there is no such interface."""
    prefix = ("-n", netns) if netns else ()
    proc = _run_ip(*prefix, "-j", "-d", "link", "show", "dev", name, check=False)
    if proc.returncode != 0:
        return None  # none, or gone since: a namespace's veths go when the kernel frees it, asynchronously
    try:
        links = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as exc:
        raise NetworkError(
            f"`ip -j -d link show dev {name}` printed something that is not JSON: {proc.stdout[:200]!r}"
        ) from exc
    return links[0] if isinstance(links, list) and links and isinstance(links[0], dict) else None


def _addresses(netns: str | None = None, dev: str | None = None) -> list[tuple[str, str, int]]:
    """``(interface, address, prefix length)`` for every IPv4 address, optionally of one interface."""
    args = [*(("-n", netns) if netns else ()), "-4", "addr", "show"]
    if dev:
        args += ["dev", dev]
    found = []
    for link in _ip_json(*args):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                found.append((str(link.get("ifname")), str(info["local"]), int(info["prefixlen"])))
    return found


class Bridge:
    """A worker's bridge and the containers attached to it.

    Every change happens under an exclusive ``flock`` on ``state_dir/.lock``, so several worker
    processes (or threads, each call opening its own descriptor) can attach and detach at once
    without handing out an address twice. The state directory holds one JSON file per container,
    written before the interfaces exist, so a crash at any point leaves a record to clean up from.
    """

    def __init__(self, name: str = "l9br0", subnet: str = "10.209.0.0/16", state_dir: Path | None = None) -> None:
        if not name or len(name) > IFNAME_MAX or "/" in name or any(c.isspace() for c in name):
            raise NetworkError(f"bridge name {name!r} is not a valid interface name (1-{IFNAME_MAX} characters)")
        try:
            network = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as exc:
            raise NetworkError(f"subnet {subnet!r} is not an IPv4 network: {exc}") from exc
        if network.prefixlen > 29:
            raise NetworkError(f"subnet {subnet} is too small for a gateway and containers")
        self.name = name
        self.network = network
        self.gateway = str(network.network_address + 1)
        self.state_dir = state_dir if state_dir is not None else Path("/run/levers9/network") / name

    def __repr__(self) -> str:
        return f"Bridge(name={self.name!r}, subnet={str(self.network)!r}, state_dir={str(self.state_dir)!r})"

    # -- public API ---------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the bridge if needed, give it the gateway address and bring it up; safe to repeat."""
        with self._locked():
            self._ensure_locked()

    def attach(self, container_id: str, owner: Path | None = None) -> Attachment:
        """Give the container a namespace on the bridge, or return the one it has; ``owner``: see Attachment."""
        with self._locked():
            self._ensure_locked()
            recorded = self._read_state(container_id)
            if recorded is not None and recorded.container_id != container_id:
                raise NetworkError(
                    f"container ids {container_id!r} and {recorded.container_id!r} hash to the same "
                    f"interface names ({recorded.veth_host}, {recorded.netns_name}); rename one of them"
                )
            if recorded is not None and self._is_wired(recorded):
                return recorded
            # A record without working interfaces is what a crash mid-attach leaves: start over, same address.
            self._unwire(container_id)
            attachment = Attachment(
                container_id=container_id,
                netns_path=str(NETNS_DIR / netns_name(container_id)),
                ip=recorded.ip if recorded is not None else self._allocate_ip(),
                gateway=self.gateway,
                prefix_len=self.network.prefixlen,
                veth_host=veth_name(container_id),
                owner=str(owner) if owner is not None else None,
            )
            self._write_state(attachment)
            try:
                self._wire(attachment)
            except BaseException:
                with contextlib.suppress(NetworkError):
                    self._unwire(container_id)
                self._state_path(container_id).unlink(missing_ok=True)
                raise
            return attachment

    def detach(self, container_id: str) -> None:
        """Delete the container's veth and namespace and release its address; nothing to do is fine."""
        with self._locked():
            recorded = self._read_state(container_id)
            if recorded is not None and recorded.container_id != container_id:
                return  # the names belong to another container whose id hashes the same way
            self._unwire(container_id)
            self._state_path(container_id).unlink(missing_ok=True)

    def sweep(self) -> list[str]:
        """Detach what dead workers left; the container ids detached.

        A record is left over when its owner is gone (a killed worker's, its state removed) or its namespace
        is: under the lock no attachment is half made, so such a record is a crash's or a hand's."""
        gone = []
        with self._locked():
            for attachment in self.attachments():
                orphaned = attachment.owner is not None and not Path(attachment.owner).exists()
                if orphaned or not Path(attachment.netns_path).exists():
                    log.warning(
                        "detaching %s from %s: its owner or its namespace is gone", attachment.container_id, self.name
                    )
                    self._unwire(attachment.container_id)
                    self._state_path(attachment.container_id).unlink(missing_ok=True)
                    gone.append(attachment.container_id)
        return gone

    def attachments(self) -> list[Attachment]:
        """Every container the state directory records, whether or not its interfaces survived."""
        if not self.state_dir.is_dir():
            return []
        found = []
        for path in sorted(self.state_dir.glob(f"l9-*{_STATE_SUFFIX}")):
            attachment = self._load(path)
            if attachment is not None:
                found.append(attachment)
        return sorted(found, key=lambda a: ipaddress.IPv4Address(a.ip))

    def destroy(self) -> None:
        """Detach every container and delete the bridge (and its host guard), including veths no record mentions."""
        with self._locked():
            for attachment in self.attachments():
                self._unwire(attachment.container_id)
                self._state_path(attachment.container_id).unlink(missing_ok=True)
            bridge = _link(self.name)
            if bridge is None:
                self._unguard()
                self._forget_state_dir()
                return
            if self._kind(bridge) != "bridge":
                raise NetworkError(
                    f"{self.name} is a {self._kind(bridge) or 'plain'} interface, not a bridge; left alone"
                )
            for port in _ip_json("link", "show", "master", self.name):
                ifname = str(port.get("ifname", ""))
                if ifname.startswith("l9h"):
                    _run_ip("link", "del", "dev", ifname, check=False)
            _run_ip("link", "del", "dev", self.name)
            self._unguard()
        self._forget_state_dir()

    def _forget_state_dir(self) -> None:
        """The bridge's state directory, once it holds no record (its lock file alone): nothing is left of it."""
        with contextlib.suppress(OSError):
            if not any(p.name != _LOCK_NAME for p in self.state_dir.iterdir()):
                (self.state_dir / _LOCK_NAME).unlink(missing_ok=True)
                self.state_dir.rmdir()

    # -- the bridge ---------------------------------------------------------------------------

    @staticmethod
    def _kind(link: dict[str, Any]) -> str:
        info = link.get("linkinfo") or {}
        return str(info.get("info_kind", "")) if isinstance(info, dict) else ""

    def _ensure_locked(self) -> None:
        bridge = _link(self.name)
        if bridge is None:
            self._check_subnet_free()
            _run_ip("link", "add", "name", self.name, "type", "bridge")
        elif self._kind(bridge) != "bridge":
            raise NetworkError(f"{self.name} exists and is a {self._kind(bridge) or 'plain'} interface, not a bridge")
        have = {(address, prefix) for _, address, prefix in _addresses(dev=self.name)}
        if (self.gateway, self.network.prefixlen) not in have:
            self._check_subnet_free()
            _run_ip("addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self.name)
        mac = bridge_mac(self.name)
        if (bridge or {}).get("address") != mac:
            _run_ip("link", "set", "dev", self.name, "address", mac)
        if "UP" not in (bridge or {}).get("flags", []):
            _run_ip("link", "set", "dev", self.name, "up")
        try:
            guard(self.name)
        except HostGuardError as exc:
            raise NetworkError(str(exc)) from exc

    def _unguard(self) -> None:
        try:
            unguard(self.name)
        except HostGuardError as exc:
            raise NetworkError(str(exc)) from exc

    def _check_subnet_free(self) -> None:
        """Refuse a subnet another interface uses: two routes for it would send traffic the wrong way."""
        for ifname, address, prefix in _addresses():
            if ifname == self.name:
                continue
            if ipaddress.IPv4Network(f"{address}/{prefix}", strict=False).overlaps(self.network):
                raise NetworkError(f"subnet {self.network} overlaps {address}/{prefix} on {ifname}")

    # -- one container ------------------------------------------------------------------------

    def _is_wired(self, attachment: Attachment) -> bool:
        if not Path(attachment.netns_path).exists():
            return False
        host = _link(attachment.veth_host)
        if host is None or host.get("master") != self.name:
            return False
        inside = _addresses(netns=attachment.netns_name, dev=CONTAINER_IFNAME)
        return (CONTAINER_IFNAME, attachment.ip, attachment.prefix_len) in inside

    def _wire(self, a: Attachment) -> None:
        ns = a.netns_name
        _run_ip("netns", "add", ns)
        # The peer is created directly inside the namespace, so its name never exists on the host.
        _run_ip("link", "add", "name", a.veth_host, "type", "veth", "peer", "name", CONTAINER_IFNAME, "netns", ns)
        _run_ip("link", "set", "dev", a.veth_host, "master", self.name)
        _run_ip("link", "set", "dev", a.veth_host, "up")
        _run_ip("-n", ns, "addr", "add", f"{a.ip}/{a.prefix_len}", "dev", CONTAINER_IFNAME)
        _run_ip("-n", ns, "link", "set", "dev", "lo", "up")
        _run_ip("-n", ns, "link", "set", "dev", CONTAINER_IFNAME, "up")
        _run_ip("-n", ns, "route", "add", "default", "via", a.gateway, "dev", CONTAINER_IFNAME)
        _run_ip("netns", "exec", ns, "/bin/sh", "-c", f"echo 0 > {UNPRIVILEGED_PORT_START}")
        # the address may be a removed container's: the host's entry for it names that one's MAC
        _run_ip("neigh", "flush", "to", a.ip, "dev", self.name, check=False)

    def _unwire(self, container_id: str) -> None:
        # The veth goes first and explicitly: deleting the namespace only unmounts it, and the
        # interfaces live on as long as any process (a container still running) holds it.
        veth = veth_name(container_id)
        if _link(veth) is not None:
            deleted = _run_ip("link", "del", "dev", veth, check=False)
            if deleted.returncode != 0 and _link(veth) is not None:  # not a veth the kernel took meanwhile
                _run_ip("link", "del", "dev", veth)  # a real failure: raise with ip's own words
        ns = netns_name(container_id)
        if (NETNS_DIR / ns).exists():
            _run_ip("netns", "del", ns)

    # -- addresses and records ----------------------------------------------------------------

    def _allocate_ip(self) -> str:
        """The lowest free address; only called under the lock, which is what makes it unique."""
        taken = {a.ip for a in self.attachments()} | {self.gateway}
        for host in self.network.hosts():
            if str(host) not in taken:
                return str(host)
        raise NetworkError(f"no free address left in {self.network} on {self.name} ({len(taken) - 1} in use)")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _state_path(self, container_id: str) -> Path:
        return self.state_dir / f"{netns_name(container_id)}{_STATE_SUFFIX}"

    def _read_state(self, container_id: str) -> Attachment | None:
        return self._load(self._state_path(container_id))

    @staticmethod
    def _load(path: Path) -> Attachment | None:
        try:
            data = json.loads(path.read_text())
            return Attachment(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise NetworkError(f"network state file {path} is unreadable: {exc}") from exc

    def _write_state(self, attachment: Attachment) -> None:
        # Written whole then renamed, so no reader (attachments(), another process) sees half a record.
        write_atomic(self._state_path(attachment.container_id), json.dumps(asdict(attachment), indent=2) + "\n")


async def close_server(server: asyncio.AbstractServer | None, tasks: set[asyncio.Task[None]]) -> None:
    """Stop ``server`` listening and cancel the connections' ``tasks``, returning once all have ended.

    The caller sets its own closing flag first, so that a connection accepted in the meantime is dropped.
    """
    if server is not None:
        server.close()
    running = list(tasks)
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    if server is not None:
        await server.wait_closed()


class PortForward:
    """A userspace TCP forwarder: host 127.0.0.1:<host_port> (or a given bind address) -> container ip:port.

    Each accepted connection opens its own connection to the target and copies bytes both ways;
    end of file in one direction shuts down writing in the same direction on the other side, so
    protocols that half-close (send a request, then read until EOF) work through it.
    """

    def __init__(self, target_host: str, target_port: int, *, bind_host: str = "127.0.0.1", bind_port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.bind_host = bind_host
        self.bind_port = bind_port
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def port(self) -> int:
        """The bound host port; only known once :meth:`start` returned."""
        if self._port is None:
            raise NetworkError("the port forward has not been started")
        return self._port

    async def start(self) -> int:
        """Listen, and return the host port (the kernel's choice when ``bind_port`` is 0)."""
        if self._server is not None:
            return self.port
        # A plain callback, not a coroutine: the task is created and recorded at once, so close() sees every one.
        self._server = await asyncio.start_server(self._accepted, self.bind_host, self.bind_port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def close(self) -> None:
        """Stop listening and drop every open connection, waiting until their tasks have finished."""
        self._closing = True
        server, self._server = self._server, None
        await close_server(server, self._tasks)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            # Accepted in the moment before close() stopped listening: drop it rather than start a task.
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        writers = [client_writer]
        try:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    target_reader, target_writer = await asyncio.open_connection(self.target_host, self.target_port)
            except (OSError, TimeoutError) as exc:
                log.info("port forward: %s:%s unreachable: %s", self.target_host, self.target_port, exc)
                return
            writers.append(target_writer)
            async with asyncio.TaskGroup() as group:
                group.create_task(_copy(client_reader, target_writer))
                group.create_task(_copy(target_reader, client_writer))
            for writer in writers:
                writer.close()
            for writer in writers:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        except Exception as exc:
            # A reset on one side is how TCP connections often end; the finally below passes it on as a reset.
            if _socket_errors_only(exc):
                log.debug("port forward connection ended by a socket error: %s", exc)
            else:
                log.exception("port forward connection to %s:%s failed", self.target_host, self.target_port)
        finally:
            # Harmless after a clean close; on cancellation or error it drops whatever was left at once.
            for writer in writers:
                writer.transport.abort()


def _socket_errors_only(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_socket_errors_only(inner) for inner in exc.exceptions)
    return isinstance(exc, OSError)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof() and not writer.is_closing():
        writer.write_eof()


def forwarder_command(
    target_host: str, target_port: int, bind_host: str, bind_port: int, ready_file: Path
) -> list[str]:
    """The argv of a standalone forwarder process, for runtimes that keep no event loop of their own.

    The process writes the bound port to ``ready_file`` (atomically) once it listens and exits
    with status 0 on SIGTERM or SIGINT, after closing every connection.
    """
    return [
        sys.executable,
        "-m",
        "levers9.engine.network",
        "--forward",
        "--target-host",
        target_host,
        "--target-port",
        str(target_port),
        "--bind-host",
        bind_host,
        "--bind-port",
        str(bind_port),
        "--ready-file",
        str(ready_file),
    ]


async def _run_forwarder(forward: PortForward, ready_file: Path) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        port = await forward.start()
        write_atomic(ready_file, f"{port}\n")
        await stop.wait()
    finally:
        await forward.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m levers9.engine.network --forward ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m levers9.engine.network", description="Forward a TCP port to a container."
    )
    parser.add_argument("--forward", action="store_true", required=True, help="run a TCP port forwarder")
    parser.add_argument("--target-host", required=True)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--bind-host", default="127.0.0.1")
    parser.add_argument("--bind-port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True, help="receives the bound port once listening")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    forward = PortForward(args.target_host, args.target_port, bind_host=args.bind_host, bind_port=args.bind_port)
    try:
        asyncio.run(_run_forwarder(forward, args.ready_file))
    except OSError as exc:
        print(
            f"port forward {args.bind_host}:{args.bind_port} -> {args.target_host}:{args.target_port}: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
