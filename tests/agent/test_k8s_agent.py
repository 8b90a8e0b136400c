"""The agent in Kubernetes mode: joined over the real Agent gRPC service, its workers Jobs in a fake cluster.

The controlplane side is :mod:`tests.agent.agent_wire` (the real Agent service,
its hub, SQLite and Redis; plain text, so the agents run ``--insecure``); the
cluster is :class:`tests.fakes.k8s_cluster.FakeCluster` with the recorded nodes
of ``tests/data/k8s`` (an EKS g6.xlarge with one L4 labelled by GPU Feature
Discovery, and an m6i.xlarge), reached by the real ``kubernetes`` client
through a kubeconfig. Join tokens are issued for ``attached_cluster`` with the
labels ``levers9 cluster join`` gives them. Orders carry the Job and Secret
``levers9.kube.jobs`` makes (:func:`tests.agent.test_k8s_workers.make_order`:
the worker's command replaced by ``sleep``).

What is checked: ``levers9 agent join --kubernetes`` (a real process) keeps
its credential in the Secret ``levers9-agent-credential`` and a second start,
by ``join`` with the spent token or by ``run``, runs with it and spends
nothing; a malformed Secret is refused by name and left as it was; each
option of the wrong mode, and a missing namespace outside a pod, is refused
by name. In the test's process (:func:`levers9.agent.daemon.run_agent` with
:class:`~levers9.agent.daemon.KubernetesMode`): the inventory reports the
nodes' GPUs by canonical type and is sent at once after each order (the poll
set to 10 minutes); provision creates the Job and Secret, terminate deletes
them; an order for a full cluster is refused ``insufficient_capacity``; an
unreachable API server means no inventory, logged once; a removed agent
deletes its Jobs and exits 3. Every test ends with no Job, pod or Secret in the
cluster (the credential Secret is deleted by the test, as an operator
uninstalling the agent would) and no agent process left.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from levers9.agent.backends import k8s_change_key
from levers9.agent.connection import join
from levers9.agent.credentials import AgentCredential
from levers9.agent.daemon import EXIT_REFUSED, EXIT_SHARED_NAMESPACE, K8S_POLL_S, Agent, KubernetesMode, run_agent
from levers9.agent.k8s_api import kubeconfig_client
from levers9.agent.k8s_credential import SECRET_KEY, SECRET_NAME
from levers9.agent.k8s_objects import MACHINE_LABEL
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import InsufficientCapacity
from levers9.hooks.types import Pool
from levers9.kube.jobs import job_name, secret_name
from levers9.proto.v1 import agent_pb2
from levers9.services import agent_join
from levers9.services.agent_messages import publish_disconnect
from levers9.services.auth import Principal
from levers9.state.sql.records import TokenKind
from levers9_local_k8s.provider import K8sProvider
from levers9_local_k8s.settings import LocalK8sSettings
from tests.agent.agent_wire import AgentServer, eventually, opened_server
from tests.agent.test_k8s_workers import make_order
from tests.fakes.k8s_cluster import CPU_NODE, GPU_NODE, FakeCluster, recorded_cluster
from tests.fixtures.ports import free_port
from tests.plugins.provision import provision_request

NAMESPACE = "levers9"
CLUSTER = "gpus"
POOL = "gpus.0a1b2c3d"
LABELS = {"cluster": CLUSTER, "pool": POOL, "name": CLUSTER}
CREDENTIAL = f"Secret {NAMESPACE}/{SECRET_NAME}"


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """The two recorded nodes; afterwards no Job, pod or Secret may be left (background deletion waited for)."""
    with recorded_cluster(NAMESPACE) as fake:
        yield fake


@pytest.fixture
def kubeconfig(cluster: FakeCluster, tmp_path: Path) -> Path:
    return cluster.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[Any]:
    """The real client's CoreV1Api on the cluster, as its owner would use it."""
    api_client = kubeconfig_client(str(kubeconfig))
    yield kubernetes.client.CoreV1Api(api_client)
    api_client.close()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[AgentServer]:
    async with opened_server(tmp_path, tls=False) as opened:
        yield opened


