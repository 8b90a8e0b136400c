"""The levers9 provider contract, run against the installed ``attached_cluster`` plugin and a fake attached cluster.

The kit's ``levers9_agents`` is the test hub of
:mod:`tests.plugins.attached_cluster.cluster_hub`, on its own loop
(``levers9_agents_loop``), with one agent of cluster ``lab`` joined for the
operator (no workspace, as the kit's pools have none): the agent's real
Kubernetes backend on the fake cluster. So every hook call the kit makes
through the plugin manager reads that agent's inventory and sends it orders.

* working settings: cluster ``lab``, the agent's namespace, the GPU taint
  tolerated; the pool asks for one L4, which the GPU node has. Every pool the
  kit makes is served by the same agent (it serves a cluster, not a pool
  name); the listing check's "other" pool still lists none of the main pool's
  machines (the Jobs carry their pool's label);
* "the bootstrap boots": the agent's Job runs the worker itself (the fake
  kubelet runs the pod as a local process reaching only the stand-in
  controlplane), so ``boots_itself``;
* failing settings: a privileged worker, which this agent does not allow: the
  agent refuses the order (``invalid_request``), a typed error;
* no capacity: a node selector no reported node matches, refused by the
  provider before any order;
* the cluster's side (its Jobs, a refused Secret, a killed pod):
  :mod:`tests.plugins.kube_contract`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from levers9.hooks.context import AgentHub
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest
from levers9.hooks.facade import Hooks
from levers9.testing import Registrar
from levers9.testing.contract_boot import run
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.agent_hub import HubLoop
from tests.fixtures.wait import wait_for
from tests.plugins.attached_cluster.cluster_hub import ClusterAgent, ClusterHub
from tests.plugins.attached_cluster.conftest import cluster_settings
from tests.plugins.kube_contract import OnFakeCluster


class TestAttachedClusterContract(OnFakeCluster):
    provider = "attached_cluster"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "L4", "gpu_count": 1}
    boots_itself = True
    settle_timeout = 30.0

    @pytest.fixture(autouse=True)
    def _agent(self, cluster: FakeCluster, join: Callable[..., ClusterAgent]) -> Iterator[None]:
        self.cluster = cluster
        self.agent = join(workspace=None)
        yield
        # background deletion goes on after the agent answered: the pods stop within their grace period
        wait_for(
            lambda: cluster.leftovers() == [], "the kit's machines to be gone", 15, lambda: str(cluster.leftovers())
        )

    @pytest.fixture
    def levers9_agents(self, hub: ClusterHub) -> AgentHub | None:
        return hub

    @pytest.fixture
    def levers9_agents_loop(self, hub_loop: HubLoop) -> asyncio.AbstractEventLoop | None:
        return hub_loop.loop

    @pytest.fixture
    def pool_settings(self) -> dict[str, Any]:
        return cluster_settings()

    @pytest.fixture
    def failing_pool_settings(self) -> dict[str, Any]:
        return cluster_settings(privileged=True)

    @pytest.fixture
    def capacity_pool_settings(self) -> dict[str, Any]:
        return cluster_settings(node_selector={"levers9.test/pool": "none-has-it"})

    @pytest.fixture
    def standin_controlplane(self) -> Iterator[Registrar]:
        """The kit's stand-in, reachable from the cluster's pods."""
        with Registrar() as registrar:
            self.cluster.set_reachable_ports([registrar.port])
            yield registrar

    def test_the_failing_settings_fail_at_the_agent_and_no_capacity_before_any_order(
        self, levers9_hooks: Hooks, failing_pool_settings: dict[str, Any], capacity_pool_settings: dict[str, Any]
    ) -> None:
        """The set-up itself: the failing settings reach the agent, which refuses them; the full pool does not."""
        pool = self._pool(levers9_hooks, failing_pool_settings, self.pool_name("fail"))
        with pytest.raises(InvalidRequest, match="privileged"):
            run(levers9_hooks.provision(self.request(levers9_hooks, pool)))
        assert self.agent.kinds() == ["provision"]
        full = self._pool(levers9_hooks, capacity_pool_settings, self.pool_name("full"))
        with pytest.raises(InsufficientCapacity, match="does not match the pool's node_selector"):
            run(levers9_hooks.provision(self.request(levers9_hooks, full)))
        assert self.agent.kinds() == ["provision"]
        assert self.cluster.created("jobs") == []
