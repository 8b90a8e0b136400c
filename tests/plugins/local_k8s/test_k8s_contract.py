"""The levers9 provider contract, run against the installed ``local_k8s`` plugin and the fake cluster.

* working settings: the fake's kubeconfig, the GPU taint tolerated; the pool
  asks for one L4, which the GPU node has;
* "the bootstrap boots": the provider runs the worker itself (a Job whose pod
  the fake kubelet runs as a local process, in a network namespace reaching
  only the stand-in controlplane), so ``boots_itself``;
* failing settings: a namespace that does not exist (the API's 404 on create,
  :class:`InvalidRequest`);
* no capacity: a node selector no node matches, refused before any Job exists;
* the cluster's side (its Jobs, a refused Secret, a killed pod):
  :mod:`tests.plugins.kube_contract`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from levers9.testing import Registrar
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.wait import wait_for
from tests.plugins.kube_contract import OnFakeCluster


class TestLocalK8sContract(OnFakeCluster):
    provider = "local_k8s"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "L4", "gpu_count": 1}
    boots_itself = True
    settle_timeout = 30.0

    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: FakeCluster) -> Iterator[None]:
        self.cluster = cluster
        yield
        # background deletion goes on after the API answered: the pods stop within their grace period
        wait_for(
            lambda: cluster.leftovers() == [], "the kit's machines to be gone", 15, lambda: str(cluster.leftovers())
        )

    @pytest.fixture
    def pool_settings(self, k8s_settings: dict[str, Any]) -> dict[str, Any]:
        return k8s_settings

    @pytest.fixture
    def failing_pool_settings(self, k8s_settings: dict[str, Any]) -> dict[str, Any]:
        return {**k8s_settings, "namespace": "no-such-namespace"}

    @pytest.fixture
    def capacity_pool_settings(self, k8s_settings: dict[str, Any]) -> dict[str, Any]:
        return {**k8s_settings, "node_selector": {"levers9.test/pool": "none-has-it"}}

    @pytest.fixture
    def standin_controlplane(self) -> Iterator[Registrar]:
        """The kit's stand-in, reachable from the cluster's pods."""
        with Registrar() as registrar:
            self.cluster.set_reachable_ports([registrar.port])
            yield registrar
