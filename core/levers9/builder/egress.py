"""A build's way out: an HTTP forward proxy on the bridge's gateway, for the build's own containers only.

Containers on a worker's bridge reach nothing beyond it (:mod:`levers9.engine.network`), and the host
refuses every connection they open to it (:mod:`levers9.engine.host_guard`). Build steps need the
Debian mirror and the Python package index, so while a build runs the worker runs this proxy: it
listens on the bridge's gateway address, on one port the kernel picks, and speaks the two forms of
HTTP proxying package tools use: ``CONNECT host:port`` (a tunnel, for https; pip) and a request with
an absolute ``http://`` URI (plain http; apt).

Who may use it: only the containers the builder admitted (:meth:`EgressProxy.admit`), by address. Each
admission also opens exactly that container's way to exactly the proxy's port in the host guard
(:func:`levers9.engine.host_guard.allow`), and :meth:`EgressProxy.forget` (or :meth:`EgressProxy.close`)
closes it again before the container's address can go to another container. A connection from any
other address is closed unanswered.

Where it goes: names are resolved here, on the host (its ``/etc/hosts`` and resolver), and the
connection goes to the address that was checked, never to a name resolved again. A destination is
refused (``403``, logged, and counted in :attr:`EgressProxy.refusals`) when an address it resolves to
is not a global unicast address (loopback, link-local, private, shared, multicast, reserved ...), is
one of the host's own addresses, or lies in the bridge's subnet, unless the destination's host and
port are among ``allowed``: the hosts the build machine's pip and apt configuration and the
blueprint name (:mod:`levers9.builder.sources`), which may well resolve to private addresses (an
internal mirror). Nothing else is filtered: a step may download from any public host, as a build
step anywhere can.

A worker killed during a build leaves its proxy's rules; the next proxy on the bridge removes every
rule whose port nothing listens on before it listens itself (:func:`levers9.engine.host_guard.sweep_allowances`).

Invariants: :meth:`EgressProxy.close` stops listening, ends every open connection and takes back
every host-guard rule this proxy added; it runs on the caller's event loop and starts no thread, so
nothing of it outlives the build. Plain-http requests go upstream with ``Connection: close`` (one
request per connection), which is why apt is told not to pipeline (:mod:`levers9.builder.steps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from levers9.engine import host_guard
from levers9.engine.network import close_server
from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from levers9.engine.network import Bridge

__all__ = ["MAX_CONNECTIONS", "EgressError", "EgressProxy", "Refusal"]

log = logging.getLogger(__name__)

#: the most connections the proxy carries at once; more are answered 503
MAX_CONNECTIONS = 256
#: the longest request head accepted (request line and headers)
MAX_HEAD_BYTES = 64 * 1024
#: how long a client has to send its request head, and the proxy to connect upstream
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 20.0
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EgressError(Levers9Error):
    """The build's egress proxy could not start (the bridge, its address or the host guard refused)."""


