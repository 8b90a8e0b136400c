"""``levers9 kubernetes manifests``: what it renders is valid Kubernetes, grants no more than local_k8s calls,
keeps every credential in Secrets, probes routes that answer, and runs: a pod of its Deployment, started as a
kubelet would (tests/deploy/pod.py), serves with a real PostgreSQL and Redis."""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import ssl
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet
from pydantic import ValidationError

from levers9.__about__ import __version__
from levers9.config.load import load_config
from levers9.controlplane.http import create_http_app
from levers9.controlplane.tls import check_plaintext
from levers9.kubernetes_manifests import ManifestError, ManifestOptions, render, to_yaml
from levers9.kubernetes_manifests.permissions import LOCAL_K8S_CALLS, ApiCall, cluster_rules, namespaced_rules
from levers9.kubernetes_manifests.pod_config import fill_state
from levers9.kubernetes_manifests.render import LIVENESS_PATH, METRICS_PATH, READINESS_PATH, RUN_AS
from levers9.services.metrics import Metrics
from tests.conftest import Result
from tests.deploy.pod import Pod
from tests.fakes.local_server import LocalServer
from tests.fixtures.ports import free_port
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services
from tests.fixtures.tls import TestCA

ROOT = Path(__file__).resolve().parents[2]
PROVIDER = ROOT / "plugins" / "local_k8s" / "levers9_local_k8s"
IMAGE = "registry.example.com/levers9/controlplane:0.1.0"
#: the oldest Kubernetes release whose schemas the manifests are held to, and the newest kubernetes-validate has
VERSIONS = ("1.30", kubernetes_validate.latest_version())

#: option sets that between them render every kind of object and every optional part
OPTION_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": {
        "namespace": "team-cp",
        "replicas": 3,
        "tls_secret": "cp-tls",
        "service_type": "LoadBalancer",
        "worker_namespaces": ("team-cp", "gpu-workers"),
        "image_pull_secrets": ("registry-a",),
        "cpu_request": "2",
        "cpu_limit": "4",
        "memory_request": "4Gi",
        "memory_limit": "6144",
        "database_secret": "pg",
        "redis_secret": "cache",
        "secret_key_secret": "fernet",
    },
    "one-replica-no-rbac": {
        "replicas": 1,
        "worker_namespaces": (),
        "tls_secret": "t",
        "tls_ca": False,
        "memory_limit": None,
    },
}
#: a config with no local_k8s pool, for the option set without worker namespaces
NO_K8S_POOL = {"version": 1, "pools": {"cpu": {"provider": "local", "runtime": "process", "max_workers": 1}}}


def _render(name: str) -> list[dict[str, Any]]:
    options = ManifestOptions(image=IMAGE, **OPTION_SETS[name])
    return render(options, NO_K8S_POOL if options.worker_namespaces == () else None)


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec["initContainers"], *spec["containers"]]


# --------------------------------------------------------------------------- the schemas, and the shape


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_every_object_is_valid_against_the_kubernetes_schemas_with_unknown_fields_refused(
    name: str, version: str
) -> None:
    objects = _render(name)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "ConfigMap", "Service", "Deployment"} <= kinds


