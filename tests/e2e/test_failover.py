"""Any replica finishes what another started: the replica holding the workers dies and stays down.

The workers dial replica 0 first (the first address of ``listen.advertise``), so their sessions are there;
the client talks to replica 1 only. Killing replica 0 with SIGKILL in the middle of a ``.map`` must lose
nothing: each worker registers with replica 1, says which calls it holds (those are claimed there, not run
again; any sent into the dying session but never received go back on the backlog), re-sends results replica
0 may not have stored, and the map's 1,000 results arrive in order.

The bound: a worker notices the broken session at once and tries the next address without backing off, so
its calls continue within about one registration round trip; a call whose worker was truly gone would be
requeued after ``scheduler.worker_keepalive_s`` (3 s here) plus one reaper period. The test's own timeout
(the pytest-timeout mark) is the only limit on time; the measured figures go to the closing note and
bench/RESULTS.md, never into an assertion.

A rolling restart (each replica SIGTERMed and started again in turn, during traffic) fails no call, leaves
no task unfinished and no worker registered twice.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.fixtures.levers9_up import end_session
from tests.fixtures.replicas import Replicas

pytestmark = pytest.mark.timeout(600)

MAP_PROGRAM = """
import levers9

@levers9.function(cpu=0.25)
def square(x: int) -> int:
    return x * x

print("warm", square.remote(3), flush=True)
for value in square.map(range({count})):
    print(value, flush=True)
print("done", flush=True)
"""


class Output:
    """A running program's stdout lines and stderr, read by threads (so neither pipe fills), killed on exit.

    Reading one pipe with ``readline`` and then calling ``communicate`` loses lines: ``communicate`` reads
    the file descriptor, not what the text wrapper had already buffered.
    """

    def __init__(self, program: subprocess.Popen[str]) -> None:
        self.program = program
        self.lines: list[str] = []
        #: when each line of ``lines`` arrived (monotonic)
        self.times: list[float] = []
        self._err: list[str] = []
        self._new = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(program.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(program.stderr, self._err), daemon=True),
        ]

    @property
    def err(self) -> str:
        return "".join(self._err)

    def _read(self, pipe: IO[str] | None, into: list[str]) -> None:
        assert pipe is not None
        for line in pipe:
            with self._new:
                if into is self.lines:
                    self.times.append(time.monotonic())
                into.append(line.rstrip("\n") if into is self.lines else line)
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_lines(self, count: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        with self._new:
            while len(self.lines) < count:
                assert self.program.poll() is None or self._readers[0].is_alive(), (
                    f"the program ended after {len(self.lines)} lines: {self.lines[-5:]}\n{self.err[-3000:]}"
                )
                assert time.monotonic() < deadline, f"only {len(self.lines)} lines: {self.lines[-5:]}"
                self._new.wait(0.5)

    def wait_exit(self, timeout: float) -> int:
        code = self.program.wait(timeout)
        for reader in self._readers:
            reader.join(30)
        return code

    def __enter__(self) -> Output:
        for reader in self._readers:
            reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.program.poll() is None:
            self.program.kill()
        self.wait_exit(30)


def _unfinished(replicas: Replicas, port: int) -> list[dict[str, object]]:
    """Tasks still pending or running, as a replica's REST API lists them."""
    found: list[dict[str, object]] = []
    for status in ("pending", "running"):
        response = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/tasks",
            params={"status": status, "limit": 500},
            headers={"authorization": f"Bearer {replicas.token}"},
            timeout=10,
        )
        response.raise_for_status()
        body = response.json()
        found += body["tasks"] if isinstance(body, dict) else body
    return found


def test_killing_the_replica_that_holds_the_workers_mid_map_loses_nothing(replicas: Replicas) -> None:
    replicas.min_workers = replicas.max_workers = 2
    replicas.start_all()
    count = 1000
    program = replicas.popen(MAP_PROGRAM.format(count=count), addresses=[replicas.addresses[1]])
    with Output(program) as output:
        output.wait_lines(101)  # "warm" and the first 100 results
        killed_at = time.monotonic()
        replicas.kill(0)
        output.wait_exit(400)
        took = time.monotonic() - killed_at
    lines, err = output.lines, output.err
    assert program.returncode == 0, "\n".join(lines[-20:]) + err + replicas.logs()
    wanted = ["warm 9", *(str(i * i) for i in range(count)), "done"]
    first = next(
        (i for i, (a, b) in enumerate(zip(lines, wanted, strict=False)) if a != b), min(len(lines), len(wanted))
    )
    assert lines == wanted, f"from line {first}: {lines[first : first + 5]}\n{err[-3000:]}"
    print(f"the last {count - 100} results took {took:.1f} s after replica 0 was killed")
    assert _unfinished(replicas, replicas.replicas[1].http_port) == []


