"""``levers9 agent join`` / ``levers9 agent run`` as real processes against the real Agent service and dockerd.

The controlplane side (the Agent gRPC service, its hub, SQLite and Redis)
runs in the test's event loop; the agent is ``python -m levers9 agent ...``
in a subprocess, so it can be SIGKILLed and started again, and its exit code
and words are what an operator sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from levers9.agent import credentials
from tests.agent.agent_wire import AgentServer, eventually, opened_server, provision_payload
from tests.fixtures.dockerd import Dockerd


class Agents:
    """Agent processes a test started: each one's stderr in a file; all killed and reaped at the end."""

    def __init__(self, tmp_path: Path, dockerd: Dockerd) -> None:
        self.tmp_path = tmp_path
        self.dockerd = dockerd
        self.started: list[tuple[asyncio.subprocess.Process, Path]] = []

    async def start(self, *args: str, token: str | None = None) -> asyncio.subprocess.Process:
        env = {k: v for k, v in os.environ.items() if k not in ("LEVERS9_JOIN_TOKEN", "DOCKER_HOST")}
        if token is not None:
            env["LEVERS9_JOIN_TOKEN"] = token
        log = self.tmp_path / f"agent-{len(self.started)}.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "levers9",
                "agent",
                *args,
                "--docker-host",
                self.dockerd.host,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
            )
        self.started.append((process, log))
        return process

    def log(self, process: asyncio.subprocess.Process) -> str:
        return next(path.read_text(errors="replace") for p, path in self.started if p is process)

    async def exit_code(self, process: asyncio.subprocess.Process, timeout: float = 20) -> int:
        try:
            return await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            pytest.fail(f"the agent did not exit within {timeout:.0f} s:\n{self.log(process)[-3000:]}")

    async def close(self) -> None:
        for process, _ in self.started:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[AgentServer]:
    async with opened_server(tmp_path, tls=True) as opened:
        yield opened


@pytest.fixture
async def agents(tmp_path: Path, dockerd: Dockerd) -> AsyncIterator[Agents]:
    started = Agents(tmp_path, dockerd)
    try:
        yield started
    finally:
        await started.close()
        left = [c for c in dockerd.containers() if "levers9.machine-id" in c["labels"]]
        if left:
            dockerd.cli("rm", "-f", *[c["id"] for c in left], check=False)


async def _connected(server: AgentServer, agent_id: str) -> None:
    def ready() -> bool:
        inventory = server.inventory(agent_id)
        return bool(inventory and inventory.connected and "details" in inventory.capacity)

    await eventually(ready, f"agent {agent_id} connected with an inventory")


async def test_join_keeps_the_credential_and_a_join_token_works_once(
    server: AgentServer, agents: Agents, tmp_path: Path
) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(server.ca_pem or "")
    token = await server.join_token()
    first = await agents.start(
        "join", "--controlplane", server.url, "--ca", str(ca_file), "--state-dir", str(tmp_path / "one"), token=token
    )
    path = tmp_path / "one" / "agent.json"
    await eventually(path.exists, "agent.json written")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = json.loads(path.read_text())
    assert saved["agent_id"].startswith("agt_")
    assert saved["token"].startswith("l9_agent_")
    assert (saved["provider"], saved["labels"], saved["ca_pem"]) == ("agent_machine", {"pool": "box"}, server.ca_pem)
    await _connected(server, saved["agent_id"])

    again = await agents.start(
        "join", "--controlplane", server.url, "--ca", str(ca_file), "--state-dir", str(tmp_path / "two"), token=token
    )
    assert await agents.exit_code(again) == 3
    assert "the controlplane refused the join token: this join token was already used" in agents.log(again)
    assert not (tmp_path / "two" / "agent.json").exists()

    plain = await agents.start(
        "join",
        "--controlplane",
        f"grpc://127.0.0.1:{server.port}",
        "--state-dir",
        str(tmp_path / "three"),
        token=await server.join_token(),
    )
    assert await agents.exit_code(plain) == 2
    assert "TLS only" in agents.log(plain)
    assert "--insecure" in agents.log(plain)

    first.send_signal(signal.SIGTERM)
    assert await agents.exit_code(first) == 0


async def test_sigkill_keeps_the_worker_and_the_restarted_agent_reports_it(
    server: AgentServer, agents: Agents, dockerd: Dockerd, tiny_image: str, tmp_path: Path
) -> None:
    credential = await server.credential()
    agent_id, machine_id = credential.agent_id, "mach_kill1"
    state = tmp_path / "state"
    credentials.save(state, credential)
    first = await agents.start("run", "--state-dir", str(state))
    await _connected(server, agent_id)
    ack = await server.send(agent_id, "provision", provision_payload(machine_id, tiny_image))
    container_id = ack.result["container_id"]

    first.kill()
    assert await agents.exit_code(first) == -signal.SIGKILL
    (container,) = [c for c in dockerd.containers() if c["id"] == container_id]
    assert container["state"] == "running"

    hellos = server.said.hellos(agent_id)
    second = await agents.start("run", "--state-dir", str(state))
    await eventually(lambda: server.said.hellos(agent_id) > hellos, "the restarted agent said Hello")

    def reported() -> bool:
        latest = server.said.inventories(agent_id)
        return bool(latest) and latest[-1].machines == (machine_id,)

    await eventually(reported, "the restarted agent's inventory lists the running container")
    again = await server.send(agent_id, "provision", provision_payload(machine_id, tiny_image))
    assert again.result["container_id"] == container_id
    assert [c["id"] for c in dockerd.containers()] == [container_id]

    second.send_signal(signal.SIGTERM)
    assert await agents.exit_code(second) == 0
    assert [c["state"] for c in dockerd.containers()] == ["running"]  # a stopped agent leaves its workers
    dockerd.cli("rm", "-f", container_id)


async def test_a_revoked_agent_stops_with_exit_code_3(server: AgentServer, agents: Agents, tmp_path: Path) -> None:
    credential = await server.credential()
    credentials.save(tmp_path / "state", credential)
    process = await agents.start("run", "--state-dir", str(tmp_path / "state"))
    await _connected(server, credential.agent_id)
    await server.revoke(credential)
    assert await agents.exit_code(process) == 3
    words = agents.log(process)
    assert "the controlplane refused this agent's credential" in words
    assert "join again with a new token" in words


async def test_run_without_a_credential_says_how_to_join(agents: Agents, tmp_path: Path) -> None:
    process = await agents.start("run", "--state-dir", str(tmp_path / "nowhere"))
    assert await agents.exit_code(process) == 2
    assert "has not joined; run `levers9 agent join`" in agents.log(process)
