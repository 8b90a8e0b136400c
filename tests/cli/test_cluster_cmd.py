"""`levers9 cluster join` and `levers9 clusters` against a real controlplane's gRPC services; the agent's manifest.

The controlplane is the one of ``tests.cli.test_machine_cmd`` (real services,
agent hub and plugins on a loop thread); the CLI runs as a subprocess, with a
context holding a workspace user's token. The manifest is checked against the
Kubernetes schemas (strict: an unknown field fails) and its RBAC against the
agent's one list of API calls.
"""

from __future__ import annotations

import ast
import base64
import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from levers9.agent import k8s_credential
from levers9.kubernetes_manifests.agent import (
    AGENT,
    CREDENTIAL_SECRET,
    JOIN_SECRET,
    JOIN_TOKEN_KEY,
    AgentManifest,
    apply_lines,
    delete_lines,
    render_agent,
)
from levers9.kubernetes_manifests.permissions import AGENT_CALLS, cluster_rules, namespaced_rules
from levers9.sdk.context import Context, save_context
from levers9.services import agent_join
from levers9.services.agent_pools import clusters
from levers9.services.agents import InventoryReport
from tests.cli import test_machine_cmd
from tests.cli.test_machine_cmd import Plane
from tests.conftest import Result
from tests.services.test_agent_hub import Agent

Cli = Callable[..., Result]
IMAGE = "registry.example.com/levers9:1.0"
WORKER_IMAGE = "registry.example.com/levers9/worker:1.0"
REPO = Path(__file__).resolve().parents[2]
#: the controlplane of `levers9 machine`'s tests
plane = test_machine_cmd.plane


