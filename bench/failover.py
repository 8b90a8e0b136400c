"""Two controlplane replicas: how long a replica's death interrupts calls, and throughput during a rolling restart.

Starts a private PostgreSQL 15 and redis-server, two ``levers9 server`` replicas on one config (the test
fixture ``tests/fixtures/replicas.py``) with a ``local`` pool of two process-runtime workers, and measures:

- **client failover**: a client lists both replicas and is connected to replica 0; it makes ``.remote()``
  calls one after another, stamping each with the wall clock. Replica 0 is SIGKILLed and left down. The
  figure is the longest gap between two completed calls over the kill (the client's pause), beside the
  usual gap between calls before it.
- **worker failover**: the workers' sessions are on replica 0 (the first address they are given); the client
  talks to replica 1 only. Replica 0 is SIGKILLed; the figure is again the client's longest pause.
- **frozen replica**: as for worker failover, but replica 0 is stopped with SIGSTOP (its sockets stay open and
  its kernel still accepts connections, like a host that stalled) and ``scheduler.worker_keepalive_s`` is the
  default 30 s. The figure is the time from the SIGSTOP to the end of the client's longest pause after it:
  the workers' pings find replica 0 gone and they register with replica 1. Replica 0 gets SIGCONT afterwards.
  A worker pings every 12 s and waits 4 s for the answer (``levers9.worker.dialing``), so the figure lies
  between about 4 and 16 s depending on where in the ping period the stop falls; ``--repeat`` shows the spread.
- **rolling restart**: a client runs maps of 100 no-op calls through both replicas. Steady state is measured
  over a window; then each replica is stopped (SIGTERM) and started again in turn, and the tasks/s over that
  whole window are compared with the steady state. Any failed call fails the benchmark.

No peer is measured beside it: the peers' high-availability setups need Kubernetes or their hosted control
planes, which this machine cannot run. Run: ``.venv/bin/python bench/failover.py`` (``--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.placement import machine, redis_server
from tests.fixtures.levers9_up import _processes_mentioning
from tests.fixtures.postgres import running_postgres
from tests.fixtures.replicas import Replicas

CALLS = """
import time
import levers9

@levers9.function(cpu=0.25)
def ping(x: int) -> int:
    return x

ping.remote(0)
print("ready", flush=True)
i = 0
while True:
    i += 1
    ping.remote(i)
    print("done", time.time(), flush=True)
"""

MAPS = """
import time
import levers9

@levers9.function(cpu=0.25)
def ping(x: int) -> int:
    return x

ping.remote(0)
print("ready", flush=True)
while True:
    got = list(ping.map(range(100)))
    assert got == list(range(100)), got
    print("map", time.time(), flush=True)