REMOTE_PROGRAM = """
import levers9

@levers9.function(cpu=0.25)
def echo(x: int) -> int:
    return x

for i in range({count}):
    assert echo.remote(i) == i
    print("call", i, flush=True)
print("done", flush=True)
"""


def test_killing_the_replica_a_client_submits_to_fails_none_of_its_calls(replicas: Replicas) -> None:
    """Calls one after another: the kill lands while one is being submitted, answered or watched. The one
    cut off before its id came is sent again to the other replica with the same submission id (stored
    once); every call completes, and no call ran twice."""
    replicas.start_all()
    count = 300
    program = replicas.popen(REMOTE_PROGRAM.format(count=count))  # both replicas listed; replica 0 first
    with Output(program) as output:
        output.wait_lines(40)
        replicas.kill(0)
        output.wait_exit(300)
    assert program.returncode == 0, "\n".join(output.lines[-10:]) + output.err[-3000:] + replicas.logs()
    assert output.lines == [*(f"call {i}" for i in range(count)), "done"]
    response = httpx.get(
        f"http://127.0.0.1:{replicas.replicas[1].http_port}/api/v1/tasks",
        params={"limit": 1000},
        headers={"authorization": f"Bearer {replicas.token}"},
        timeout=10,
    )
    response.raise_for_status()
    assert len(response.json()) == count  # every call stored once: none submitted twice


def test_a_worker_leaves_a_replica_that_froze_without_closing_its_connections(replicas: Replicas) -> None:
    """SIGSTOP: replica 0 keeps its sockets open and answers nothing, like a host gone from the network.

    The worker is started by hand (no provider replaces it), with replica 0 first. Its pings on the session
    find replica 0 gone and it registers with replica 1, which runs the calls; without pings it would wait
    for TCP to give up, which takes minutes.
    """
    replicas.min_workers = replicas.max_workers = 0
    replicas.start_all()
    issued = replicas.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert issued.returncode == 0, issued.stderr
    log_path = replicas.root / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "levers9",
                "worker",
                "--controlplane",
                ",".join(replicas.addresses),
                "--pool",
                "local",
                "--state-dir",
                str(replicas.root / "worker-state"),
            ],
            env={**replicas.env, "LEVERS9_TOKEN": issued.stdout.strip()},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process = replicas.replicas[0].process
    assert process is not None
    try:
        replicas.wait_workers(1, timeout=60)
        process.send_signal(signal.SIGSTOP)
        done = replicas.python(REMOTE_PROGRAM.format(count=3), addresses=[replicas.addresses[1]], timeout=180)
        assert done.returncode == 0, done.stderr[-3000:] + log_path.read_text()[-3000:]
        assert done.stdout.splitlines() == ["call 0", "call 1", "call 2", "done"]
    finally:
        replicas.kill(0)  # SIGKILL ends a stopped process too
        end_session(worker)


ROLLING_PROGRAM = """
import levers9

@levers9.function(cpu=0.25)
def inc(x: int) -> int:
    return x + 1

rounds = 0
while True:
    got = list(inc.map(range(50)))
    assert got == list(range(1, 51)), got
    rounds += 1
    print("round", rounds, flush=True)
"""