def as_team(plane: Plane) -> str:
    """Switch the CLI's context to a user of workspace ``team``; the workspace's id."""

    async def issue() -> tuple[str, str]:
        workspace = await plane.services.workspaces.get_or_create("team")
        _, token = await plane.services.tokens.issue("user", workspace_id=workspace.id, subject="someone@team")
        return workspace.id, token

    workspace_id, token = plane.run(issue())
    save_context(Context(name="test", grpc=plane.address, token=token))
    return workspace_id


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_join_writes_the_agents_manifest_once_and_clusters_lists_it_live(
    plane: Plane, cli: Cli, tmp_path: Path
) -> None:
    workspace_id = as_team(plane)
    path = tmp_path / "lab.yaml"
    result = cli(
        "cluster",
        "join",
        "lab",
        "--gpu",
        "l4",
        "--image",
        IMAGE,
        "--worker-image",
        WORKER_IMAGE,
        "--max-workers",
        "2",
        "--output",
        str(path),
        "--ttl",
        "30m",
    )
    assert result.returncode == 0, result.stderr
    pool = clusters.pool_name("lab", workspace_id)
    attached, namespace, apply = result.stdout.strip().splitlines()
    assert attached == f"attached cluster lab as pool {pool}; its agent's manifest: {path}"
    # the namespace is made apart (when missing), so `kubectl delete -f` of the manifest never removes it
    assert namespace == (
        "kubectl get namespace levers9 >/dev/null 2>&1 || { kubectl create namespace levers9 && "
        "kubectl label namespace levers9 pod-security.kubernetes.io/enforce=baseline; }"
    )
    assert apply == f"kubectl apply -f {path}"
    assert "within 30m" in result.stderr
    # the agent dials what the controlplane advertises to its workers, not this context's plain-text address
    assert "plain text" not in result.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the token
    objects = list(yaml.safe_load_all(path.read_text()))
    kinds = by_kind(objects)
    token = kinds["Secret"]["stringData"][JOIN_TOKEN_KEY]
    assert token.startswith("l9_agent_")
    assert token not in result.stdout + result.stderr
    assert token not in json.dumps(kinds["Deployment"])  # the pod reads it through a secretKeyRef only
    command = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "levers9",
        "agent",
        "join",
        "--kubernetes",
        "--namespace",
        "levers9",
        "--controlplane",
        "grpcs://cp.example:50051",
    ]
    assert "Namespace" not in kinds
    assert {
        o["metadata"].get("namespace") for o in objects if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")
    } == {"levers9"}

    listed = cli("clusters", "--json")
    assert listed.returncode == 0, listed.stderr
    [pending] = json.loads(listed.stdout)
    assert (pending["name"], pending["pool"], pending["gpu"], pending["connected"], pending["nodes"]) == (
        "lab",
        pool,
        "L4",
        False,
        0,
    )

    async def join_and_report() -> Agent:
        joined = await agent_join.join(plane.services, token, version="test", hostname="agent-pod")
        agent = Agent(plane.hub, await agent_join.authenticate_agent(plane.services, joined.token))
        await agent.connect(provider="attached_cluster")
        assert agent.session is not None
        await agent.session.inventory(
            InventoryReport(
                cpu_millicores=8000,
                memory_mib=32768,
                free_cpu_millicores=6000,
                free_memory_mib=30000,
                gpus=(("L4", 1, 1),),
                machines=(),
                details={"nodes": [{"metadata": {"name": "n1"}}]},
            )
        )
        return agent

    plane.agents.append(plane.run(join_and_report()))
    table = cli("clusters")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.strip().splitlines()
    assert header.split("\t") == [
        "name",
        "pool",
        "connected",
        "last heartbeat",
        "nodes",
        "GPUs (free/total)",
        "workers",
    ]
    cells = row.split("\t")
    assert cells[:3] == ["lab", pool, "yes"]
    assert cells[4:] == ["1", "1/1 L4", "0"]

    removed = cli("cluster", "remove", "lab", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed cluster lab (pool {pool}): 0 workers stopped, 1 agents revoked"
    # what removes the agent's objects (the manifest file was deleted once applied: it held the token), and
    # nothing else: no namespace
    selector = "app.kubernetes.io/instance=lab,app.kubernetes.io/component=agent"
    assert (
        f"kubectl -n levers9 delete deployment,rolebinding,role,serviceaccount,secret -l {selector}\n"
        f"kubectl -n levers9 delete secret {CREDENTIAL_SECRET} --ignore-not-found\n"
        f"kubectl delete clusterrolebinding,clusterrole -l {selector}\n"
    ) in removed.stderr
    assert "namespace levers9 and anything else in it stay" in removed.stderr
    assert "delete namespace" not in removed.stderr
    plane.agents.pop()  # its stream was cut
    assert cli("clusters", "--json").stdout.strip() == "[]"
    again = cli("cluster", "remove", "lab", "--yes")
    assert again.returncode == 1
    assert "'lab' does not exist" in again.stderr


def test_refusals_are_explained(plane: Plane, cli: Cli, tmp_path: Path) -> None:
    base = ["--image", IMAGE, "--worker-image", WORKER_IMAGE, "--output", str(tmp_path / "x.yaml")]
    operator = cli("cluster", "join", "lab", *base)  # the plane's context is the operator's
    assert operator.returncode == 1
    assert "workspace" in operator.stderr
    as_team(plane)
    bad_name = cli("cluster", "join", "Lab_1", *base)  # refused here, before the controlplane records anything
    assert bad_name.returncode == 2
    assert "cluster 'Lab_1' must be a DNS label" in bad_name.stderr
    bad_gpu = cli("cluster", "join", "lab", "--gpu", "Z9000", *base)
    assert bad_gpu.returncode == 1
    assert "Z9000" in bad_gpu.stderr
    bad_json = cli("cluster", "join", "lab", "--settings", "{", *base)
    assert (bad_json.returncode, "--settings is not JSON" in bad_json.stderr) == (2, True)
    bad_image = cli("cluster", "join", "lab", "--image", "no spaces allowed", "--worker-image", WORKER_IMAGE)
    assert bad_image.returncode == 2
    assert "image" in bad_image.stderr
    assert not (tmp_path / "x.yaml").exists()
    nothing = cli("clusters")
    assert (nothing.returncode, nothing.stdout) == (0, "")
    assert "no attached clusters" in nothing.stderr


# ---------------------------------------------------------------------------------------------- the manifest


def manifest(**given: Any) -> list[dict[str, Any]]:
    base = {
        "cluster": "lab",
        "namespace": "gpu-jobs",
        "image": IMAGE,
        "controlplane_url": "grpcs://cp.example:1993",
        "join_token": "l9_agent_x",
        "ca_pem": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    }
    return render_agent(AgentManifest(**(base | given)))


@pytest.mark.parametrize("version", ["1.30", kubernetes_validate.latest_version()])
def test_every_object_is_valid_against_the_kubernetes_schemas_with_unknown_fields_refused(version: str) -> None:
    for obj in manifest(allow_privileged=True, image_pull_secrets=("regcred",)):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_agent_runs_as_nobody_once_at_a_time_with_the_ca_and_no_insecure_over_tls() -> None:
    kinds = by_kind(manifest())
    deployment = kinds["Deployment"]["spec"]
    assert (deployment["replicas"], deployment["strategy"]) == (1, {"type": "Recreate"})
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == AGENT
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    security = container["securityContext"]
    assert (security["allowPrivilegeEscalation"], security["readOnlyRootFilesystem"]) == (False, True)
    command = container["command"]
    assert "--insecure" not in command
    ca = base64.b64decode(command[command.index("--ca-b64") + 1]).decode()
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    [token] = [e for e in container["env"] if e["name"] == JOIN_TOKEN_KEY]
    assert token["valueFrom"]["secretKeyRef"]["name"] == JOIN_SECRET
    assert kinds["Secret"]["metadata"]["name"] == JOIN_SECRET


def test_the_rbac_grants_exactly_the_agents_listed_calls() -> None:
    kinds = by_kind(manifest())
    assert kinds["Role"]["rules"] == namespaced_rules(AGENT_CALLS)
    assert kinds["ClusterRole"]["rules"] == cluster_rules(AGENT_CALLS)
    # nodes only: no pod of another namespace is read unless the customer grants it (before: every pod)
    assert kinds["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    assert (
        kinds["RoleBinding"]["subjects"]
        == kinds["ClusterRoleBinding"]["subjects"]
        == [{"kind": "ServiceAccount", "name": AGENT, "namespace": "gpu-jobs"}]
    )
    # the credential Secret the agent keeps is one it may create and read back; it reads no other Secret and
    # lists none (before: get and list on every Secret of the namespace)
    secrets = [r for r in kinds["Role"]["rules"] if r["resources"] == ["secrets"]]
    assert secrets == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [CREDENTIAL_SECRET], "verbs": ["get"]},
    ]
    assert CREDENTIAL_SECRET == k8s_credential.SECRET_NAME  # the name the agent keeps its credential under


