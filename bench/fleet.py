"""The controlplane at fleet scale: its CPU and memory at rest with 1,000 idle workers and 100 agents connected.

Against a real ``levers9 up`` over TLS (``bench/agents_setup.py``: SQLite, the
embedded redis-server, a throw-away CA), with two pools: ``box`` (provider
``agent_machine``, for the agents) and ``fleet`` (provider ``local`` with
``min_workers: 0, max_workers: 0``, so the controlplane never starts a worker
of its own; its workers register with a pool worker token, as workers started
by hand do). Two windows, each after the controlplane has settled:

- **baseline** (``--only baseline``): nothing connected, ``--baseline`` seconds;
- **loaded** (``--only loaded``): two load generators in processes of their
  own, whose CPU is shown but never counted: ``bench/fleet_load.py`` registers
  ``--workers`` simulated idle workers and holds their sessions (a keepalive
  every ``RegisterResponse.keepalive_s``, gRPC pings every 15 s, see its
  docstring for what a simulated worker does and does not do), and
  ``bench/agents_load.py`` creates, joins and connects ``--agents`` simulated
  agents (``levers9 machine create`` as ``CreateJoinedMachine``, then ``Join``
  and a ``Connect`` stream heartbeating every ``Welcome.heartbeat_s``).
  ``--window`` seconds, starting ``SETTLE_S`` after every worker registered
  and every agent connected.

Measured as ``bench/agents.py`` measures (``bench/agents_proc.py``): the
controlplane's CPU and its redis-server's, separately (``utime + stime`` over
the window's wall time; 100% is one core), the controlplane's by thread group,
RSS and PSS at the end of the window. Afterwards the controlplane is asked
how many workers it lists and how many machines of ``box`` are connected; a
loaded window in which a worker's session ended or a worker or an agent was
lost is printed marked as such, and the run exits with status 1.

Run: ``.venv/bin/python bench/fleet.py`` (``--help``; ``--only baseline`` and
``--only loaded`` run the two windows against separate controlplanes, to keep
each run short). ``--profile FILE`` attaches py-spy to the loaded controlplane;
``--worker-ping-s`` and ``--worker-keepalive-s`` make the simulated workers
ping or keep alive at other intervals than real ones: what-ifs, labelled as
such in the table, never figures of the product.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents import SETTLE_S, LoadGenerator, Window, measure, pct
from bench.agents_proc import memory
from bench.agents_setup import Controlplane
from bench.fleet_load import TOKEN_ENV
from bench.placement import machine
from levers9.worker.session import SESSION_PING_S

#: the pool the simulated workers register in: the controlplane itself never starts one (max_workers 0)
FLEET_POOL = """\
  fleet:
    provider: local
    runtime: process
    cpu: 2
    memory: 4GiB
    min_workers: 0
    max_workers: 0
