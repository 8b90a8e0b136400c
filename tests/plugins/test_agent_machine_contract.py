"""The levers9 provider contract, run against the installed ``agent_machine`` plugin with a real agent and dockerd.

For the class's lifetime one real agent (``python -m levers9 agent join``, a
subprocess, over TLS) is joined for pool ``box`` with a join token whose
labels name that pool; it runs its worker containers on this test process's
private dockerd (:mod:`tests.fixtures.dockerd`), from the worker image of this
checkout (:mod:`tests.fixtures.worker_image`). The kit's ``levers9_agents``
is the real :class:`~levers9.services.agents.AgentHub` the agent dials
(:mod:`tests.fixtures.agent_hub`), so every order the provider sends travels
the real stream to the real agent, and every listing is what the agent
reported.

* "the bootstrap boots": the provider starts the worker itself (a container
  running ``levers9 worker`` from the image with the bootstrap's environment),
  so ``boots_itself = True``; the container's network is the host's, so it
  reaches the kit's stand-in controlplane on 127.0.0.1 and must register there
  with exactly the bootstrap's token and machine id. The stand-in speaks plain
  text, and an agent refuses to start a worker that would dial a plain-text
  controlplane unless it runs with ``--insecure``: so this agent does (its own
  stream is still TLS, verified against the test CA).
* failing settings: a ``worker_image`` the box's Docker does not have; the
  agent refuses the order (``invalid_request``) and the scheduler must see a
  typed error.
* no capacity: the box already runs a worker of the pool and the pool allows
  one per machine (``max_workers_per_machine: 1``); provisioning must raise
  ``InsufficientCapacity``.

The kit's two seams for a provider whose machines are agents are used here:
``levers9_agents_loop`` (the plugins start on the hub's own loop, as in the
controlplane, so ``send_order`` reaches it) and ``pool_name`` (an agent serves
only the pool its join token named, so every pool is that one except the
listing check's "other").

After each test no container of the agent may be left (the kit terminates what
it provisioned); one left fails the test and is removed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from levers9.hooks.context import AgentHub
from levers9.hooks.errors import InvalidRequest
from levers9.hooks.facade import Hooks
from levers9.hooks.types import Machine
from levers9.images.worker import BuildResult
from levers9.testing import ProviderContract
from levers9.testing.provider_contract import run
from tests.agent.agent_wire import provision_payload
from tests.fixtures.agent_hub import JoinedBox, joined_box
from tests.fixtures.dockerd import Dockerd

#: the pool the agent joined for (its join token's ``pool`` label)
JOINED_POOL = "box"
#: the kit's pool for "a machine is listed only in its own pool": one the agent does not serve


@pytest.fixture(scope="class")
def box(tmp_path_factory: pytest.TempPathFactory, dockerd: Dockerd, worker_image: BuildResult) -> Iterator[JoinedBox]:
    """The class's joined box: one real agent for pool ``box`` on the private dockerd (stopped at the end)."""
    with joined_box(tmp_path_factory.mktemp("agent-box"), dockerd, pool=JOINED_POOL, insecure=True) as joined:
        yield joined


@pytest.fixture(autouse=True)
def no_leaks(box: JoinedBox) -> Iterator[None]:
    """Fail a test that leaves a container of the agent behind (after the kit's own clean-up ran)."""
    yield
    left = box.containers()
    if left:
        box.dockerd.cli("rm", "-f", *[c["id"] for c in left], check=False)
    assert not left, f"containers left on the box: {[(c['name'], c['state']) for c in left]}"