"""


class Stamps:
    """A client program's stamped lines, read in a thread; the program is killed on exit."""

    def __init__(self, program: subprocess.Popen[str]) -> None:
        self.program = program
        self.stamps: list[float] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._errors = threading.Thread(target=self._drain_stderr, daemon=True)

    def _read(self) -> None:
        assert self.program.stdout is not None
        for line in self.program.stdout:
            word, *rest = line.split()
            if word == "ready":
                self.ready.set()
            elif rest:
                self.stamps.append(float(rest[0]))

    def _drain_stderr(self) -> None:
        assert self.program.stderr is not None
        self.stderr = self.program.stderr.read()

    def __enter__(self) -> Stamps:
        self.stderr = ""
        self._reader.start()
        self._errors.start()
        if not self.ready.wait(180):
            raise RuntimeError(f"the client did not start: {self.program.poll()}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.program.poll() is None:
            self.program.kill()
        self.program.wait(30)
        self._reader.join(10)
        self._errors.join(10)

    def alive(self) -> None:
        if self.program.poll() is not None:
            self._errors.join(10)
            raise RuntimeError(f"the client failed (exit {self.program.returncode}):\n{self.stderr[-3000:]}")

    def pause_around(self, moment: float, timeout: float = 300) -> tuple[float, float]:
        """The longest gap between two calls completing, over the kill, and the median gap before it.

        Waits until 20 calls completed after ``moment``; the call in flight at the kill may finish at once
        (its answer was on its way), so the gap, not the first completion, is what the client lived through.
        """
        deadline = time.monotonic() + timeout
        while sum(1 for s in self.stamps if s > moment) < 20:
            self.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than 20 calls completed within {timeout} s of the kill")
            time.sleep(0.05)
        before = [s for s in self.stamps if s <= moment]
        after = [s for s in self.stamps if s > moment][:20]
        window = before[-1:] + after
        longest = max(b - a for a, b in itertools.pairwise(window))
        steady = statistics.median(b - a for a, b in itertools.pairwise(before[-50:]))
        return longest, steady

    def resumed_after(self, moment: float, timeout: float = 300) -> float:
        """Seconds from ``moment`` to the end of the longest gap between completed calls after it (20 calls)."""
        deadline = time.monotonic() + timeout
        while sum(1 for s in self.stamps if s > moment) < 20:
            self.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than 20 calls completed within {timeout} s of the stop")
            time.sleep(0.05)
        window = [moment, *[s for s in self.stamps if s > moment][:20]]
        _, end = max(itertools.pairwise(window), key=lambda pair: pair[1] - pair[0])
        return end - moment

    def count_between(self, start: float, end: float) -> int:
        return sum(1 for s in self.stamps if start < s <= end)


@contextlib.contextmanager
def cluster(pg: str, redis_url: str, workers: int, keepalive_s: float = 3) -> Iterator[Replicas]:
    root = Path(tempfile.mkdtemp(prefix="l9-bench-failover-"))
    import psycopg

    name = f"bench_{time.monotonic_ns()}"
    with psycopg.connect(pg.replace("postgresql+psycopg", "postgresql") + "postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    group = Replicas(
        root,
        pg + name,
        redis_url,
        count=2,
        min_workers=workers,
        max_workers=workers,
        cpu=1,
        worker_keepalive_s=keepalive_s,
    )
    try:
        group.start_all()
        yield group
    finally:
        with contextlib.suppress(Exception):
            group.stop_all()
        for pid, _ in _processes_mentioning(str(root)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def client_failover(pg: str, redis_url: str) -> tuple[float, float]:
    with cluster(pg, redis_url, 2) as group, Stamps(group.popen(CALLS)) as client:
        time.sleep(3)
        killed = time.time()
        group.kill(0)
        return client.pause_around(killed)


def worker_failover(pg: str, redis_url: str) -> tuple[float, float]:
    with (
        cluster(pg, redis_url, 2) as group,
        Stamps(group.popen(CALLS, addresses=[group.addresses[1]])) as client,
    ):
        time.sleep(3)
        killed = time.time()
        group.kill(0)
        return client.pause_around(killed)


def frozen_replica(pg: str, redis_url: str) -> float:
    """Seconds from SIGSTOP of the workers' replica to the end of the client's longest pause after it."""
    with (
        cluster(pg, redis_url, 2, keepalive_s=30) as group,
        Stamps(group.popen(CALLS, addresses=[group.addresses[1]])) as client,
    ):
        time.sleep(3)
        process = group.replicas[0].process
        assert process is not None
        stopped = time.time()
        process.send_signal(signal.SIGSTOP)
        try:
            return client.resumed_after(stopped)
        finally:
            process.send_signal(signal.SIGCONT)


def rolling(pg: str, redis_url: str, window_s: float) -> tuple[float, float, float]:
    """Maps/s in steady state, maps/s over the whole rolling restart, and how long that restart took."""
    with cluster(pg, redis_url, 2) as group, Stamps(group.popen(MAPS)) as client:
        time.sleep(2)
        start = time.time()
        time.sleep(window_s)
        steady = client.count_between(start, time.time()) / (time.time() - start)
        begin = time.time()
        for i in range(2):
            group.stop(i)
            group.start(i)
        end = time.time()
        client.alive()
        during = client.count_between(begin, end) / (end - begin)
        return steady * 100, during * 100, end - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each failover measurement")
    parser.add_argument("--only", choices=["frozen"], help="run only this measurement")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady state measured")
    args = parser.parse_args()
    for key, value in machine().items():
        print(f"- {key}: {value}")
    with redis_server() as redis_url, running_postgres() as pg:
        if args.only == "frozen":
            frozen = [frozen_replica(pg, redis_url) for _ in range(args.repeat)]
            print(
                f"\nfrozen replica: calls go on {statistics.median(frozen):.1f} s after SIGSTOP (median; "
                f"{', '.join(f'{f:.1f}' for f in frozen)} s)"
            )
            return
        clients = [client_failover(pg, redis_url) for _ in range(args.repeat)]
        print(f"  client failover (pause, steady gap): {clients}", file=sys.stderr)
        workers = [worker_failover(pg, redis_url) for _ in range(args.repeat)]
        print(f"  worker failover (pause, steady gap): {workers}", file=sys.stderr)
        frozen = [frozen_replica(pg, redis_url) for _ in range(args.repeat)]
        print(f"  frozen replica (SIGSTOP to calls going on): {frozen}", file=sys.stderr)
        steady, during, took = rolling(pg, redis_url, args.window)
    print("\n| measurement | longest pause between two calls, median | runs | one call, steady |")
    print("|--|--:|--|--:|")
    for name, runs in (
        ("replica killed, the client moves to the other", clients),
        ("replica holding the workers killed, the client on the other", workers),
    ):
        pauses = [p for p, _ in runs]
        print(
            f"| {name} | {statistics.median(pauses):.2f} s | {', '.join(f'{p:.2f}' for p in pauses)} "
            f"| {statistics.median(g for _, g in runs) * 1000:.0f} ms |"
        )
    print(
        f"\nReplica holding the workers frozen (SIGSTOP, worker_keepalive_s 30 s), the client on the other: "
        f"calls go on {statistics.median(frozen):.1f} s after the stop (median; "
        f"{', '.join(f'{f:.1f}' for f in frozen)} s)."
    )
    print(
        f"\nRolling restart of both replicas ({took:.0f} s): {during:,.0f} tasks/s against {steady:,.0f} tasks/s "
        f"steady ({during / steady:.2f}x); no call failed."
    )


if __name__ == "__main__":
    main()
