"""The gateway's overhead: a warm endpoint through the gateway, directly, and through nginx, with wrk.

One run measures the same container three ways, with the same ``wrk`` load:

1. **direct**: to the address its worker reported (the container's own HTTP server);
2. **gateway**: ``/endpoint/hello`` on `levers9 up`'s HTTP port, with a bearer token: auth, the
   deployment lookup, a slot on a ready container, and the proxy hop;
3. **nginx**: one nginx worker proxying to the same address over kept-alive connections: what a
   plain, well-tuned reverse proxy costs on this machine.

At one connection (``-c 1``) the p50 difference to direct is the latency the hop adds; at many
connections the requests per second show how much of the container's throughput each path keeps.
Each configuration runs ``--rounds`` times, interleaved, and the medians are reported.

Run: ``.venv/bin/python bench/gateway.py`` (needs ``wrk`` and ``nginx``: ``apt-get install wrk
nginx-light``, which ``scripts/setup`` does as root); ``--write`` appends the table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

APP = """
import levers9

# a whole CPU: under runc and gVisor a container gets the CPU it asks for (the SDK's default is 0.125)
@levers9.endpoint(cpu=1, memory=512, min_containers=1, max_containers=1, tasks_per_container=256)
def hello() -> dict:
    return {"hello": "world"}
"""

NGINX = """
worker_processes 1;
daemon off;
error_log {root}/nginx-error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/nginx-tmp;
    proxy_temp_path {root}/nginx-tmp;
    fastcgi_temp_path {root}/nginx-tmp;
    uwsgi_temp_path {root}/nginx-tmp;
    scgi_temp_path {root}/nginx-tmp;
    upstream container {{ server {address}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://container/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


@dataclass
class Figures:
    rps: float
    p50_ms: float
    p99_ms: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(url: str, connections: int, seconds: int, headers: dict[str, str]) -> Figures:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors against {url}:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    return Figures(rps, p50, p99)


def _wait_for(check: object, what: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", default="1,64", help="wrk connections to measure at (default 1,64)")
    parser.add_argument("--seconds", type=int, default=5, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each configuration")
    parser.add_argument("--runtime", default="process", help="the local pool's runtime (process, runc, gvisor)")
    parser.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()
    missing = [
        tool for tool in ("wrk", "nginx") if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()
    ]
    if missing:
        sys.exit(f"this benchmark needs {' and '.join(missing)}: apt-get install wrk nginx-light")
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"

    root = Path(tempfile.mkdtemp(prefix="l9-bench-gw-"))
    home = root / "home"
    home.mkdir()
    cpus = os.cpu_count() or 1
    (home / "levers9.yaml").write_text(
        f"version: 1\npools:\n  local:\n    provider: local\n    runtime: {args.runtime}\n"
        f"    cpu: {cpus}\n    memory: 4096\n    min_workers: 1\n    max_workers: 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(LEVERS9_HOME=str(home), XDG_STATE_HOME=str(root / "state"))
    grpc_port, http_port, metrics_port, nginx_port = (_free_port() for _ in range(4))
    up_log = root / "up.log"
    with up_log.open("wb") as log:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "levers9",
                "up",
                "--log-level",
                "info",
                "--grpc-port",
                str(grpc_port),
                "--http-port",
                str(http_port),
                "--metrics-port",
                str(metrics_port),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    nginx: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(lambda: b"levers9 is up" in up_log.read_bytes(), "levers9 up", 60, up_log)
        (root / "app.py").write_text(textwrap.dedent(APP))
        deploy = subprocess.run(
            [sys.executable, "-m", "levers9", "deploy", str(root / "app.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if deploy.returncode != 0:
            raise RuntimeError(f"levers9 deploy failed: {deploy.stderr}")
        token = re.search(r"l9_user_[A-Za-z0-9_-]+", (home / "config").read_text()).group(0)  # type: ignore[union-attr]
        gateway = f"http://127.0.0.1:{http_port}/endpoint/hello"
        ready = re.compile(rb"is ready at ([0-9.]+:[0-9]+)")
        _wait_for(lambda: ready.search(up_log.read_bytes()), "a ready container", 120, up_log)
        address = ready.search(up_log.read_bytes()).group(1).decode()  # type: ignore[union-attr]
        (root / "nginx-tmp").mkdir()
        (root / "nginx.conf").write_text(NGINX.format(root=root, address=address, port=nginx_port))
        nginx = subprocess.Popen(
            [nginx_bin, "-p", str(root), "-c", str(root / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        paths = {
            "direct": (f"http://{address}/", {}),
            "gateway": (gateway, {"authorization": f"Bearer {token}"}),
            "nginx": (f"http://127.0.0.1:{nginx_port}/", {}),
        }
        for url, headers in paths.values():
            wrk(url, 4, 1, headers)  # warm: connections, caches
        connections = [int(c) for c in args.connections.split(",")]
        runs: dict[tuple[int, str], list[Figures]] = {}
        for _ in range(args.rounds):
            for c in connections:
                for name, (url, headers) in paths.items():
                    figures = wrk(url, c, args.seconds, headers)
                    print(
                        f"  c={c} {name}: {figures.rps:,.0f}/s p50 {figures.p50_ms:.3f} ms p99 {figures.p99_ms:.3f} ms",
                        file=sys.stderr,
                    )
                    runs.setdefault((c, name), []).append(figures)
    finally:
        if nginx is not None:
            nginx.send_signal(signal.SIGQUIT)
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait()
        up.terminate()
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        shutil.rmtree(root, ignore_errors=True)

    def median(c: int, name: str) -> Figures:
        figures = runs[(c, name)]
        return Figures(*(statistics.median(getattr(f, k) for f in figures) for k in ("rps", "p50_ms", "p99_ms")))

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{platform.node()}: {cpus} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    lines = [
        f"### Gateway overhead: gateway, direct and nginx ({when})",
        "",
        f"Machine: {machine}. One warm endpoint container (the `{args.runtime}` runtime, 1 CPU) returning a small JSON "
        f"object; `wrk -t1` for {args.seconds} s per run, medians of {args.rounds} interleaved rounds. Gateway: "
        "`levers9 up` with a bearer token; nginx: one worker, kept-alive upstream connections.",
        "",
        "| connections | path | requests/s | p50 (ms) | p99 (ms) | p50 added over direct (ms) | throughput / direct |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c in connections:
        direct = median(c, "direct")
        for name in ("direct", "gateway", "nginx"):
            f = median(c, name)
            lines.append(
                f"| {c} | {name} | {f.rps:,.0f} | {f.p50_ms:.3f} | {f.p99_ms:.3f} | "
                f"{f.p50_ms - direct.p50_ms:+.3f} | {f.rps / direct.rps:.2f}x |"
            )
    table = "\n".join(lines)
    print(table)
    if args.write:
        with (ROOT / "bench" / "RESULTS.md").open("a") as out:
            out.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
