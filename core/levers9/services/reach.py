"""Where the gateway may connect: a serving container's address, checked against the worker that reported it.

A worker says where its endpoint and box containers answer, and the gateway
then opens connections there and relays callers' requests (bodies and tokens of
the deployment's workspace included) and the answers. Left unchecked, that is a
server-side request forgery: a worker reporting ``127.0.0.1:<metrics port>``
made the gateway serve the controlplane's own metrics, and a worker reporting
an address on the controlplane's network (a cloud's metadata service at
169.254.169.254, a database) would have the gateway reach it on its behalf.

The rule (:func:`check`), for an address ``HOST:PORT`` a worker reports:

* through the worker's tunnel, anything: the worker's side of the tunnel
  connects, on the worker's own machine, so the controlplane reaches nothing;
* otherwise ``HOST`` must be an IP address (a name could resolve anywhere, and
  differently on each look), never unspecified, multicast, broadcast or
  link-local (metadata services live there), and the port 1-65535;
* an address of the controlplane's own host (loopback, or one bound to one of
  its interfaces, such as a container bridge's) only from a worker whose
  session comes from this host too, and never a port this process listens on
  (gRPC, HTTP, metrics): a worker elsewhere has no containers here, and the
  controlplane's listeners are no container's;
* from a worker on this host, an address on one of this host's Linux bridges
  (a runc or gVisor container's own address on its worker's bridge), never
  one reached through a router or on any other network the host is on;
* any other address only when it is the address the worker's session comes
  from: its own machine, where its runtime publishes container ports.

A refused address is never stored: the container's start is not reported to
the gateway (which stops waiting for it at its start timeout), and the refusal
is logged and counted like any report on a task not placed on the worker.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket

from levers9.services.reports import ServingReport
from levers9.services.tunnels import SCHEME

__all__ = ["check", "check_report", "is_local", "listening_ports", "on_a_bridge"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(host: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_local(ip: IPAddress) -> bool:
    """Whether ``ip`` is this host's: loopback, or bound to one of its interfaces (a bind to it succeeds)."""
    if ip.is_loopback:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((str(ip), 0))
        return True
    return False


def on_a_bridge(ip: IPAddress) -> bool:
    """Whether ``ip`` is on the subnet of one of this host's Linux bridges, reached without a router (IPv4)."""
    if ip.version != 4:
        return False
    with contextlib.suppress(OSError), open("/proc/net/route") as lines:
        next(lines, None)
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[2] != "00000000":  # through a gateway: another network
                continue
            iface, destination, mask = fields[0], int(fields[1], 16), int(fields[7], 16)
            if mask == 0 or not os.path.isdir(f"/sys/class/net/{iface}/bridge"):
                continue
            # /proc/net/route writes addresses in the host's byte order (little-endian here)
            network = ipaddress.IPv4Network((socket.ntohl(destination), bin(mask).count("1")), strict=False)
            if ip in network:
                return True
    return False


def listening_ports() -> frozenset[int]:
    """The TCP ports this process listens on, on any address (read from /proc: serving reports are rare)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)
            for line in lines:
                fields = line.split()
                # local address, remote, state (0A: LISTEN), ..., inode at index 9
                if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return frozenset(ports)


def check(address: str, *, peer_host: str, own_ports: frozenset[int] | None = None) -> str | None:
    """Why the gateway may not connect to ``address`` for a worker whose session comes from ``peer_host``; None if it may.

    ``peer_host`` is "" when the session's origin is unknown (a unix socket): then only tunnels pass.
    """
    if not address or address.startswith(SCHEME):
        return None
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return f"{address!r} is not HOST:PORT with a port of 1-65535"
    ip = _ip(host)
    if ip is None:
        return f"{address!r} does not name an IP address (a host name could resolve anywhere)"
    if ip.is_unspecified or ip.is_multicast or ip.is_link_local or ip == ipaddress.IPv4Address("255.255.255.255"):
        return f"{address!r} is an unspecified, multicast, broadcast or link-local address"
    peer = _ip(peer_host)
    if peer is None:
        return f"{address!r}: the worker's session comes from no IP address, so only its tunnel can be trusted"
    if is_local(ip):
        if not is_local(peer):
            return f"{address!r} is on the controlplane's host, and the worker's session comes from {peer}"
        if int(port_text) in (listening_ports() if own_ports is None else own_ports):
            return f"{address!r} is one of the controlplane's own listeners"
        return None
    if ip == peer or (is_local(peer) and on_a_bridge(ip)):
        return None
    return f"{address!r} is not the address the worker's session comes from ({peer}), nor a container's on this host"


def check_report(report: ServingReport, *, peer_host: str) -> str | None:
    """:func:`check` for every address of a serving report; the first refusal, or None."""
    for address in (report.address, *report.ports.values()):
        reason = check(address, peer_host=peer_host)
        if reason is not None:
            return reason
    return None
