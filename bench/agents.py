"""Agent machines: the agent's idle cost, the controlplane's cost with 1,000 agents, and an SSH join to a first call.

Three measurements, each against a real ``levers9 up`` over TLS (its SQLite and
embedded redis-server, ``bench/agents_setup.py``) with a pool ``box`` of
provider ``agent_machine``:

- **idle agent** (``idle``): a private dockerd; ``levers9 machine create``,
  ``levers9 agent join`` with the printed token, then the agent restarted as
  ``levers9 agent run`` (what the service unit runs), which is measured: CPU
  over ``--window`` seconds (its own and its reaped children's, from
  /proc/<pid>/stat) and RSS/PSS at the end (/proc/<pid>/smaps_rollup), first with
  no container, then with two running containers of a tiny image (``sleep``)
  labelled as levers9 workers of a pool the controlplane does not configure
  (so the reconciler leaves them alone; the agent polls and reports them like
  any worker). dockerd's CPU over the same windows is given beside it.
- **1,000 agents** (``fleet``): the controlplane idle over ``--baseline``
  seconds, then ``bench/agents_load.py`` in its own process creates
  ``--agents`` joined machines (CreateJoinedMachine), spends each join token
  (Join) and holds one Connect stream per agent on its own TLS connection:
  Hello, one Inventory, a Heartbeat every ``Welcome.heartbeat_s``. The
  controlplane's CPU and its redis-server's, separately, over ``--window``
  seconds once all are connected; then again with every agent also sending an
  Inventory every 5 min (the real agent sends one on every change, and every 5 min regardless). The load
  generator's CPU is its own process's and is never counted.
- **SSH join** (``ssh``): ``bench/agents_ssh.py``, twice: a fresh box (the join sends the worker image over
  SSH) and a box whose Docker has the image already (its cold build timed apart).

Run (root, docker.io and openssh-server installed): ``.venv/bin/python bench/agents.py``
(``--help``; ``--only idle,fleet`` for a part).
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents_proc import CpuWindow, Memory, ThreadWindow, cpu_seconds, memory
from bench.agents_setup import TINY, Controlplane, private_dockerd
from bench.placement import machine
from tests.fixtures.dockerd import Dockerd

SETTLE_S = 15.0


def wait_until(what: str, check: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- the idle agent


@dataclass
class IdleFigures:
    containers: int
    agent_cpu: float
    dockerd_cpu: float
    wall_s: float
    agent_memory: Memory


def _agent(cp: Controlplane, daemon: Dockerd, state: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (state.parent / "agent.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "levers9", "agent", *args, "--state-dir", str(state), "--docker-host", daemon.host],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cp.root,
    )


def _connected(cp: Controlplane, name: str) -> bool:
    return any(m["name"] == name and m["state"] == "joined" and m["connected"] for m in cp.machines())


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _measure_idle(agent: subprocess.Popen[bytes], daemon: Dockerd, containers: int, window: float) -> IdleFigures:
    time.sleep(SETTLE_S)
    cpu = CpuWindow({"agent": agent.pid, "dockerd": daemon.process.pid})
    cpu.start()
    time.sleep(window)
    if agent.poll() is not None:
        raise RuntimeError(f"the agent exited ({agent.returncode}) during the window")
    shares = cpu.stop()
    return IdleFigures(containers, shares["agent"], shares["dockerd"], cpu.wall_s, memory(agent.pid))


def idle_agent(window: float) -> list[IdleFigures]:
    figures = []
    with private_dockerd() as daemon, Controlplane() as cp:
        made = json.loads(cp.levers9("machine", "create", "--pool", "box", "--name", "idle-box", "--json").stdout)
        state = cp.root / "agent-state"
        env = dict(cp.env) | {"LEVERS9_JOIN_TOKEN": made["join_token"]}
        env.pop("LEVERS9_TOKEN")
        joining = _agent(cp, daemon, state, "join", "--controlplane", cp.url, "--ca", str(cp.ca_file), env=env)
        running: subprocess.Popen[bytes] | None = None
        try:
            wait_until("the agent to join", lambda: _connected(cp, "idle-box"), 120)
            _stop(joining)
            env.pop("LEVERS9_JOIN_TOKEN")
            running = _agent(cp, daemon, state, "run", env=env)
            time.sleep(3)
            wait_until("the agent to connect again", lambda: _connected(cp, "idle-box"), 120)
            figures.append(_measure_idle(running, daemon, 0, window))
            agent_id = json.loads((state / "agent.json").read_text())["agent_id"]
            for i in range(2):
                daemon.cli(
                    "run",
                    "-d",
                    "--name",
                    f"l9w-mach_bench{i}",
                    "--network",
                    "none",
                    "--cpus",
                    "0.1",
                    "--memory",
                    "64m",
                    "--label",
                    f"levers9.machine-id=mach_bench{i}",
                    "--label",
                    "levers9.pool=bench-idle",
                    "--label",
                    f"levers9.agent-id={agent_id}",
                    "--label",
                    "levers9.workspace=",
                    "--label",
                    "levers9.gpus=",
                    TINY,
                    "/bin/sleep",
                    "1000000",
                )
            figures.append(_measure_idle(running, daemon, 2, window))
            left = [c for c in daemon.containers() if c["state"] == "running"]
            if len(left) != 2:
                raise RuntimeError(f"the two stand-in containers did not stay running: {left}")
        finally:
            _stop(joining)
            if running is not None:
                _stop(running)
    return figures


# ---------------------------------------------------------------- 1,000 agents


class LoadGenerator:
    """``bench/agents_load.py`` in its own process; its JSON lines in a queue."""

    def __init__(self, cp: Controlplane, count: int) -> None:
        script = Path(__file__).resolve().parent / "agents_load.py"
        self.stderr = (cp.root / "load.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, str(script), "--count", str(count), "--pool", "box"],
            env=cp.env,
            cwd=cp.root,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.log_path = cp.root / "load.log"
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def expect(self, phase: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the load generator exited ({self.process.returncode}):\n"
                        f"{self.log_path.read_text(errors='replace')[-3000:]}"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the load generator did not reach {phase!r} in {timeout:.0f} s") from None
                continue
            if got["phase"] == phase:
                return got

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.stderr.close()


@dataclass
class FleetFigures:
    agents: int
    baseline: dict[str, float]
    baseline_memory: Memory
    created_s: float
    joined_s: float
    connected_s: float
    ramp_cpu_s: float
    heartbeats: dict[str, float]
    heartbeats_memory: Memory
    inventories: dict[str, float]
    inventories_memory: Memory
    redis_memory: Memory
    connected_at_end: int
    counts: dict[str, Any]
    wall_s: float
    threads: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Window:
    """One measured window: CPU shares by process, the controlplane's by thread group, its memory at the end."""

    shares: dict[str, float]
    threads: dict[str, float]
    memory: Memory
    wall_s: float