def test_a_rolling_restart_fails_no_call_and_leaves_nothing_behind(replicas: Replicas) -> None:
    replicas.min_workers = replicas.max_workers = 2
    replicas.start_all()
    program = replicas.popen(ROLLING_PROGRAM)
    with Output(program) as output:
        rounds = 3
        output.wait_lines(rounds)
        for i in range(len(replicas.replicas)):
            replicas.stop(i)  # SIGTERM, as a service manager stops it for an upgrade
            rounds += 2
            output.wait_lines(rounds)  # the other replica carries the traffic
            replicas.start(i)
            rounds += 2
            output.wait_lines(rounds)
    assert all(line.startswith("round") for line in output.lines[:rounds]), output.err[-3000:]
    # nothing left unfinished once the killed client's last calls settle, and no worker counted twice
    deadline = time.monotonic() + 60
    while True:
        left = [t for t in _unfinished(replicas, replicas.replicas[0].http_port) if t.get("status") == "running"]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == []
    workers = replicas.workers()
    assert len(workers) == 2, workers
    assert len({w["id"] for w in workers}) == 2
    # no gauge outlives what it counts: one lease holder, the workers counted once, nothing serving or waiting
    deadline = time.monotonic() + 30
    while True:
        scraped = [_metrics(r.metrics_port) for r in replicas.replicas]
        merged = [line for text in scraped for line in text]
        holders = sum(v for name, v in merged if name.startswith("levers9_planner_lease_held{"))
        workers_running = sum(
            v for name, v in merged if name.startswith("levers9_workers{") and 'status="running"' in name
        )
        if (holders, workers_running) == (1, 2) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (holders, workers_running) == (1, 2), merged
    leftovers = [
        (name, v)
        for name, v in merged
        if v and name.startswith(("levers9_serving_containers{", "levers9_gateway_waiting_requests{"))
    ]
    assert leftovers == []


def _metrics(port: int, timeout: float = 10) -> list[tuple[str, float]]:
    """A replica's samples as (name{labels}, value), comments left out."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout).text
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples.append((name, float(value)))
    return samples


#: how long the replica holding the workers stays stopped: past the default worker_keepalive_s (30 s) and the
#: reaper's period after it, when the trial's workers were judged gone and killed
FREEZE_S = 40
FROZEN_PROGRAM = """
import time
import levers9

@levers9.function(cpu=0.25)
def slow_square(x: int) -> int:
    with open({runs!r}, "a") as runs:
        runs.write(f"{{x}}\\n")
    time.sleep(1)
    return x * x

print("warm", slow_square.remote(-1), flush=True)
for value in slow_square.map(range({count})):
    print(value, flush=True)
print("done", flush=True)
"""


class Scrapes:
    """Both replicas' ``levers9_planner_lease_held`` scraped every half second, in a thread, until closed.

    A frozen replica answers no scrape (its metrics request times out): it is counted as not holding.
    """

    def __init__(self, replicas: Replicas) -> None:
        self.ports = [r.metrics_port for r in replicas.replicas]
        self.seen: list[tuple[float, list[float | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _held(self, port: int) -> float | None:
        try:
            samples = _metrics(port, timeout=2)
        except httpx.HTTPError:
            return None
        return sum(v for name, v in samples if name.startswith("levers9_planner_lease_held{"))

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.seen.append((time.monotonic(), [self._held(port) for port in self.ports]))

    def __enter__(self) -> Scrapes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _pool_workers(replicas: Replicas) -> dict[str, int]:
    """The ``local`` pool's worker processes alive now, as its records list them: machine id -> pid."""
    found: dict[str, int] = {}
    for path in (replicas.root / "state" / "levers9" / "local" / "local").glob("*.json"):
        record = json.loads(path.read_text())
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            continue
        found[record["machine_id"]] = record["pid"]
    return found


def _ran(runs: Path) -> int:
    """How many calls began (each writes a line first)."""
    return len(runs.read_text().split()) if runs.exists() else 0


def _holders(replicas: Replicas) -> list[float]:
    """Each replica's ``levers9_planner_lease_held`` (0 for one that does not answer)."""
    held = []
    for replica in replicas.replicas:
        try:
            samples = _metrics(replica.metrics_port, timeout=5)
        except httpx.HTTPError:
            samples = []
        held.append(sum(v for name, v in samples if name.startswith("levers9_planner_lease_held{")))
    return held


def _lease_to(replicas: Replicas, i: int) -> None:
    """Have replica ``i`` hold the planner lease: the other one (that holds it) is restarted, releasing it."""
    deadline = time.monotonic() + 60
    while (held := _holders(replicas)).count(1) != 1:
        assert time.monotonic() < deadline, held
        time.sleep(0.5)
    holder = held.index(1)
    if holder == i:
        return
    replicas.stop(holder)  # SIGTERM releases the lease; the other replica takes it at its next leader step
    while _holders(replicas)[i] != 1:
        assert time.monotonic() < deadline, replicas.logs()
        time.sleep(0.5)
    replicas.start(holder)


def _pool_logs(replicas: Replicas) -> str:
    """The tail of each pool worker's log, for assertion messages."""
    logs = sorted((replicas.root / "state" / "levers9" / "local" / "local").glob("*.log"))
    return "\n".join(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}" for path in logs)


