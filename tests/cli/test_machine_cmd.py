"""`levers9 machine create | remove` and `levers9 machines` against a real controlplane's gRPC services.

The controlplane is its real services (SQLite, Redis), agent hub and plugins,
serving ControlPlane and Agent on a loop thread of its own; the CLI runs as a
subprocess, as a user runs it. The agent's side (Join, a stream, an inventory)
is played on the server's loop. ``--ssh`` itself is exercised end to end by
the SSH join's own tests (a real sshd); here only its argument checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from levers9.cli.machine_cmd import parse_ssh, parse_ttl
from levers9.config.load import load_config
from levers9.controlplane.grpc_agent import AgentService
from levers9.controlplane.grpc_api import ControlPlaneService
from levers9.controlplane.wheels import OwnWheels
from levers9.images.wheel import build, wheel_name
from levers9.proto.v1 import agent_pb2_grpc, controlplane_pb2_grpc
from levers9.sdk.context import Context, save_context
from levers9.services import agent_join
from levers9.services.agents import AgentCut, AgentHub, InventoryReport
from levers9.services.core import Services, open_services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from tests.conftest import Result
from tests.services.test_agent_hub import Agent

T = TypeVar("T")

#: the HTTP listener the controlplane advertises (nothing listens: the command is only printed)
WHEELS_AT = "https://cp.example:8443"

CONFIG = """\
version: 1
data_dir: {data_dir}
state:
  database_url: sqlite:///{data_dir}/levers9.db
pools:
  lab:
    provider: agent_machine
    runtime: runc
    gpu: H100
    cpu: 4
    memory: 16GiB
    max_workers: 2
    settings:
      worker_image: levers9/worker:test
  cpu:
    provider: local
    runtime: runc
    cpu: 2
    memory: 4GiB
    max_workers: 1
