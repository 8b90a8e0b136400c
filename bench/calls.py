"""Function calls end to end: levers9 (`levers9 up`) against a local Ray, doing the same no-op work.

Measured on each, after a warm-up that leaves warm workers behind:

1. throughput of ``.map`` over N no-op calls (levers9: ``f.map(range(N))``;
   Ray: ``ray.get([f.remote(i) for i in range(N)])``), in calls per second;
2. latency of one ``.remote()`` on a warm worker, one call after another
   (levers9: ``f.remote(i)``; Ray: ``ray.get(f.remote(i))``): p50 and p99.

levers9 runs as a user runs it: `levers9 up` (SQLite, the embedded Redis, one
local pool of the `process` runtime with as many CPUs as this machine), and
the calls come from another process through the SDK. Ray gets the same CPUs
(``ray.init(num_cpus=...)``). Each side runs in its own processes, one after
the other, so they never share the machine.

During the latency loop, the CPU each process of the run spends is read from
``/proc`` (user + system time, per call): levers9's controlplane, worker,
runners, redis-server and client, found by the run's home in their
environment; Ray's driver, raylet, GCS and workers, found as the driver's
descendants. On a machine whose CPUs the processes share, a sequential call
takes at least the CPU its busiest process spends on it, so this says where a
call's latency goes.

Run: ``.venv/bin/python bench/calls.py`` (Ray comes from ``pip install 'levers9[bench]'``);
``--write`` appends the table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.agents_proc import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]

LEVERS9_CLIENT = """
import json, sys, time, levers9

@levers9.function(cpu={cpu}, memory={memory})
def noop(x):
    return x

n, latency_calls = {n}, {latency_calls}
list(noop.map(range(min(n, 2000))))  # warm-up: containers up, stub registered
start = time.perf_counter()
out = list(noop.map(range(n)))
took = time.perf_counter() - start
assert out == list(range(n))
lat = []
open({marks!r} + ".start", "w").close()
for i in range(latency_calls):
    t = time.perf_counter()
    noop.remote(i)
    lat.append(time.perf_counter() - t)
