"""The contract kit's view of a fake Kubernetes cluster from its own side, for the two Kubernetes providers.

``local_k8s`` and ``attached_cluster`` (through its agent) both start a
machine as a Job (``backoffLimit: 0``) and then the Secret holding its join
token, owned by the Job. So, for :class:`levers9.testing.ProviderContract`:
the cluster's instances are its Jobs not being deleted, tagged with their
machine-id label; the step after the create that can fail is the Secret's
(the fake API server refuses it); a machine breaks when the node kills its
pod's container (the Job fails); and nothing takes a Job's pod back as a spot
machine is taken back, nor has a zone (the offers are the GPU nodes, by type).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import ClassVar

from levers9.hooks.types import Machine
from levers9.kube.jobs import MACHINE_LABEL
from levers9.testing import ProviderContract
from tests.fakes.k8s_cluster import FakeCluster
from tests.fixtures.wait import wait_for


class OnFakeCluster(ProviderContract):
    """Mixed into a contract class whose autouse fixture sets ``self.cluster``."""

    cluster: FakeCluster
    preemptible: ClassVar[bool] = False
    zonal: ClassVar[bool] = False

    def cloud_instances(self) -> dict[str, str | None]:
        """The cluster's Jobs not being deleted, read from the fake API server, with their machine-id label."""
        return {
            job["metadata"]["name"]: (job["metadata"].get("labels") or {}).get(MACHINE_LABEL)
            for job in self.cluster.objects("jobs")
            if not job["metadata"].get("deletionTimestamp")
        }

    @contextlib.contextmanager
    def fail_after_create(self) -> Iterator[None]:
        """The API server refuses the token's Secret, created after the Job."""
        self.cluster.fail("POST", r"/secrets$", 500, "InternalError", "etcd is down (injected)", times=None)
        try:
            yield
        finally:
            self.cluster.clear_faults()

    def fail(self, machine: Machine) -> None:
        """The node kills the worker's container (the only pod the test runs), so the Job fails."""
        wait_for(lambda: bool(self.cluster.running_processes()), f"the pod of {machine.provider_id} to run", 60)
        for pid in self.cluster.running_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