"""


@dataclass
class Plane:
    services: Services
    hub: AgentHub
    address: str
    loop: asyncio.AbstractEventLoop = field(repr=False)
    agents: list[Agent] = field(default_factory=list)
    #: the agents' heartbeats (:meth:`keep_beating`), on the plane's loop
    beats: list[asyncio.Task[None]] = field(default_factory=list)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def keep_beating(self, agent: Agent) -> None:
        """From the plane's loop: ``agent`` heartbeats until its stream ends, as a real agent does (here three times
        a heartbeat period, so that a loaded loop never lets one lapse).

        The loop runs on its own thread, so the heartbeats go on while the test's body waits for a CLI subprocess;
        without them, four CLI runs on a loaded machine once took longer than the hub's three heartbeat periods
        (15 s), and the hub cut the silent agent ("sent nothing for 15.4 s") before the test looked at it.
        """
        session = agent.session
        assert session is not None

        async def beat() -> None:
            while session.live:
                await session.heartbeat()
                await asyncio.sleep(self.hub.heartbeat_s / 3)

        self.beats.append(asyncio.create_task(beat(), name=f"heartbeats of {agent.identity.agent_id}"))

    async def stop_beating(self) -> None:
        """Ends the heartbeats; one that failed fails the test."""
        for task in self.beats:
            task.cancel()
        for outcome in await asyncio.gather(*self.beats, return_exceptions=True):
            if isinstance(outcome, Exception):
                raise outcome


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plane]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="controlplane-test", daemon=True)
    thread.start()
    config = tmp_path / "levers9.yaml"
    (tmp_path / "data").mkdir()
    config.write_text(CONFIG.format(data_dir=tmp_path / "data"))
    loaded = load_config(config)
    stack = contextlib.AsyncExitStack()

    async def start() -> tuple[Services, AgentHub, int, str]:
        services = await open_services(loaded, controlplane_url="grpcs://cp.example:50051")
        stack.push_async_callback(services.close)
        stack.push_async_callback(services.scheduler.stop)
        hub = AgentHub(services.redis, name="replica-a", heartbeat_s=5.0)
        await hub.start()
        stack.push_async_callback(hub.close)
        await services.hooks.startup(agents=hub)
        dataplane = DataPlane(services, Hub(services.redis, name=services.scheduler.name))
        stack.push_async_callback(dataplane.close)
        server = grpc.aio.server()
        add_api: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
        add_agent: Any = agent_pb2_grpc.add_AgentServicer_to_server
        add_api(ControlPlaneService(dataplane, wheels=OwnWheels(WHEELS_AT)), server)
        add_agent(AgentService(services, hub), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stack.push_async_callback(server.stop, None)
        _, token = await services.tokens.issue("user", subject="root")
        return services, hub, port, token

    try:
        services, hub, port, token = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
        monkeypatch.setenv("LEVERS9_HOME", str(tmp_path / "home"))
        for key in ("LEVERS9_CONTEXT", "LEVERS9_TOKEN", "LEVERS9_GRPC"):
            monkeypatch.delenv(key, raising=False)
        address = f"127.0.0.1:{port}"
        save_context(Context(name="test", grpc=address, token=token))
        plane = Plane(services, hub, address, loop)
        yield plane
        plane.run(plane.stop_beating())
        for agent in plane.agents:
            plane.run(agent.hang_up())
    finally:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        loaded.hooks.close()


Cli = Callable[..., Result]


def test_create_prints_the_join_command_once_and_machines_lists_it_live(plane: Plane, cli: Cli) -> None:
    result = cli("machine", "create", "--pool", "lab", "--name", "box-1", "--ttl", "30m")
    assert result.returncode == 0, result.stderr
    assert "plain text" in result.stderr
    assert "--insecure" in result.stderr
    assert "within 30m" in result.stderr
    created, command = result.stdout.strip().splitlines()
    assert created.startswith("created machine box-1 (agt_")
    assert created.endswith("for pool lab")
    # levers9 comes from the controlplane's own wheel, its hash checked: never by name from an index (issue 35)
    assert "levers9==" not in command
    wheel = wheel_name()
    assert command.startswith(f'd=$(mktemp -d) && curl -fsSL -o "$d"/{wheel} {WHEELS_AT}/api/v1/wheels/{wheel} && ')
    assert f'echo "{build().sha256}  $d/{wheel}" | sha256sum -c - && ' in command
    assert f'pip install "levers9[agent] @ file://$d/{wheel}" && LEVERS9_JOIN_TOKEN=' in command
    token = command.split("LEVERS9_JOIN_TOKEN=", 1)[1].split(" ", 1)[0]
    assert command.endswith(f"levers9 agent join --controlplane grpc://{plane.address} --insecure")

    listed = cli("machines", "--json")
    assert listed.returncode == 0, listed.stderr
    [pending] = json.loads(listed.stdout)
    assert (pending["name"], pending["pool"], pending["state"], pending["connected"]) == (
        "box-1",
        "lab",
        "pending",
        False,
    )
    assert token not in listed.stdout  # the token was shown once

    async def join_and_report() -> Agent:
        joined = await agent_join.join(plane.services, token, version="test", hostname="box-1.lab")
        agent = Agent(plane.hub, await agent_join.authenticate_agent(plane.services, joined.token))
        await agent.connect()
        assert agent.session is not None
        await agent.session.inventory(
            InventoryReport(
                cpu_millicores=16000,
                memory_mib=65536,
                free_cpu_millicores=12000,
                free_memory_mib=60000,
                gpus=(("H100", 2, 1),),
                machines=("mach_1",),
            )
        )
        plane.keep_beating(agent)
        return agent

    plane.agents.append(plane.run(join_and_report()))
    listed = cli("machines", "--json")
    [joined] = json.loads(listed.stdout)
    assert (joined["state"], joined["connected"], joined["hostname"]) == ("joined", True, "box-1.lab")
    assert joined["gpus"] == [{"gpu": "H100", "count": 2, "free": 1}]
    assert joined["workers"] == ["mach_1"]
    table = cli("machines")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.strip().splitlines()
    assert header.split("\t")[:5] == ["name", "pool", "state", "connected", "last heartbeat"]
    cells = row.split("\t")
    assert cells[:4] == ["box-1", "lab", "joined", "yes"]
    assert cells[5:] == ["1/2 H100", "12/16", "60000/65536 MiB", "1"]

    removed = cli("machine", "remove", "box-1", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith("removed machine box-1 (agt_")
    assert "0 workers stopped" in removed.stdout
    agent = plane.agents.pop()
    with pytest.raises(AgentCut, match="this machine was removed"):  # its stream was cut at once
        plane.run(agent.hang_up())
    empty = cli("machines")
    assert empty.returncode == 0
    assert empty.stdout == ""
    assert "no joined machines" in empty.stderr


def test_refusals_are_explained(plane: Plane, cli: Cli) -> None:
    wrong = cli("machine", "create", "--pool", "cpu")
    assert wrong.returncode == 1
    assert "pool 'cpu' uses provider 'local'" in wrong.stderr
    assert "pools you may join machines to: lab" in wrong.stderr
    unknown = cli("machine", "remove", "nope", "--yes")
    assert unknown.returncode == 1
    assert "'nope'" in unknown.stderr
    ttl = cli("machine", "create", "--pool", "lab", "--ttl", "soon")
    assert ttl.returncode == 2
    assert "--ttl 'soon' is not a duration" in ttl.stderr
    lonely = cli("machine", "create", "--pool", "lab", "--sudo")
    assert lonely.returncode == 2
    assert "need --ssh" in lonely.stderr
    bad_ssh = cli("machine", "create", "--pool", "lab", "--ssh", "ubuntu@host:99999")
    assert bad_ssh.returncode == 2
    assert "is not user@host[:port]" in bad_ssh.stderr
    # nothing was created by the refused commands
    assert json.loads(cli("machines", "--json").stdout) == []


def test_the_json_answer_carries_the_token_and_command(plane: Plane, cli: Cli) -> None:
    result = cli("machine", "create", "--pool", "lab", "--json")
    assert result.returncode == 0, result.stderr
    made = json.loads(result.stdout)
    assert made["name"] == made["id"]
    assert made["id"].startswith("agt_")
    assert made["join_token"] in made["join_command"]
    assert made["expires_at"]


def test_parse_ttl_and_ssh() -> None:
    assert [parse_ttl(v) for v in ("90", "90s", "30m", "1h", "2d", "1.5h")] == [90, 90, 1800, 3600, 172800, 5400]
    for bad in ("0", "-1h", "1w", "h"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_ttl(bad)
    assert dataclasses.astuple(parse_ssh("ubuntu@10.0.0.5")) == ("ubuntu", "10.0.0.5", None)
    assert dataclasses.astuple(parse_ssh("root@box:2222")) == ("root", "box", 2222)
    assert dataclasses.astuple(parse_ssh("box")) == (None, "box", None)
    assert dataclasses.astuple(parse_ssh("ops@[fe80::1]:22")) == ("ops", "fe80::1", 22)
    with pytest.raises(ValueError, match="is not user@host"):
        parse_ssh("a@b@c")


def test_machines_lists_those_started_from_providers_for_an_operator(plane: Plane, cli: Cli) -> None:
    machines = plane.services.machines

    async def records() -> tuple[str, str]:
        priced = await machines.create(
            "cpu", "local", region="us-east-1", zone="us-east-1b", instance_type="m7i.large", price_per_hour=0.1008
        )
        await machines.set_state(priced.id, "starting")
        await machines.mark_registered(priced.id, "w-1")
        ended = await machines.create("cpu", "local")
        await machines.set_state(ended.id, "failed", "no capacity")
        await machines.create("lab", "agent_machine")  # a worker on a joined box: listed under the box, not here
        return priced.id, ended.id

    priced, ended = plane.run(records())
    listed = cli("machines", "--json")
    assert listed.returncode == 0, listed.stderr
    [running] = json.loads(listed.stdout)
    assert running["kind"] == "provider"
    assert (running["id"], running["pool"], running["provider"], running["state"]) == (
        priced,
        "cpu",
        "local",
        "running",
    )
    assert (running["instance_type"], running["zone"], running["price_per_hour"]) == ("m7i.large", "us-east-1b", 0.1008)
    everything = json.loads(cli("machines", "--json", "--all").stdout)
    assert {(m["id"], m["state"], m["price_per_hour"]) for m in everything} == {
        (priced, "running", 0.1008),
        (ended, "failed", None),
    }
    assert cli("machines", "--json", "--pool", "lab").stdout.strip() == "[]"

    table = cli("machines")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.strip().splitlines()
    assert header.split("\t")[:7] == ["machine", "pool", "provider", "state", "instance type", "zone", "price"]
    assert row.split("\t")[:8] == [priced, "cpu", "local", "running", "m7i.large", "us-east-1b", "$0.10/h", "cpu"]

    async def user_token() -> str:
        workspace = await plane.services.workspaces.create("team-a")
        _, token = await plane.services.tokens.issue("user", workspace_id=workspace.id, subject="someone@a")
        return token

    as_user = cli("machines", "--json", env={"LEVERS9_TOKEN": plane.run(user_token())})
    assert as_user.returncode == 0, as_user.stderr
    assert json.loads(as_user.stdout) == []  # the machines started from providers are the operators' to see
