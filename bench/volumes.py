"""Volumes (JuiceFS) against local disk: inside a container, and `levers9 cp` against `cp`.

One run, one machine. Everything is started by the script: a real `levers9 up` (as
``tests/fixtures/levers9_up.py`` starts it: its own home, SQLite, embedded Redis) with one local pool of the
runc runtime. Its volumes are the default file system of `up`: JuiceFS 1.4.2, metadata in SQLite
(``data_dir/volumes/meta.db``), data in a directory (``data_dir/volumes/data``), both on this machine's disk.

1. In a container: ONE call of a function with ``volumes=[levers9.Volume("bench", "/data/bench")]``
   (cpu 2, memory 3 GiB) runs :func:`workload`, which measures, the two sides alternating rep by rep
   (volume first in even reps, local disk first in odd ones):

   - sequential write of ``--size-mib`` (1 GiB) in 1 MiB ``write(2)`` calls, then ``fsync`` and ``close``
     (all three in the time);
   - two sequential reads of it (1 MiB ``readinto``). The page cache cannot be dropped from inside a
     container (no ``/proc/sys/vm/drop_caches`` there), so the first read right after the write may
     already come from cache; both are reported, the second is called "cached". A third read, after
     ``sync(2)`` (which writes out every dirty page of the machine: JuiceFS's objects and cache blocks
     too) and a second of quiet, tells the page cache's own speed from the background work the write
     and first read leave. The file is removed after its reads, so one side's cache never crowds out
     the other's in the container's memory cgroup;
   - creating ``--files`` (10,000) files of ``--file-kib`` (4 KiB) in a fresh directory, each
     ``open(O_CREAT|O_EXCL)``, ``write``, ``close``, each of the three timed apart.

   "Volume" is the volume's path in the container: a bind mount of the volume's directory of the
   worker's JuiceFS mount (FUSE). "Local disk" is ``/scratch`` in the container's own root, whose writes
   land in the overlay's upper directory below the worker's state directory, on the same disk as the
   volume's data (``/tmp`` in the container is a tmpfs, so it is not used). The container reports both
   mounts (``/proc/self/mountinfo``), printed with the results.

   Where the volume's time goes: while the call runs, this script reads the worker's mount's ``.stats``
   (JuiceFS's own counters: FUSE requests, metadata operations, object-store requests, its CPU) every
   0.2 s; the workload pauses 0.5 s after each volume phase, so the samples just before and just after a
   phase bracket it alone. FUSE durations are the daemon's time per request and include the metadata
   and object time below them.

2. On this machine: `levers9 cp` of a ``--cp-mib`` (1 GiB) file into the volume and back out (the CLI,
   the controlplane's gRPC Volumes service, the controlplane's own JuiceFS mount), against plain ``cp``
   into that same mount (``data_dir/volumes/mnt/<workspace id>/<volume id>``) and out of it, and ``cp``
   to and from a directory on the local disk; the three alternate rep by rep. Each destination is removed
   (untimed) before it is written again. The source stays in the page cache throughout; no side calls
   ``sync`` (JuiceFS's ``close`` returns once the data is in its object store, here files in the data
   directory, themselves in the page cache; the local ``cp`` returns with its data in the page cache).
   The CPU of the CLI (or ``cp``), the controlplane and its ``juicefs`` are read per copy. A 1-byte
   ``levers9 cp`` each way gives the CLI's fixed cost.

3. Proposals (``--options``; skipped with ``--options ''``): the same workload, run by this script on
   the host (no container) against a scratch file system of the same kind mounted by levers9's own
   :class:`~levers9.volumes.juicefs.JuiceFsMount` (the product's flags), with each extra ``juicefs mount``
   option appended by a wrapper binary; the option sets alternate rep by rep, each with its own local-disk
   figures. No product code changes; ``--writeback`` is never tried (it loses closed data on a crash).
   ``--engines 'sqlite;redis'`` runs them on a second file system whose metadata is in a Redis this script
   starts (append-only, fsynced every second), to tell the metadata engine's share from JuiceFS's own.

Run (root; runc, fusermount3 and the juicefs binary of ``.venv``): ``.venv/bin/python bench/volumes.py``;
``--write-results`` appends a section to bench/RESULTS.md. Everything started is stopped and its directory
removed; the script fails if a FUSE mount or a process of its own is left.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import levers9.volumes.juicefs as juicefs_module
from bench.agents_proc import cpu_seconds
from levers9.volumes.juicefs import FileSystem, fuse_mounts_below, juicefs_binary, sweep
from tests.fixtures.levers9_up import Up, _processes_mentioning, _reap

ROOT = Path(__file__).resolve().parents[1]
VOLUME, MOUNT_PATH, LOCAL_PATH = "bench", "/data/bench", "/scratch"
CALL_CPU, CALL_MEMORY_MIB = 2, 3072
SAMPLE_S, PAUSE_S = 0.2, 0.5
OPTION_SETS = (
    "",
    "--max-fuse-io 1M",
    "--buffer-size 1024",
    "--max-uploads 50",
    "--attr-cache 10 --entry-cache 10 --dir-entry-cache 10",
    "--open-cache 1",
    "-o writeback_cache",
    "--cache-partial-only",
    "--cache-size 0",
)


def workload(
    volume: str, local: str, size_mib: int, files: int, file_kib: int, reps: int, pause_s: float
) -> dict[str, Any]:
    """The measured work (its source is shipped into the call as it is: it imports what it uses)."""
    import os
    import time

    block = os.urandom(1 << 20)
    view = memoryview(bytearray(1 << 20))
    small = os.urandom(file_kib * 1024)
    sides = {"volume": volume, "local": local}
    for directory in (volume, local):
        os.makedirs(directory, exist_ok=True)
    out: dict[str, Any] = {"phases": [], "mounts": {}}

    def phase(side: str, what: str, rep: int, t0: float, seconds: float, **more: float) -> None:
        out["phases"].append(
            {"side": side, "what": what, "rep": rep, "t0": t0, "t1": time.time(), "s": seconds, **more}
        )
        if side == "volume":
            time.sleep(pause_s)  # the host's .stats samples bracket each volume phase alone

    time.sleep(2 * pause_s)
    for rep in range(reps):
        order = ["volume", "local"] if rep % 2 == 0 else ["local", "volume"]
        for side in order:
            path = os.path.join(sides[side], f"big-{rep}")
            t0, a = time.time(), time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for _ in range(size_mib):
                if os.write(fd, block) != len(block):
                    raise OSError(f"short write to {path}")
            b = time.perf_counter()
            os.fsync(fd)
            c = time.perf_counter()
            os.close(fd)
            d = time.perf_counter()
            phase(side, "write", rep, t0, d - a, writes=b - a, fsync=c - b, close=d - c)
            for what in ("read 1", "read 2", "read 3"):
                if what == "read 3":  # the machine's dirty pages written out first, and a second of quiet
                    os.sync()
                    time.sleep(1.0)
                t0, a = time.time(), time.perf_counter()
                got = 0
                with open(path, "rb", buffering=0) as f:
                    while n := f.readinto(view):
                        got += n
                if got != size_mib << 20:
                    raise OSError(f"read {got} bytes of {path}, wrote {size_mib << 20}")
                phase(side, what, rep, t0, time.perf_counter() - a)
            os.unlink(path)
        for side in order:
            directory = os.path.join(sides[side], f"small-{rep}")
            os.mkdir(directory)
            create = write = close = 0.0
            t0, start = time.time(), time.perf_counter()
            for i in range(files):
                a = time.perf_counter()
                fd = os.open(f"{directory}/{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                b = time.perf_counter()
                os.write(fd, small)
                c = time.perf_counter()
                os.close(fd)
                d = time.perf_counter()
                create, write, close = create + b - a, write + c - b, close + d - c
            phase(side, "create files", rep, t0, time.perf_counter() - start, create=create, writes=write, close=close)
    for side, path in sides.items():  # the mount each side is on (the longest mount point above it)
        best = ("", "")
        with open("/proc/self/mountinfo") as info:
            for line in info:
                fields, _, rest = line.partition(" - ")
                point = fields.split()[4]
                if (path + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best[0]):
                    kind, source, options = rest.split()[:3]
                    kept = ",".join(o for o in options.split(",") if o.startswith(("upperdir", "max_read")))
                    best = (point, f"{point}: {kind} {source} {kept}".strip())
        out["mounts"][side] = best[1]
    return out


APP = """\
from __future__ import annotations