def test_a_frozen_replica_costs_seconds_and_kills_no_worker(replicas: Replicas) -> None:
    """SIGSTOP of the replica holding the pool workers' sessions, mid-map, for longer than the keepalive TTL.

    Replica 0 holds the workers' sessions and the planner lease; the client talks to replica 1.
    ``worker_keepalive_s`` is the default (30 s) and the freeze lasts :data:`FREEZE_S` (40 s): what the
    trial found (the workers staying on the frozen replica, the other one judging them silent, requeueing
    their calls and killing them) happens after that TTL, so a shorter freeze or TTL would hide it. The
    workers' pings move them to replica 1 (in about 16 s) and the map goes on there during the freeze; no
    worker process is killed, every result arrives in order, calls run twice are at most those in flight
    on the workers at the stop, and no scrape of either replica ever shows two lease holders, before or
    after SIGCONT (replica 0 reads 0 from its first answer on). About 100 s.
    """
    replicas.min_workers = replicas.max_workers = 2
    replicas.worker_keepalive_s = 30
    replicas.start_all()
    _lease_to(replicas, 0)  # the frozen replica holds the lease too: it resumes believing it still does
    frozen = replicas.replicas[0].process
    assert frozen is not None
    before = _pool_workers(replicas)
    assert len(before) == 2, before
    # calls run as nobody, who cannot enter the test's directory: each run is written in one it may write to
    runs_dir = Path(tempfile.mkdtemp(prefix="levers9-runs-"))
    runs_dir.chmod(0o777)
    runs = runs_dir / "runs.txt"
    count = 300
    program = replicas.popen(FROZEN_PROGRAM.format(runs=str(runs), count=count), addresses=[replicas.addresses[1]])
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, runs_dir, ignore_errors=True)
        scrapes = cleanup.enter_context(Scrapes(replicas))
        output = cleanup.enter_context(Output(program))
        deadline = time.monotonic() + 120
        while _ran(runs) < 80:  # a quarter of the calls started: the map is in full flow on both workers
            assert program.poll() is None, output.err[-3000:]
            assert time.monotonic() < deadline, (_ran(runs), output.lines[-5:], replicas.logs())
            time.sleep(0.05)
        stopped_at = time.monotonic()
        frozen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)
        finally:
            frozen.send_signal(signal.SIGCONT)
        continued_at = time.monotonic()
        output.wait_exit(300)
        # replica 0 is back: it must neither act on what it believed (kill a worker) nor claim the lease
        time.sleep(max(0.0, continued_at + 10 - time.monotonic()))
        after = _pool_workers(replicas)
        ran = Counter(runs.read_text().split())
        worker_logs = _pool_logs(replicas)
    lines, err = output.lines, output.err
    assert program.returncode == 0, "\n".join(lines[-20:]) + err[-3000:] + replicas.logs()
    assert lines == ["warm 1", *(str(i * i) for i in range(count)), "done"], err[-3000:]
    # the pause: the longest wait for a result after the stop (results already on their way arrive at once)
    after_stop = [stopped_at, *(t for t in output.times if t > stopped_at)]
    resumed_at = max(itertools.pairwise(after_stop), key=lambda pair: pair[1] - pair[0])[1]
    during = sum(1 for t in output.times if stopped_at < t < continued_at)
    twice = [x for x, n in ran.items() if n > 1 and x != "-1"]
    two_holders = [(round(t - stopped_at, 1), held) for t, held in scrapes.seen if held.count(1) > 1]
    print(
        f"frozen replica: results went on {resumed_at - stopped_at:.1f} s after SIGSTOP (the longest wait); "
        f"{during} results during the freeze; {len(twice)} calls ran twice; {len(scrapes.seen)} scrapes"
    )
    assert during >= 150, (during, worker_logs, replicas.logs())  # the other replica carried the map
    assert two_holders == [], two_holders
    # after SIGCONT replica 0 reads 0 from its first answer on, and replica 1 goes on holding the lease
    resumed = [held for t, held in scrapes.seen if t > continued_at]
    assert resumed, scrapes.seen
    assert all(held[0] in (0, None) for held in resumed), resumed
    assert resumed[-1] == [0, 1], resumed
    assert after == before, (before, after, worker_logs, replicas.logs())
    assert len(twice) <= 16, (twice, worker_logs, replicas.logs())  # 2 workers x 8 calls of 0.25 cpu in 2 cpus
