"""End-to-end placement: ``Scheduler.place_once`` with its SQL history stored, the way the controlplane runs it.

``bench/placement.py`` measures the Redis step alone. The controlplane does more: every
placement also gets a line in the task's placement history in SQL. Its placement loop
calls ``place_once(wait_for_history=False)`` batch after batch and hands the history to
the scheduler's history writer (``levers9.scheduler.history``), which stores whatever
piled up in one transaction at a time. The clock here stops only once that history is
stored and counted in SQL, so the figure is N placements placed *and* recorded.

Modes (``--modes``):

- ``loop``: the controlplane's placement loop, as above;
- ``await``: ``place_once()`` awaiting each batch's history before the next batch, which is
  how this benchmark measured the step before the history writer (2026-11-30);
- ``unrecorded``: the loop with the history thrown away instead of stored: the ceiling the
  Redis step and the client set for the other two on this workload (not an end-to-end figure).

Each mode runs 10,000 requests onto 1,000 workers on the embedded SQLite and on a real
PostgreSQL, with a real redis-server. Submitting (SQL rows and the backlog) is not timed.

Run: ``.venv/bin/python bench/scheduler_place.py`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis
from sqlalchemy import Connection, text

from bench.placement import POOLS, fleet, machine, redis_server
from levers9.config.model import SchedulerConfig
from levers9.gpu.preference import parse_gpu
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import Pool
from levers9.scheduler.history import HistoryWriter
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.request import PlacementRequest
from levers9.scheduler.service import Scheduler
from levers9.state.redis.connect import connect
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.records import PlacementEvent
from levers9.state.sql.tasks import TaskStore
from levers9.state.sql.workspaces import WorkspaceStore
from tests.fixtures.postgres import running_postgres

MODES = ("loop", "await", "unrecorded")
#: how many placement history rows of a workspace are stored, and how many of its tasks know their worker
_COUNT = text(
    "SELECT (SELECT count(*) FROM task_placements p JOIN tasks t ON t.id = p.task_id"
    "        WHERE t.workspace_id = :ws AND p.outcome = 'placed'),"
    "       (SELECT count(*) FROM tasks WHERE workspace_id = :ws AND worker_id IS NOT NULL)"
)


class Unrecorded:
    """A stand-in for the task store that stores nothing (the ``unrecorded`` mode)."""

    async def record(self, events: Sequence[PlacementEvent], *, skip_missing: bool = False) -> list[str]:
        return []


@dataclass
class Run:
    seconds: float
    #: when the last placement was made (the rest is the history's tail being stored)
    placed_s: float
    #: SQL transactions that stored the history
    transactions: int
    #: the bench process's CPU time over the timed part, and the whole machine's busy CPU time
    process_cpu_s: float
    machine_cpu_s: float
    #: redis-server's CPU time over the timed part (``INFO cpu``)
    redis_cpu_s: float


def pools() -> dict[str, PoolSpec]:
    return {
        p.name: PoolSpec(
            pool=Pool(name=p.name, provider="none", runtime="runc", gpu=p.gpu, gpu_count=p.gpus),
            cpu_millicores=p.cpu,
            memory_mib=p.mem,
        )
        for p in POOLS
    }


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent not idle since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def redis_cpu_s(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def stored(db: Database, workspace: str) -> tuple[int, int]:
    def count(connection: Connection) -> tuple[int, int]:
        row = connection.execute(_COUNT, {"ws": workspace}).one()
        return int(row[0]), int(row[1])

    return await db.run(count)


async def place_all(scheduler: Scheduler, mode: str, count: int) -> float:
    """Place ``count`` requests; returns when the last was placed (seconds on the perf counter)."""
    placed = 0
    while placed < count:
        result = await scheduler.place_once(wait_for_history=mode == "await")
        if not result.placed:
            raise RuntimeError(f"stuck after {placed} placements")
        placed += len(result.placed)
    if placed != count or await scheduler.backlog.size():
        raise RuntimeError(f"placed {placed} of {count}")
    return time.perf_counter()


async def one_run(
    db_url: str, redis_url: str, workers: int, count: int, mode: str, profile: cProfile.Profile | None = None
) -> Run:
    """One timed run; with ``profile``, that profiler runs over the timed part only."""
    redis = connect(redis_url)
    await redis.flushall()
    db = await open_database(db_url)
    hooks = Hooks(PluginSet(PluginPolicy(allow=frozenset())))
    scheduler = Scheduler(db=db, redis=redis, hooks=hooks, pools=pools(), settings=SchedulerConfig())
    if mode == "unrecorded":
        scheduler.history = HistoryWriter(cast(TaskStore, Unrecorded()))
    try:
        ws = await WorkspaceStore(db).get_or_create(f"bench-{time.monotonic_ns()}")
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
        transactions = scheduler.history.transactions
        cpu, busy, redis_cpu = time.process_time(), busy_cpu_s(), await redis_cpu_s(redis)
        if profile is not None:
            profile.enable()
        began = time.perf_counter()
        placed_at = await place_all(scheduler, mode, count)
        await scheduler.history.written(scheduler.history.added)
        history, located = (count, count) if mode == "unrecorded" else await stored(db, ws.id)
        seconds = time.perf_counter() - began
        if profile is not None:
            profile.disable()
        if (history, located) != (count, count):
            raise RuntimeError(f"{count} placed, but {history} history rows and {located} tasks with a worker stored")
        return Run(
            seconds,
            placed_at - began,
            scheduler.history.transactions - transactions,
            time.process_time() - cpu,
            busy_cpu_s() - busy,
            await redis_cpu_s(redis) - redis_cpu,
        )
    finally:
        await scheduler.stop()
        hooks.close()
        await db.close()
        await redis.aclose()


async def main(
    workers: int, count: int, repeat: int, modes: list[str], only: list[str], profile: str | None = None
) -> None:
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
        targets = [
            ("sqlite", "SQLite (embedded default)", f"sqlite:///{tmp}/levers9.db"),
            ("postgresql", "PostgreSQL 15", pg + "bench"),
        ]
        for key, name, url in targets:
            if key not in only:
                continue
            for mode in modes:
                profiler = cProfile.Profile() if profile else None
                runs = [await one_run(url, redis_url, workers, count, mode, profiler) for _ in range(repeat)]
                if profiler is not None:
                    profiler.dump_stats(f"{profile}.{key}.{mode}")
                print(f"  {name}, {mode}: {[round(r.seconds, 3) for r in runs]} s", file=sys.stderr)
                rows.append((name, mode, runs))
    print(
        "| database | mode | placements/s | µs per placement | runs (s) | last placed at (s) "
        "| history transactions | CPUs busy: machine | bench process | redis-server |"
    )
    print("|--|--|--:|--:|--|--:|--:|--:|--:|--:|")
    for name, mode, runs in rows:
        mid = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
        seconds = statistics.median(r.seconds for r in runs)
        print(
            f"| {name} | {mode} | {count / seconds:,.0f} | {seconds / count * 1e6:.1f} "
            f"| {', '.join(f'{r.seconds:.2f}' for r in runs)} | {mid.placed_s:.2f} "
            f"| {'-' if mode == 'unrecorded' else mid.transactions} "
            f"| {mid.machine_cpu_s / mid.seconds:.2f} of {os.cpu_count()} | {mid.process_cpu_s / mid.seconds:.2f} "
            f"| {mid.redis_cpu_s / mid.seconds:.2f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--only", default="sqlite,postgresql", help="comma-separated databases: sqlite, postgresql")
    parser.add_argument("--profile", metavar="PREFIX", help="cProfile the timed parts into PREFIX.DATABASE.MODE")
    args = parser.parse_args()
    chosen = [m for m in args.modes.split(",") if m]
    if not chosen or set(chosen) - set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    asyncio.run(main(args.workers, args.requests, args.repeat, chosen, args.only.split(","), args.profile))