import json
from typing import Any

import levers9

volume = levers9.Volume(name={volume!r}, mount_path={mount!r})

{workload}

@levers9.function(volumes=[volume], cpu={cpu}, memory={memory}, timeout=7200)
def measure(args: dict[str, Any]) -> dict[str, Any]:
    return workload(**args)


def main() -> None:
    print("RESULT " + json.dumps(measure.remote({args!r})))
"""


# ------------------------------------------------------------------------------------------------ .stats


def read_stats(mount: Path) -> dict[str, float]:
    stats = {}
    for line in (mount / ".stats").read_text().splitlines():
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            stats[name] = float(value)
    return stats


class Sampler:
    """``.stats`` of the worker's JuiceFS mount (the one ending in ``volumes/fs`` below ``root``), every 0.2 s."""

    def __init__(self, root: Path) -> None:
        self.root, self._stop = root, threading.Event()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for point, _ in fuse_mounts_below(self.root):
                if point.endswith("/volumes/fs"):
                    with contextlib.suppress(OSError):
                        self.samples.append((time.time(), read_stats(Path(point))))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def bracket(self, t0: float, t1: float) -> dict[str, float] | None:
        """The counters' change from just before ``t0`` to just after ``t1`` (None: no sample on a side)."""
        before = [s for t, s in self.samples if t <= t0]
        after = [s for t, s in self.samples if t >= t1]
        if not before or not after:
            return None
        a, b = before[-1], after[0]
        if a.get("juicefs_process_start_time_seconds") != b.get("juicefs_process_start_time_seconds"):
            return None
        return {k: v - a.get(k, 0.0) for k, v in b.items()}


