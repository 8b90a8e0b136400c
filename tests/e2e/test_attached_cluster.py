"""A workspace's own Kubernetes cluster, attached by an agent that dials out, behind two ``levers9 server`` replicas.

The customer's cluster is :class:`tests.fakes.k8s_cluster.FakeCluster` (the
Kubernetes API at the wire, a scheduler, a kubelet that runs each bound pod's
container as a local process in a network namespace reaching only the
controlplane's gRPC ports; its nodes are the recorded GFD-labelled L4 node,
tainted ``nvidia.com/gpu``, and a CPU node). Nothing gives the controlplane a
kubeconfig: workspace ``team`` runs ``levers9 cluster join``, and the test
starts the agent exactly as the manifest's Deployment does (its command, the
token from its Secret), with the fake cluster's kubeconfig standing in for the
pod's service account. What is checked:

1. the agent joins with the manifest's token, reports the cluster's nodes
   (``levers9 clusters``: connected, 2 nodes, the L4);
2. ``team``'s call with ``gpu=["L4"]`` runs in a Job the agent created on the
   L4 node, in the cluster's pool;
3. another workspace's ``gpu=["L4"]`` call never lands there: it is refused at
   once (no pool of its own has an L4) and no Job is made;
4. the replica holding the agent's stream is SIGKILLed: the agent dials the
   other, and ``team``'s next call runs in a new Job ordered through it;
5. idle workers released and the cluster removed (``levers9 cluster
   remove``: its agent is revoked and exits 3), no Job, pod or Secret of
   levers9's is left in the cluster but the agent's own credential Secret.

No time is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.k8s_cluster import GPU_NODE, FakeCluster, load_recorded_nodes
from tests.fixtures.replicas import Replicas
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(900)

NS = "levers9"

PROGRAM = """
import levers9

@levers9.function(gpu=["L4"], cpu=0.25)
def answer() -> int:
    return 42