async def cluster_join_token(server: AgentServer) -> str:
    """A join token as `levers9 cluster join` issues it: provider attached_cluster, the cluster's labels."""
    record, _ = await server.services.tokens.issue("user", subject="root")
    operator = Principal(record.id, TokenKind.USER, None, "root")
    issued = await agent_join.issue_join_token(server.services, operator, "attached_cluster", LABELS)
    return issued.token


async def joined(server: AgentServer) -> AgentCredential:
    credential = await join(
        server.url, await cluster_join_token(server), ca_pem=None, insecure=True, stop=asyncio.Event()
    )
    assert credential is not None
    return credential


async def connected(server: AgentServer, agent_id: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        inventory = server.inventory(agent_id)
        if inventory is None or not inventory.connected or "details" not in inventory.capacity:
            return None
        return inventory.capacity

    capacity: dict[str, Any] = await eventually(ready, f"agent {agent_id} connected with an inventory")
    return capacity


def stored_credential(cluster: FakeCluster) -> dict[str, Any] | None:
    """The credential Secret as the API stores it; None when there is none."""
    return next((s for s in cluster.objects("secrets", NAMESPACE) if s["metadata"]["name"] == SECRET_NAME), None)


def worker_objects(cluster: FakeCluster) -> list[str]:
    return sorted(
        f"{kind} {o['metadata']['name']}"
        for kind in ("jobs", "secrets")
        for o in cluster.objects(kind, NAMESPACE)
        if MACHINE_LABEL in (o["metadata"].get("labels") or {})
    )


@contextlib.asynccontextmanager
async def running_agent(
    credential: AgentCredential, kubeconfig: Path, *, poll_s: float | None = 0.2, share_namespace: bool = False
) -> AsyncIterator[tuple[asyncio.Task[int], list[Agent]]]:
    """``run_agent`` in Kubernetes mode on the fake's kubeconfig; stopped at the end (0) unless it ended itself."""
    stop = asyncio.Event()
    made: list[Agent] = []

    async def ready(agent: Agent) -> None:
        made.append(agent)

    mode = KubernetesMode(
        NAMESPACE, api_client_factory=partial(kubeconfig_client, str(kubeconfig)), share_namespace=share_namespace
    )
    task = asyncio.create_task(run_agent(credential, stop, kubernetes=mode, poll_s=poll_s, on_ready=ready))
    try:
        yield task, made
    finally:
        stop.set()
        code = await asyncio.wait_for(task, 30)
        assert code in (0, EXIT_REFUSED)


# ---------------------------------------------------------------------------------------------- agent processes


class Agents:
    """``python -m levers9 agent ...`` processes; each one's output in a file; all killed and reaped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[tuple[asyncio.subprocess.Process, Path]] = []

    async def start(self, *args: str, token: str | None = None) -> asyncio.subprocess.Process:
        env = {k: v for k, v in os.environ.items() if k not in ("LEVERS9_JOIN_TOKEN", "KUBECONFIG", "DOCKER_HOST")}
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
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
            )
        self.started.append((process, log))
        return process

    def log(self, process: asyncio.subprocess.Process) -> str:
        return next(path.read_text(errors="replace") for p, path in self.started if p is process)

    def all_logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for _, path in self.started)

    async def exit_code(self, process: asyncio.subprocess.Process, timeout: float = 30) -> int:
        try:
            return await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            pytest.fail(f"the agent did not exit within {timeout:.0f} s:\n{self.log(process)[-3000:]}")

    async def stopped(self, process: asyncio.subprocess.Process) -> int:
        process.send_signal(signal.SIGTERM)
        return await self.exit_code(process)

    async def close(self) -> None:
        for process, _ in self.started:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[Agents]:
    started = Agents(tmp_path)
    try:
        yield started
    finally:
        await started.close()


async def test_join_keeps_the_credential_in_a_secret_and_a_restarted_agent_spends_no_token(
    server: AgentServer, agents: Agents, cluster: FakeCluster, kubeconfig: Path, kube: Any
) -> None:
    token = await cluster_join_token(server)
    options = ("--kubernetes", "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig), "--poll-s", "0.3")
    first = await agents.start("join", "--controlplane", server.url, "--insecure", *options, token=token)
    secret = await eventually(lambda: stored_credential(cluster), f"{CREDENTIAL} created")
    saved = json.loads(base64.b64decode(secret["data"][SECRET_KEY]))
    agent_id = saved["agent_id"]
    assert agent_id.startswith("agt_")
    assert saved["token"].startswith("l9_agent_")
    assert (saved["provider"], saved["labels"], saved["controlplane"], saved["insecure"]) == (
        "attached_cluster",
        LABELS,
        server.url,
        True,
    )
    assert secret["immutable"] is True
    assert MACHINE_LABEL not in secret["metadata"]["labels"]  # never taken for a worker's Secret
    capacity = await connected(server, agent_id)
    assert capacity["gpus"] == {"L4": 1}
    assert [n["metadata"]["name"] for n in capacity["details"]["nodes"]] == sorted([CPU_NODE, GPU_NODE])
    assert await agents.stopped(first) == 0

    # the pod restarts with the same (spent) token in its environment: it runs with the Secret
    hellos = server.said.hellos(agent_id)
    again = await agents.start("join", "--controlplane", server.url, "--insecure", *options, token=token)
    await eventually(lambda: server.said.hellos(agent_id) > hellos, "the restarted agent's Hello")
    await connected(server, agent_id)
    assert await agents.stopped(again) == 0
    assert "the join token is not spent" in agents.log(again)
    assert "refused" not in agents.log(again)
    # and `run` needs no token at all
    hellos = server.said.hellos(agent_id)
    plain = await agents.start("run", *options)
    await eventually(lambda: server.said.hellos(agent_id) > hellos, "the Hello of `agent run --kubernetes`")
    assert await agents.stopped(plain) == 0

    assert stored_credential(cluster) == secret  # never rewritten
    logs = agents.all_logs()
    assert token not in logs
    assert saved["token"] not in logs
    assert secret["data"][SECRET_KEY] not in logs
    kube.delete_namespaced_secret(SECRET_NAME, NAMESPACE)


async def test_a_malformed_secret_is_refused_by_name_and_left_as_it_was(
    agents: Agents, cluster: FakeCluster, kubeconfig: Path, kube: Any
) -> None:
    options = ("--kubernetes", "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig))
    nowhere = f"grpc://127.0.0.1:{free_port()}"  # an agent that tried to join would dial it for ever

    missing = await agents.start("run", *options)
    assert await agents.exit_code(missing) == 2
    assert f"{CREDENTIAL} does not exist: this agent has not joined" in agents.log(missing)

    for data, said in (
        ({SECRET_KEY: base64.b64encode(b"{not json").decode()}, "is not JSON"),
        ({"other": base64.b64encode(b"{}").decode()}, f"has no data key '{SECRET_KEY}' (it has other)"),
        ({SECRET_KEY: base64.b64encode(b'{"agent_id": "agt_1"}').decode()}, "lacks token, controlplane, provider"),
    ):
        kube.create_namespaced_secret(NAMESPACE, {"metadata": {"name": SECRET_NAME}, "data": data})
        before = stored_credential(cluster)
        for args in (("run", *options), ("join", "--controlplane", nowhere, "--insecure", *options)):
            process = await agents.start(*args, token="l9_join_never_spent")
            assert await agents.exit_code(process) == 2
            words = agents.log(process)
            assert CREDENTIAL in words, words
            assert said in words, words
            assert f"kubectl -n {NAMESPACE} delete secret {SECRET_NAME}" in words
            assert stored_credential(cluster) == before
        kube.delete_namespaced_secret(SECRET_NAME, NAMESPACE)


async def test_options_of_the_other_mode_and_a_missing_namespace_are_refused_by_name(
    agents: Agents, kubeconfig: Path
) -> None:
    cases = [
        (
            ("run", "--kubernetes", "--kubeconfig", str(kubeconfig)),
            "--namespace is needed: this process does not run in a pod",
        ),
        (("run", "--namespace", NAMESPACE), "Kubernetes mode's options (--namespace) need --kubernetes"),
        (("run", "--share-namespace"), "Kubernetes mode's options (--share-namespace) need --kubernetes"),
        (
            ("run", "--allow-privileged", "--context", "fake"),
            "Kubernetes mode's options (--context, --allow-privileged) need",
        ),
        (
            ("run", "--kubernetes", "--namespace", NAMESPACE, "--state-dir", "/tmp/x"),
            "a machine's agent's options (--state-dir) do not apply in Kubernetes mode",
        ),
        (("run", "--kubernetes", "--namespace", "Not_A_Namespace"), "is not a namespace name"),
        (("run", "--kubernetes", "--namespace", NAMESPACE, "--context", "fake"), "give --kubeconfig FILE"),
        (
            ("run", "--kubernetes", "--namespace", NAMESPACE, "--kubeconfig", "/nonexistent/kubeconfig"),
            "--kubeconfig /nonexistent/kubeconfig: no such file",
        ),
        (("run", "--poll-s", "0"), "--poll-s must be a number of seconds above 0"),
        (("run", "--poll-s", "inf"), "--poll-s must be a number of seconds above 0"),
    ]
    for args, said in cases:
        process = await agents.start(*args)
        assert await agents.exit_code(process) == 2, args
        assert said in agents.log(process), (args, agents.log(process))


# ---------------------------------------------------------------------------------------------- orders and inventory


async def test_orders_create_and_delete_jobs_and_each_is_reported_at_once(
    server: AgentServer, cluster: FakeCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # what a --log-level debug agent would write: never a secret
    credential = await joined(server)
    agent_id = credential.agent_id
    order = make_order()
    machine_id = order["machine_id"]
    worker_token = next(iter(order["secret"]["stringData"].values()))
    # a poll of ten minutes: every inventory the test sees after Welcome was sent because of an order
    async with running_agent(credential, kubeconfig, poll_s=600) as (_, made):
        capacity = await connected(server, agent_id)
        assert made[0].poll_s == 600
        assert (capacity["gpus"], capacity["free"]["gpus"]) == ({"L4": 1}, {"L4": 1})
        assert capacity["details"]["namespace"] == NAMESPACE
        assert capacity["details"]["workers"] == []
        first = len(server.said.inventories(agent_id))

        ack = await server.send(agent_id, "provision", order)
        [job] = cluster.objects("jobs", NAMESPACE)
        assert ack.result == {
            "machine_id": machine_id,
            "job": job_name(machine_id),
            "namespace": NAMESPACE,
            "uid": job["metadata"]["uid"],
        }
        assert worker_objects(cluster) == [f"jobs {job_name(machine_id)}", f"secrets {secret_name(machine_id)}"]

        def reported(machine_ids: list[str]) -> bool:
            inventory = server.inventory(agent_id)
            workers = inventory.capacity["details"]["workers"] if inventory is not None else None
            return workers is not None and [w["machine_id"] for w in workers] == machine_ids

        await eventually(lambda: reported([machine_id]), "the inventory sent after the provision order")
        assert len(server.said.inventories(agent_id)) > first

        # the GPU node's only L4 is the worker's: a second GPU worker has no room
        await eventually(
            lambda: any(p.get("status", {}).get("phase") == "Running" for p in cluster.pods(NAMESPACE)),
            "the worker's pod running",
        )
        with pytest.raises(InsufficientCapacity, match="no node has room for the worker's pod"):
            await server.send(agent_id, "provision", make_order())
        assert len(cluster.objects("jobs", NAMESPACE)) == 1

        listed = await server.send(agent_id, "list", {})
        assert [(w["machine_id"], w["job"]) for w in listed.result["workers"]] == [(machine_id, job_name(machine_id))]

        done = await server.send(agent_id, "terminate", {"machine_id": machine_id})
        # the Secret is the Job's: the garbage collector may delete it before the agent's own delete (a 404: fine)
        assert done.result["deleted"][0] == f"Job {NAMESPACE}/{job_name(machine_id)}"
        assert done.result["deleted"][1:] in ([], [f"Secret {NAMESPACE}/{secret_name(machine_id)}"])
        assert worker_objects(cluster) == []
        await eventually(lambda: reported([]), "the inventory sent after the terminate order")
    assert worker_token not in caplog.text
    assert credential.token not in caplog.text


async def test_the_default_poll_is_ten_seconds_and_the_gpus_are_typed_from_the_node_labels(
    server: AgentServer, cluster: FakeCluster, kubeconfig: Path
) -> None:
    credential = await joined(server)
    async with running_agent(credential, kubeconfig, poll_s=None) as (_, made):
        capacity = await connected(server, credential.agent_id)
        assert made[0].poll_s == K8S_POLL_S == 10.0
        assert capacity["gpus"] == {"L4": 1}  # GFD's nvidia.com/gpu.product=NVIDIA-L4
        assert capacity["cpu_millicores"] == 7840  # the two nodes' allocatable
        inventory = server.inventory(credential.agent_id)
        assert inventory is not None
        assert inventory.machines == []


async def test_an_unreachable_api_server_sends_no_inventory_and_is_logged_once(
    server: AgentServer, cluster: FakeCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    credential = await joined(server)
    agent_id = credential.agent_id
    caplog.set_level(logging.INFO, logger="levers9.agent.daemon")
    async with running_agent(credential, kubeconfig) as _:
        await connected(server, agent_id)
        cluster.fail("GET", r"^/api/v1/nodes$", 503, "ServiceUnavailable", "the API server is down", times=None)

        def refused_nodes() -> int:
            return sum(1 for method, path, status in cluster.calls if path == "/api/v1/nodes" and status == 503)

        await eventually(lambda: refused_nodes() >= 1, "a look at the nodes refused")
        sent = len(server.said.inventories(agent_id))
        await eventually(lambda: refused_nodes() >= 4, "three more looks refused")
        assert len(server.said.inventories(agent_id)) == sent
        unsent = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no inventory sent")]
        assert len(unsent) == 1, unsent
        assert "the API server is down" in unsent[0]

        cluster.clear_faults()
        await eventually(
            lambda: any(
                "the Kubernetes API (namespace levers9) answers again" in r.getMessage() for r in caplog.records
            ),
            "the agent seeing the API answer again",
        )
        inventory = server.inventory(agent_id)
        assert inventory is not None
        assert inventory.capacity["gpus"] == {"L4": 1}


async def test_a_removed_agent_deletes_its_jobs_and_stops(
    server: AgentServer, cluster: FakeCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    credential = await joined(server)
    agent_id = credential.agent_id
    orders = [make_order(gpu=False), make_order()]
    async with running_agent(credential, kubeconfig) as (task, _):
        await connected(server, agent_id)
        for order in orders:
            await server.send(agent_id, "provision", order)
        assert len(worker_objects(cluster)) == 4
        # what `levers9 cluster remove` does to the agent: marked removed, revoked, its stream cut (marked first:
        # a stream refused in between is told the agent was removed, not only that its token is revoked)
        services = server.services
        await services.agents.removed(agent_id)
        await services.tokens.revoke_subject(agent_id)
        await publish_disconnect(services.redis, services.agents.prefix, agent_id, "this machine was removed (test)")
        try:
            code = await asyncio.wait_for(asyncio.shield(task), 60)
        except TimeoutError:
            pytest.fail(f"the removed agent did not stop within 60 s:\n{caplog.text[-4000:]}")
        assert code == EXIT_REFUSED
    assert worker_objects(cluster) == [], caplog.text[-4000:]
    words = caplog.text
    assert "this machine was removed" in words
    assert f"this agent was removed: deleted its worker Jobs and Secrets in namespace {NAMESPACE}" in words
    assert "delete Secret levers9/levers9-agent-credential and join again with a new token" in words


async def test_cluster_remove_leaves_a_local_k8s_pools_job_in_the_same_namespace(
    server: AgentServer, cluster: FakeCluster, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A local_k8s pool and an attached cluster's agent in one namespace (both default to levers9): the agent
    refuses to share it unless told, and once told, its removal deletes its own Job and leaves the local_k8s
    pool's running worker alone (before: remove_mine deleted every Job labelled levers9/machine-id)."""
    local = K8sProvider()
    settings = LocalK8sSettings.model_validate(
        {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE, "worker_image": "registry.example.com/w:1"}
    )
    pool = Pool(name="cpu-local", provider="local_k8s", runtime="process", settings=settings)
    try:
        theirs = local.levers9_provision(provision_request(pool, None))
        credential = await joined(server)
        agent_id = credential.agent_id
        mode = KubernetesMode(NAMESPACE, api_client_factory=partial(kubeconfig_client, str(kubeconfig)))
        assert await run_agent(credential, asyncio.Event(), kubernetes=mode) == EXIT_SHARED_NAMESPACE
        assert (
            f"namespace {NAMESPACE} is used by another levers9 pool already (Job {theirs.provider_id} of levers9 "
            f"pool 'cpu-local'), and this agent's workers belong to pool '{POOL}'" in caplog.text
        )
        assert "start the agent with --share-namespace" in caplog.text

        order = make_order(gpu=False)
        async with running_agent(credential, kubeconfig, share_namespace=True) as (task, _):
            capacity = await connected(server, agent_id)
            assert capacity["details"]["workers"] == []  # the local_k8s pool's Job is not reported as its own
            await server.send(agent_id, "provision", order)
            services = server.services
            await services.agents.removed(agent_id)
            await services.tokens.revoke_subject(agent_id)
            await publish_disconnect(services.redis, services.agents.prefix, agent_id, "this machine was removed (t)")
            assert await asyncio.wait_for(asyncio.shield(task), 60) == EXIT_REFUSED
        assert f"deleted its worker Jobs and Secrets in namespace {NAMESPACE}" in caplog.text
        jobs = [j["metadata"]["name"] for j in cluster.objects("jobs", NAMESPACE)]
        assert jobs == [theirs.provider_id]
        assert [m.machine_id for m in local.levers9_list_machines(pool)] == [theirs.machine_id]
        local.levers9_terminate(pool, theirs)
        await eventually(lambda: worker_objects(cluster) == [], "the local_k8s pool's Job gone by its own hand")
    finally:
        local.levers9_shutdown(PluginContext.bare("local_k8s"))


# ---------------------------------------------------------------------------------------------- the change key


def _inventory(workers: list[dict[str, Any]], requested: dict[str, Any] | None = None) -> agent_pb2.Inventory:
    details = {"namespace": NAMESPACE, "nodes": [], "requested": requested or {}, "workers": workers}
    return agent_pb2.Inventory(cpu_millicores=1000, details_json=json.dumps(details))


def test_the_change_key_ignores_the_kubelets_back_off_words_and_nothing_else() -> None:
    pulling = {"machine_id": "m1", "phase": "Pending", "container": "ErrImagePull: rpc error: pull access denied"}
    backing_off = dict(pulling, container='ImagePullBackOff: Back-off pulling image "registry.example.com/x"')
    assert k8s_change_key(_inventory([pulling])) == k8s_change_key(_inventory([backing_off]))
    # why the worker cannot start alternates the same way (it carries the kubelet's words too)
    blocked = dict(pulling, cannot_start=pulling["container"])
    assert k8s_change_key(_inventory([blocked])) == k8s_change_key(
        _inventory([dict(backing_off, cannot_start=backing_off["container"])])
    )
    assert k8s_change_key(_inventory([blocked])) != k8s_change_key(_inventory([pulling]))
    keys = {
        k8s_change_key(_inventory([pulling])),
        k8s_change_key(_inventory([dict(pulling, container="CreateContainerConfigError: secret not found")])),
        k8s_change_key(_inventory([dict(pulling, phase="Running", container=None)])),
        k8s_change_key(_inventory([pulling], {"node-a": {"cpu": "250m", "pods": "1"}})),
        k8s_change_key(_inventory([])),
    }
    assert len(keys) == 5