def test_the_strict_schemas_refuse_a_field_kubernetes_does_not_have() -> None:
    """The validation above can fail: a misspelt field in the Deployment is an error, not ignored."""
    deployment = _one(_render("defaults"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_every_object_says_it_is_levers9_its_component_and_version(name: str) -> None:
    for obj in _render(name):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "levers9", obj["kind"]
        assert labels["app.kubernetes.io/component"] in {"controlplane", "workers", "local-k8s"}, obj["kind"]
        assert labels["app.kubernetes.io/version"] == __version__, obj["kind"]


def test_the_deployment_runs_levers9_server_with_failover() -> None:
    objects = _render("everything")
    deployment = _one(objects, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (server,) = pod["containers"]
    assert spec["replicas"] == 3
    assert server["command"] == ["levers9", "server"]
    assert server["image"] == IMAGE
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {"grpc": 1993, "http": 1994, "metrics": 9090}
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    by_key = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert by_key["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert by_key["kubernetes.io/hostname"]["labelSelector"]["matchLabels"] == selector
    assert _one(objects, "PodDisruptionBudget")["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert annotations["prometheus.io/path"] == METRICS_PATH
    assert annotations["prometheus.io/scheme"] == "https"
    assert pod["imagePullSecrets"] == [{"name": "registry-a"}]
    assert server["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "6Gi"}}
    services = {s["metadata"]["name"]: s["spec"] for s in objects if s["kind"] == "Service"}
    assert services["levers9-grpc"]["type"] == services["levers9-http"]["type"] == "LoadBalancer"
    assert [p["targetPort"] for s in services.values() for p in s["ports"]] == ["grpc", "http"]
    assert all(s["selector"] == selector for s in services.values())


def test_one_replica_gets_no_disruption_budget_which_would_block_every_drain() -> None:
    kinds = [o["kind"] for o in _render("one-replica-no-rbac")]
    assert "PodDisruptionBudget" not in kinds


def test_the_pods_run_as_nobody_of_the_worker_image_without_privileges() -> None:
    from levers9.images import rootfs

    pod = _one(_render("defaults"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == RUN_AS
    # the worker image's /etc/passwd has that user, so the image can run the controlplane as it
    assert f"nobody:x:{RUN_AS}:{RUN_AS}:" in rootfs._PASSWD
    for container in _containers(_one(_render("defaults"), "Deployment")):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_changed_config_changes_the_pod_template_so_the_replicas_roll() -> None:
    options = ManifestOptions(image=IMAGE)

    def digest(config: dict[str, Any]) -> str:
        template = _one(render(options, config), "Deployment")["spec"]["template"]
        return str(template["metadata"]["annotations"]["levers9/config-sha256"])

    other = json.loads(json.dumps(NO_K8S_POOL))
    other["pools"]["cpu"]["max_workers"] = 2
    assert digest(NO_K8S_POOL) != digest(other)
    assert digest(NO_K8S_POOL) == digest(json.loads(json.dumps(NO_K8S_POOL)))


# --------------------------------------------------------------------------- RBAC: exactly what local_k8s calls


def test_the_role_in_each_worker_namespace_and_the_cluster_role_grant_exactly_the_listed_calls() -> None:
    objects = _render("everything")
    expected_ns = {(c.group, c.resource, c.verb) for c in LOCAL_K8S_CALLS if not c.cluster}
    expected_cluster = {(c.group, c.resource, c.verb) for c in LOCAL_K8S_CALLS if c.cluster}

    def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        out = set()
        for rule in rules:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, no wildcards
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        assert not any("*" in part for grant in out for part in grant)
        return out

    roles = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "Role"}
    assert sorted(roles) == ["gpu-workers", "team-cp"]
    for role in roles.values():
        assert granted(role["rules"]) == expected_ns
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    assert granted(cluster_role["rules"]) == expected_cluster
    subject = [{"kind": "ServiceAccount", "name": "levers9", "namespace": "team-cp"}]
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == subject
        target = cluster_role if binding["kind"] == "ClusterRoleBinding" else roles[binding["metadata"]["namespace"]]
        assert binding["roleRef"]["name"] == target["metadata"]["name"]
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "levers9"
    assert pod["automountServiceAccountToken"] is True


def test_without_a_local_k8s_pool_there_is_no_rbac_and_no_api_token() -> None:
    objects = _render("one-replica-no-rbac")
    assert not [o for o in objects if "Role" in o["kind"]]
    assert _one(objects, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def _attributes(method: str, target: str) -> tuple[str, str, str, bool]:
    """The RBAC (group, resource, verb, cluster-wide) of a request, by the API server's request-info rules."""
    url = urlsplit(target)
    parts = url.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = rest[0] == "namespaces" and len(rest) >= 3
    if namespaced:
        rest = rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "watch" if parse_qs(url.query).get("watch") == ["true"] else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return group, resource, verb, not namespaced


@pytest.fixture
def recording_api() -> Iterator[tuple[LocalServer, list[tuple[str, str]]]]:
    """An HTTP server that answers ``{}`` to anything and records (method, path?query)."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.command, self.path))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = LocalServer(Handler, name="k8s-recorder")
    try:
        yield server, seen
    finally:
        server.close()


@pytest.mark.parametrize("call", LOCAL_K8S_CALLS, ids=lambda c: c.method)
def test_each_listed_call_sends_the_request_its_rule_allows(
    call: ApiCall, recording_api: tuple[LocalServer, list[tuple[str, str]]]
) -> None:
    """The real client method, sent to a recording server: the request's RBAC attributes are the ones listed."""
    import kubernetes

    server, seen = recording_api
    cls_name, method_name = call.method.split(".")
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    with kubernetes.client.ApiClient(configuration) as client:
        method = getattr(getattr(kubernetes.client, cls_name)(client), method_name)
        # the client checks bodies against its models: an access review needs its spec
        body = {"spec": {"resourceAttributes": {"verb": "create"}}} if "access_review" in method_name else {}
        values = {"namespace": "workers", "name": "levers9-m1", "body": body}
        required = [
            p.name
            for p in inspect.signature(method).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        method(*[values[name] for name in required], _preload_content=False)
    assert len(seen) == 1
    assert _attributes(*seen[0]) == (call.group, call.resource, call.verb, call.cluster), seen[0]


def test_every_kubernetes_call_in_the_local_k8s_provider_is_granted() -> None:
    """Each client method the provider's code names is in the list; once it names any, every listed one is used."""
    import kubernetes

    methods = set()  # the API operations: each has a ``_with_http_info`` twin
    for name in dir(kubernetes.client):
        cls = getattr(kubernetes.client, name)
        if name.endswith("Api") and isinstance(cls, type):
            methods |= {m.removesuffix("_with_http_info") for m in vars(cls) if m.endswith("_with_http_info")}
    sources = sorted(PROVIDER.rglob("*.py"))
    assert sources, f"no Python files under {PROVIDER}"
    used = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr.removesuffix("_with_http_info") in methods:
                used.add(node.attr.removesuffix("_with_http_info"))
    listed = {c.method.split(".")[1] for c in LOCAL_K8S_CALLS}
    assert used <= listed, f"local_k8s calls methods no RBAC rule allows: {sorted(used - listed)}"
    if used:
        assert listed <= used, f"RBAC granted for calls local_k8s never makes: {sorted(listed - used)}"


def test_rules_are_built_from_the_list_alone() -> None:
    one = (
        ApiCall("BatchV1Api.list_namespaced_job", "batch", "jobs", "list", False, "x"),
        ApiCall("BatchV1Api.create_namespaced_job", "batch", "jobs", "create", False, "x"),
        ApiCall("CoreV1Api.list_node", "", "nodes", "list", True, "x"),
    )
    assert namespaced_rules(one) == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "list"]}]
    assert cluster_rules(one) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]


# --------------------------------------------------------------------------- credentials stay in Secrets


def test_the_urls_and_the_key_reach_the_pods_only_through_secret_key_refs() -> None:
    options = ManifestOptions(image=IMAGE, database_secret="pg", redis_secret="cache", secret_key_secret="fernet")
    deployment = _one(render(options), "Deployment")
    refs = {}
    for container in _containers(deployment):
        for item in container.get("env", []):
            if "valueFrom" in item:
                refs[item["name"]] = item["valueFrom"]["secretKeyRef"]
            else:
                assert item["name"] in {"LEVERS9_CONFIG", "LEVERS9_HOME"}, item
    assert refs == {
        "LEVERS9_DATABASE_URL": {"name": "pg", "key": "url"},
        "LEVERS9_REDIS_URL": {"name": "cache", "key": "url"},
        "LEVERS9_SECRET_KEY": {"name": "fernet", "key": "key"},
    }
    assert not [o for o in render(options) if o["kind"] == "Secret"]


@pytest.mark.parametrize("field", ["database_url", "redis_url", "secret_key_file"])
def test_a_config_holding_a_url_or_key_file_is_refused_without_repeating_it(field: str) -> None:
    value = {
        "database_url": "postgresql+psycopg://levers9:made-up-pw-7@db/levers9",
        "redis_url": "redis://:made-up-pw-7@redis:6379/0",
        "secret_key_file": "/made-up-pw-7",
    }[field]
    config = {**NO_K8S_POOL, "state": {field: value}}
    with pytest.raises(ManifestError) as caught:
        render(ManifestOptions(image=IMAGE, worker_namespaces=()), config)
    assert f"state.{field}" in str(caught.value)
    assert "made-up-pw-7" not in str(caught.value)


def test_write_config_names_a_missing_or_wrong_url_without_repeating_it(tmp_path: Path) -> None:
    template = _one(_render("defaults"), "ConfigMap")["data"]["levers9.yaml"]
    good = {
        "LEVERS9_DATABASE_URL": "postgresql+psycopg://u:made-up-pw-8@db/l9",
        "LEVERS9_REDIS_URL": "redis://r:6379/0",
    }
    filled = yaml.safe_load(fill_state(template, good))
    assert filled["state"] == {"database_url": good["LEVERS9_DATABASE_URL"], "redis_url": "redis://r:6379/0"}
    for broken, variable in (
        ({**good, "LEVERS9_REDIS_URL": "http://:made-up-pw-8@r"}, "$LEVERS9_REDIS_URL"),
        ({**good, "LEVERS9_DATABASE_URL": "sqlite:///made-up-pw-8"}, "$LEVERS9_DATABASE_URL"),
        ({"LEVERS9_REDIS_URL": good["LEVERS9_REDIS_URL"]}, "$LEVERS9_DATABASE_URL"),
    ):
        with pytest.raises(ManifestError) as caught:
            fill_state(template, broken)
        assert variable in str(caught.value)
        assert "made-up-pw-8" not in str(caught.value)


# --------------------------------------------------------------------------- probes and metrics answer


async def test_the_probes_ask_routes_the_rest_api_answers_and_metrics_answer_at_their_path(tmp_path: Path) -> None:
    """The real REST app on real services: readiness is the health route (200, ok), liveness answers too."""
    container = _one(_render("defaults"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    probes = {kind: container[kind]["httpGet"]["path"] for kind in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes == {"readinessProbe": READINESS_PATH, "livenessProbe": LIVENESS_PATH, "startupProbe": LIVENESS_PATH}
    assert {container[kind]["httpGet"]["port"] for kind in probes} == {"http"}
    async with opened_services(tmp_path, ONE_POOL_CONFIG, f"sqlite:///{tmp_path / 'l9.db'}") as services:
        app = create_http_app(services, metrics=Metrics())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod") as client:
            ready = await client.get(READINESS_PATH)
            assert ready.status_code == 200, ready.text
            assert ready.json()["status"] == "ok"
            assert (await client.get(LIVENESS_PATH)).status_code == 200
            assert (await client.get("/api/v1/no-such-route")).status_code == 404  # a wrong path would fail above
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=Metrics().asgi_app()), base_url="http://pod") as c:
        scraped = await c.get(METRICS_PATH)
    assert scraped.status_code == 200
    assert "levers9_" in scraped.text


# --------------------------------------------------------------------------- the command


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    full = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    full.pop("LEVERS9_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "levers9.cli.main", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_the_command_writes_yaml_that_reads_back_to_the_rendered_objects(tmp_path: Path) -> None:
    flags = [
        "--image",
        IMAGE,
        "--namespace",
        "team-cp",
        "--replicas",
        "3",
        "--tls-secret",
        "cp-tls",
        "--worker-namespace",
        "team-cp",
        "--worker-namespace",
        "gpu-workers",
        "--database-secret",
        "pg",
    ]
    expected = render(
        ManifestOptions(
            image=IMAGE,
            namespace="team-cp",
            replicas=3,
            tls_secret="cp-tls",
            worker_namespaces=("team-cp", "gpu-workers"),
            database_secret="pg",
        )
    )
    written = _cli("kubernetes", "manifests", *flags, "-o", "cp.yaml", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert written.stdout == ""
    assert list(yaml.safe_load_all((tmp_path / "cp.yaml").read_text())) == expected
    printed = _cli("kubernetes", "manifests", *flags, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert list(yaml.safe_load_all(printed.stdout)) == expected
    lines = written.stderr.splitlines()
    assert "kubectl apply -f cp.yaml" in lines
    assert "kubectl -n team-cp rollout status deployment/levers9" in lines
    creates = [line for line in lines if " create secret generic " in line]
    assert [line.split()[6] for line in creates] == ["pg", "levers9-redis", "levers9-secret-key", "cp-tls"]
    assert lines.index(creates[-1]) < lines.index("kubectl apply -f cp.yaml")


def test_the_command_takes_a_config_file_and_gives_its_local_k8s_pools_namespaces_a_role(tmp_path: Path) -> None:
    (tmp_path / "team.yaml").write_text(
        "version: 1\npools:\n  gpu:\n    provider: local_k8s\n    gpu: L4\n    settings:\n"
        "      namespace: gpu-jobs\n      worker_image: registry.example.com/levers9/worker:0.1.0\n"
    )
    done = _cli("kubernetes", "manifests", "--image", IMAGE, "--config", "team.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert [o["metadata"]["namespace"] for o in objects if o["kind"] == "Role"] == ["gpu-jobs"]
    config = yaml.safe_load(_one(objects, "ConfigMap")["data"]["levers9.yaml"])
    assert config["pools"]["gpu"]["settings"]["namespace"] == "gpu-jobs"
    refused = _cli(
        "kubernetes",
        "manifests",
        "--image",
        IMAGE,
        "--config",
        "team.yaml",
        "--worker-namespace",
        "levers9",
        cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert "pools.gpu.settings.namespace" in refused.stderr
    assert "--worker-namespace gpu-jobs" in refused.stderr
    (tmp_path / "bad.yaml").write_text("version: 1\npools:\n  gpu:\n    provider: local_k8s\n    settings: {}\n")
    invalid = _cli("kubernetes", "manifests", "--image", IMAGE, "--config", "bad.yaml", cwd=tmp_path)
    assert invalid.returncode == 2
    assert "pools.gpu.settings.worker_image" in invalid.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--namespace", "Team_A"], "--namespace"),
        (["--database-secret", "postgresql://u:p@h/d"], "--database-secret"),
        (["--memory-request", "4Gi", "--memory-limit", "2Gi"], "memory_limit"),
        (["--service-type", "LoadBalancer"], "tls_secret"),
    ],
)
def test_bad_options_fail_naming_the_option(flags: list[str], named: str, tmp_path: Path) -> None:
    done = _cli("kubernetes", "manifests", "--image", IMAGE, *flags, cwd=tmp_path)
    assert done.returncode == 2
    assert named in done.stderr
    assert done.stdout == ""
    assert "u:p@h" not in done.stderr


@pytest.mark.parametrize(("field", "value"), [("replicas", 0), ("namespace", "Team_A"), ("namespace", "a" * 64)])
def test_the_options_model_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        ManifestOptions(image=IMAGE, **{field: value})
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


def test_the_command_line_starts_without_loading_the_manifests_or_yaml_dumping(tmp_path: Path) -> None:
    probe = "import sys, levers9.cli.main; print(sorted(m for m in sys.modules if 'kubernetes' in m))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True
    )
    assert proc.stdout.strip() == "['levers9.cli.kubernetes_cmd']"


# --------------------------------------------------------------------------- a pod of the Deployment runs


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[str]:
    """A redis-server on a TCP port of 127.0.0.1 that wants a password; yields its URL with the password."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed; run scripts/setup (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="l9-k8s-redis-"))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            "made-up-redis-pw",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "-a", "made-up-redis-pw", "--no-auth-warning", "ping"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            != "PONG"
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start on port {port} (exit {proc.poll()})")
            time.sleep(0.05)
        yield f"redis://:made-up-redis-pw@127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(pod: Pod, url: str, verify: ssl.SSLContext | bool) -> httpx.Response:
    deadline = time.monotonic() + 120
    while True:
        assert pod.main is not None
        if pod.main.poll() is not None:
            pytest.fail(f"the server exited {pod.main.returncode}:\n{pod.log('server')[-4000:]}")
        try:
            answer = httpx.get(url, verify=verify, timeout=5)
            if answer.status_code == 200:
                return answer
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{url} never answered 200:\n{pod.log('server')[-4000:]}")
        time.sleep(0.2)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_pod_of_the_deployment_serves_with_the_secrets_as_its_only_source_of_credentials(
    tls: bool, tmp_path: Path, postgres_url: str, redis_with_password: str
) -> None:
    """The pod template run as a kubelet would: the init container completes the config from the Secrets, the
    server starts as nobody with the pod's mounts, its probes and metrics answer, and SIGTERM stops it cleanly."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.fail("running a pod needs root, unshare and setpriv (util-linux), as on the CI machines")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    config = {
        "version": 1,
        "listen": {"grpc_port": grpc_port, "http_port": http_port, "metrics_port": metrics_port},
        "pools": {
            "k8s-cpu": {
                "provider": "local_k8s",
                "runtime": "process",
                "workspace": "default",
                "max_workers": 1,
                "settings": {"worker_image": "registry.example.com/levers9/worker:0.1.0"},
            }
        },
    }
    options = ManifestOptions(image=IMAGE, tls_secret="levers9-tls" if tls else None)
    objects = render(options, config)
    database_url = postgres_url.replace("postgres@", "postgres:made-up-pg-pw@", 1)  # trust auth: unused, but carried
    key = Fernet.generate_key().decode()
    secrets = {
        "levers9-database": {"url": database_url + "\n"},
        "levers9-redis": {"url": redis_with_password},
        "levers9-secret-key": {"key": key},
    }
    ca = TestCA()
    if tls:
        issued = ca.issue()
        secrets["levers9-tls"] = {
            "tls.crt": issued.cert_pem.decode(),
            "tls.key": issued.key_pem.decode(),
            "ca.crt": ca.pem.decode(),
        }
    manifests = to_yaml(objects)
    for value in ("made-up-pg-pw", "made-up-redis-pw", key):
        assert value not in manifests
    config_map = _one(objects, "ConfigMap")
    pod = Pod(
        _one(objects, "Deployment"),
        config_maps={config_map["metadata"]["name"]: config_map["data"]},
        secrets=secrets,
        root=tmp_path / "pod",
    )
    try:
        pod.run_init_containers()
        written = pod.volumes["config"] / "levers9.yaml"
        info = written.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, RUN_AS)
        filled = load_config(written)
        try:
            listen = filled.config.listen
            check_plaintext(listen.host, listen.tls, listen.plaintext)  # the server's own refusal does not apply
        finally:
            filled.hooks.close()
        pod.start()
        scheme = "https" if tls else "http"
        verify: ssl.SSLContext | bool = ssl.create_default_context(cadata=ca.pem.decode()) if tls else False
        ready = _wait_ready(pod, f"{scheme}://127.0.0.1:{http_port}{READINESS_PATH}", verify)
        assert ready.json() == {"status": "ok", "database": "ok", "redis": "ok", "disk": "ok"}
        assert httpx.get(f"{scheme}://127.0.0.1:{http_port}{LIVENESS_PATH}", verify=verify).status_code == 200
        scraped = httpx.get(f"{scheme}://127.0.0.1:{metrics_port}{METRICS_PATH}", verify=verify)
        assert scraped.status_code == 200
        assert "levers9_" in scraped.text
        assert pod.stop() == 0, pod.log("server")[-4000:]
        for value in ("made-up-pg-pw", "made-up-redis-pw", key):
            assert value not in pod.log("write-config") + pod.log("server")
    finally:
        pod.close()


def test_the_starter_config_completed_by_the_init_container_passes_the_config_check(tmp_path: Path) -> None:
    template = _one(_render("defaults"), "ConfigMap")["data"]["levers9.yaml"]
    (tmp_path / "levers9.yaml").write_text(template)
    env = {"LEVERS9_DATABASE_URL": "postgresql+psycopg://u:pw@db/levers9", "LEVERS9_REDIS_URL": "redis://r:6379/0"}
    (tmp_path / "run").mkdir()
    done = _cli(
        "kubernetes",
        "write-config",
        "--template",
        "levers9.yaml",
        "--output",
        "run/levers9.yaml",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    checked = _cli("config", "check", "run/levers9.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "k8s-cpu: provider local_k8s, runtime process" in checked.stdout