open({marks!r} + ".end", "w").close()
lat.sort()
print(json.dumps({{"throughput": n / took, "p50_ms": lat[len(lat) // 2] * 1000,
                  "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000}}))
"""

RAY_CLIENT = """
import json, time, ray

ray.init(num_cpus={cpus}, include_dashboard=False, logging_level="ERROR")

@ray.remote
def noop(x):
    return x

n, latency_calls = {n}, {latency_calls}
ray.get([noop.remote(i) for i in range(min(n, 2000))])  # warm-up: workers up
start = time.perf_counter()
out = ray.get([noop.remote(i) for i in range(n)])
took = time.perf_counter() - start
assert out == list(range(n))
lat = []
open({marks!r} + ".start", "w").close()
for i in range(latency_calls):
    t = time.perf_counter()
    ray.get(noop.remote(i))
    lat.append(time.perf_counter() - t)
open({marks!r} + ".end", "w").close()
lat.sort()
print(json.dumps({{"throughput": n / took, "p50_ms": lat[len(lat) // 2] * 1000,
                  "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000}}))
ray.shutdown()
"""


def _cpu_s(pid: int) -> float:
    """CPU seconds the process has used so far (its own, not its children's); 0 once it is gone."""
    try:
        return cpu_seconds(pid, children=False)
    except ProcessLookupError:
        return 0.0


def _processes(belongs: Callable[[int], bool]) -> dict[int, str]:
    """The processes ``belongs`` picks, by pid, each named by its command line."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and belongs(int(entry.name)):
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
    return found


class CpuPerCall:
    """CPU each process spends while the client makes its sequential ``.remote()`` calls (per call).

    The client marks the loop's start and end with files ``<marks>.start`` and ``<marks>.end``; a thread
    reads the CPU of every process ``belongs`` picks at both marks. Processes are grouped by ``name_of``.
    """

    def __init__(self, marks: Path, belongs: Callable[[int], bool], name_of: Callable[[str], str]) -> None:
        self.marks, self.belongs, self.name_of = marks, belongs, name_of
        self.by_name: dict[str, float] = {}
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        start, end = Path(f"{self.marks}.start"), Path(f"{self.marks}.end")
        while not start.exists():
            time.sleep(0.01)
        procs = _processes(self.belongs)
        before = {pid: _cpu_s(pid) for pid in procs}
        while not end.exists():
            time.sleep(0.01)
        for pid, name in procs.items():
            used = _cpu_s(pid) - before[pid]
            group = self.name_of(name)
            self.by_name[group] = self.by_name.get(group, 0.0) + max(0.0, used)

    def per_call_ms(self, calls: int) -> dict[str, float]:
        self._thread.join(30)
        return {name: used / calls * 1000 for name, used in sorted(self.by_name.items(), key=lambda kv: -kv[1])}


def _environ_has(pid: int, text: bytes) -> bool:
    try:
        return text in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _cmdline_has(pid: int, text: bytes) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


#: what a process of each run is, by a part of its command line (the first that matches)
LEVERS9_PARTS = (
    ("levers9 up", "controlplane (levers9 up)"),
    ("levers9 worker", "worker"),
    ("levers9.runner", "runners"),
    ("redis-server", "redis-server"),
    ("client.py", "client (SDK)"),
)
RAY_PARTS = (
    ("raylet", "raylet"),
    ("gcs_server", "gcs_server"),
    ("ray::", "workers"),
    ("default_worker", "workers"),
    ("-c", "driver (client)"),
)


def _part(parts: tuple[tuple[str, str], ...]) -> Callable[[str], str]:
    def name_of(cmdline: str) -> str:
        return next((named for part, named in parts if part in cmdline), "other")

    return name_of


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_levers9(n: int, latency_calls: int, cpu: float, memory: int, cpus: int, queue: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="l9-bench-"))
    home = root / "home"
    home.mkdir()
    (home / "levers9.yaml").write_text(
        "version: 1\npools:\n  local:\n    provider: local\n    runtime: process\n"
        f"    cpu: {cpus}\n    memory: 8192\n    min_workers: 1\n    max_workers: 1\n"
        f"scheduler:\n  worker_queue: {queue}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(LEVERS9_HOME=str(home), XDG_STATE_HOME=str(root / "state"))
    ports = [str(_free_port()) for _ in range(3)]
    log = (root / "up.log").open("wb")
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "levers9",
            "up",
            "--grpc-port",
            ports[0],
            "--http-port",
            ports[1],
            "--metrics-port",
            ports[2],
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while b"levers9 is up" not in (root / "up.log").read_bytes():
            if up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("levers9 up did not start:\n" + (root / "up.log").read_text()[-3000:])
            time.sleep(0.1)
        client = root / "client.py"
        marks = root / "latency"
        client.write_text(
            LEVERS9_CLIENT.format(n=n, latency_calls=latency_calls, cpu=cpu, memory=memory, marks=str(marks))
        )
        # every process of this run has its directory in its environment (the controlplane, its worker and
        # the worker's runners, the client) or its command line (redis-server)
        mine = str(root).encode()
        cpu_use = CpuPerCall(
            marks, lambda pid: _environ_has(pid, mine) or _cmdline_has(pid, mine) or pid == up.pid, _part(LEVERS9_PARTS)
        )
        done = subprocess.run([sys.executable, str(client)], env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"the levers9 client failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["cpu_ms"] = cpu_use.per_call_ms(latency_calls)
        return result
    finally:
        up.terminate()
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def run_ray(n: int, latency_calls: int, cpus: int) -> dict[str, Any] | str:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed: pip install 'levers9[bench]'"
    with tempfile.TemporaryDirectory(prefix="l9-bench-ray-") as tmp:
        marks = Path(tmp) / "latency"
        driver = subprocess.Popen(
            [sys.executable, "-c", RAY_CLIENT.format(n=n, latency_calls=latency_calls, cpus=cpus, marks=str(marks))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Ray's processes descend from the driver (raylet, GCS, workers)
        cpu_use = CpuPerCall(marks, lambda pid: _descends(pid, driver.pid), _part(RAY_PARTS))
        try:
            out, err = driver.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            driver.kill()
            out, err = driver.communicate()
        if driver.returncode != 0:
            return f"Ray failed: {err[-2000:]}"
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result["cpu_ms"] = cpu_use.per_call_ms(latency_calls)
        return result


def _cpu_line(cpu_ms: dict[str, float]) -> str:
    parts = ", ".join(f"{name} {ms:.2f}" for name, ms in cpu_ms.items())
    return f"{sum(cpu_ms.values()):.2f} in all: {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000, help="calls in the measured map (default 10,000)")
    parser.add_argument("--latency-calls", type=int, default=300, help="sequential .remote() calls timed")
    parser.add_argument(
        "--sizes",
        default="0.125:128,0.002:4",
        help="levers9 call sizes to measure, CPU:MiB each (default: the SDK's default size, and a tiny one); "
        "a worker holds as many calls at once as their sizes fit",
    )
    parser.add_argument(
        "--queues",
        default="256,0",
        help="scheduler.worker_queue values to measure each size with (default: the default, 256, and 0: off)",
    )
    parser.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    sizes = [(float(c), int(m)) for c, m in (s.split(":") for s in args.sizes.split(","))]
    queues = [int(q) for q in args.queues.split(",")]
    ours = {
        (cpu, memory, queue): run_levers9(args.n, args.latency_calls, cpu, memory, cpus, queue)
        for cpu, memory in sizes
        for queue in queues
    }
    theirs = run_ray(args.n, args.latency_calls, cpus)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{platform.node()}: {cpus} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    lines = [
        f"### Function calls, levers9 against Ray ({when})",
        "",
        f"Machine: {machine}. `.map` over {args.n:,} no-op calls on warm workers, then {args.latency_calls} "
        f"sequential `.remote()` calls. levers9: `levers9 up` (SQLite, embedded Redis, one local pool of the "
        f"`process` runtime, {cpus} CPUs, 8 GiB), every call stored in SQL. Ray: `ray.init(num_cpus={cpus})`.",
        "",
        "| | map throughput (calls/s) | `.remote()` p50 (ms) | `.remote()` p99 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for (cpu, memory, queue), r in ours.items():
        lines.append(
            f"| levers9, calls of {cpu:g} CPU / {memory} MiB, worker queue {queue} | {r['throughput']:,.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    if isinstance(theirs, str):
        lines.append(f"| Ray | {theirs} | | |")
    else:
        lines.append(f"| Ray | {theirs['throughput']:,.0f} | {theirs['p50_ms']:.1f} | {theirs['p99_ms']:.1f} |")
        ray = theirs["throughput"]
        lines.append("")
        lines += [
            f"levers9 / Ray throughput, calls of {c:g} CPU, worker queue {q}: {r['throughput'] / ray:.2f}x"
            for (c, _, q), r in ours.items()
        ]
    lines += [
        "",
        f"CPU per sequential `.remote()` call, by process (ms; {args.latency_calls} calls; the machine's "
        "CPUs are shared, so a call's latency is at least the largest of these):",
        "",
    ]
    for (c, _, q), r in ours.items():
        lines.append(f"- levers9, {c:g} CPU, worker queue {q}: " + _cpu_line(r["cpu_ms"]))
    if not isinstance(theirs, str):
        lines.append("- Ray: " + _cpu_line(theirs["cpu_ms"]))
    table = "\n".join(lines)
    print(table)
    if args.write:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