def op_rows(deltas: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    """(operation, count per run, seconds per run) for what JuiceFS did in the phases ``deltas`` bracket."""
    n, rows = len(deltas), []

    def mean(key: str) -> float:
        return sum(d.get(key, 0.0) for d in deltas) / n

    names = sorted({k for d in deltas for k in d})
    for prefix, label in (("juicefs_fuse_ops_total_", "FUSE {}"), ("juicefs_meta_ops_total_", "metadata {}")):
        for key in (k for k in names if k.startswith(prefix)):
            op = key.removeprefix(prefix)
            durations = key.replace("_total_", "_durations_seconds_" if "fuse" in key else "_duration_seconds_")
            if mean(key) >= 1:
                rows.append((label.format(op), mean(key), mean(durations)))
    for method in ("PUT", "GET"):
        base = f"juicefs_object_request_durations_histogram_seconds_{method}"
        if mean(base + "_total") >= 1:
            rows.append((f"object store {method}", mean(base + "_total"), mean(base + "_sum")))
    if mean("juicefs_blockcache_writes") >= 1:
        rows.append(
            (
                "cache-dir block writes",
                mean("juicefs_blockcache_writes"),
                mean("juicefs_blockcache_write_hist_seconds_sum"),
            )
        )
    if mean("juicefs_blockcache_hits") >= 1:
        rows.append(
            ("cache-dir block hits", mean("juicefs_blockcache_hits"), mean("juicefs_blockcache_read_hist_seconds_sum"))
        )
    rows.append(("juicefs's CPU (seconds, all threads)", 0.0, mean("juicefs_cpu_usage")))
    return rows


# ------------------------------------------------------------------------------------------------ the parts


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rotate(items: list[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return items[k:] + items[:k]


def in_container(up: Up, args: argparse.Namespace) -> tuple[dict[str, Any], Sampler]:
    call_args = {
        "volume": MOUNT_PATH,
        "local": LOCAL_PATH,
        "size_mib": args.size_mib,
        "files": args.files,
        "file_kib": args.file_kib,
        "reps": args.reps,
        "pause_s": PAUSE_S,
    }
    app = up.root / "volume_bench_app.py"
    app.write_text(
        APP.format(
            volume=VOLUME,
            mount=MOUNT_PATH,
            workload=inspect.getsource(workload),
            cpu=CALL_CPU,
            memory=CALL_MEMORY_MIB,
            args=call_args,
        )
    )
    sampler = Sampler(up.root)
    try:
        run = up.levers9("run", f"{app.name}::main", timeout=7200)
    finally:
        sampler.stop()
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(
            f"the call failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n"
            f"--- up:\n{up.log()[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result, sampler


def juicefs_pids(mount: Path) -> list[int]:
    """The ``juicefs mount`` processes of ``mount`` (its watchdog and the mount; juicefs rewrites its argv)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            title = (entry / "cmdline").read_bytes()
            if entry.name.isdigit() and b"juicefs mount " in title and f" {mount} ".encode() in title:
                found.append(int(entry.name))
    if not found:
        raise RuntimeError(f"no juicefs process mounts {mount}")
    return found


def juicefs_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def copies(up: Up, mount: Path, volume_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Seconds and CPU per copy, by side and direction (``in``, ``out``, ``in cpu:...``...)."""
    src, local, back = up.root / "cp-src.bin", up.root / "cp-local", up.root / "cp-back"
    for d in (local, back):
        d.mkdir()
    with src.open("wb") as f:
        for _ in range(args.cp_mib):
            f.write(os.urandom(1 << 20))
    direct = volume_dir / "cp-direct"
    direct.mkdir()
    jpids, cpid = juicefs_pids(mount), up.process.pid if up.process else 0
    l9 = [sys.executable, "-m", "levers9"]
    sides: dict[str, tuple[list[str], Path, list[str]]] = {
        "levers9 cp": (
            [*l9, "cp", str(src), f"{VOLUME}:cp-l9/"],
            volume_dir / "cp-l9" / src.name,
            [*l9, "cp", f"{VOLUME}:cp-l9/{src.name}", str(back)],
        ),
        "cp through the controlplane's mount": (
            ["cp", str(src), str(direct)],
            direct / src.name,
            ["cp", str(direct / src.name), str(back)],
        ),
        "cp on the local disk": (
            ["cp", str(src), str(local)],
            local / src.name,
            ["cp", str(local / src.name), str(back)],
        ),
    }
    found: dict[str, dict[str, list[float]]] = {name: {} for name in sides}

    def timed(name: str, direction: str, argv: list[str]) -> None:
        cpu0 = (resource.getrusage(resource.RUSAGE_CHILDREN), cpu_seconds(cpid, children=False), juicefs_cpu(jpids))
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=up.env, capture_output=True, text=True, cwd=up.root, check=False)
        seconds = time.perf_counter() - t0
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
        figures = {
            "": seconds,
            " cpu: the copier": child.ru_utime + child.ru_stime - cpu0[0].ru_utime - cpu0[0].ru_stime,
            " cpu: the controlplane": cpu_seconds(cpid, children=False) - cpu0[1],
            " cpu: its juicefs": juicefs_cpu(jpids) - cpu0[2],
        }
        for key, value in figures.items():
            found.setdefault(name, {}).setdefault(direction + key, []).append(value)

    for rep in range(args.cp_reps + 1):  # rep 0: untimed warm-up of each side
        for name in rotate(list(sides), rep):
            into, landed, out_of = sides[name]
            landed.unlink(missing_ok=True)
            (back / src.name).unlink(missing_ok=True)
            timed(name, "in", into)
            if landed.stat().st_size != src.stat().st_size:
                raise RuntimeError(f"{name}: {landed} has {landed.stat().st_size} bytes, not {src.stat().st_size}")
            timed(name, "out", out_of)
            if rep == args.cp_reps and subprocess.run(["cmp", str(src), str(back / src.name)]).returncode != 0:
                raise RuntimeError(f"{name}: the copy back differs from the source")
        if rep == 0:
            found = {name: {} for name in sides}
        say(f"  copies: rep {rep} done")
    tiny = up.root / "one-byte"
    tiny.write_bytes(b"x")
    for _ in range(args.cp_reps):
        timed("levers9 cp, 1 byte", "in", [*l9, "cp", str(tiny), f"{VOLUME}:tiny/"])
        timed("levers9 cp, 1 byte", "out", [*l9, "cp", f"{VOLUME}:tiny/one-byte", str(back)])
    return found


def _engine(home: Path, engine: str, stack: contextlib.ExitStack) -> str:
    """The metadata URL of a scratch file system on ``engine``: SQLite (the product's for `up`) or Redis (a
    ``redis-server`` started here on a Unix socket, append-only file fsynced every second, stopped at the end)."""
    if engine == "sqlite":
        return f"sqlite3://{home / 'meta.db'}"
    if engine != "redis":
        raise SystemExit(f"--engines: {engine!r} is not sqlite or redis")
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("--engines redis needs redis-server: apt-get install -y redis-server")
    sock = home / "redis.sock"
    proc = subprocess.Popen(
        [
            server,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--dir",
            str(home),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    return f"unix://{sock}?db=1"


def try_options(root: Path, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The workload on the host, on scratch file systems (one per metadata engine of ``--engines``) mounted by
    levers9's JuiceFsMount plus each option set."""
    sets = [s.strip() for s in args.options.split(";")] if args.options.strip() else []
    engines = [e.strip() for e in args.engines.split(";") if e.strip()]
    if engines != ["sqlite"] and not sets:
        sets = [""]  # other engines with the product's flags
    if not sets:
        return {}
    real = juicefs_binary()
    found: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        systems: dict[str, tuple[FileSystem, Path]] = {}
        for engine in engines:
            home = root / f"options-{engine}"
            home.mkdir(parents=True)
            fs = FileSystem(
                metadata_url=_engine(home, engine, stack),
                storage="file",
                bucket=f"{home / 'data'}/",
                name="levers9-bench",
            )
            fs.format()
            systems[engine] = (fs, home)
        trials = [(engine, options) for engine in engines for options in sets]
        wrapper = root / "juicefs-wrapper"
        juicefs_module.juicefs_binary = lambda: str(wrapper)
        stack.callback(lambda: setattr(juicefs_module, "juicefs_binary", juicefs_binary))
        for rep in range(args.option_reps):
            for i, (engine, options) in enumerate(rotate(trials, rep)):
                fs, home = systems[engine]
                wrapper.write_text(
                    f'#!/bin/sh\n[ "$1" = mount ] && exec {shlex.quote(real)} "$@" {options}\n'
                    f'exec {shlex.quote(real)} "$@"\n'
                )
                wrapper.chmod(0o755)
                mounted = fs.mount(home / "mnt", cache_dir=home / "cache")
                try:
                    out = workload(
                        str(home / "mnt" / f"run-{rep}-{i}"),
                        str(home / f"local-{rep}-{i}"),
                        args.size_mib,
                        args.files,
                        args.file_kib,
                        1,
                        0.0,
                    )
                finally:
                    mounted.stop()
                name = options if engine == "sqlite" else f"metadata in Redis{': ' + options if options else ''}"
                found.setdefault(name, []).append(out)
                say(f"  options rep {rep}: {engine}, {options or '(the product flags)'} done")
    return found


# ------------------------------------------------------------------------------------------------ report


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def machine(root: Path) -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    disk = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", str(root)], capture_output=True, text=True, check=False
    ).stdout.split()
    name = Path(disk[0]).name if disk else "?"
    rotational = Path(f"/sys/block/{name}/queue/rotational")
    kind = (
        {"0": "non-rotational", "1": "rotational"}.get(rotational.read_text().strip(), "")
        if rotational.exists()
        else ""
    )
    runc = subprocess.run(["runc", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    jfs = subprocess.run([juicefs_binary(), "version"], capture_output=True, text=True, check=False).stdout.strip()
    os_name = platform.freedesktop_os_release().get("PRETTY_NAME", platform.system())
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {os_name}, kernel {platform.release()}; disk "
        f"{' '.join(disk)} ({kind or 'kind unknown'}, virtio); {runc}; {jfs}; Python {platform.python_version()}"
    )


def figures(phases: list[dict[str, Any]], side: str, what: str, key: str = "s") -> list[float]:
    return [p[key] for p in phases if p["side"] == side and p["what"] == what]


def report(
    args: argparse.Namespace,
    where: str,
    loads: list[float],
    result: dict[str, Any],
    sampler: Sampler,
    cps: dict[str, dict[str, list[float]]],
    options: dict[str, list[dict[str, Any]]],
) -> list[str]:
    phases, mib = result["phases"], args.size_mib
    lines = [
        f"- Machine: {where}",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; 1-minute load average "
        f"{loads[0]:.1f} at the start, {loads[1]:.1f} after the copies, {loads[-1]:.1f} at the end.",
        f"- Command: `.venv/bin/python bench/volumes.py {shlex.join(sys.argv[1:])}` (root).",
        f"- In the call: volume `{result['mounts']['volume']}`; local disk `{result['mounts']['local']}`.",
        "",
        f"In one call, in a runc container ({args.reps} reps each, sides alternating; median, min-max):",
        "",
        "| measurement | volume | local disk | volume / local | target |",
        "|--|--:|--:|--:|--|",
    ]
    for what in ("write", "read 1", "read 2", "read 3"):
        vol = [mib / s for s in figures(phases, "volume", what)]
        loc = [mib / s for s in figures(phases, "local", what)]
        ratio = statistics.median(vol) / statistics.median(loc)
        label = {
            "write": f"write {mib} MiB + fsync + close",
            "read 1": "first read, right after the write",
            "read 2": "second read (cached)",
            "read 3": "third read, after sync(2) and 1 s",
        }[what]
        target = f"≥ 0.8x: {'met' if ratio >= 0.8 else '**not met**'}" if what == "read 2" else ""
        lines.append(
            f"| {label}, MiB/s | {spread(vol, '{:.0f}')} | {spread(loc, '{:.0f}')} | {ratio:.2f}x | {target} |"
        )
    vol, loc = figures(phases, "volume", "create files"), figures(phases, "local", "create files")
    ratio = statistics.median(vol) / statistics.median(loc)
    lines.append(
        f"| create {args.files:,} files of {args.file_kib} KiB, s | {spread(vol, '{:.2f}')} | "
        f"{spread(loc, '{:.3f}')} | {ratio:.1f}x | ≤ 5x: {'met' if ratio <= 5 else '**not met**'} |"
    )
    for key, label in (("create", "open(O_CREAT)"), ("writes", "write 4 KiB"), ("close", "close")):
        v = [s / args.files * 1e6 for s in figures(phases, "volume", "create files", key)]
        loc_us = [s / args.files * 1e6 for s in figures(phases, "local", "create files", key)]
        lines.append(
            f"| &nbsp;&nbsp;per file: {label}, µs | {spread(v, '{:.0f}')} | {spread(loc_us, '{:.1f}')} | "
            f"{statistics.median(v) / statistics.median(loc_us):.0f}x | |"
        )
    for key, label in (("writes", "the 1 MiB writes"), ("fsync", "fsync"), ("close", "close")):
        v, loc = [s * 1e3 for s in figures(phases, "volume", "write", key)], figures(phases, "local", "write", key)
        lines.append(
            f"| &nbsp;&nbsp;of the big write: {label}, ms | {spread(v, '{:.0f}')} | "
            f"{spread([s * 1e3 for s in loc], '{:.0f}')} | | |"
        )

    lines += [
        "",
        "What the worker's juicefs did per volume phase (its `.stats`, bracketed by samples 0.2 s apart; "
        "mean per run; FUSE rows include the metadata and object rows under them; open, read, flush and release rows of "
        "a few are this script's own reads of `.stats`):",
        "",
        "| phase | operation | count | seconds | µs each |",
        "|--|--|--:|--:|--:|",
    ]
    for what in ("write", "read 1", "read 2", "read 3", "create files"):
        deltas = [
            d
            for p in phases
            if p["side"] == "volume" and p["what"] == what
            if (d := sampler.bracket(p["t0"], p["t1"])) is not None
        ]
        if not deltas:
            lines.append(f"| {what} | (no bracketing samples) | | | |")
            continue
        for op, count, seconds in op_rows(deltas):
            each, n = (f"{seconds / count * 1e6:.0f}", f"{count:.0f}") if count else ("", "")
            lines.append(f"| {what} ({len(deltas)}) | {op} | {n} | {seconds:.3f} | {each} |")

    lines += [
        "",
        f"`levers9 cp` against `cp`, {args.cp_mib} MiB, on this machine ({args.cp_reps} reps after a warm-up "
        "of each, sides alternating; median, min-max; CPU seconds per copy):",
        "",
        "| copy | into, MiB/s | out of, MiB/s | CPU in: copier / controlplane / juicefs | CPU out: same |",
        "|--|--:|--:|--|--|",
    ]
    for name, got in cps.items():
        cpu = {
            d: " / ".join(
                f"{statistics.median(got[f'{d} cpu: {w}']):.2f}"
                for w in ("the copier", "the controlplane", "its juicefs")
            )
            for d in ("in", "out")
        }
        if "1 byte" in name:
            cells = [f"{spread(got[d])} s" for d in ("in", "out")]
        else:
            cells = [spread([args.cp_mib / s for s in got[d]], "{:.0f}") for d in ("in", "out")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {cpu['in']} | {cpu['out']} |")

    if options:
        lines += [
            "",
            f"Proposals: the same workload on the host (no container), on a scratch file system mounted by "
            f"`JuiceFsMount` with one extra option each ({args.option_reps} reps, sets alternating; medians, "
            "volume / local of the same runs):",
            "",
            f"| extra `juicefs mount` option | write MiB/s | first read | cached read | after sync | {args.files:,} files, s |",
            "|--|--:|--:|--:|--:|--:|",
        ]
        for name, outs in options.items():
            ph = [p for out in outs for p in out["phases"]]
            row = []
            for what in ("write", "read 1", "read 2", "read 3", "create files"):
                vm, lm = statistics.median(figures(ph, "volume", what)), statistics.median(figures(ph, "local", what))
                row.append(
                    f"{vm:.2f} ({vm / lm:.0f}x)" if what == "create files" else f"{mib / vm:.0f} ({lm / vm:.2f}x)"
                )
            lines.append(f"| {f'`{name}`' if name else '(none: the product flags)'} | {' | '.join(row)} |")
    return lines


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up as ^C does


def main(args: argparse.Namespace) -> None:
    for tool in ("runc", "fusermount3", "cp", "cmp", "findmnt"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y runc fuse3 coreutils util-linux")
    if os.geteuid() != 0:
        sys.exit("run as root: the runc pool and the FUSE mounts need it")
    juicefs_binary()
    signal.signal(signal.SIGTERM, interrupted)
    root = Path(tempfile.mkdtemp(prefix="l9-bench-vol-"))
    up = Up(root)
    up.use_runtime("runc")
    where = machine(root)
    loads = [os.getloadavg()[0]]
    left: list[str] = []
    try:
        say(f"starting levers9 up in {root}")
        up.start()
        # `levers9 cp` first: the controlplane formats the file system at its first mount, which only ls, cp and
        # rm make; a worker mounting it before that finds no metadata (ContainerStartFailed, seen on ef8acbb)
        marker = root / "where"
        marker.write_bytes(b"x")
        made = up.levers9("volume", "create", VOLUME)
        if made.returncode == 0:
            made = up.levers9("cp", str(marker), f"{VOLUME}:")
        if made.returncode != 0:
            raise RuntimeError(f"levers9 cp of a marker file (or volume create) failed: {made.stderr}")
        mount = up.home / "data" / "volumes" / "mnt"
        volume_dir = next(mount.glob("*/*/where")).parent
        say(f"the call: {args.reps} reps of {args.size_mib} MiB and {args.files} files, on the volume and /scratch")
        result, sampler = in_container(up, args)
        say("copies")
        cps = copies(up, mount, volume_dir, args)
        loads.append(os.getloadavg()[0])
        say("mount options on the host")
        options = try_options(root, args)
        loads.append(os.getloadavg()[0])
    finally:
        with contextlib.suppress(BaseException):
            up.stop()
        deadline = time.monotonic() + 15
        while _processes_mentioning(str(root)) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = [f"process {pid}: {cmd[:120]}" for pid, cmd in _reap(root)]
        left += [f"FUSE mount {point}" for point, _ in fuse_mounts_below(root)]
        sweep(root)
        shutil.rmtree(root, ignore_errors=True)
        fuse_left = [
            line for line in Path("/proc/mounts").read_text().splitlines() if "fuse" in line and str(root) in line
        ]
        if left or fuse_left:
            say("LEFT BEHIND (removed now): " + "; ".join(left + fuse_left))
    lines = report(args, where, loads, result, sampler, cps, options)
    print("\n".join(lines))
    if left:
        sys.exit(1)
    if args.write_results:
        title = f"## Volumes (issue 34, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC)"
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write(f"\n{title}\n\n" + "\n".join(lines) + "\n")
        say("appended to bench/RESULTS.md")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the big file, MiB (default 1024)")
    parser.add_argument("--files", type=int, default=10_000, help="small files per rep (default 10,000)")
    parser.add_argument("--file-kib", type=int, default=4, help="each small file, KiB (default 4)")
    parser.add_argument("--reps", type=int, default=5, help="reps of each side in the call (default 5)")
    parser.add_argument("--cp-mib", type=int, default=1024, help="the file copied, MiB (default 1024)")
    parser.add_argument("--cp-reps", type=int, default=5, help="copies each way of each side (default 5)")
    parser.add_argument(
        "--options",
        default=";".join(OPTION_SETS),
        help="';'-separated extra juicefs mount options to try on the host ('' first: none; "
        "--options '' skips the proposals)",
    )
    parser.add_argument(
        "--engines",
        default="sqlite",
        help="metadata engines of the proposals' file systems, ';'-separated: sqlite (default), redis",
    )
    parser.add_argument("--option-reps", type=int, default=3, help="runs of each option set (default 3)")
    parser.add_argument("--write-results", action="store_true", help="append the section to bench/RESULTS.md")
    main(parser.parse_args())
