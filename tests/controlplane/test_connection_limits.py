"""The connection caps a controlplane derives from its descriptor limit, and the ones its gRPC listener keeps.

The HTTP listeners' caps and timeouts are tried over raw sockets in test_slow_clients.py; here the budget
itself (levers9.controlplane.limits) and a real Server's gRPC listener, which grpcio serves with its own
threads, so its cap and handshake deadline are options handed to grpcio rather than code of ours.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from levers9.config.load import load_config
from levers9.controlplane.limits import METRICS_CAP, MIN_RESERVE, SLACK, LimitsError, plan
from levers9.controlplane.server import Listeners, Server
from tests.fixtures.levers9_up import free_port

#: a controlplane of its own, with no pools: only its listeners matter here
BASE = """\
version: 1
data_dir: {data_dir}
state:
  database_url: {database_url}
"""


@pytest.mark.parametrize("descriptors", [1024, 20_000, 1 << 20])
def test_unset_caps_are_derived_from_the_descriptor_limit_and_leave_a_fifth(descriptors: int) -> None:
    budget = plan(descriptors)
    assert budget.http == budget.grpc > 0
    assert budget.http_per_client == budget.http // 8
    assert budget.reserve >= max(MIN_RESERVE, descriptors // 5)
    assert budget.http + budget.grpc + METRICS_CAP + 2 * SLACK + budget.reserve == descriptors


def test_a_cap_set_in_the_config_is_kept_and_the_other_takes_what_it_leaves() -> None:
    budget = plan(20_000, http=12_000, http_per_client=0)
    assert (budget.http, budget.http_per_client) == (12_000, 0)
    assert budget.reserve == 20_000 // 5
    assert plan(20_000, grpc=2_000).http > plan(20_000).http


def test_caps_that_leave_too_few_descriptors_are_refused_naming_the_keys() -> None:
    with pytest.raises(
        LimitsError,
        match=r"listen.max_connections \(15000\) and listen.grpc_max_connections "
        r"\(5000\).*LimitNOFILE",
    ):
        plan(20_000, http=15_000, grpc=5_000)
    with pytest.raises(LimitsError, match=r"only 300 file descriptors.*at least \d+"):
        plan(300)


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 512, "this test needs a hard descriptor limit above 512"

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource; from levers9.controlplane.limits import raise_descriptor_limit; "
            "print(raise_descriptor_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
        ],
        preexec_fn=lower,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == [str(hard), str(hard)]


LIMITED = BASE + (
    "listen:\n  grpc_max_connections: 16\n  max_connections: 40\n  max_connections_per_client: 0\n"
    "  header_timeout_s: 3\n"
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_grpc_listener_closes_connections_over_its_cap_and_handshakes_past_the_header_timeout(
    tmp_path: Path, database_url: str
) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(LIMITED.format(data_dir=tmp_path / "data", database_url=database_url))
    loaded = load_config(path)
    server = Server(loaded, Listeners("127.0.0.1", free_port(), free_port(), free_port()))
    held: list[socket.socket] = []
    try:
        await server.start()
        assert server.budget is not None
        assert (server.budget.grpc, server.budget.http, server.budget.http_per_client) == (16, 40, 0)
        port = server.listeners.grpc_port
        loop = asyncio.get_running_loop()
        for _ in range(16):  # connections that never send gRPC's preface: the cap's worth
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setblocking(False)
            held.append(sock)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.setblocking(False)
        held.append(extra)
        assert (
            await asyncio.wait_for(_until_closed(loop, extra), 10) == b""
        )  # the 17th, queued after them: closed as it came
        for sock in held[:16]:  # the silent ones: closed after the header timeout (3 s), after a GOAWAY
            await asyncio.wait_for(_until_closed(loop, sock), 10)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)  # room again for a real client
    finally:
        for sock in held:
            sock.close()
        await server.stop(grace_s=1)
        loaded.hooks.close()


async def _until_closed(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    """Read ``sock`` until the server closes it; the last bytes read (b'' when it sent nothing at all)."""
    last = b""
    while True:
        try:
            data = await loop.sock_recv(sock, 4096)
        except ConnectionResetError:
            return last
        if not data:
            return last
        last = data


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_server_whose_caps_do_not_fit_its_descriptors_does_not_start(tmp_path: Path, database_url: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        (BASE + "listen:\n  max_connections: 100000000\n").format(data_dir=tmp_path / "data", database_url=database_url)
    )
    loaded = load_config(path)
    server = Server(loaded, Listeners("127.0.0.1", free_port(), free_port(), free_port()))
    try:
        with pytest.raises(LimitsError, match=r"listen.max_connections \(100000000\)"):
            await server.start()
        assert server.services is None  # refused before anything opened
    finally:
        await server.stop(grace_s=1)
        loaded.hooks.close()
