"""One controlplane process: gRPC, HTTP and metrics listeners over one set of services, stopped gracefully.

Start-up order matters: the database is migrated and the backlog rebuilt from
SQL before any listener opens, so the first worker that reconnects after a
restart finds its tasks already queued. Shutdown runs the other way: the
long-lived streams end at once with UNAVAILABLE (workers' sessions and tunnels,
agents' streams, watches, followed logs: their other side dials another
replica), the listeners stop taking calls (in-flight ones get ``grace_s`` to
finish), then the scheduler and the stores close.

With ``listen.tls`` every listener (gRPC, HTTP, metrics) serves TLS with one
certificate, re-read when its files change (:mod:`levers9.controlplane.tls`).
Without it the listeners are plain text, which is refused on an address other
machines can reach unless ``listen.plaintext`` says so.

Every listener holds a bounded number of connections, below the process's
descriptor limit (raised to its hard limit first), so no flood of clients can
take the descriptors the rest of the process needs
(:mod:`levers9.controlplane.limits`): the HTTP listeners cap, evict and refuse
in their sockets (:mod:`levers9.controlplane.listener`) and time out slow
requests in their protocols (:mod:`levers9.controlplane.http_deadlines`); gRPC
closes connections over its own cap and those whose handshake takes longer than
the header timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import uvicorn

from levers9.config.replica_address import replica_address
from levers9.controlplane.grpc_agent import AgentService
from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.grpc_replica import RelayDialer, ReplicaService
from levers9.controlplane.grpc_volumes import VolumesService
from levers9.controlplane.grpc_worker import WorkerService
from levers9.controlplane.http import create_http_app
from levers9.controlplane.http_deadlines import GuardedHttpTools
from levers9.controlplane.http_front import FrontProtocol
from levers9.controlplane.limits import Budget, plan, raise_descriptor_limit
from levers9.controlplane.listener import EVENTS, Listener, quiet_accept_failures
from levers9.controlplane.observe import GrpcMetricsInterceptor, HttpMetricsMiddleware
from levers9.controlplane.registry_proxy import RegistryProxy, WithRegistry
from levers9.controlplane.tls import ListenerTls, check_plaintext
from levers9.controlplane.wheels import OwnWheels
from levers9.gateway.autoscaler import ServingAutoscaler
from levers9.gateway.routes import GatewayApp
from levers9.gateway.shortpath import ShortPath
from levers9.gateway.upstream import Upstream
from levers9.hooks.errors import Levers9Error
from levers9.payloads import MESSAGE_MAX_BYTES
from levers9.proto.v1 import agent_pb2_grpc, controlplane_pb2_grpc, replica_pb2_grpc, volume_pb2_grpc, worker_pb2_grpc
from levers9.services.agent_pools import clusters
from levers9.services.agents import AgentHub
from levers9.services.builds import Builds, RegistryTarget
from levers9.services.core import Services, open_services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.metrics import Metrics
from levers9.services.plugin_metrics import PluginSeries
from levers9.services.replica_name import ReplicaNameClaim, process_identity, replica_name
from levers9.services.sandboxes import SandboxService
from levers9.services.tunnel_holders import TunnelHolders, configured_credentials
from levers9.services.tunnels import TunnelRegistry

if TYPE_CHECKING:
    from levers9.config.load import LoadedConfig
    from levers9.config.model import TlsConfig

__all__ = ["GRPC_OPTIONS", "STOP_GRACE_S", "Listeners", "Server", "serve", "stop_grace_s"]

log = logging.getLogger(__name__)

#: the interpreter's switch interval in the controlplane process (see serve)
SWITCH_INTERVAL_S = 0.0005

#: how long the calls in flight at a stop get to finish, unless ``$LEVERS9_STOP_GRACE_S`` says otherwise
STOP_GRACE_S = 10.0

GRPC_OPTIONS = [
    # gRPC shares a port with any other process by default (SO_REUSEPORT): a second controlplane would
    # then take half of the first one's calls instead of failing to start
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
    # pinged after 60 s of silence: workers (every few seconds), agents (every 30 s) and SDK clients (their own
    # pings) are never silent that long while alive, so on a busy controlplane these pings are for dead peers only
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    # A fixed 4 MiB window per stream for what clients send (uploads: 4 MiB per round trip, 80 MiB/s at 50 ms)
    # instead of gRPC's bandwidth probing, which sends a PING on nearly every message that arrives: with a
    # thousand agents heartbeating that was a third of the controlplane's socket work (bench/RESULTS.md,
    # "Agent machines"). grpc-java runs a fixed window by default too. What the controlplane sends is
    # governed by the client's window, which still probes.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 * 1024 * 1024),
]


@dataclass(frozen=True)
class Listeners:
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    #: ``listen.tls``: every listener serves TLS with it; None: plain text
    tls: TlsConfig | None = None
    #: ``listen.plaintext``: plain text allowed on a non-loopback host
    plaintext: bool = False
    #: ``listen.advertise``: the addresses workers dial, when this host's own is not the one
    advertise: tuple[str, ...] = field(default=())
    #: ``listen.advertise_http``: the HTTP listener's address, when it is not derived from ``advertise``
    advertise_http: str | None = None
    #: ``listen.replica_address``: where the other replicas reach this one, when not derived
    replica_address: str | None = None

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> Listeners:
        listen = loaded.config.listen
        return cls(
            listen.host,
            listen.grpc_port,
            listen.http_port,
            listen.metrics_port,
            tls=listen.tls,
            plaintext=listen.plaintext,
            advertise=tuple(listen.advertise),
            advertise_http=listen.advertise_http,
            replica_address=listen.replica_address,
        )

    def relay_address(self) -> str:
        """HOST:PORT the other replicas dial this one's gRPC listener at (relays through the tunnels held here):
        ``listen.replica_address``, else ``$LEVERS9_REPLICA_ADDRESS``, else this host and the gRPC port."""
        if self.replica_address:
            return self.replica_address
        explicit = os.environ.get("LEVERS9_REPLICA_ADDRESS", "").strip()
        if explicit:
            return replica_address(explicit, "$LEVERS9_REPLICA_ADDRESS")
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        return f"[{host}]:{self.grpc_port}" if ":" in host else f"{host}:{self.grpc_port}"

    def advertised_grpc(self) -> str:
        """The address(es) workers dial: ``listen.advertise`` (comma-joined), else ``$LEVERS9_ADVERTISE_URL``,
        else this host and the gRPC port, ``grpcs://`` with TLS and ``grpc://`` without."""
        if self.advertise:
            return ",".join(self.advertise)
        explicit = os.environ.get("LEVERS9_ADVERTISE_URL")
        if explicit:
            return explicit
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        if ":" in host:
            host = f"[{host}]"
        return f"{'grpcs' if self.tls is not None else 'grpc'}://{host}:{self.grpc_port}"

    def advertised_http(self) -> str:
        """The HTTP listener's URL as workers reach it (the registry host of built images' refs):
        ``listen.advertise_http``, else the host of the first advertised gRPC address with ``listen.http_port``,
        ``https://`` with TLS and ``http://`` without."""
        if self.advertise_http:
            return self.advertise_http
        first = self.advertised_grpc().split(",")[0].strip()
        parts = urllib.parse.urlsplit(first if "://" in first else f"grpc://{first}")
        host = parts.hostname or self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.http_port}"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the server process decides when to stop.

    Its main loop wakes once a second, not ten times: uvicorn's own loop sleeps 0.1 s between ticks, yet
    its tick's work (the date header, checking whether to exit) is per second; at rest those extra
    wake-ups were a third of the idle controlplane's. :meth:`exit` wakes it at once.
    """

    _woken: asyncio.Event | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        while not await self.on_tick(0):  # a tick of 0 refreshes the date header
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 1.0)

    def exit(self) -> None:
        """Stop serving, without waiting for idle keep-alive connections."""
        self.should_exit = True
        self.force_exit = True
        if self._woken is not None:
            self._woken.set()


class _UvicornConfig(uvicorn.Config):
    """uvicorn's config with a context of ours: one that follows certificate renewals, which the context
    uvicorn builds from ``ssl_certfile`` would not. Set after ``load()`` (every uvicorn version builds its own
    there); uvicorn hands ``config.ssl`` to the event loop's ``create_server``. It also carries what the
    protocols of ours read: the short path, the listener and the request timeouts."""

    def __init__(
        self,
        app: Any,
        *,
        ssl_context: ssl.SSLContext | None,
        short_path: ShortPath | None = None,
        listener: Listener | None = None,
        header_timeout_s: float,
        body_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._ssl_context = ssl_context
        #: read by the HTTP front (:class:`FrontProtocol`), which offers it every simple request first
        self.short_path = short_path
        #: told by the protocols when a connection sent its first head, and of their timeouts
        self.listener = listener
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s

    def load(self) -> None:
        super().load()
        if self._ssl_context is not None:
            self.ssl = self._ssl_context


class Server:
    def __init__(
        self, loaded: LoadedConfig, listeners: Listeners | None = None, *, replica_name: str | None = None
    ) -> None:
        self.loaded = loaded
        #: ``--replica-name``; None: listen.replica_name, else the host name (see levers9.services.replica_name)
        self.replica_name = replica_name
        #: this replica's hold on its name in Redis, while it runs
        self.name_claim: ReplicaNameClaim | None = None
        self.listeners = listeners or Listeners.from_config(loaded)
        self.services: Services | None = None
        self.metrics = Metrics()
        self._grpc: grpc.aio.Server | None = None
        self._http: list[_Uvicorn] = []
        self._tasks: list[asyncio.Task[Any]] = []
        #: the HTTP listeners' sockets, bound before anything starts and served by uvicorn
        self._sockets: list[socket.socket] = []
        self.hub: Hub | None = None
        #: the agents' streams on this replica, and what provider plugins send them
        self.agents: AgentHub | None = None
        self._plugins_started = False
        self.dataplane: DataPlane | None = None
        self.serving: ServingAutoscaler | None = None
        self.upstream: Upstream | None = None
        self.short_path: ShortPath | None = None
        self.tunnels: TunnelRegistry | None = None
        self.sandboxes: SandboxService | None = None
        #: this replica's tunnels and relay address in Redis, and its relays through the other replicas' tunnels
        self.tunnel_holders: TunnelHolders | None = None
        self.relays: RelayDialer | None = None
        #: blueprint builds, into the registry this controlplane serves under /v2/; None without a registry
        self.builds: Builds | None = None
        #: the listeners' certificate, with ``listen.tls``
        self.tls: ListenerTls | None = None
        #: the connection caps, worked out at start from the descriptor limit
        self.budget: Budget | None = None
        self._restore_exception_handler: Any = None

    async def start(self, progress: Callable[[str], None] | None = None) -> None:
        """Open the state, start the parts and listen; ``progress`` hears each step as it begins (`levers9 up`
        prints them, so a start of several seconds is not a silent one)."""
        say = progress or (lambda _step: None)
        ls = self.listeners
        # Before anything opens: a controlplane that may not (or cannot) serve must not start machines.
        check_plaintext(ls.host, ls.tls, ls.plaintext)
        listen = self.loaded.config.listen
        budget = self.budget = plan(
            raise_descriptor_limit(),
            http=listen.max_connections,
            http_per_client=listen.max_connections_per_client,
            grpc=listen.grpc_max_connections,
        )
        self.tls = ListenerTls(ls.tls) if ls.tls is not None else None
        ca = self.tls.ca_pem if self.tls is not None else ""
        name = replica_name(self.replica_name, listen.replica_name)  # stable; the process has its own identity
        say("opening the database and Redis")
        services = self.services = await open_services(
            self.loaded, controlplane_url=ls.advertised_grpc(), controlplane_ca=ca, identity=process_identity(name)
        )
        try:
            await self._claim_name(services, name)
            credentials = await self._assemble(services, ca)
            wheels = OwnWheels(self.listeners.advertised_http())  # levers9's own wheel, for join commands
            services.scheduler.ctx.wheel = wheels.url_and_hash  # and for booted machines without levers9
            # The ports are taken before anything starts: a controlplane that cannot listen must not
            # have begun provisioning machines for its pools.
            server = self._grpc_server(services, credentials, wheels)
            http_socket, metrics_socket = self._bind_http()
            self._restore_exception_handler = quiet_accept_failures(asyncio.get_running_loop())
            say("starting the scheduler, the pools and gRPC")
            await self._start_parts(services, server)
            say("serving HTTP")
            await self._serve_http(services, wheels, http_socket, metrics_socket)
            self._tasks.append(asyncio.create_task(self._refresh_metrics(), name="metrics"))
            # last: a restart of the embedded Redis runs what the steps above did to fill it
            services.supervise_redis(self._redis_restarted, on_restart=self.metrics.embedded_redis_restarted)
            services.watch_redis(self._redis_restarted)  # a configured one: after a failover, restart or flush
        except BaseException:
            await self.stop()
            raise
        # What start-up made (imported modules, the app, the stores) lives as long as the process: kept out
        # of the collector's full passes, which would otherwise walk it all and stall every request for
        # tens of milliseconds a few times a second under load.
        gc.freeze()
        log.info(
            "levers9 controlplane listening%s: gRPC %s:%d, HTTP :%d, metrics :%d",
            " over TLS" if self.tls is not None else "",
            ls.host,
            ls.grpc_port,
            ls.http_port,
            ls.metrics_port,
        )
        log.info(
            "connection caps, of %d file descriptors: HTTP %d (%s per client address), gRPC %d, metrics %d; "
            "%d left to the rest",
            budget.descriptors,
            budget.http,
            budget.http_per_client or "no cap",
            budget.grpc,
            budget.metrics,
            budget.reserve,
        )

    async def _claim_name(self, services: Services, name: str) -> None:
        """Before anything acts: a second live replica under one name is refused, not run."""
        self.name_claim = ReplicaNameClaim(services.redis, name, services.scheduler.name)
        await self.name_claim.claim()
        log.info("replica %s (this process: %s)", name, services.scheduler.name)
        self.metrics.replica = name  # the label of its series, the same after a restart
        self.metrics.seed(services.pools.values())  # counters at 0, so increase() sees a first burst
        services.scheduler.ctx.on_provisioned = self.metrics.provisioned
        services.scheduler.ctx.on_event = self.metrics.scheduler_event

    async def _assemble(self, services: Services, ca: str) -> list[str]:
        """The replica's parts (hubs, dataplane, autoscaler, tunnels, gateway upstream, builds), none started
        yet but the registry; returns the replicas' shared credentials."""
        ls = self.listeners
        self.hub = Hub(services.redis, name=services.scheduler.name)
        self.agents = AgentHub(services.redis, name=services.scheduler.name)
        self.dataplane = DataPlane(services, self.hub, self.metrics)
        self.serving = ServingAutoscaler(self.dataplane, metrics=self.metrics)
        # workers' tunnels to this replica, and relays to those other replicas hold: the gateway's way to them
        state = self.loaded.config.state
        credentials = configured_credentials(state.secret_key_file, self.loaded.config.data_dir)
        self.tunnel_holders = TunnelHolders(services.redis, replica=services.scheduler.name, address=ls.relay_address())
        self.relays = RelayDialer(credentials[0], tls=self.tls is not None, ca_pem=ca)
        self.tunnels = TunnelRegistry(self.tunnel_holders, self.relays)
        self.upstream = Upstream(tunnel=self.tunnels.connect_address)
        # sandboxes, reached through the same tunnels (or relays to the replica holding one)
        tunnels = self.tunnels
        dataplane = self.dataplane
        self.sandboxes = SandboxService(
            services,
            lambda worker, host, port, timeout: tunnels.connect(worker, host, port, timeout_s=timeout),
            registry_host=lambda: dataplane.registry_host,
            http_url=ls.advertised_http(),
        )
        # built images are named by this controlplane's HTTP address, which relays /v2/ to the registry; a
        # stub may name only its own workspace's images there, whether or not the registry is up
        target = RegistryTarget(
            url=ls.advertised_http(), repository_prefix=self.loaded.config.registry.repository_prefix
        )
        self.dataplane.registry_host = target.host
        await services.registry.start()
        if services.registry.problem is None:
            self.builds = Builds(self.dataplane, target)
        return credentials

    def _grpc_server(self, services: Services, credentials: list[str], wheels: OwnWheels) -> grpc.aio.Server:
        """The gRPC server with every service added, its port bound (OSError naming the address if it cannot be)."""
        assert self.dataplane is not None
        assert self.tunnels is not None
        assert self.agents is not None
        assert self.budget is not None
        ls = self.listeners
        options = [
            *GRPC_OPTIONS,
            # gRPC's own cap: connections beyond it are closed as they come, before any handshake
            ("grpc.max_allowed_incoming_connections", self.budget.grpc),
            # a connection that has not finished TLS and sent its HTTP/2 settings by then is closed
            ("grpc.server_handshake_timeout_ms", int(self.loaded.config.listen.header_timeout_s * 1000)),
        ]
        server = grpc.aio.server(options=options, interceptors=[GrpcMetricsInterceptor(self.metrics)])
        add_api: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
        add_worker: Any = worker_pb2_grpc.add_WorkerServicer_to_server
        add_agent: Any = agent_pb2_grpc.add_AgentServicer_to_server
        add_api(ControlPlaneService(self.dataplane, builds=self.builds, wheels=wheels), server)
        registry_url = self.builds.registry.url if self.builds is not None and self.builds.registry else ""
        add_worker(
            WorkerService(self.dataplane, self.tunnels, registry_url=registry_url, http_url=ls.advertised_http()),
            server,
        )
        add_agent(AgentService(services, self.agents), server)
        add_replica: Any = replica_pb2_grpc.add_ReplicaServicer_to_server
        add_replica(ReplicaService(self.tunnels, credentials), server)
        add_volumes: Any = volume_pb2_grpc.add_VolumesServicer_to_server
        add_volumes(VolumesService(services), server)
        address = f"{ls.host}:{ls.grpc_port}"
        try:
            if self.tls is not None:
                bound = server.add_secure_port(address, self.tls.grpc_credentials())
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError:  # grpc raises this for a port another process holds
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {address}: the port is taken or the address is not ours")
        return server

    def _bind_http(self) -> tuple[Listener, Listener]:
        """The HTTP and metrics sockets, bound now and handed to uvicorn later, so no other process can take a
        port between a check and uvicorn's own bind (which would end in uvicorn's sys.exit inside a running
        controlplane)."""
        ls, budget = self.listeners, self.budget
        assert budget is not None
        plain = self.tls is None  # the refusals' 503 is plain HTTP
        http_socket = _listen(
            ls.host, ls.http_port, cap=budget.http, per_client=budget.http_per_client, name="HTTP", answer=plain
        )
        self._sockets.append(http_socket)
        metrics_socket = _listen(ls.host, ls.metrics_port, cap=budget.metrics, name="metrics", answer=plain)
        self._sockets.append(metrics_socket)
        for name, sock in (("http", http_socket), ("metrics", metrics_socket)):
            sock.on_event = self.metrics.connection_counter(name, EVENTS)  # at 0 from the start
            self.metrics.watch_connections(name, sock.open_now)
        return http_socket, metrics_socket

    async def _start_parts(self, services: Services, server: grpc.aio.Server) -> None:
        """Start the hubs, the plugins, the scheduler, the autoscaler and the gRPC server, in that order."""
        assert self.hub is not None
        assert self.agents is not None
        assert self.serving is not None
        assert self.tunnel_holders is not None
        assert self.tunnels is not None
        await self.hub.start()
        await self.agents.start()
        # the plugins start before the scheduler, which calls them, and get the agent hub
        await self._start_plugins(services)
        # the attached clusters' pools join the config's before the scheduler first plans
        await clusters.sync_pools(services)
        self._tasks.append(asyncio.create_task(clusters.keep_pools(services), name="cluster pools"))
        await services.scheduler.start()
        await self.serving.start()
        await server.start()
        self._grpc = server
        self.tunnel_holders.start(self.tunnels.held)  # other replicas may relay through this one from now

    async def _serve_http(
        self, services: Services, wheels: OwnWheels, http_socket: Listener, metrics_socket: Listener
    ) -> None:
        """Serve the gateway on the HTTP socket and the metrics on theirs; returns once both listen."""
        assert self.dataplane is not None
        assert self.serving is not None
        assert self.upstream is not None
        ls, listen = self.listeners, self.loaded.config.listen
        gateway = GatewayApp(
            services,
            self.dataplane,
            self.serving,
            self.upstream,
            create_http_app(
                services, metrics=self.metrics, dataplane=self.dataplane, wheels=wheels, sandboxes=self.sandboxes
            ),
            metrics=self.metrics,
            sandboxes=self.sandboxes,
        )
        services.deployments.on_stopped.append(gateway.stopped)
        self.short_path = ShortPath(gateway, self.serving, metrics=self.metrics)
        # the HTTP listener's simple requests take the front (every gateway request crosses it), and an
        # endpoint's in the steady state the gateway's short path
        for app, port, sock, protocol, short in (
            (
                HttpMetricsMiddleware(WithRegistry(gateway, RegistryProxy(self.dataplane)), self.metrics),
                ls.http_port,
                http_socket,
                FrontProtocol,
                self.short_path,
            ),
            (self.metrics.asgi_app(), ls.metrics_port, metrics_socket, GuardedHttpTools, None),
        ):
            context = self.tls.ssl_context() if self.tls is not None else None
            config = _UvicornConfig(
                app,
                ssl_context=context,
                short_path=short,
                listener=sock,
                header_timeout_s=listen.header_timeout_s,
                body_timeout_s=listen.body_timeout_s,
                host=ls.host,
                port=port,
                log_level="warning",
                lifespan="off",
                http=protocol,
                timeout_keep_alive=listen.keep_alive_s,
            )
            http = _Uvicorn(config)
            self._http.append(http)
            self._tasks.append(asyncio.create_task(http.serve(sockets=[sock]), name=f"http :{port}"))
        while not all(h.started for h in self._http):
            failed = [t for t in self._tasks if t.done()]
            if failed:
                failed[0].result()
                raise OSError("an HTTP listener stopped while starting (is its port taken?)")
            await asyncio.sleep(0.02)

    async def _redis_restarted(self) -> None:
        """The embedded Redis died and a new, empty one runs, or a configured one may have lost writes (a
        Sentinel failover, a restart, a flush): start-up's steps that filled it, again (each leaves alone
        what Redis still knows).

        The backlog is rebuilt from SQL as at start; the agents dial again and say Hello anew; the
        workers' sessions end at their next keepalive (Redis no longer knows them) and the workers
        register again; the planner lease is taken by the next leader step; subscriptions open again
        by themselves.
        """
        assert self.services is not None
        await self.services.scheduler.rebuild()
        if self.agents is not None:  # its streams end (each agent dials again and says Hello anew), then it starts
            await self.agents.close()
            await self.agents.start()

    async def until_stopped(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; raises why when the controlplane cannot go on first.

        That is an embedded ``redis-server`` that died and could not be started again
        (:class:`~levers9.state.errors.StateError`): the caller stops the server and exits non-zero.
        """
        supervisor = self.services.redis_supervisor if self.services is not None else None
        if supervisor is None:
            await stop.wait()
            return
        waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(supervisor.failed.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if not stop.is_set() and supervisor.failure is not None:
            raise supervisor.failure

    async def _start_plugins(self, services: Services) -> None:
        series = PluginSeries(self.metrics.registry, self.metrics.replica)
        self._plugins_started = True
        await services.hooks.startup(agents=self.agents, metrics=series.for_plugin)

    async def _refresh_metrics(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                assert self.services is not None
                await self.metrics.refresh(self.services)
            await asyncio.sleep(5.0)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop listening (calls in flight get ``grace_s``), then the scheduler, then the stores.

        Every step has a deadline: a stuck step is logged and skipped, so a stop always ends.
        """
        await self._stop_listening(grace_s)
        await self._stop_gateway()
        self._tasks.clear()
        self._http.clear()
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
        if self._restore_exception_handler is not None:
            self._restore_exception_handler()
            self._restore_exception_handler = None
        await self._stop_state()
        log.info("the controlplane stopped")

    async def _stop_listening(self, grace_s: float) -> None:
        """End the open streams, stop the gRPC listener (calls in flight get ``grace_s``) and the HTTP ones."""
        if self.services is not None and self.services.redis_supervisor is not None:
            # first: an embedded Redis dying while the rest stops is not restarted (nor its state rebuilt)
            await _step("embedded Redis supervisor", self.services.redis_supervisor.close(), 5)
        if self._grpc is not None and self.services is not None:
            # before the grace: the streams that never end by themselves (worker sessions and tunnels, watches,
            # followed logs) end now with UNAVAILABLE, on which their other side dials another replica; so do
            # the agents' (they dial again). Calls and transfers in flight get the grace.
            ended = self.services.auth.streams.stop()
            if self.agents is not None:
                await _step("agent streams", self.agents.close(), 5)
            log.info("stopping: ended %d open stream(s); calls in flight get %g s", ended, grace_s)
        if self._grpc is not None:
            await _step("gRPC listener", self._grpc.stop(grace_s), grace_s + 5)
            self._grpc = None
        for http in self._http:
            http.exit()
        for task in self._tasks:
            if task.get_name() in ("metrics", "cluster pools"):
                task.cancel()
        await _step("HTTP listeners", asyncio.gather(*self._tasks, return_exceptions=True), grace_s)

    async def _stop_gateway(self) -> None:
        """Close what the gateway and the workers reach through: serving, upstream, tunnels, worker reports."""
        if self.serving is not None:
            await _step("serving containers", self.serving.close(), 15)
            self.serving = None
        if self.upstream is not None:
            await _step("gateway connections", self.upstream.close(), 5)
            self.upstream = None
        if self.sandboxes is not None:
            await _step("sandbox connections", self.sandboxes.close(), 5)
            self.sandboxes = None
        if self.short_path is not None:
            self.short_path.close()
            self.short_path = None
        if self.relays is not None:
            await _step("relays", self.relays.close(), 5)
            self.relays = None
        if self.tunnel_holders is not None:
            await _step("tunnel holders", self.tunnel_holders.close(self.tunnels.held() if self.tunnels else ()), 5)
            self.tunnel_holders = None
        if self.tunnels is not None:
            self.tunnels.close()
            self.tunnels = None
        if self.dataplane is not None:
            await _step("worker reports", self.dataplane.close(), 10)

    async def _stop_state(self) -> None:
        """Stop the scheduler, the plugins and the hubs, release the replica's name, close the stores."""
        if self.services is not None:
            await _step("scheduler", self.services.scheduler.stop(), 30)
            if self._plugins_started:
                await _step("plugins", self.services.hooks.shutdown(), 30)
                self._plugins_started = False
        if self.agents is not None:
            await _step("agent hub", self.agents.close(), 5)
            self.agents = None
        if self.hub is not None:
            await _step("event hub", self.hub.close(), 5)
        if self.services is not None:
            if self.name_claim is not None:
                await _step("replica name", self.name_claim.release(), 5)
                self.name_claim = None
            await _step("state", self.services.close(), 10)
            self.services = None


def _listen(
    host: str, port: int, *, cap: int | None = None, per_client: int = 0, name: str = "HTTP", answer: bool = True
) -> Listener:
    """A listening socket on ``host:port`` holding at most ``cap`` connections, ``per_client`` from one address
    (:class:`Listener`; None, 0: no cap), or OSError naming the port (taken, or not an address of ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named (Listener does): asyncio sets TCP_NODELAY only on connections accepted from a socket that
    # says so, and without it a kept-alive client waits out Nagle and delayed ACK (40 ms) on every response
    sock = Listener(family, cap=cap, per_client=per_client, name=name, answer=answer)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror}") from None
    return sock


async def _step(what: str, awaitable: Any, timeout: float) -> None:
    log.debug("stopping %s", what)
    try:
        await asyncio.wait_for(asyncio.ensure_future(awaitable), timeout)
    except TimeoutError:
        log.error("stopping %s took over %.0f s; going on without it", what, timeout)
    except Exception as exc:
        log.warning("stopping %s failed: %s", what, exc)


def stop_grace_s() -> float:
    """``$LEVERS9_STOP_GRACE_S`` (seconds, 0 or more), else :data:`STOP_GRACE_S`; Levers9Error naming it."""
    text = os.environ.get("LEVERS9_STOP_GRACE_S", "").strip()
    if not text:
        return STOP_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value < float("inf")):
        raise Levers9Error(f"$LEVERS9_STOP_GRACE_S must be a number of seconds, 0 or more; got {text!r}")
    return value


async def serve(
    loaded: LoadedConfig,
    listeners: Listeners | None = None,
    *,
    ready: asyncio.Event | None = None,
    replica_name: str | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then stop (calls in flight get :func:`stop_grace_s`; the process is ours)."""
    grace_s = stop_grace_s()  # a bad value is refused before anything starts
    # The event loop shares the interpreter with SQLite's thread (Database.run): a thread waiting for the
    # interpreter lock gets it after the switch interval at worst, and Python's 5 ms default put that wait
    # on a call's path whenever a transaction ran beside it. Set here, for the process, not in Server.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = Server(loaded, listeners, replica_name=replica_name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        if ready is not None:
            ready.set()
        await server.until_stopped(stop)
        log.info("stopping the controlplane")
    finally:
        await server.stop(grace_s)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
