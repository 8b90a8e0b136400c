"""Everything one controlplane process holds, built once from the config and shared by every front end.

With the embedded ``redis-server`` (no ``state.redis_url``), :meth:`Services.supervise_redis` keeps it
alive (:mod:`levers9.state.redis.supervisor`); :meth:`Services.close` stops the supervisor before the
server, so a stop is never taken for a death. A configured Redis is watched instead
(:meth:`Services.watch_redis`): a failover, restart or flush that may have lost writes has the same
state rebuilt from SQL.

The image registry the ``/v2/`` relay speaks to is :attr:`Services.registry`
(:mod:`levers9.services.registry_backend`): made here, started by the server at start-up (or by the
first request that needs it, so a process that never relays an image starts no ``docker-registry``),
and stopped, supervisor first, by :meth:`Services.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from levers9.scheduler.pools import PoolSpec, pool_specs
from levers9.scheduler.service import Scheduler
from levers9.services.agent_pools.clusters import ATTACHED_CLUSTERS
from levers9.services.agent_pools.joined_machines import JOINED_MACHINES
from levers9.services.agent_pools.registry import AgentPools
from levers9.services.agent_store import AgentStore
from levers9.services.auth import Authenticator
from levers9.services.registry_backend import RegistryBackend
from levers9.state.crypto import SecretBox
from levers9.state.disk import require_room
from levers9.state.redis.connect import EmbeddedRedis, ManagedRedis, connect, verify
from levers9.state.redis.supervisor import RedisSupervisor
from levers9.state.redis.watch import watch
from levers9.state.sql.apps import AppStore, DeploymentStore, StubStore
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.members import MemberStore, UserStore
from levers9.state.sql.sandbox_snapshots import SandboxSnapshotStore
from levers9.state.sql.secrets import SecretStore
from levers9.state.sql.tasks import TaskStore
from levers9.state.sql.volumes import VolumeStore
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

    from levers9.config.load import LoadedConfig
    from levers9.config.model import Config
    from levers9.hooks.facade import Hooks
    from levers9.services.volume_files import VolumeFiles

__all__ = ["Services", "open_services"]


@dataclass
class Services:
    """Everything the service layer works with: the stores, the scheduler and the authenticator."""

    loaded: LoadedConfig
    db: Database
    redis: Redis
    box: SecretBox
    scheduler: Scheduler
    auth: Authenticator
    workspaces: WorkspaceStore
    tokens: TokenStore
    apps: AppStore
    stubs: StubStore
    deployments: DeploymentStore
    tasks: TaskStore
    secrets: SecretStore
    machines: MachineStore
    #: the agents' registrations, inventories and heartbeats (Redis); the hub that talks to them is the server's
    agents: AgentStore
    #: the registry behind the ``/v2/`` relay (built images); started by the server or on first use
    registry: RegistryBackend
    #: each workspace's volumes, and the controlplane's mount of the file system they live on (made at first use)
    volumes: VolumeStore
    volume_files: VolumeFiles
    #: each workspace's stored sandbox snapshots (their objects live in the checkpoint storage)
    sandbox_snapshots: SandboxSnapshotStore
    #: the kinds of agent-backed pools, through which token checking restores an agent's lost registration
    agent_pools: AgentPools
    embedded_redis: EmbeddedRedis | None = None
    managed_redis: ManagedRedis | None = None
    #: restarts :attr:`managed_redis` when it dies (see :meth:`supervise_redis`); None without one
    redis_supervisor: RedisSupervisor | None = None
    #: notices a configured Redis that may have lost writes (see :meth:`watch_redis`); None without one
    redis_watch: asyncio.Task[None] | None = None

    @property
    def users(self) -> UserStore:
        return UserStore(self.db)

    @property
    def members(self) -> MemberStore:
        return MemberStore(self.db)

    @property
    def config(self) -> Config:
        return self.loaded.config

    @property
    def hooks(self) -> Hooks:
        return self.loaded.hooks

    @property
    def pools(self) -> dict[str, PoolSpec]:
        return self.scheduler.ctx.pools

    def require_room(self) -> None:
        """Raise :class:`~levers9.state.errors.DataDirectoryFull` while the data directory is too full for new work."""
        require_room(self.config.data_dir)

    def supervise_redis(
        self, recover: Callable[[], Awaitable[None]], *, on_restart: Callable[[], None] | None = None
    ) -> RedisSupervisor | None:
        """Restart the embedded ``redis-server`` whenever it dies, running ``recover`` after each restart.

        Returns the supervisor (its ``failed`` event is set when it gave up), or None when this process has
        no ``redis-server`` child (a configured Redis, or the in-process one, which cannot die on its own).
        """
        if self.managed_redis is None:
            return None
        if self.redis_supervisor is None:
            self.redis_supervisor = RedisSupervisor(self.managed_redis, recover, on_restart=on_restart)
            self.redis_supervisor.start()
        return self.redis_supervisor

    def watch_redis(self, rebuild: Callable[[], Awaitable[None]]) -> None:
        """With a configured Redis: run ``rebuild`` whenever it may have lost writes (a Sentinel failover, a
        restart, a flush; :mod:`levers9.state.redis.watch`). The embedded one has its supervisor instead."""
        if self.managed_redis is None and self.embedded_redis is None and self.redis_watch is None:
            self.redis_watch = asyncio.create_task(watch(self.redis, self.agents.prefix, rebuild), name="redis watch")

    async def close(self) -> None:
        if self.redis_watch is not None:
            self.redis_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.redis_watch
            self.redis_watch = None
        await self.volume_files.close()
        await self.registry.close()
        if self.redis_supervisor is not None:
            await self.redis_supervisor.close()
            self.redis_supervisor = None
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        await self.db.close()
        if self.managed_redis is not None:
            self.managed_redis.stop()


async def open_services(
    loaded: LoadedConfig,
    *,
    controlplane_url: str,
    controlplane_ca: str = "",
    prefix: str = "l9:",
    identity: str | None = None,
) -> Services:
    """Open the database (migrating it), connect Redis (embedded when no URL is configured) and build the stores.

    ``controlplane_url`` and ``controlplane_ca`` (PEM; empty: the system trust store) go to every machine
    the scheduler starts: where its worker dials and what verifies the controlplane's certificate.
    ``identity`` is what this process is known by in Redis (the planner lease's holder, the hubs' sender:
    levers9.services.replica_name.process_identity); None: the host name, the pid and a random suffix.
    """
    config = loaded.config
    from levers9.config.data_dir import secure_data_dir
    from levers9.config.load import ConfigError
    from levers9.services.isolation import builds_without_capture, shared_without_isolation

    secure_data_dir(config.data_dir)  # 0700, before anything is created in it
    embedded: EmbeddedRedis | None = None
    managed: ManagedRedis | None = None
    url = config.state.redis_url
    if not url:
        # first, so a second controlplane on this data directory is refused at once (the embedded
        # Redis holds its lock) instead of queueing behind the first one's SQLite writes
        managed = ManagedRedis.start(Path(config.data_dir).expanduser() / "redis")
        if managed is not None:
            url = managed.url
        else:
            embedded = EmbeddedRedis()
    try:
        db = await open_database(config.database_url)
    except BaseException:
        if managed is not None:
            managed.stop()
        raise
    try:
        issues = await shared_without_isolation(loaded) + builds_without_capture(loaded)
        if issues:
            raise ConfigError(issues)
        workspaces = WorkspaceStore(db)
        bound = {
            name: (await workspaces.get_or_create(pool.workspace)).id
            for name, pool in config.pools.items()
            if pool.workspace
        }
        redis = connect(url, embedded=embedded)
        if config.state.redis_url:
            await verify(redis, config.state.redis_url)  # a clear StateError (no password) when it cannot be used
        box = SecretBox.from_config(config.state.secret_key_file, config.data_dir)
        tokens = TokenStore(db)
        volume_files = _volume_files(loaded)
        scheduler = Scheduler(
            db=db,
            redis=redis,
            hooks=loaded.hooks,
            pools=pool_specs(loaded, bound),
            settings=config.scheduler,
            controlplane_url=controlplane_url,
            controlplane_ca=controlplane_ca,
            prefix=prefix,
            name=identity,
        )
    except BaseException:
        await db.close()
        if managed is not None:
            managed.stop()
        raise
    return Services(
        loaded=loaded,
        db=db,
        redis=redis,
        box=box,
        scheduler=scheduler,
        auth=Authenticator(tokens, workspaces=workspaces),
        workspaces=workspaces,
        tokens=tokens,
        apps=AppStore(db),
        stubs=StubStore(db),
        deployments=DeploymentStore(db),
        tasks=TaskStore(db),
        secrets=SecretStore(db, box),
        machines=MachineStore(db),
        agents=AgentStore(redis, prefix=prefix),
        embedded_redis=embedded,
        managed_redis=managed,
        registry=RegistryBackend(config.registry, Path(config.data_dir)),
        volumes=VolumeStore(db),
        volume_files=volume_files,
        sandbox_snapshots=SandboxSnapshotStore(db),
        agent_pools=AgentPools([JOINED_MACHINES, ATTACHED_CLUSTERS]),
    )


def _volume_files(loaded: LoadedConfig) -> VolumeFiles:
    """The volumes' file system as the config says; ConfigError when a variable it names is not set."""
    from levers9.config.load import ConfigError, ConfigIssue
    from levers9.hooks.errors import Levers9Error
    from levers9.services.volume_files import VolumeFiles
    from levers9.volumes.juicefs import FileSystem

    config = loaded.config
    try:
        fs = FileSystem.from_config(config.volumes, config.data_dir)
    except Levers9Error as exc:
        raise ConfigError([ConfigIssue(loaded.file or "config", None, "volumes", str(exc))]) from None
    return VolumeFiles(fs, Path(config.data_dir).expanduser() / "volumes")
