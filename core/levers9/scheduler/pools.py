"""Pools as the scheduler sees them: the provider's view plus sizes, limits and ownership."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from levers9.hooks.types import Pool, Resources

if TYPE_CHECKING:
    from levers9.config.load import LoadedConfig
    from levers9.config.model import PoolConfig

__all__ = ["PoolSpec", "pool_specs"]


@dataclass(frozen=True)
class PoolSpec:
    pool: Pool
    #: what one worker machine of the pool has
    cpu_millicores: int
    memory_mib: int
    min_workers: int = 0
    max_workers: int = 10
    priority: int = 0
    idle_timeout_s: float = 300.0
    cpu_work: bool = False
    #: the one workspace whose calls the pool serves: the one that attached its cluster, or the one its config
    #: names (a pool whose runtime isolates nothing must name one); None for the operator's shared pools
    workspace: str | None = None
    #: the pool is in the config file (the operator's, whether or not it names a workspace); False for the pool
    #: of a cluster a workspace attached
    configured: bool = False
    #: the pool's workers build blueprint images; builds go only to such pools
    builds: bool = False
    #: how its workers reach volumes (``volume_access``): "direct", "controlplane", or None for the default
    volume_access: str | None = None
    #: the most sandboxes one worker of the pool runs at once (``sandboxes``); 0: the pool serves none
    sandboxes: int = 0
    #: sandboxes each worker keeps started for the next creates (``sandboxes_warm``)
    sandboxes_warm: int = 0

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def gpu(self) -> str | None:
        return self.pool.gpu

    @property
    def gpu_count(self) -> int:
        return self.pool.gpu_count

    @property
    def resources(self) -> Resources:
        return Resources(
            cpu_millicores=self.cpu_millicores, memory_mib=self.memory_mib, gpu=self.gpu, gpu_count=self.gpu_count
        )

    def describe(self) -> str:
        """``h100 (2x H100, ec2 us-east-1)``: for error messages that list pools."""
        what = f"{self.gpu_count}x {self.gpu}" if self.gpu else "CPU"
        where = self.pool.provider + (f" {self.pool.region}" if self.pool.region else "")
        return f"{self.name} ({what}, {where})"

    @classmethod
    def from_config(cls, pool: Pool, config: PoolConfig, *, workspace: str | None = None) -> PoolSpec:
        if pool.workspace != workspace:  # the provider sees whose pool it serves (agents are per workspace)
            pool = pool.model_copy(update={"workspace": workspace})
        return cls(
            pool=pool,
            cpu_millicores=round(config.cpu * 1000),
            memory_mib=config.memory,
            min_workers=config.min_workers,
            max_workers=config.max_workers,
            priority=config.priority,
            idle_timeout_s=config.idle_timeout_s,
            cpu_work=config.cpu_work,
            workspace=workspace,
            builds=config.builds,
            volume_access=config.volume_access,
            sandboxes=config.sandboxes,
            sandboxes_warm=config.sandboxes_warm,
        )


def pool_specs(loaded: LoadedConfig, workspaces: Mapping[str, str] | None = None) -> dict[str, PoolSpec]:
    """Every pool of a loaded config, ready for the scheduler; ``workspaces``: pool -> the id of the one
    workspace it serves (its config's ``workspace``), for the pools that name one."""
    bound = workspaces or {}
    # the provider sees the operator's pool (workspace None) whichever workspace's calls it serves
    return {
        name: dataclasses.replace(
            PoolSpec.from_config(pool, loaded.config.pools[name]), workspace=bound.get(name), configured=True
        )
        for name, pool in loaded.pools.items()
    }
