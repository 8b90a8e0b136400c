"""The agent in this process against the real Agent gRPC service and a real dockerd.

Orders go through the controlplane's own :class:`AgentHub`, over gRPC (TLS in
the first test), to :func:`levers9.agent.daemon.run_agent`, which starts and
removes containers on the test's private dockerd. GPUs come from a recorded
``nvidia-smi`` output (a T4 machine), parsed by the core's own parser; the
private dockerd has no ``nvidia`` runtime, as a box without the NVIDIA
Container Toolkit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from levers9.agent import credentials
from levers9.agent.connection import InsecureRefused, open_channel
from levers9.agent.credentials import AgentCredential
from levers9.agent.daemon import run_agent
from levers9.agent.inventory import GpuSource
from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest
from levers9.hooks.types import GpuDevice
from tests.agent.agent_wire import AgentServer, eventually, opened_server, provision_payload
from tests.fixtures.dockerd import Dockerd

T4_SMI = Path(__file__).parents[1] / "data" / "gpu" / "nvidia_smi" / "t4_1x.csv"
SECRET = "l9_secret_for_the_test"


async def _no_gpus() -> list[GpuDevice]:
    return []


async def _one_t4() -> list[GpuDevice]:
    return parse_query_gpu(T4_SMI.read_text())


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[AgentServer]:
    async with opened_server(tmp_path, tls=True) as server:
        yield server


@pytest.fixture
async def plain_server(tmp_path: Path) -> AsyncIterator[AgentServer]:
    async with opened_server(tmp_path, tls=False) as server:
        yield server


@pytest.fixture
def no_containers_left(dockerd: Dockerd) -> Iterator[None]:
    """Remove whatever levers9 container a test left, then fail the test if there was one."""
    yield
    left = [c for c in dockerd.containers() if "levers9.machine-id" in c["labels"]]
    if left:
        dockerd.cli("rm", "-f", *[c["id"] for c in left], check=False)
    assert not left, f"containers left behind: {[c['name'] for c in left]}"


@contextlib.asynccontextmanager
async def running_agent(
    credential: AgentCredential, dockerd: Dockerd, gpus: GpuSource = _no_gpus
) -> AsyncIterator[asyncio.Task[int]]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_agent(credential, stop, docker_host=dockerd.host, gpus=gpus, stop_grace_s=1, poll_s=0.3)
    )
    try:
        yield task
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def _connected(server: AgentServer, agent_id: str) -> None:
    def ready() -> bool:
        inventory = server.inventory(agent_id)
        return bool(inventory and inventory.connected and "details" in inventory.capacity)

    await eventually(ready, f"agent {agent_id} connected with an inventory")


async def test_provision_list_terminate_over_tls(
    tls_server: AgentServer,
    dockerd: Dockerd,
    tiny_image: str,
    no_containers_left: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    credential = await tls_server.credential()
    assert credential.ca_pem == tls_server.ca_pem
    assert not credential.insecure
    agent_id, machine_id = credential.agent_id, "mach_tls1"
    async with running_agent(credential, dockerd):
        await _connected(tls_server, agent_id)
        ack = await tls_server.send(agent_id, "provision", provision_payload(machine_id, tiny_image), order_id="ord_a")
        result = ack.result
        assert (result["name"], result["machine_id"], result["gpus"]) == (f"l9w-{machine_id}", machine_id, [])

        client = dockerd.client()
        try:
            container = client.containers.get(result["container_id"])
            assert container.name == f"l9w-{machine_id}"
            assert container.status == "running"
            assert container.labels == {
                "levers9.machine-id": machine_id,
                "levers9.pool": "box",
                "levers9.agent-id": agent_id,
                "levers9.workspace": "",
                "levers9.gpus": "",
            }
            host = container.attrs["HostConfig"]
            assert (host["NanoCpus"], host["Memory"]) == (250_000_000, 64 * 2**20)
            assert host["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
            assert host["NetworkMode"] == "host"
            assert f"LEVERS9_TOKEN={SECRET}" in container.attrs["Config"]["Env"]
            assert container.attrs["Config"]["Cmd"] == ["/bin/sleep", "3600"]
        finally:
            client.close()

        # the same order again, and a new order for the same machine: no second container
        again = await tls_server.send(
            agent_id, "provision", provision_payload(machine_id, tiny_image), order_id="ord_a"
        )
        assert again.result == result
        other = await tls_server.send(agent_id, "provision", provision_payload(machine_id, tiny_image))
        assert other.result["container_id"] == result["container_id"]
        assert [c["name"] for c in dockerd.containers()] == [f"l9w-{machine_id}"]

        listed = await tls_server.send(agent_id, "list", {})
        info = {
            "machine_id": machine_id,
            "pool": "box",
            "container_id": result["container_id"],
            "state": "running",
            "exit_code": None,
            "gpus": [],
        }
        assert listed.result == {"containers": [info]}

        def reports_it() -> bool:
            inventory = tls_server.inventory(agent_id)
            return inventory is not None and inventory.machines == [machine_id]

        await eventually(reports_it, "the inventory lists the machine")
        inventory = tls_server.inventory(agent_id)
        assert inventory is not None
        details = inventory.capacity["details"]
        assert details["containers"] == [info]
        assert details["docker"]["nvidia"] is False
        assert details["docker"]["version"]
        capacity = inventory.capacity
        assert capacity["free"]["cpu_millicores"] == capacity["cpu_millicores"] - 250
        assert capacity["free"]["memory_mib"] == capacity["memory_mib"] - 64

        done = await tls_server.send(agent_id, "terminate", {"machine_id": machine_id})
        assert done.ok
        assert dockerd.containers() == []
        assert (await tls_server.send(agent_id, "terminate", {"machine_id": machine_id})).ok

        def gone() -> bool:
            inventory = tls_server.inventory(agent_id)
            return (
                inventory is not None and inventory.machines == [] and inventory.capacity["details"]["containers"] == []
            )

        await eventually(gone, "the inventory no longer lists the machine")
    assert SECRET not in caplog.text


async def test_refusals_name_the_image_the_toolkit_and_the_shortfall(
    plain_server: AgentServer, dockerd: Dockerd, tiny_image: str, no_containers_left: None
) -> None:
    credential = await plain_server.credential()
    agent_id = credential.agent_id
    async with running_agent(credential, dockerd, gpus=_one_t4):
        await _connected(plain_server, agent_id)
        inventory = plain_server.inventory(agent_id)
        assert inventory is not None
        assert inventory.capacity["gpus"] == {"T4": 1}
        assert inventory.capacity["free"]["gpus"] == {"T4": 1}

        with pytest.raises(InvalidRequest) as missing:
            await plain_server.send(agent_id, "provision", provision_payload("mach_r1", "levers9/missing:9"))
        assert "'levers9/missing:9'" in str(missing.value)
        assert "levers9 worker-image build" in str(missing.value)

        gpu_order = provision_payload("mach_r2", tiny_image, gpu="T4", gpu_count=1, gpu_runtime="nvidia")
        with pytest.raises(InvalidRequest, match="NVIDIA Container Toolkit"):
            await plain_server.send(agent_id, "provision", gpu_order)

        too_big = provision_payload("mach_r3", tiny_image, memory_mib=inventory.capacity["memory_mib"] + 1)
        with pytest.raises(InsufficientCapacity, match="MiB of memory"):
            await plain_server.send(agent_id, "provision", too_big)

        with pytest.raises(InvalidRequest, match="does not know the order 'reboot'"):
            await plain_server.send(agent_id, "reboot", {})
    assert dockerd.containers() == []


async def test_the_agent_dials_again_after_the_controlplane_restarts(
    plain_server: AgentServer, dockerd: Dockerd, no_containers_left: None
) -> None:
    credential = await plain_server.credential()
    agent_id = credential.agent_id
    said = plain_server.said
    async with running_agent(credential, dockerd) as agent:
        await _connected(plain_server, agent_id)
        assert said.hellos(agent_id) == 1
        assert said.inventories(agent_id)
        await plain_server.stop()
        await asyncio.sleep(1.0)  # the agent fails to dial at least once (back-off) while nothing listens
        assert not agent.done()
        before = len(said.events)
        await plain_server.start()
        await eventually(lambda: said.hellos(agent_id) == 2, "a second Hello after the restart")
        await eventually(
            lambda: any(kind == "inventory" for kind, _, _ in said.events[before:]),
            "an inventory after the second Hello",
        )
        assert (await plain_server.send(agent_id, "list", {})).result == {"containers": []}


async def test_plain_text_needs_insecure(plain_server: AgentServer) -> None:
    with pytest.raises(InsecureRefused, match=r"grpcs://host:port.*--insecure"):
        open_channel(plain_server.url, ca_pem=None, insecure=False)
    with pytest.raises(InsecureRefused, match="all grpcs:// or all grpc://"):
        open_channel("grpcs://a:1993,grpc://b:1993", ca_pem=None, insecure=True)


def test_the_credential_file_is_the_owners_only(tmp_path: Path) -> None:
    saved = AgentCredential(
        agent_id="agt_1",
        token="l9_agent_x",
        controlplane="grpcs://cp:1993",
        provider="agent_machine",
        ca_pem="PEM",
        labels={"pool": "box"},
    )
    path = credentials.save(tmp_path / "state", saved)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert credentials.load(tmp_path / "state") == saved
    assert "l9_agent_x" not in repr(saved)
    os.chmod(path, 0o644)
    with pytest.raises(credentials.CredentialError, match="chmod 600"):
        credentials.load(tmp_path / "state")
    assert json.loads(path.read_text())["token"] == "l9_agent_x"  # refused, never rewritten
    with pytest.raises(credentials.NotJoined, match="levers9 agent join"):
        credentials.load(tmp_path / "elsewhere")