@dataclass(frozen=True)
class Refusal:
    """A request the proxy refused: from which container, to where, and why."""

    client: str
    destination: str
    reason: str

    def __str__(self) -> str:
        return f"build egress refused {self.destination} for {self.client}: {self.reason}"


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class EgressProxy:
    """The proxy of one build (see the module docstring); use as ``async with EgressProxy(...) as proxy``."""

    def __init__(
        self,
        bridge: Bridge,
        *,
        allowed: Collection[tuple[str, int]] = (),
        on_refusal: Callable[[Refusal], None] | None = None,
    ) -> None:
        self.bridge = bridge
        self.allowed = {(host.lower().rstrip("."), port) for host, port in allowed}
        self.on_refusal = on_refusal
        #: every request refused so far
        self.refusals: list[Refusal] = []
        self._admitted: set[str] = set()
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._own: set[Address] = set()
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def host(self) -> str:
        """The address the proxy listens on: the bridge's gateway."""
        return self.bridge.gateway

    @property
    def port(self) -> int:
        if self._port is None:
            raise EgressError("the build's egress proxy has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``http://<gateway>:<port>``: what a step's ``http_proxy`` and ``https_proxy`` are set to."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen on the bridge's gateway (making the bridge and its guard first, as attaching a container does)."""
        if self._server is not None:
            return
        try:
            await asyncio.to_thread(self.bridge.ensure)
            swept = await asyncio.to_thread(host_guard.sweep_allowances, self.bridge.name, tcp_listening)
            for rule in swept:
                log.warning("removed a build proxy's host-guard rule its dead worker left: %s", rule)
            self._own = await asyncio.to_thread(_host_addresses)
            self._server = await asyncio.start_server(self._accepted, self.host, 0, limit=MAX_HEAD_BYTES)
        except (Levers9Error, OSError) as exc:
            raise EgressError(
                f"the build's egress proxy cannot listen on {self.host} ({self.bridge.name}): {exc}"
            ) from exc
        self._port = int(self._server.sockets[0].getsockname()[1])
        log.info("build egress proxy listening on %s", self.url)

    async def close(self) -> None:
        """Stop listening, end every connection, and close every container's way to the proxy."""
        self._closing = True
        server, self._server = self._server, None
        await close_server(server, self._tasks)
        for ip in sorted(self._admitted):
            await self.forget(ip)

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def admit(self, ip: str) -> None:
        """Let the container at ``ip`` use the proxy (and reach its port through the host guard)."""
        port = self.port
        try:
            await asyncio.to_thread(host_guard.allow, self.bridge.name, ip, self.host, port)
        except (host_guard.HostGuardError, ValueError) as exc:
            raise EgressError(f"opening the build proxy's port {port} to {ip} failed: {exc}") from exc
        self._admitted.add(ip)

    async def forget(self, ip: str) -> None:
        """Take back what :meth:`admit` gave ``ip``; its open connections end with it."""
        self._admitted.discard(ip)
        if self._port is not None:
            await asyncio.to_thread(host_guard.disallow, self.bridge.name, ip, self.host, self._port)

    @property
    def admitted(self) -> frozenset[str]:
        return frozenset(self._admitted)

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._tasks)

    # ------------------------------------------------------------------ serving

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        if self._closing or client not in self._admitted:
            if not self._closing:
                self._refuse(client, f"{self.host}:{self._port}", "not a container of this build")
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(client, reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ends = [writer]
        try:
            await self._handle(client, reader, writer, ends)
        except Exception as exc:
            if not _socket_errors_only(exc):
                log.exception("build proxy connection from %s failed", client)
        except BaseException:  # cancelled: the proxy is closing, drop at once
            for end in ends:
                _drop(end)
            raise
        await _close(ends)  # what is still buffered goes out before the connections close

    async def _handle(
        self, client: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: list[asyncio.StreamWriter]
    ) -> None:
        """Answer one proxy request; an upstream connection it opens is appended to ``ends``."""
        if len(self._tasks) > MAX_CONNECTIONS:
            await _answer(writer, 503, f"the build proxy carries {MAX_CONNECTIONS} connections at most")
            return
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            await _answer(writer, 400, "no complete request head (at most 64 KiB, within 30 s)")
            return
        try:
            method, host, port, forward = _parse(head)
            address = await self._check(host, port)
        except _Refused as refused:
            if refused.status == 403:
                self._refuse(client, f"{_show(head)}", refused.reason)
            await _answer(writer, refused.status, refused.reason)
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, upstream = await asyncio.open_connection(str(address), port, limit=MAX_HEAD_BYTES)
        except (OSError, TimeoutError) as exc:
            await _answer(writer, 502, f"{host}:{port} ({address}) could not be reached: {exc or 'timed out'}")
            return
        ends.append(upstream)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            async with asyncio.TaskGroup() as group:
                group.create_task(_copy(reader, upstream))
                group.create_task(_copy(up_reader, writer))
            return
        # One request per connection: upstream was asked to close after its answer, and the client is told
        # the same, so it never sends a second request down a connection that is about to close.
        upstream.write(forward)
        await upstream.drain()
        sending = asyncio.ensure_future(_copy(reader, upstream))  # the request's body, if it has one
        try:
            try:
                response = await up_reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                raise ConnectionError(f"{host}:{port} sent no complete response head") from exc
            writer.write(_closing(response))
            await _copy(up_reader, writer)
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)

    async def _check(self, host: str, port: int) -> Address:
        """The address to connect to for ``host:port``, or _Refused saying why none may be."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise _Refused(502, f"{host} does not resolve: {exc}") from None
        addresses = list(dict.fromkeys(_unmapped(ipaddress.ip_address(info[4][0])) for info in infos))
        if not addresses:
            raise _Refused(502, f"{host} resolves to no address")
        if (host.lower().rstrip("."), port) in self.allowed:
            return addresses[0]
        for address in addresses:
            why = self._forbidden(address)
            if why is not None:
                raise _Refused(
                    403,
                    f"{host}:{port} resolves to {address}, {why}; only hosts the build machine's pip and apt "
                    "configuration or the blueprint's index_url name may be reached there",
                )
        return addresses[0]

    def _forbidden(self, address: Address) -> str | None:
        if address.is_loopback:
            return "a loopback address"
        if address.is_link_local:
            return "a link-local address"
        if address in self._own:
            return "an address of the build machine itself"
        if address.version == 4 and address in self.bridge.network:
            return f"in the containers' subnet {self.bridge.network}"
        if not address.is_global or address.is_multicast:
            return "not a public unicast address"
        return None

    def _refuse(self, client: str, destination: str, reason: str) -> None:
        refusal = Refusal(client=client, destination=destination, reason=reason)
        self.refusals.append(refusal)
        log.warning("%s", refusal)
        if self.on_refusal is not None:
            with contextlib.suppress(Exception):
                self.on_refusal(refusal)


def _parse(head: bytes) -> tuple[str, str, int, bytes]:
    """(method, host, port, the request head to send upstream) of a proxy request, or _Refused (400)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise _Refused(400, "the request head is not text") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "not an HTTP/1.x request line")
    method, target, version = parts
    if method == "CONNECT":
        host, port = _authority(target, None)
        return method, host, port, b""
    if not target.lower().startswith("http://"):
        raise _Refused(400, "a proxied request names an absolute http:// URI (https goes through CONNECT)")
    rest = target[len("http://") :]
    authority, slash, path = rest.partition("/")
    host, port = _authority(authority, 80)
    headers = [line for line in lines[1:] if line and line.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    if not any(line.split(":", 1)[0].strip().lower() == "host" for line in headers):
        headers.insert(0, f"Host: {authority}")
    forward = f"{method} /{path if slash else ''} {version}\r\n" + "".join(f"{h}\r\n" for h in headers)
    return method, host, port, (forward + "Connection: close\r\n\r\n").encode("latin-1")


def _authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if "@" in authority:
        raise _Refused(400, "credentials in a proxied URI are not accepted")
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.partition(":")
    if not port_text and default_port is None:
        raise _Refused(400, f"{authority!r} names no port (CONNECT host:port)")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise _Refused(400, f"{authority!r} has a port that is not a number") from None
    if not host or port is None or not 0 < port < 65536:
        raise _Refused(400, f"{authority!r} is not a host and port")
    return host, port


def _closing(head: bytes) -> bytes:
    """A response head with its connection headers replaced by ``Connection: close``."""
    lines = head.decode("latin-1").split("\r\n")
    kept = [line for line in lines[1:] if line and line.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    return (lines[0] + "\r\n" + "".join(f"{line}\r\n" for line in kept) + "Connection: close\r\n\r\n").encode("latin-1")


async def _close(ends: list[asyncio.StreamWriter]) -> None:
    """Close each connection once what is buffered for it is sent; a peer that stops reading gets 10 s.

    ``abort`` would drop what is still buffered (the end of an answer); cancelled meanwhile, it drops it.
    """
    for end in ends:
        end.close()
    try:
        async with asyncio.timeout(10):
            for end in ends:
                with contextlib.suppress(OSError):
                    await end.wait_closed()
    except TimeoutError:
        for end in ends:
            _drop(end)
    except BaseException:
        for end in ends:
            _drop(end)
        raise


def _drop(end: asyncio.StreamWriter) -> None:
    """Close a connection now, dropping what is buffered for it (one closed already is left as it is)."""
    with contextlib.suppress(AttributeError, RuntimeError):  # asyncio's transport has no loop once closed
        end.transport.abort()


def _unmapped(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _show(head: bytes) -> str:
    """The request line of ``head``, for a refusal's message."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    parts = line.split(" ")
    return parts[1] if len(parts) == 3 else line[:200]


async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}
    body = f"levers9 build proxy: {text}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        writer.write(head.encode() + body)
        await writer.drain()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof() and not writer.is_closing():
        with contextlib.suppress(OSError):
            writer.write_eof()


def _socket_errors_only(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_socket_errors_only(inner) for inner in exc.exceptions)
    return isinstance(exc, OSError)


def _host_addresses() -> set[Address]:
    """Every address of this host's interfaces (``ip -j addr``), or those its name resolves to without ``ip``."""
    found: set[Address] = set()
    try:
        done = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=30, check=False)
        for link in json.loads(done.stdout or "[]"):
            for info in link.get("addr_info", []):
                with contextlib.suppress(KeyError, ValueError):
                    found.add(ipaddress.ip_address(str(info["local"]).split("%")[0]))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    if not found:
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(socket.gethostname(), None):
                found.add(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
    return found


def tcp_listening(address: str, port: int) -> bool:
    """Whether a socket of this network namespace listens on IPv4 ``address:port`` (or on every address)."""
    wanted = {f"{_proc_address(address)}:{port:04X}", f"00000000:{port:04X}"}
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return True  # cannot tell: keep the rule
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and fields[1] in wanted:  # 0A: LISTEN
            return True
    return False


def _proc_address(address: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the 32-bit value in the host's byte order, in hex."""
    return f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}"
