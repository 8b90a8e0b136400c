"""deploy/: the alert rules pass promtool, and the dashboard and the rules name only metrics levers9 exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from levers9.scheduler import events
from levers9.services.metrics import Metrics
from tests.controlplane.conftest import Api

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "levers9.json"
#: the metric names of PromQL expressions: ours, the process collector's, and Prometheus's own ``up``
_NAME = re.compile(r"\b(levers9_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up)\b")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed; install it with: apt-get install prometheus (see .ci/apt-packages.txt)")
    return found


def _run(*args: str) -> None:
    done = subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def test_the_alert_rules_are_valid() -> None:
    _run("check", "rules", str(RULES))


def test_every_alert_rule_fires_and_stays_quiet_as_its_unit_tests_say() -> None:
    _run("test", "rules", str(RULE_TESTS))
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {
        t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert rules == tested, f"rules without unit tests: {sorted(rules - tested)}"


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return exprs + [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


async def _exported(api: Api) -> set[str]:
    """Every sample name a replica holding the lease exports once each code path has counted something."""
    metrics = Metrics(replica="r1")
    metrics.placed("cpu", None)
    metrics.provisioned("local", 1.0, "ok")
    metrics.task_finished("complete", 1.0)
    metrics.gateway_answered("endpoint", 200, 0.01)
    metrics.gateway_wait.observe(0.5)
    metrics.serving(1, 2, 3, 4)
    metrics.grpc_answered("/levers9.v1.ControlPlane/Submit", "OK", 0.01)
    metrics.http_answered("/api/v1/tasks/{task_id}", "GET", 200, 0.01)
    for event in (
        events.Requeued(events.REQUEUE_WORKER_LOST),
        events.WorkerLost("cpu", events.LOST_KEEPALIVE),
        events.MachineTerminated("cpu", events.TERMINATED_IDLE),
        events.ProviderCalled("local", "provision", "InsufficientCapacity"),
    ):
        metrics.scheduler_event(event)
    assert await api.services.scheduler.lease.acquire()
    await metrics.refresh(api.services)
    return {s.name for family in metrics.registry.collect() for s in family.samples} | {"up"}


async def test_the_dashboard_and_the_rules_use_only_exported_metrics(api: Api) -> None:
    exported = await _exported(api)
    used = {name for expr in _expressions() for name in _NAME.findall(expr)}
    assert used - exported == set(), f"queried but never exported: {sorted(used - exported)}"
    # and the dashboard covers what an operator needs (the brief of deploy/grafana)
    for needed in (
        "levers9_grpc_requests_total",
        "levers9_pending_tasks",
        "levers9_oldest_pending_seconds",
        "levers9_workers",
        "levers9_requeues_total",
        "levers9_workers_lost_total",
        "levers9_provider_errors_total",
        "levers9_planner_lease_held",
        "levers9_serving_containers",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert needed in used, f"the dashboard and rules never query {needed}"
