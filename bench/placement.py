"""Placement throughput: how fast ``Backlog.place`` empties a 10,000-request backlog as the fleet grows.

The scheduler's promise is that placement cost barely depends on fleet size (each
lookup is a range query on a per-pool sorted set), and that batching many placements
into one script call is what makes it fast. This measures both on a private
``redis-server``, with a fixed, seeded workload so runs are comparable, and splits the
wall time into time spent inside Redis (``INFO commandstats``) and everything else.

Run: ``.venv/bin/python bench/placement.py`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from levers9.state.redis.backlog import Backlog, Group, PlaceResult, QueuedRequest
from levers9.state.redis.connect import connect
from levers9.state.redis.workers import WorkerInfo, WorkerRegistry

#: the controlplane's default ``scheduler.batch_size``
BATCH = 256
TTL_MS = 3_600_000


@dataclass(frozen=True)
class PoolShape:
    name: str
    share: float
    cpu: int
    mem: int
    gpu: str | None = None
    gpus: int = 0


# A small but realistic mix: two CPU pools and two GPU pools, every worker the same size within a pool.
POOLS = (
    PoolShape("cpu-a", 0.35, 64_000, 262_144),
    PoolShape("cpu-b", 0.35, 32_000, 131_072),
    PoolShape("h100", 0.15, 192_000, 2_097_152, "H100", 8),
    PoolShape("l40s", 0.15, 64_000, 524_288, "L40S", 8),
)


def fleet(n: int) -> list[WorkerInfo]:
    counts = [round(n * p.share) for p in POOLS]
    counts[0] += n - sum(counts)
    return [
        WorkerInfo(f"{p.name}-{i:05d}", p.name, p.cpu, p.mem, p.gpu, p.gpus)
        for p, count in zip(POOLS, counts, strict=True)
        for i in range(count)
    ]


def workload(count: int, now_ms: int, seed: int = 9) -> list[QueuedRequest]:
    """Mostly small CPU tasks with 1-3 preference groups, 2% one-GPU tasks; all of it fits 100 workers."""
    rng = random.Random(seed)
    far = now_ms + 10**9
    out = []
    for i in range(count):
        if rng.random() < 0.02:
            cpu, mem, gpus = 4_000, 16_384, 1
            groups: tuple[Group, ...] = (Group(0, ("h100",), 1), Group(0, ("l40s",), 1), Group(far, ("cpu-a",), 0))
        else:
            cpu, mem, gpus = rng.choice((100, 250, 500)), rng.choice((128, 256, 512)), 0
            groups = rng.choice(
                (
                    (Group(0, ("cpu-a", "cpu-b")),),
                    (Group(0, ("cpu-a",)), Group(0, ("cpu-b",))),
                    (Group(0, ("cpu-b",)), Group(0, ("cpu-a",)), Group(far, ("l40s", "h100"))),
                )
            )
        # Spread over the last minute, so the backlog order is not simply the id order.
        out.append(QueuedRequest(f"req-{i:05d}", cpu, mem, gpus, groups, now_ms - rng.randrange(60_000)))
    return out


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway ``redis-server`` on a unix socket, gone (with its directory) however the run ends."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="l9-bench-"))
    sock = workdir / "redis.sock"
    proc = None
    try:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--unixsocket",
                str(sock),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--logfile",
                str(workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (exit {proc.poll()})")
            time.sleep(0.02)
        yield f"unix://{sock}"
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class Run:
    seconds: float
    #: microseconds Redis spent running EVALSHA (the place script), from INFO commandstats
    redis_usec: int
    calls: int


async def one_run(redis: Redis, workers: list[WorkerInfo], requests: list[QueuedRequest], now: int, limit: int) -> Run:
    await redis.flushall()
    registry, backlog = WorkerRegistry(redis), Backlog(redis)
    for info in workers:
        await registry.register(info, now_ms=now, ttl_ms=TTL_MS)
    assert await backlog.enqueue(requests) == len(requests)
    # Load the script (a due time before every request, so nothing moves) before counting commands.
    assert await backlog.place(0, limit=1) == PlaceResult([], [])
    await redis.config_resetstat()

    placed: list[str] = []
    calls = 0
    start = time.perf_counter()
    while len(placed) < len(requests):
        result = await backlog.place(now, limit=limit)
        calls += 1
        if result.unplaced or not result.placed:
            raise RuntimeError(f"the workload should fit: {len(result.unplaced)} unplaced after {len(placed)} placed")
        placed += [p.request for p in result.placed]
    seconds = time.perf_counter() - start

    stats = await redis.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    # Verify, outside the timed part, that the number measures what it claims.
    assert len(placed) == len(set(placed)) == len(requests), "every request placed exactly once"
    assert await backlog.size() == 0
    states = await registry.get_many([w.id for w in workers])
    assert sum(s.running for s in states if s is not None) == len(requests)
    assert int(evalsha.get("calls", 0)) == calls
    return Run(seconds, int(evalsha.get("usec", 0)), calls)


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown",
    )
    mem_kib = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": f"{mem_kib / 1024 / 1024:.0f} GiB",
        "os": f"{platform.freedesktop_os_release().get('PRETTY_NAME', platform.system())}, kernel {platform.release()}",
        "python": platform.python_version(),
        "redis": redis_version,
    }


async def main(sizes: list[int], count: int, repeat: int, single_at: int) -> None:
    for key, value in machine().items():
        print(f"- {key}: {value}")
    print(f"- workload: {count:,} requests, batch limit {BATCH}, median of {repeat} runs\n")

    now = int(time.time() * 1000)
    requests = workload(count, now)
    configs = [(n, BATCH) for n in sizes] + ([(single_at, 1)] if single_at else [])
    rows = []
    with redis_server() as url:
        redis = connect(url)
        try:
            for n, limit in configs:
                workers = fleet(n)
                runs = [await one_run(redis, workers, requests, now, limit) for _ in range(repeat)]
                mid = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
                rows.append((n, limit, mid, statistics.median(r.seconds for r in runs)))
                print(f"  {n:>6} workers, limit {limit:>3}: {[round(r.seconds, 3) for r in runs]} s", file=sys.stderr)
        finally:
            await redis.aclose()

    base = next((seconds for n, limit, _, seconds in rows if limit == BATCH), rows[0][3])
    print(
        "| workers | batch limit | placements/s | µs per placement | vs 100 workers (limit 256) | µs in Redis per placement |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    for n, limit, mid, seconds in rows:
        per = seconds / count * 1e6
        print(
            f"| {n:,} | {limit} | {count / seconds:,.0f} | {per:.1f} | {seconds / base:.2f}x | {mid.redis_usec / count:.1f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="100,1000,10000", help="fleet sizes, comma-separated")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--single-at", type=int, default=1_000, help="fleet size for the limit=1 line (0: skip)")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.workers.split(",")], args.requests, args.repeat, args.single_at))
