"""Workers the controlplane cannot connect to: deciding which they are, and the tunnels they open to this replica.

Reachability is decided per worker when it registers (:func:`decide_tunnel`):
a machine whose provider declared ``provider_data["reachable"] is False`` is
tunnelled without trying; otherwise the worker names a TCP port it listens on
and a nonce, and the controlplane connects to that port at the address the
worker's call came from (:func:`probe`, one second at most). Reached and
answered with the nonce: the gateway connects to the worker's serving
containers directly, as always. Not reached (a firewall dropping inbound
connections, NAT), or answered by something else: the worker is told to open
its tunnel. A worker that offers no port is taken as reachable (what every
worker was before tunnels).

A tunnelled worker holds the ``Tunnel`` stream open to the replica it
registered with; :class:`TunnelRegistry` keeps one :class:`~levers9.tunnel.mux.Mux`
per worker (a newer tunnel of the same worker replaces the older). The
addresses its serving containers report are rewritten to
``tunnel://<worker_id>/<host>:<port>`` (:func:`through_tunnel`), where
``host:port`` is what the worker connects to locally; the gateway's upstream
opens such an address with :meth:`TunnelRegistry.connect`.

Failures: :class:`NoTunnel` when the worker has no tunnel to this replica
(after waiting ``timeout_s`` for one: a worker just told to open it may not
have yet). With several replicas a gateway request that arrives on a replica
the worker's tunnel does not go to is answered 502 with that message (the
tunnel is not forwarded between replicas). A stream the worker could not
connect raises :class:`~levers9.tunnel.mux.StreamReset` with its reason; a
tunnel that ended fails its streams with
:class:`~levers9.tunnel.mux.TunnelClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import urllib.parse
from collections.abc import AsyncIterable

from levers9.services.reports import ServingReport
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Mux, Send
from levers9.tunnel.streams import TunnelReader, TunnelWriter, open_connection

__all__ = [
    "PROBE_TIMEOUT_S",
    "SCHEME",
    "NoTunnel",
    "TunnelRegistry",
    "decide_tunnel",
    "parse_address",
    "probe",
    "through_tunnel",
]

log = logging.getLogger(__name__)

SCHEME = "tunnel://"
#: how long the controlplane tries to connect to a registering worker
PROBE_TIMEOUT_S = 1.0


class NoTunnel(ConnectionError):
    """The worker holds no tunnel to this replica."""


def tunnel_address(worker_id: str, address: str) -> str:
    return f"{SCHEME}{worker_id}/{address}"


def parse_address(address: str) -> tuple[str, str, int] | None:
    """``(worker_id, host, port)`` of a ``tunnel://`` address; None for any other address."""
    if not address.startswith(SCHEME):
        return None
    worker_id, _, target = address[len(SCHEME) :].partition("/")
    host, _, port = target.rpartition(":")
    if not worker_id or not host or not port.isdigit():
        raise ValueError(f"a tunnel address is tunnel://WORKER_ID/HOST:PORT, not {address!r}")
    return worker_id, host.strip("[]"), int(port)


def through_tunnel(worker_id: str, report: ServingReport) -> ServingReport:
    """A tunnelled worker's serving container, its addresses rewritten to go through the worker's tunnel."""
    return ServingReport(
        report.task_id,
        tunnel_address(worker_id, report.address) if report.address else "",
        {port: tunnel_address(worker_id, address) for port, address in report.ports.items()},
    )


async def probe(host: str, port: int, nonce: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``host:port`` accepts a connection and answers ``nonce`` within ``timeout_s``."""
    if not host or port <= 0 or not nonce:
        return False
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            answer = await reader.readexactly(len(nonce.encode()))
        return secrets.compare_digest(answer, nonce.encode())
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        if writer is not None:
            writer.close()


async def decide_tunnel(
    *, declared_reachable: object, peer_host: str, probe_port: int, probe_nonce: str, worker: str
) -> bool:
    """Whether a registering worker must open a tunnel (see the module's docstring)."""
    if declared_reachable is False:
        log.info("worker %s: its provider declares its machine unreachable; it serves through a tunnel", worker)
        return True
    if declared_reachable is True or not probe_port:
        return False
    if await probe(peer_host, probe_port, probe_nonce):
        return False
    log.info(
        "worker %s: no connection to %s:%d within %g s; it serves through a tunnel",
        worker, peer_host, probe_port, PROBE_TIMEOUT_S,
    )  # fmt: skip
    return True


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); "" for others (unix sockets)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    # gRPC percent-encodes the brackets of an IPv6 peer: ipv6:%5B::1%5D:5
    host = urllib.parse.unquote(rest).rpartition(":")[0]
    return host.strip("[]")


class TunnelRegistry:
    """The tunnels workers hold open to this replica: worker id -> its multiplexed connection."""

    def __init__(self) -> None:
        self._tunnels: dict[str, Mux] = {}
        self._changed = asyncio.Condition()

    def has(self, worker_id: str) -> bool:
        return worker_id in self._tunnels

    async def serve(self, worker_id: str, incoming: AsyncIterable[Frame], send: Send) -> None:
        """Hold a worker's tunnel until it ends; a tunnel the worker held before is closed in its favour."""
        mux = Mux(send, name=worker_id, initiator=True)
        async with self._changed:
            old = self._tunnels.get(worker_id)
            self._tunnels[worker_id] = mux
            self._changed.notify_all()
        if old is not None:
            old.close("the worker opened a new tunnel")
        log.info("worker %s opened its tunnel", worker_id)
        try:
            await mux.run(incoming)
        finally:
            if self._tunnels.get(worker_id) is mux:
                del self._tunnels[worker_id]
            log.info("worker %s's tunnel ended: %s", worker_id, mux.closed)

    async def connect(
        self, worker_id: str, host: str, port: int, *, timeout_s: float = 5.0
    ) -> tuple[TunnelReader, TunnelWriter]:
        """A connection to ``host:port`` as the worker sees it, through its tunnel (see :class:`NoTunnel`)."""
        mux = self._tunnels.get(worker_id)
        if mux is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s), self._changed:
                    await self._changed.wait_for(lambda: worker_id in self._tunnels)
            mux = self._tunnels.get(worker_id)
        if mux is None:
            raise NoTunnel(
                f"worker {worker_id} serves through a tunnel and holds none to this controlplane replica "
                "(with several replicas, the tunnel goes to the one the worker registered with)"
            )
        return await open_connection(mux, host, port, timeout_s=timeout_s)

    async def connect_address(self, address: str, timeout_s: float) -> tuple[TunnelReader, TunnelWriter]:
        """:meth:`connect` for a ``tunnel://`` address (the gateway's upstream seam)."""
        parsed = parse_address(address)
        if parsed is None:
            raise ValueError(f"not a tunnel address: {address!r}")
        worker_id, host, port = parsed
        return await self.connect(worker_id, host, port, timeout_s=timeout_s)

    def close(self) -> None:
        for mux in list(self._tunnels.values()):
            mux.close("the controlplane is stopping")
        self._tunnels.clear()
