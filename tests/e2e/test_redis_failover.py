"""Two replicas on a Redis behind Sentinel: the Redis primary dies mid-map, Sentinel fails over, nothing is lost.

A real primary, replica and three Sentinels (tests/fixtures/redis_sentinel.py, ``down-after-milliseconds``
1000), two ``levers9 server`` replicas on PostgreSQL with ``state.redis_url: redis+sentinel://...``
(tests/fixtures/replicas.py), and a ``.map`` of 400 calls. SIGKILL of the Redis primary after the first
100 results: while no primary is elected, Redis commands fail and are retried by their callers; then every
connection finds the new primary through the Sentinels, the scripts are loaded there again, the
subscriptions open again, each replica notices the new server (levers9.state.redis.watch) and puts back
from SQL whatever the new primary lacks, and the map ends with every result right and in order, no task left unfinished.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tests.e2e.test_failover import Output, _unfinished
from tests.fixtures.redis_sentinel import SentinelRedis, redis_sentinel  # noqa: F401
from tests.fixtures.replicas import Replicas

pytestmark = pytest.mark.timeout(300)

#: calls that take a while, so many are running or queued when Redis fails (2 workers, 8 calls each at once)
SLOW_MAP = """
import time
import levers9

@levers9.function(cpu=0.25)
def square(x: int) -> int:
    time.sleep(0.3)
    return x * x

print("warm", square.remote(3), flush=True)
for value in square.map(range({count})):
    print(value, flush=True)
print("done", flush=True)
"""


def test_killing_the_redis_primary_mid_map_loses_nothing(
    redis_sentinel: SentinelRedis,  # noqa: F811 - first, so it stops after the replicas (they stop against a Redis)
    replicas: Replicas,
) -> None:
    replicas.redis_url = redis_sentinel.url
    replicas.min_workers = replicas.max_workers = 2
    started = time.monotonic()
    replicas.start_all()
    print(f"replicas up in {time.monotonic() - started:.1f} s")
    count = 300
    program = replicas.popen(SLOW_MAP.format(count=count), addresses=[replicas.addresses[1]])
    with Output(program) as output:
        output.wait_lines(61)  # "warm" and the first 60 results: about 4 s of work left
        at_kill = len(output.lines)
        killed_at, killed_wall = time.monotonic(), datetime.now()
        redis_sentinel.kill_primary()
        redis_sentinel.wait_failover()
        failed_over = time.monotonic() - killed_at
        at_failover = len(output.lines)
        output.wait_exit(200)
        took = time.monotonic() - killed_at
    lines, err = output.lines, output.err
    assert program.returncode == 0, "\n".join(lines[-20:]) + err + replicas.logs()
    wanted = ["warm 9", *(str(i * i) for i in range(count)), "done"]
    first = next(
        (i for i, (a, b) in enumerate(zip(lines, wanted, strict=False)) if a != b), min(len(lines), len(wanted))
    )
    assert lines == wanted, f"from line {first}: {lines[first : first + 5]}\n{err[-3000:]}"
    # A success reaches its caller before it is stored (0.2 s here unloaded, longer beside a CPU hog), and calls
    # are at least once (a report Redis lost with the old primary may run its call again): nothing may stay
    # unfinished, so every task ends within a minute of the map's end.
    drained = time.monotonic()
    for replica in replicas.replicas:
        while left := _unfinished(replicas, replica.http_port):
            if time.monotonic() - drained > 60:
                ids = [str(t["id"]) for t in left]
                full = "\n".join(r.log() for r in replicas.replicas)
                about = [line for line in full.splitlines() if any(i in line for i in ids)]
                pytest.fail(f"unfinished a minute after the map: {left}\n" + "\n".join(about[-40:]))
            time.sleep(0.5)
    drain_s = time.monotonic() - drained
    noticed = []
    for replica in replicas.replicas:  # each sees the new primary and puts back what SQL has and Redis lost
        deadline = time.monotonic() + 30
        while not (done := [x for x in replica.log().splitlines() if "rebuilt the Redis state from SQL" in x]):
            assert time.monotonic() < deadline, replica.log()[-3000:]
            time.sleep(0.1)
        at = datetime.strptime(done[0][:23], "%Y-%m-%d %H:%M:%S,%f")  # the log's local time, as datetime.now()
        noticed.append((at - killed_wall).total_seconds())
    print(
        f"{at_kill} lines at the kill, {at_failover} at the failover ({failed_over:.1f} s later); "
        f"the map ended {took:.1f} s after the kill ({drain_s:.1f} s more until no task was unfinished); the replicas rebuilt {noticed[0]:.1f} and {noticed[1]:.1f} s after it"
    )