def test_every_kubernetes_call_the_agent_makes_is_granted() -> None:
    """Each ``self.core.X`` / ``self.batch.X`` the agent's API module names is in AGENT_CALLS."""
    granted = {c.method for c in AGENT_CALLS}
    classes = {"core": "CoreV1Api", "batch": "BatchV1Api"}
    named: set[str] = set()
    for path in (REPO / "core/levers9/agent").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in classes
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"
            ):
                named.add(f"{classes[node.value.attr]}.{node.attr}")
    assert named, "the agent's Kubernetes calls were not found: has k8s_api.py moved?"
    assert named <= granted, f"called but not granted: {sorted(named - granted)}"
    assert granted <= named | {"CoreV1Api.read_namespaced_secret", "CoreV1Api.create_namespaced_secret"}, (
        f"granted but never called: {sorted(granted - named)}"
    )


def test_bad_fields_are_named() -> None:
    with pytest.raises(ValueError, match=r"namespace 'Bad_NS'.*DNS label") as refused:
        manifest(namespace="Bad_NS", controlplane_url="http://x")
    assert "controlplane_url 'http://x'" in str(refused.value)


def test_delete_of_the_manifest_keeps_the_namespace_and_sharing_it_is_the_agents_flag() -> None:
    """``kubectl delete -f`` of the manifest deletes what it lists: no Namespace may be among it (before: the
    Namespace came first, and deleting the manifest removed the namespace with everything in it)."""
    objects = manifest()
    assert [o["kind"] for o in objects if o["kind"] == "Namespace"] == []
    assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {"gpu-jobs"}
    lines = apply_lines("lab.yaml", "gpu-jobs", allow_privileged=True)
    assert lines == [
        "kubectl get namespace gpu-jobs >/dev/null 2>&1 || { kubectl create namespace gpu-jobs && "
        "kubectl label namespace gpu-jobs pod-security.kubernetes.io/enforce=privileged; }",
        "kubectl apply -f lab.yaml",
    ]
    assert not any("namespace" in line.split(" -l ")[0].split("delete", 1)[1] for line in delete_lines("lab", "x"))
    command = by_kind(manifest(share_namespace=True))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert command["command"][-1] == "--share-namespace"
    assert (
        "--share-namespace"
        not in by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    )