"""


@dataclass(frozen=True)
class WhatIf:
    """How the simulated workers differ from real ones in a what-if run (the defaults: they do not)."""

    #: seconds between gRPC pings on each worker's connection
    ping_s: float = SESSION_PING_S
    #: seconds between keepalives; 0: what Register answers
    keepalive_s: float = 0.0

    def __str__(self) -> str:
        said = [f"pings every {self.ping_s:g} s"] if self.ping_s != SESSION_PING_S else []
        said += [f"keepalives every {self.keepalive_s:g} s"] if self.keepalive_s else []
        return f" (what-if: workers' {', '.join(said)})" if said else ""


class WorkerLoad(LoadGenerator):
    """``bench/fleet_load.py`` in its own process; its JSON lines in a queue (read as ``LoadGenerator`` reads)."""

    def __init__(self, cp: Controlplane, count: int, token: str, what_if: WhatIf) -> None:
        script = Path(__file__).resolve().parent / "fleet_load.py"
        self.log_path = cp.root / "fleet_load.log"
        self.stderr = self.log_path.open("wb")
        args = [
            "--count",
            str(count),
            "--pool",
            "fleet",
            "--ping-s",
            str(what_if.ping_s),
            "--keepalive-s",
            str(what_if.keepalive_s),
        ]
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            env=cp.env | {TOKEN_ENV: token},
            cwd=cp.root,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()


@dataclass
class Loaded:
    workers: int
    agents: int
    window: Window
    #: seconds from starting the load generators to every worker registered / every agent connected
    workers_up_s: float
    agents_up_s: float
    listed_workers: int
    connected_agents: int
    redis_rss_mib: float
    worker_counts: dict[str, Any]
    agent_counts: dict[str, Any]
    load_avg: tuple[str, str]
    what_if: WhatIf
    #: why the fleet did not hold through the window (a worker's session ended, one missing): "" when it held
    trouble: str = ""


def load_avg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def baseline(seconds: float) -> tuple[Window, tuple[str, str]]:
    with Controlplane(extra_pools=FLEET_POOL) as cp:
        time.sleep(SETTLE_S)
        before = load_avg()
        idle = measure({"controlplane": cp.pid, "redis": cp.redis_pid()}, seconds)
        return idle, (before, load_avg())


def _listed_workers(cp: Controlplane) -> int:
    return len(json.loads(cp.levers9("workers", "--pool", "fleet", "--json").stdout or "[]"))


def py_spy(pid: int, out: str, seconds: float) -> subprocess.Popen[bytes]:
    """A sampling profile of ``pid`` (py-spy, raw folded stacks, idle samples left out) for ``seconds``."""
    binary = Path(sys.executable).parent / "py-spy"
    args = [
        str(binary),
        "record",
        "-p",
        str(pid),
        "-d",
        str(int(seconds)),
        "-r",
        "100",
        "--nonblocking",
        "-f",
        "raw",
        "-o",
        out,
    ]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def loaded(workers: int, agents: int, seconds: float, *, what_if: WhatIf, profile: str = "") -> Loaded:
    with Controlplane(extra_pools=FLEET_POOL) as cp:
        token = cp.levers9("token", "create", "--kind", "worker", "--pool", "fleet").stdout.strip().splitlines()[-1]
        began = time.monotonic()
        worker_load = WorkerLoad(cp, workers, token, what_if)
        agent_load = LoadGenerator(cp, agents) if agents else None
        try:
            worker_load.expect("registered", 1200)
            workers_up = time.monotonic() - began
            print(f"  {workers} workers registered in {workers_up:.1f} s", file=sys.stderr)
            agents_up = 0.0
            if agent_load is not None:
                agent_load.expect("connected", 1200)
                agents_up = time.monotonic() - began
                print(f"  {agents} agents connected in {agents_up:.1f} s", file=sys.stderr)
            time.sleep(SETTLE_S)
            pids = {"controlplane": cp.pid, "redis": cp.redis_pid(), "worker load": worker_load.process.pid}
            if agent_load is not None:
                pids["agent load"] = agent_load.process.pid
            before = load_avg()
            spy = py_spy(cp.pid, profile, min(90.0, seconds)) if profile else None
            window = measure(pids, seconds)
            after = load_avg()
            if spy is not None:
                spy.wait(60)
            print(f"  loaded: {window.shares}", file=sys.stderr)
            listed = _listed_workers(cp)
            connected = sum(1 for m in cp.machines() if m["pool"] == "box" and m["connected"])
            redis_rss = memory(pids["redis"]).rss_mib
        finally:
            worker_load.stop()
            if agent_load is not None:
                agent_load.stop()
        worker_counts = worker_load.expect("done", 60)
        agent_counts = agent_load.expect("done", 60) if agent_load is not None else {}
        trouble = ""
        if listed != workers or connected != agents or worker_counts.get("session_ends"):
            trouble = (
                f"{listed:,} workers listed of {workers:,}, {connected:,} agents connected of {agents:,}, "
                f"sessions ended: {worker_counts.get('session_ends')}; the controlplane's log ends:\n"
                f"{cp.log()[-3000:]}"
            )
    return Loaded(
        workers,
        agents,
        window,
        workers_up,
        agents_up,
        listed,
        connected,
        redis_rss,
        worker_counts,
        agent_counts,
        (before, after),
        what_if,
        trouble,
    )


# ---------------------------------------------------------------- output


def print_windows(idle: tuple[Window, tuple[str, str]] | None, load: Loaded | None) -> None:
    rows: list[tuple[str, Window, tuple[str, str]]] = []
    if idle is not None:
        rows.append(("nothing connected (idle)", idle[0], idle[1]))
    if load is not None:
        name = f"{load.workers:,} workers + {load.agents:,} agents, at rest{load.what_if}"
        rows.append((name, load.window, load.load_avg))
    print("\n| state | controlplane CPU | redis-server CPU | together | controlplane RSS / PSS | window | load avg |")
    print("|--|--:|--:|--:|--:|--:|--|")
    for name, w, avg in rows:
        cp, redis = w.shares["controlplane"], w.shares["redis"]
        print(
            f"| {name} | {pct(cp)} | {pct(redis)} | {pct(cp + redis)} | "
            f"{w.memory.rss_mib:.0f} / {w.memory.pss_mib:.0f} MiB | {w.wall_s:.0f} s | {avg[0]} -> {avg[1]} |"
        )
    groups = sorted({g for _, w, _ in rows for g in w.threads})
    print("\nThe controlplane's CPU by thread (% of one core):\n")
    print(f"| state | {' | '.join(groups)} |")
    print(f"|--|{'--:|' * len(groups)}")
    for name, w, _ in rows:
        print(f"| {name} | {' | '.join(pct(w.threads.get(g, 0.0)) for g in groups)} |")
    if load is not None:
        shares = load.window.shares
        print(
            f"\n- workers registered {load.workers_up_s:.1f} s after the load started; agents connected "
            f"{load.agents_up_s:.1f} s after; then {SETTLE_S:.0f} s of settling before the window"
        )
        print(
            f"- after the window: `levers9 workers --pool fleet` listed {load.listed_workers:,}; "
            f"{load.connected_agents:,} machines of `box` connected; redis-server RSS {load.redis_rss_mib:.1f} MiB"
        )
        print(
            f"- load generators (not counted): workers {pct(shares['worker load'])}, "
            f"agents {pct(shares.get('agent load', 0.0))} of one core over the window"
        )
        print(f"- worker load: {load.worker_counts}")
        print(f"- agent load: {load.agent_counts}")
        if load.trouble:
            print(f"\n**The fleet did not hold, so these figures are not of a fleet at rest**: {load.trouble}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="baseline,loaded", help="comma-separated: baseline, loaded")
    parser.add_argument("--window", type=float, default=120.0, help="seconds the loaded window lasts")
    parser.add_argument("--baseline", type=float, default=120.0, help="seconds the idle controlplane is measured")
    parser.add_argument("--workers", type=int, default=1000, help="simulated idle workers")
    parser.add_argument("--agents", type=int, default=100, help="simulated agents (0: none)")
    parser.add_argument(
        "--profile",
        default="",
        help="py-spy's raw profile of the loaded controlplane to this file "
        "(90 s at most, from the window's start; a run with it is not one to report)",
    )
    parser.add_argument(
        "--worker-ping-s",
        type=float,
        default=SESSION_PING_S,
        help="seconds between the simulated workers' gRPC pings (default: the worker's, "
        f"{SESSION_PING_S:g} s; another value is a what-if, not the product)",
    )
    parser.add_argument(
        "--worker-keepalive-s",
        type=float,
        default=0.0,
        help="seconds between the simulated workers' keepalives (default 0: what Register answers; "
        "another value is a what-if, not the product)",
    )
    args = parser.parse_args()
    parts = set(args.only.split(","))
    for key, value in machine().items():
        print(f"- {key}: {value}")
    sys.stdout.flush()
    idle = baseline(args.baseline) if "baseline" in parts else None
    load = None
    if "loaded" in parts:
        what_if = WhatIf(args.worker_ping_s, args.worker_keepalive_s)
        load = loaded(args.workers, args.agents, args.window, what_if=what_if, profile=args.profile)
    print_windows(idle, load)
    if load is not None and load.trouble:
        sys.exit(1)


if __name__ == "__main__":
    main()