class TestAgentMachineContract(ProviderContract):
    provider = "agent_machine"
    settle_timeout = 60.0
    boots_itself = True
    boot_timeout = 120.0
    preemptible = False  # a box its owner joined is never taken back
    zonal = False  # a box is one machine: its offers name no zone
    # The provider's start is one order to the agent; what the agent does when its container's start fails after
    # the create is the agent's own (levers9.agent.docker_workers), which this set-up cannot fail without
    # breaking the box's Docker for the whole class.
    one_step_start = True

    @pytest.fixture(autouse=True)
    def _box(self, box: JoinedBox) -> None:
        self.box = box

    def cloud_instances(self) -> dict[str, str | None]:
        """The box's worker containers that have not ended, from its dockerd (not through the agent or plugin)."""
        return {
            c["id"]: c["labels"].get("levers9.machine-id")
            for c in self.box.containers()
            if c["state"] not in ("exited", "dead")
        }

    def fail(self, machine: Machine) -> None:
        """The worker's container is killed on the box: it exited, and will not run again."""
        for container in self.box.containers():
            if container["labels"].get("levers9.machine-id") == machine.machine_id:
                self.box.dockerd.cli("kill", container["id"], check=False)

    # ---------------------------------------------------------------------- the kit's fixtures

    @pytest.fixture
    def levers9_agents(self, box: JoinedBox) -> AgentHub | None:
        return box.hub

    @pytest.fixture
    def levers9_agents_loop(self, box: JoinedBox) -> asyncio.AbstractEventLoop | None:
        return box.hub_loop.loop

    def pool_name(self, role: str) -> str:
        """Every pool the kit makes is the joined pool, but the listing check's "other", which the agent does
        not serve."""
        return super().pool_name(role) if role == "other" else JOINED_POOL

    @pytest.fixture
    def pool_settings(self, dockerd: Dockerd, worker_image: BuildResult) -> dict[str, Any]:
        return {
            "worker_image": worker_image.tag,
            "docker_host": dockerd.host,
            "docker_network_mode": "host",
            "gpu_runtime": "none",
            # the kit's checks run one after another, each terminating what it started; room for a straggler
            "max_workers_per_machine": 4,
        }

    @pytest.fixture
    def failing_pool_settings(self, pool_settings: dict[str, Any]) -> dict[str, Any]:
        return {**pool_settings, "worker_image": "levers9-test/no-such-worker:0"}

    @pytest.fixture
    def capacity_pool_settings(
        self, box: JoinedBox, pool_settings: dict[str, Any], tiny_image: str
    ) -> Iterator[dict[str, Any] | None]:
        """The box already runs one worker of the pool, and the pool allows one per machine."""
        machine_id = f"m-filler-{uuid.uuid4().hex[:8]}"
        ack = box.send("provision", provision_payload(machine_id, tiny_image))
        assert ack.ok, ack
        try:

            def reported() -> bool:
                found = box.inventory()
                details = (found.capacity.get("details") or {}) if found else {}
                return any(
                    c.get("machine_id") == machine_id and c.get("state") == "running"
                    for c in details.get("containers") or []
                )

            box.wait_for(f"the agent reported the box's first worker {machine_id} running", reported)
            yield {**pool_settings, "max_workers_per_machine": 1}
        finally:
            box.send("terminate", {"machine_id": machine_id})

    # ---------------------------------------------------------------------- beyond the kit, and the set-up itself

    def test_a_missing_worker_image_is_named_with_its_build_command(
        self, levers9_hooks: Hooks, failing_pool_settings: dict[str, Any]
    ) -> None:
        """The failing settings fail for the reason they are meant to: the agent's Docker lacks the image."""
        pool = self._pool(levers9_hooks, failing_pool_settings, self.pool_name("fail"))
        with pytest.raises(InvalidRequest) as caught:
            run(levers9_hooks.provision(self.request(levers9_hooks, pool)))
        message = str(caught.value)
        assert failing_pool_settings["worker_image"] in message
        assert f"levers9 worker-image build --tag {failing_pool_settings['worker_image']}" in message

    def test_the_box_is_the_joined_pools_only_agent(self, box: JoinedBox) -> None:
        """What the class relies on: one agent joined for ``box``, connected, of no workspace, reporting Docker."""
        (found,) = [i for i in box.hub.inventories("agent_machine") if i.labels.get("pool") == JOINED_POOL]
        assert found.agent_id == box.agent_id
        assert found.connected
        assert found.workspace is None
        assert isinstance(found.capacity["details"]["docker"]["version"], str)