def measure(pids: dict[str, int], seconds: float) -> Window:
    cpu, by_thread = CpuWindow(pids), ThreadWindow(pids["controlplane"])
    cpu.start()
    by_thread.start()
    time.sleep(seconds)
    shares = cpu.stop()
    return Window(shares, by_thread.stop(), memory(pids["controlplane"]), cpu.wall_s)


def fleet(count: int, window: float, baseline_s: float) -> FleetFigures:
    with Controlplane() as cp:
        pids = {"controlplane": cp.pid, "redis": cp.redis_pid()}
        time.sleep(SETTLE_S)
        idle = measure(pids, baseline_s)
        ramp_from = cpu_seconds(cp.pid) + cpu_seconds(pids["redis"])
        load = LoadGenerator(cp, count)
        try:
            created = load.expect("created", 1800)["seconds"]
            print(f"  created {count} machines in {created:.1f} s", file=sys.stderr)
            joined = load.expect("joined", 1800)["seconds"]
            print(f"  joined {count} agents in {joined:.1f} s", file=sys.stderr)
            connected = load.expect("connected", 1800)["seconds"]
            print(f"  connected {count} streams in {connected:.1f} s", file=sys.stderr)
            ramp_cpu = cpu_seconds(cp.pid) + cpu_seconds(pids["redis"]) - ramp_from
            time.sleep(SETTLE_S)
            beats = measure(pids, window)
            print(f"  heartbeats only: {beats.shares}", file=sys.stderr)
            load.process.send_signal(signal.SIGUSR1)
            time.sleep(SETTLE_S + 10)
            both = measure(pids, window)
            print(f"  with inventories: {both.shares}", file=sys.stderr)
            connected_now = sum(1 for m in cp.machines() if m["connected"])
            redis_memory = memory(pids["redis"])
        finally:
            load.stop()
        counts = load.expect("done", 60)
    threads = {"idle": idle.threads, "heartbeats": beats.threads, "heartbeats + inventories": both.threads}
    return FleetFigures(
        count,
        idle.shares,
        idle.memory,
        created,
        joined,
        connected,
        ramp_cpu,
        beats.shares,
        beats.memory,
        both.shares,
        both.memory,
        redis_memory,
        connected_now,
        counts,
        beats.wall_s,
        threads,
    )


