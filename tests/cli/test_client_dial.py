"""Clients that do not wait on a dead address: every replica dialled at once, handshakes that cannot work said
in one line, global options before or after the subcommand, and ``levers9 run`` with no controlplane at all.

The controlplane is the in-process gRPC server of test_client_cmds.py (plain text or TLS with a throw-away
CA); a dead address is a closed port (refused) or a real listening socket nobody accepts on (TCP completes in
the kernel's backlog, gRPC never answers). The commands run as subprocesses, as a user runs them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from levers9.proto.v1 import controlplane_pb2_grpc
from levers9.sdk.context import Context, save_context
from tests.cli.test_client_cmds import TOKEN, Cli, FakeControlPlane, Server, serving
from tests.fixtures.ports import free_port
from tests.fixtures.tls import TestCA


def _silent_socket() -> socket.socket:
    """A listening socket with a backlog that never accepts: connections complete and are never answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


#: silent addresses listed before the live one; one after another at 5 s each (the old way) is 20 s
SILENT = 4
#: the bound on `levers9 tasks` through them: a hang bound, far above the fraction of a second they cost now
TASKS_TIMEOUT_S = 15


@pytest.fixture
def silent() -> Iterator[list[socket.socket]]:
    sockets = [_silent_socket() for _ in range(SILENT)]
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def test_dead_addresses_before_the_live_one_cost_no_wait(silent: list[socket.socket], server: Server, cli: Cli) -> None:
    """Every address is dialled at once: four that never answer (or refuse) do not hold up the live one."""
    dead = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in silent]
    save_context(Context(name="test", grpc=",".join([*dead, server.address]), token=TOKEN))
    started = time.monotonic()
    result = cli("tasks", timeout=TASKS_TIMEOUT_S)
    print(f"levers9 tasks, {SILENT} silent addresses first: {time.monotonic() - started:.2f} s")
    assert result.returncode == 0, result.stderr
    assert "t-0002" in result.stdout

    refused = [f"127.0.0.1:{free_port()}" for _ in range(SILENT)]
    save_context(Context(name="test", grpc=",".join([*refused, server.address]), token=TOKEN))
    started = time.monotonic()
    result = cli("tasks", timeout=TASKS_TIMEOUT_S)
    print(f"levers9 tasks, {SILENT} refused addresses first: {time.monotonic() - started:.2f} s")
    assert result.returncode == 0, result.stderr
    assert "t-0002" in result.stdout


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    with serving(FakeControlPlane(), tmp_path, monkeypatch) as running:
        yield running


@pytest.fixture
def tls_and_plain() -> Iterator[tuple[int, int, TestCA]]:
    """One FakeControlPlane on a TLS port and on a plain-text port, on its own loop thread."""
    import threading

    ca = TestCA()
    issued = ca.issue()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-tls-test-server", daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int, int]:
        srv = grpc.aio.server()
        controlplane_pb2_grpc.add_ControlPlaneServicer_to_server(FakeControlPlane(), srv)
        tls = srv.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(issued.key_pem, issued.cert_pem)]))
        plain = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        return srv, tls, plain

    srv, tls_port, plain_port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield tls_port, plain_port, ca
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(None), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def test_handshakes_that_cannot_work_are_one_clear_line(
    tls_and_plain: tuple[int, int, TestCA], tmp_path: Path, cli: Cli
) -> None:
    tls_port, plain_port, ca = tls_and_plain
    ca_file = ca.write(tmp_path / "ca.pem")
    wrong_ca = TestCA("another CA").write(tmp_path / "wrong-ca.pem")
    base = {"LEVERS9_TOKEN": TOKEN}
    assert (
        cli(
            "tasks", env={**base, "LEVERS9_GRPC": f"grpcs://127.0.0.1:{tls_port}", "LEVERS9_CA_FILE": str(ca_file)}
        ).returncode
        == 0
    )

    wrong = cli(
        "tasks", env={**base, "LEVERS9_GRPC": f"grpcs://127.0.0.1:{tls_port}", "LEVERS9_CA_FILE": str(wrong_ca)}
    )
    assert wrong.returncode == 1
    [line] = wrong.stderr.splitlines()  # no gRPC handshake log lines before it
    assert line.startswith(f"error: the controlplane's certificate at 127.0.0.1:{tls_port} was not trusted"), line
    assert str(wrong_ca) in line
    assert "$LEVERS9_CA_FILE" in line
    # GRPC_VERBOSITY set by the person wins: the quiet default hides nothing they ask to see
    env = {
        **base,
        "LEVERS9_GRPC": f"grpcs://127.0.0.1:{tls_port}",
        "LEVERS9_CA_FILE": str(wrong_ca),
        "GRPC_VERBOSITY": "INFO",
    }
    assert "Handshake failed" in cli("tasks", env=env).stderr

    plain_to_tls = cli("tasks", env={**base, "LEVERS9_GRPC": f"127.0.0.1:{tls_port}"})
    assert plain_to_tls.returncode == 1
    [line] = plain_to_tls.stderr.splitlines()
    assert line.startswith(f"error: 127.0.0.1:{tls_port} speaks TLS: use grpcs://127.0.0.1:{tls_port} and --ca-file"), (
        line
    )

    tls_to_plain = cli(
        "tasks", env={**base, "LEVERS9_GRPC": f"grpcs://127.0.0.1:{plain_port}", "LEVERS9_CA_FILE": str(ca_file)}
    )
    assert tls_to_plain.returncode == 1
    [line] = tls_to_plain.stderr.splitlines()
    assert line.startswith(f"error: 127.0.0.1:{plain_port} speaks plain text, not TLS: use grpc://"), line


