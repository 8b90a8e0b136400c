"""End-to-end placement: ``Scheduler.place_once``, which also writes each batch's history to SQL.

``bench/placement.py`` measures the Redis step alone. The controlplane does more
per batch: after the Lua step it records every placement in the task's history,
in one SQL transaction per batch. This measures that whole step, 10,000 requests
onto 1,000 workers, on the embedded SQLite and on a real PostgreSQL, both with a
real redis-server. Submitting (SQL rows and the backlog) is not timed.

Run: ``.venv/bin/python bench/scheduler_place.py`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.placement import POOLS, fleet, machine, redis_server
from levers9.config.model import SchedulerConfig
from levers9.gpu.preference import parse_gpu
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import Pool
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.request import PlacementRequest
from levers9.scheduler.service import Scheduler
from levers9.state.redis.connect import connect
from levers9.state.sql.database import open_database
from levers9.state.sql.workspaces import WorkspaceStore
from tests.fixtures.postgres import running_postgres


def pools() -> dict[str, PoolSpec]:
    return {
        p.name: PoolSpec(
            pool=Pool(name=p.name, provider="none", runtime="runc", gpu=p.gpu, gpu_count=p.gpus),
            cpu_millicores=p.cpu,
            memory_mib=p.mem,
        )
        for p in POOLS
    }


async def one_run(db_url: str, redis_url: str, workers: int, count: int) -> float:
    redis = connect(redis_url)
    await redis.flushall()
    db = await open_database(db_url)
    hooks = Hooks(PluginSet(PluginPolicy(allow=frozenset())))
    try:
        ws = await WorkspaceStore(db).get_or_create(f"bench-{time.monotonic_ns()}")
        scheduler = Scheduler(db=db, redis=redis, hooks=hooks, pools=pools(), settings=SchedulerConfig())
        for info in fleet(workers):
            await scheduler.register_worker(info)
        now = int(time.time() * 1000)
        requests = [
            PlacementRequest(
                id=f"t-{time.monotonic_ns()}-{i}",
                workspace=ws.id,
                cpu_millicores=250,
                memory_mib=256,
                gpu=parse_gpu(None),
                submitted_ms=now,
            )
            for i in range(count)
        ]
        for start in range(0, count, 1000):
            await scheduler.submit_many(requests[start : start + 1000])
        placed = 0
        began = time.perf_counter()
        while placed < count:
            result = await scheduler.place_once()
            if not result.placed:
                raise RuntimeError(f"stuck after {placed} placements")
            placed += len(result.placed)
        seconds = time.perf_counter() - began
        if placed != count or await scheduler.backlog.size():
            raise RuntimeError(f"placed {placed} of {count}")
        return seconds
    finally:
        hooks.close()
        await db.close()
        await redis.aclose()


async def main(workers: int, count: int, repeat: int) -> None:
    for key, value in machine().items():
        print(f"- {key}: {value}")
    print(f"- workload: {count:,} CPU requests onto {workers:,} workers, batch {SchedulerConfig().batch_size}\n")
    rows = []
    with (
        redis_server() as redis_url,
        tempfile.TemporaryDirectory(prefix="l9-bench-sql-") as tmp,
        running_postgres() as pg,
    ):
        import psycopg

        with psycopg.connect(pg.replace("postgresql+psycopg", "postgresql") + "postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE bench")
        targets = [("SQLite (embedded default)", f"sqlite:///{tmp}/levers9.db"), ("PostgreSQL 15", pg + "bench")]
        for name, url in targets:
            runs = [await one_run(url, redis_url, workers, count) for _ in range(repeat)]
            print(f"  {name}: {[round(r, 3) for r in runs]} s", file=sys.stderr)
            rows.append((name, statistics.median(runs)))
    print("| database | placements/s | µs per placement |")
    print("|--|--:|--:|")
    for name, seconds in rows:
        print(f"| {name} | {count / seconds:,.0f} | {seconds / count * 1e6:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.workers, args.requests, args.repeat))