# ---------------------------------------------------------------- output


def pct(share: float) -> str:
    return f"{share * 100:.2f}%"


def print_idle(figures: list[IdleFigures]) -> None:
    print("\n### The idle agent\n")
    print("| worker containers | agent CPU (% of one core) | agent RSS | agent PSS | dockerd CPU | window |")
    print("|--:|--:|--:|--:|--:|--:|")
    for f in figures:
        print(
            f"| {f.containers} | {pct(f.agent_cpu)} | {f.agent_memory.rss_mib:.1f} MiB | "
            f"{f.agent_memory.pss_mib:.1f} MiB | {pct(f.dockerd_cpu)} | {f.wall_s:.0f} s |"
        )


def print_fleet(f: FleetFigures) -> None:
    print(f"\n### The controlplane with {f.agents:,} agents\n")
    print(
        f"- created {f.agents:,} joined machines in {f.created_s:.1f} s, joined them in {f.joined_s:.1f} s, "
        f"connected {f.agents:,} streams in {f.connected_s:.1f} s; controlplane + redis CPU over the connect "
        f"ramp: {f.ramp_cpu_s:.1f} s"
    )
    print(f"- connected at the end (ListJoinedMachines): {f.connected_at_end:,}; load generator: {f.counts}\n")
    print("| state | controlplane CPU | redis-server CPU | together | controlplane RSS / PSS |")
    print("|--|--:|--:|--:|--:|")
    for name, shares, mem in (
        ("no agent (idle)", f.baseline, f.baseline_memory),
        (f"{f.agents:,} agents, heartbeats", f.heartbeats, f.heartbeats_memory),
        (f"{f.agents:,} agents, heartbeats + inventory every 5 min", f.inventories, f.inventories_memory),
    ):
        print(
            f"| {name} | {pct(shares['controlplane'])} | {pct(shares['redis'])} | "
            f"{pct(shares['controlplane'] + shares['redis'])} | {mem.rss_mib:.0f} / {mem.pss_mib:.0f} MiB |"
        )
    print(
        f"\nredis-server RSS / PSS at the end: {f.redis_memory.rss_mib:.1f} / {f.redis_memory.pss_mib:.1f} MiB; "
        f"windows of {f.wall_s:.0f} s"
    )
    groups = sorted({g for split in f.threads.values() for g in split})
    print("\nThe controlplane's CPU by thread (% of one core):\n")
    print(f"| state | {' | '.join(groups)} |")
    print(f"|--|{'--:|' * len(groups)}")
    for state, split in f.threads.items():
        print(f"| {state} | {' | '.join(pct(split.get(g, 0.0)) for g in groups)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="idle,fleet,ssh", help="comma-separated: idle, fleet, ssh")
    parser.add_argument("--window", type=float, default=120.0, help="seconds each CPU window lasts")
    parser.add_argument("--baseline", type=float, default=60.0, help="seconds the idle controlplane is measured")
    parser.add_argument("--agents", type=int, default=1000, help="simulated agents in the fleet measurement")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    for key, value in machine().items():
        print(f"- {key}: {value}")
    if "idle" in parts:
        print_idle(idle_agent(args.window))
        sys.stdout.flush()
    if "fleet" in parts:
        print_fleet(fleet(args.agents, args.window, args.baseline))
        sys.stdout.flush()
    if "ssh" in parts:
        from bench.agents_ssh import print_ssh, ssh_join

        print_ssh(ssh_join(preloaded=False))
        print_ssh(ssh_join(preloaded=True))


if __name__ == "__main__":
    main()