APP = """
import levers9

@levers9.function(cpu=0.25)
def f() -> int:
    return 1

print(f.remote())
"""


def test_the_sdk_fails_at_once_on_a_handshake_and_when_no_controlplane_exists(
    tls_and_plain: tuple[int, int, TestCA], tmp_path: Path, cli: Cli
) -> None:
    """Neither waits out reconnect_s (120 s by default; the subprocess timeout of 60 s would end the test)."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    tls_port, _, _ = tls_and_plain
    plain_to_tls = cli("run", str(app), env={"LEVERS9_TOKEN": TOKEN, "LEVERS9_GRPC": f"127.0.0.1:{tls_port}"})
    assert plain_to_tls.returncode == 1
    [line] = plain_to_tls.stderr.splitlines()  # the one line, no traceback through the SDK
    assert line.startswith(f"error: 127.0.0.1:{tls_port} speaks TLS: use grpcs://127.0.0.1:{tls_port} and --ca-file")

    refused = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    nothing = cli("run", str(app), env={"LEVERS9_TOKEN": TOKEN, "LEVERS9_GRPC": ",".join(refused)})
    print(f"levers9 run with every address refused: {time.monotonic() - started:.2f} s")
    assert nothing.returncode == 1
    assert nothing.stderr.splitlines() == [
        f"levers9: connecting to {', '.join(refused)}...",
        f"error: no levers9 controlplane at {', '.join(refused)}: start one with `levers9 up` or check the context"
        " ('env')",
    ], nothing.stderr


def test_global_options_before_or_after_the_subcommand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    with serving(FakeControlPlane(), tmp_path, monkeypatch):
        _global_options_before_or_after_the_subcommand(cli, tmp_path)


def _global_options_before_or_after_the_subcommand(cli: Cli, tmp_path: Path) -> None:
    save_context(Context(name="down", grpc=f"127.0.0.1:{free_port()}", token=TOKEN))  # the current one
    for argv in (
        ["-c", "test", "tasks"],
        ["tasks", "-c", "test"],
        ["--context=test", "pools"],
        ["pools", "--context", "test"],
    ):
        result = cli(*argv)
        assert result.returncode == 0, (argv, result.stderr)
    bad = tmp_path / "bad.yaml"
    bad.write_text("bogus_key: 1\n")
    # the order of docs/deploy.md's systemd unit (`levers9 --config F server` always worked); ~10 s: server
    # loads its plugins before the config
    result = cli("server", f"--config={bad}")
    assert result.returncode != 0
    assert "bogus_key: unknown field" in result.stderr, result.stderr
    # a command's own --config stays its own, and the app's arguments stay the app's
    echo = tmp_path / "echo.py"
    echo.write_text("import sys\nprint(sys.argv[1:])\n")
    result = cli("run", str(echo), "--config", "mine.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['--config', 'mine.yaml']"


@pytest.mark.parametrize(
    ("argv", "quiet"),
    [(["tasks", "--help"], True), (["server", "--help"], False), (["--config", "x.yaml", "up", "--help"], False)],
)
def test_grpc_lines_are_hidden_for_client_commands_only(argv: list[str], quiet: bool) -> None:
    """A daemon keeps gRPC's own lines (its log of failed client handshakes), and so do the workers it starts."""
    program = (
        "import os, sys\nfrom levers9.cli.main import main\nsys.argv = ['levers9', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('GRPC_VERBOSITY', os.environ.get('GRPC_VERBOSITY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run([sys.executable, "-c", program, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == ("GRPC_VERBOSITY ERROR" if quiet else "GRPC_VERBOSITY None")