print("RESULT", answer.remote(), flush=True)
"""


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster(NS, max_grace_s=3.0) as fake:
        yield load_recorded_nodes(fake)
        assert fake.errors == []


def _as(replicas: Replicas, token: str) -> dict[str, str]:
    return replicas.sdk_env(None, None) | {"LEVERS9_TOKEN": token}


def _cli(replicas: Replicas, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "levers9", *args],
        env=_as(replicas, token),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=replicas.root,
    )


def _clusters(replicas: Replicas, token: str) -> list[dict[str, Any]]:
    listed = _cli(replicas, token, "clusters", "--json")
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def _call(replicas: Replicas, token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(replicas.program(PROGRAM))],
        env=_as(replicas, token),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=replicas.root,
    )


def _user(replicas: Replicas, workspace: str) -> str:
    issued = replicas.levers9("token", "create", "--workspace", workspace)
    assert issued.returncode == 0, issued.stderr
    return issued.stdout.strip()


def _worker_jobs(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [j for j in cluster.objects("jobs", NS) if "levers9/machine-id" in (j["metadata"].get("labels") or {})]


def test_an_attached_cluster_runs_its_workspaces_calls_through_its_agent_across_a_replica_kill(
    replicas: Replicas, cluster: FakeCluster, tmp_path: Path
) -> None:
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    replicas.count = 2
    replicas.min_workers = 0
    replicas.scheduler = "  offers_ttl_s: 1\n"
    replicas.write_config()
    cluster.set_reachable_ports([r.grpc_port for r in replicas.replicas])
    agent: subprocess.Popen[bytes] | None = None
    agent_log = tmp_path / "agent.log"
    try:
        replicas.start(0)
        replicas.start(1)
        replicas.token = _user(replicas, "team")
        team = replicas.token
        other = _user(replicas, "other")

        # the customer attaches the cluster; the manifest is what they would apply
        manifest = tmp_path / "lab.yaml"
        joined = _cli(
            replicas,
            team,
            "cluster",
            "join",
            "lab",
            "--gpu",
            "L4",
            "--runtime",
            "process",
            "--image",
            "registry.example.com/levers9:test",
            "--worker-image",
            "registry.example.com/levers9/worker:test",
            "--cpu",
            "1",
            "--memory",
            "2048",
            "--max-workers",
            "1",
            "--idle-timeout",
            "2",
            "--output",
            str(manifest),
        )
        assert joined.returncode == 0, f"{joined.stderr}\n{replicas.logs()}"
        assert joined.stdout.strip().endswith(f"kubectl apply -f {manifest}")
        objects = {o["kind"]: o for o in yaml.safe_load_all(manifest.read_text())}
        token = objects["Secret"]["stringData"]["LEVERS9_JOIN_TOKEN"]
        [container] = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
        assert container["command"][:4] == ["levers9", "agent", "join", "--kubernetes"]
        [lab] = _clusters(replicas, team)
        pool = lab["pool"]
        assert (lab["name"], lab["connected"], pool.startswith("lab.")) == ("lab", False, True)

        # 1. the agent, as the Deployment starts it (the kubeconfig stands in for the pod's service account)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
        env.update(LEVERS9_JOIN_TOKEN=token, HOME=str(tmp_path), PYTHONUNBUFFERED="1")
        with agent_log.open("wb") as log:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "levers9",
                    *container["command"][1:],
                    "--kubeconfig",
                    str(kubeconfig),
                    "--log-level",
                    "info",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                start_new_session=True,
            )

        def report() -> str:
            return f"agent:\n{agent_log.read_text()[-4000:]}\n{replicas.logs()}"

        wait_for(lambda: (_clusters(replicas, team) or [{}])[0].get("nodes") == 2, "the agent's inventory", 90, report)
        [lab] = _clusters(replicas, team)
        assert lab["connected"] is True
        assert lab["gpus"] == [{"gpu": "L4", "count": 1, "free": 1}]
        assert _clusters(replicas, other) == []  # another workspace does not see it

        # 2. team's call runs in a Job the agent created, on the L4 node
        run = _call(replicas, team)
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{report()}"
        assert "RESULT 42" in run.stdout
        [job] = cluster.created("jobs")
        assert (job["metadata"]["namespace"], job["metadata"]["labels"]["levers9/pool"]) == (NS, pool)
        [pod] = [p for p in cluster.pods(NS) if p["metadata"]["labels"].get("levers9/pool") == pool]
        assert pod["spec"]["nodeName"] == GPU_NODE
        # nothing reaches into the customer's cluster: the worker serves through its tunnel
        assert any("declares its machine unreachable; it serves through a tunnel" in r.log() for r in replicas.replicas)

        # 3. another workspace's L4 call: refused at once, naming no pool of team's; no Job made for it
        refused = _call(replicas, other)
        assert refused.returncode != 0, refused.stdout
        assert pool not in refused.stderr + refused.stdout
        assert "L4" in refused.stderr
        assert len(cluster.created("jobs")) == 1

        wait_for(lambda: not _worker_jobs(cluster), "the idle worker's Job to be deleted", 120, report)
        connects = agent_log.read_text().count("connected to")

        # 4. the replica holding the agent's stream dies: the agent dials the other one, which orders the next Job
        replicas.kill(0)
        wait_for(lambda: agent_log.read_text().count("connected to") > connects, "the agent to dial again", 120, report)
        replicas.token = team
        run = _call(replicas, team)
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{report()}"
        assert "RESULT 42" in run.stdout
        assert len(cluster.created("jobs")) == 2

        # 5. nothing left: the idle worker's Job and Secret deleted on the surviving replica's order
        wait_for(lambda: not _worker_jobs(cluster), "the second idle worker's Job to be deleted", 120, report)
        removed = _cli(replicas, team, "cluster", "remove", "lab", "--yes")
        assert removed.returncode == 0, f"{removed.stderr}\n{report()}"
        assert agent.wait(60) == 3, report()  # revoked: it says so and exits 3
        assert "attached cluster lab was removed" in agent_log.read_text()
        assert _clusters(replicas, team) == []
        # only the agent's own credential stays (the customer's `kubectl delete -f` of the manifest removes it)
        kept = [f"Secret {NS}/levers9-agent-credential"]
        wait_for(
            lambda: cluster.leftovers() == kept,
            "no worker Job, pod or Secret left",
            120,
            lambda: f"{cluster.leftovers()}\n{report()}",
        )
        assert cluster.running_processes() == []
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(10)
