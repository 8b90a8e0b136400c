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

With several replicas, any replica serves any gateway request: each records
in Redis the tunnels it holds and the address the others reach it at
(:mod:`levers9.services.tunnel_holders`), and a replica asked for a worker
whose tunnel another holds opens a relay to that one (the ``Replica.Relay``
gRPC call, authenticated by the replicas' shared credential), which connects
through the tunnel and passes bytes both ways: a byte pipe, so a streamed or
long response passes as it does through a local tunnel. A relay never goes
further than the holder (:meth:`TunnelRegistry.connect_here`), so it cannot loop.

Failures: :class:`NoTunnel` when neither this replica nor one named in Redis
holds the worker's tunnel within ``timeout_s``: a worker just told to open it
may not have yet, and a holder that is gone (its entry not yet expired, the
relay failing with :class:`~levers9.services.tunnel_holders.RelayFailed`) is
waited past while the worker dials again; the gateway answers 502 with its
message, which names the worker. A stream the worker could not connect
raises :class:`~levers9.tunnel.mux.StreamReset` with its reason (through a
relay, ``ConnectionRefusedError``); a tunnel that ended fails its streams
with :class:`~levers9.tunnel.mux.TunnelClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import urllib.parse
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

from levers9.services.reports import ServingReport
from levers9.services.tunnel_holders import RelayFailed, TunnelHolders
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Mux, Send
from levers9.tunnel.streams import TunnelReader, TunnelWriter, open_connection

__all__ = [
    "PROBE_TIMEOUT_S",
    "SCHEME",
    "NoTunnel",
    "RelayDial",
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
    """The worker holds no tunnel to this replica (nor, with relays, to any replica named in Redis)."""


#: opens a relay through the replica at ADDRESS: ``(address, worker_id, host, port, timeout_s)`` -> a
#: reader/writer pair; raises RelayFailed when that replica cannot serve it, ConnectionRefusedError when the
#: worker could not connect
RelayDial = Callable[[str, str, str, int, float], Awaitable[tuple[Any, Any]]]
#: how often a wait for a worker's tunnel looks in Redis again for a holder elsewhere
_LOOK_AGAIN_S = 0.25


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
        worker,
        peer_host,
        probe_port,
        PROBE_TIMEOUT_S,
    )
    return True


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string; "" for a peer with no IP address (``unix:``, ``unix-abstract:``).

    gRPC writes ``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5`` and, in some versions, percent-encodes the IPv6 form
    (``ipv6:%5B::1%5D:5``, a zone as ``%25``: ``ipv6:%5Bfe80::1%25eth0%5D:5``). An IPv4-mapped IPv6 address
    (a dual-stack listener's IPv4 peer) is given as the IPv4 address.
    """
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = urllib.parse.unquote(rest).rpartition(":")[0]
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if kind == "ipv6" and host.lower().startswith("::ffff:") and host.count(".") == 3:
        return host[7:]
    return host


class TunnelRegistry:
    """The tunnels workers hold open to this replica: worker id -> its multiplexed connection.

    With ``holders`` and ``relay`` (several replicas), the tunnels held here are recorded in Redis and a
    worker's tunnel held by another replica is reached through a relay to it (see the module's docstring).
    """

    def __init__(self, holders: TunnelHolders | None = None, relay: RelayDial | None = None) -> None:
        self._tunnels: dict[str, Mux] = {}
        self._changed = asyncio.Condition()
        self.holders = holders
        self.relay = relay

    def has(self, worker_id: str) -> bool:
        return worker_id in self._tunnels

    def held(self) -> list[str]:
        """The workers whose tunnels this replica holds."""
        return list(self._tunnels)

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
        if self.holders is not None:
            await self.holders.held(worker_id)
        try:
            await mux.run(incoming)
        finally:
            if self._tunnels.get(worker_id) is mux:
                del self._tunnels[worker_id]
                if self.holders is not None:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(self.holders.released(worker_id))
            log.info("worker %s's tunnel ended: %s", worker_id, mux.closed)

    async def connect_here(
        self, worker_id: str, host: str, port: int, *, timeout_s: float = 5.0
    ) -> tuple[TunnelReader, TunnelWriter]:
        """A connection through the worker's tunnel held by this replica, waiting ``timeout_s`` for it; never
        relayed (what a relay from another replica opens)."""
        mux = self._tunnels.get(worker_id)
        if mux is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s), self._changed:
                    await self._changed.wait_for(lambda: worker_id in self._tunnels)
            mux = self._tunnels.get(worker_id)
        if mux is None:
            raise NoTunnel(f"worker {worker_id} serves through a tunnel and holds none to this controlplane replica")
        return await open_connection(mux, host, port, timeout_s=timeout_s)

    async def connect(self, worker_id: str, host: str, port: int, *, timeout_s: float = 5.0) -> tuple[Any, Any]:
        """A connection to ``host:port`` as the worker sees it, through its tunnel here or a relay to the
        replica holding it; :class:`NoTunnel` when none holds it within ``timeout_s``."""
        if self.holders is None or self.relay is None:
            return await self.connect_here(worker_id, host, port, timeout_s=timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        why = "no controlplane replica is recorded as holding it"
        while True:
            mux = self._tunnels.get(worker_id)
            if mux is not None:
                return await open_connection(mux, host, port, timeout_s=max(0.1, deadline - loop.time()))
            holder = await self.holders.holder(worker_id)
            if holder is not None and holder[0] != self.holders.replica:
                replica, address = holder
                try:
                    return await self.relay(address, worker_id, host, port, max(0.1, deadline - loop.time()))
                except RelayFailed as exc:
                    why = f"replica {replica} at {address}, recorded as holding it, did not relay: {exc}"
            left = deadline - loop.time()
            if left <= 0:
                raise NoTunnel(
                    f"worker {worker_id} serves through a tunnel and no controlplane replica holds "
                    f"one within {timeout_s:g} s ({why})"
                )
            # a tunnel opening here ends the wait at once; one opening elsewhere is seen at the next look
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, _LOOK_AGAIN_S)), self._changed:
                    await self._changed.wait_for(lambda: worker_id in self._tunnels)

    async def connect_address(self, address: str, timeout_s: float) -> tuple[Any, Any]:
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
