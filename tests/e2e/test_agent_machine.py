"""Agent machines end to end: `levers9 machine create --ssh` joins this machine, whose dockerd runs the workers.

Every part is real: `levers9 up` serving TLS, the session's sshd and private
dockerd, paramiko, the worker image built from this checkout, the agent the
SSH join installs (a container of the worker image, or a ``levers9`` of this
version found on the box's PATH) under a supervisor, and the worker
containers it starts. The box is this machine (tests/fixtures/agent_box.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from levers9.agent.docker_workers import LABEL_AGENT, LABEL_MACHINE, LABEL_POOL, DockerWorkers, OrderRefused
from tests.fixtures.agent_box import AgentPlane, Box, agent_plane, wait_until
from tests.fixtures.dockerd import Dockerd

__all__ = ["agent_plane"]

pytestmark = pytest.mark.timeout(900)

#: a call that says where it ran
WHERE = """
import os
import levers9

@levers9.function(cpu=0.25)
def where(x):
    import os, time
    time.sleep({sleep})
    return {{"x": x * 2, "in_docker": os.path.exists("/.dockerenv")}}

print("result", where.remote(21))
"""


def _join(plane: AgentPlane, box: Box, *extra: str) -> subprocess.CompletedProcess[str]:
    assert plane.sshd is not None
    done = plane.operator(
        "machine",
        "create",
        "--pool",
        "box",
        "--ssh",
        f"root@127.0.0.1:{plane.sshd.port}",
        "--agent-dir",
        str(box.agent_dir),
        *extra,
        timeout=600,
    )
    box.create_output = done.stdout + done.stderr
    assert done.returncode == 0, f"{box.create_output}\n--- box log:\n{box.log()[-3000:]}\n{plane.log()[-3000:]}"
    machines = plane.machines()
    assert len(machines) == 1, machines
    box.name, box.machine_id = machines[0]["name"], machines[0]["id"]
    return done


def _logs(plane: AgentPlane, box: Box) -> str:
    workers = [
        f"--- {c['name']} ({c['state']}):\n" + box.dockerd.cli("logs", "--tail", "60", c["name"], check=False).stderr
        for c in box.workers()
    ]
    return "\n".join([f"--- agent:\n{box.agent_log()[-3000:]}", *workers, f"--- up:\n{plane.log()[-6000:]}"])


def _call(plane: AgentPlane, box: Box, sleep: float = 0, timeout: float = 300) -> str:
    try:
        done = plane.python(WHERE.format(sleep=sleep), timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the call did not return within {timeout:.0f} s\n{_logs(plane, box)}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{_logs(plane, box)}"
    return done.stdout


def _running(plane: AgentPlane, function: str) -> bool:
    """Whether a call of ``function`` runs now (`levers9 tasks`)."""
    listed = plane.levers9("tasks", "--json")
    assert listed.returncode == 0, listed.stderr
    return any(t.get("function") == function and t.get("status") == "running" for t in json.loads(listed.stdout))


def _inventory_machines(plane: AgentPlane, box: Box) -> list[str]:
    found = next((m for m in plane.machines() if m["id"] == box.machine_id), None)
    return list(found["workers"]) if found and found["connected"] else []


def test_machine_create_over_ssh_joins_a_box_and_serves_a_function(agent_plane: tuple[AgentPlane, Box]) -> None:
    plane, box = agent_plane
    plane.start()
    began = time.monotonic()
    done = _join(plane, box)
    for step in range(1, 6):
        assert f"[{step}/6]" in done.stdout, done.stdout
    assert "joined pool box" in done.stdout
    assert "LEVERS9_JOIN_TOKEN" not in done.stdout + done.stderr  # the SSH path never prints the token
    listed = plane.operator("machines")
    assert listed.returncode == 0, listed.stderr
    for shown in (box.name, "joined", "yes"):
        assert shown in listed.stdout, listed.stdout
    [machine] = plane.machines()
    assert (machine["state"], machine["connected"], machine["pool"]) == ("joined", True, "box")
    assert min(machine["cpu_millicores"], machine["memory_mib"]) > 0, machine
    assert machine["last_seen"]

    out = _call(plane, box)
    first_result_s = time.monotonic() - began
    print(f"\nBENCH machine create --ssh to first function result: {first_result_s:.1f} s")
    assert "result {'x': 42, 'in_docker': True}" in out, out
    [worker] = box.workers()
    labels = worker["labels"]
    assert worker["state"] == "running"
    assert (labels[LABEL_POOL], labels[LABEL_AGENT]) == ("box", box.machine_id)
    assert worker["name"] == f"l9w-{labels[LABEL_MACHINE]}"
    assert plane.workers(), "the worker container registered"

    removed = plane.operator("machine", "remove", box.name, "--yes", timeout=300)
    assert removed.returncode == 0, removed.stderr + plane.log()[-3000:]
    assert "1 workers stopped" in removed.stdout, removed.stdout + removed.stderr
    wait_until("the worker container's removal", lambda: not box.workers(), 120, why=box.agent_log)
    wait_until("the supervisor's end", lambda: box.supervisor_pid() is None, 120, why=box.log)
    assert box.agent_container() is None
    assert not box.agent_processes()
    assert "status 3" in box.log(), box.log()
    assert plane.machines() == []
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "levers9",
            "agent",
            "run",
            "--state-dir",
            str(box.state_dir),
            "--docker-host",
            box.dockerd.host,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=plane.env,
    )
    assert again.returncode == 3, again.stderr
    assert "this machine was removed" in again.stderr


def test_killing_the_agent_mid_call_loses_nothing(agent_plane: tuple[AgentPlane, Box]) -> None:
    plane, box = agent_plane
    plane.start()
    _join(plane, box)
    _call(plane, box)  # a worker is up
    [worker] = box.workers()
    result: dict[str, Any] = {}
    call = threading.Thread(target=lambda: result.update(out=_call(plane, box, sleep=12)))
    call.start()
    try:
        wait_until("the call to run on the box", lambda: _running(plane, "where"), 300, why=lambda: _logs(plane, box))
        # the controlplane notices the stream end; the supervisor starts the agent again within seconds, so the
        # box may show connected again before a listing could show it gone: the controlplane's log is what says
        disconnected = f"agent {box.machine_id} disconnected"
        before = plane.log().count(disconnected)
        killed = box.kill_agent()
        wait_until(
            "the controlplane noticing the agent's death",
            lambda: plane.log().count(disconnected) > before,
            120,
            why=lambda: plane.log()[-3000:],
        )
        assert [w["id"] for w in box.workers()] == [worker["id"]], f"killed {killed}"
        assert box.workers()[0]["state"] == "running"
    finally:
        call.join(600)
    assert "result {'x': 42, 'in_docker': True}" in result.get("out", ""), result
    # the supervisor started the agent again (`levers9 agent run --state-dir ...`): it reports the same container
    machine_id = worker["labels"][LABEL_MACHINE]
    wait_until(
        "the agent's return",
        lambda: _inventory_machines(plane, box) == [machine_id],
        180,
        every=1,
        why=lambda: box.log()[-3000:] + box.agent_log()[-3000:],
    )
    assert [w["id"] for w in box.workers()] == [worker["id"]]
    assert "result {'x': 42, 'in_docker': True}" in _call(plane, box)
    assert [w["id"] for w in box.workers()] == [worker["id"]]


def test_killing_the_controlplane_starts_nothing_twice(agent_plane: tuple[AgentPlane, Box]) -> None:
    """SIGKILL `levers9 up` with a worker running on the box, start it again: at most one worker container at once.

    The pool's max_workers is 1, so two ``l9w-*`` containers at any moment would be a worker started twice. The
    worker's keepalive here (3 s) is shorter than the outage, so the restarted controlplane may have forgotten the
    worker: then it replaces it (its terminate order waits for the agent), and the new one serves the call.
    """
    plane, box = agent_plane
    plane.start()
    _join(plane, box)
    _call(plane, box)
    [worker] = box.workers()
    seen: dict[str, int] = {"running": 1, "per_machine": 1}
    ids: set[str] = set()
    watching = threading.Event()
    watching.set()

    def watch() -> None:
        while watching.is_set():
            containers = box.workers()
            ids.update(c["id"] for c in containers)
            machines = [c["labels"].get(LABEL_MACHINE, "") for c in containers]
            running = sum(c["state"] == "running" for c in containers)
            seen["running"] = max(seen["running"], running)
            seen["per_machine"] = max([seen["per_machine"], *(machines.count(m) for m in machines)])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        plane.kill()
        time.sleep(3)  # the point: a window in which a worker that followed its controlplane down would go
        assert [w["id"] for w in box.workers()] == [worker["id"]]  # the worker outlives its controlplane
        restarted = time.monotonic()
        plane.start()
        wait_until(
            "the agent's reconnection",
            lambda: any(m["connected"] for m in plane.machines()),
            180,
            every=1,
            why=lambda: _logs(plane, box),
        )
        reconnected = time.monotonic() - restarted
        assert "result {'x': 42, 'in_docker': True}" in _call(plane, box)
        print(
            f"\nafter the restart: agent reconnected in {reconnected:.1f} s, "
            f"a call returned in {time.monotonic() - restarted:.1f} s"
        )
        time.sleep(12)  # the point: two reconcile passes (5 s) with the agent connected, watched for a second worker
    finally:
        watching.clear()
        watcher.join(10)
    kept = [w["id"] for w in box.workers()] == [worker["id"]]
    print(f"\nafter the controlplane's restart the worker was {'kept' if kept else 'replaced'}; containers seen: {ids}")
    assert seen["per_machine"] == 1, f"{seen['per_machine']} containers for one machine id: {ids}"
    assert seen["running"] == 1, f"{seen['running']} worker containers running at once (max_workers is 1): {ids}"
    wait_until("one worker container left", lambda: len(box.workers()) == 1, 120, why=lambda: _logs(plane, box))
    listed = _inventory_machines(plane, box)
    assert [f"l9w-{m}" for m in listed] == [w["name"] for w in box.workers()]


# ------------------------------------------------------------------------------------------------ refusals


def _agent(plane: AgentPlane, box: Box, *args: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {**plane.env, **({"LEVERS9_JOIN_TOKEN": token} if token else {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "levers9", "agent", *args, "--docker-host", box.dockerd.host],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    box.started.append(process)
    return process


def _ended(process: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def _created(plane: AgentPlane, *args: str) -> str:
    made = plane.operator("machine", "create", "--pool", "box", *args)
    assert made.returncode == 0, made.stderr
    assert "LEVERS9_JOIN_TOKEN=" in made.stdout
    assert "--ca-b64" in made.stdout
    return made.stdout.split("LEVERS9_JOIN_TOKEN=", 1)[1].split()[0]


def test_refusals_reach_the_agent_and_the_cli(agent_plane: tuple[AgentPlane, Box], tiny_image: str) -> None:
    plane, box = agent_plane
    plane.start()
    ca = ("--controlplane", plane.url(), "--ca", str(plane.ca_file))
    first, second = box.agent_dir / "first", box.agent_dir / "second"

    token = _created(plane, "--name", "one")
    joined = _agent(plane, box, "join", *ca, "--state-dir", str(first), token=token)
    wait_until("the join", lambda: (first / "agent.json").exists() or joined.poll() is not None, 120)
    wait_until("the agent's connection", lambda: any(m["connected"] for m in plane.machines()), 120)
    joined.terminate()
    assert _ended(joined)[0] == 0

    reused = _agent(plane, box, "join", *ca, "--state-dir", str(second), token=token)
    code, out = _ended(reused)
    assert code == 3, out
    assert "refused the join token" in out
    assert not (second / "agent.json").exists()

    expired = _created(plane, "--name", "two", "--ttl", "1s")
    time.sleep(2)  # the point: the token's 1 s lifetime passes
    code, out = _ended(_agent(plane, box, "join", *ca, "--state-dir", str(second), token=expired))
    assert code == 3, out
    assert "expired" in out

    # a workspace user may not join machines to the operator's shared pool
    theirs = plane.levers9("machine", "create", "--pool", "box", "--name", "three")
    assert theirs.returncode == 1
    assert "box" in theirs.stderr
    assert "operator" in theirs.stderr, theirs.stderr

    # the removed machine's agent removes its own worker containers, and only those, before it exits 3
    [one] = [m for m in plane.machines() if m["name"] == "one"]
    mine = _labelled_container(box.dockerd, tiny_image, "mach_e2e_mine", one["id"])
    other = _labelled_container(box.dockerd, tiny_image, "mach_e2e_other", "agt_someone_else")
    removed = plane.operator("machine", "remove", "one", "--yes")
    assert removed.returncode == 0, removed.stderr
    code, out = _ended(_agent(plane, box, "run", "--state-dir", str(first)))
    assert code == 3, out
    assert "this machine was removed" in out
    names = {c["name"] for c in box.dockerd.containers()}
    assert mine not in names, names
    assert other in names, names
    box.dockerd.cli("rm", "-f", other)


def _labelled_container(dockerd: Dockerd, image: str, machine_id: str, agent_id: str) -> str:
    name = f"l9w-{machine_id}"
    dockerd.cli(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        "--label",
        f"{LABEL_MACHINE}={machine_id}",
        "--label",
        f"{LABEL_POOL}=box",
        "--label",
        f"{LABEL_AGENT}={agent_id}",
        image,
        "sleep",
        "600",
    )
    return name


def test_the_agent_starts_no_worker_that_would_dial_in_plain_text(dockerd: Dockerd, tiny_image: str) -> None:
    def order(machine_id: str, url: str) -> dict[str, Any]:
        return {
            "machine_id": machine_id,
            "pool": "box",
            "workspace": None,
            "image": tiny_image,
            "command": ["sleep", "600"],
            "env": {"LEVERS9_CONTROLPLANE_URL": url},
            "secret_env": {},
            "cpu_millicores": 0,
            "memory_mib": 0,
            "gpu": None,
            "gpu_count": 0,
            "network_mode": "none",
            "gpu_runtime": None,
        }

    strict = DockerWorkers("agt_tls_only", docker_host=dockerd.host, stop_grace_s=0)
    loose = DockerWorkers("agt_insecure", docker_host=dockerd.host, stop_grace_s=0, insecure=True)
    try:
        for url in ("grpc://127.0.0.1:1993", "127.0.0.1:1993"):
            with pytest.raises(OrderRefused, match="over TLS only") as refused:
                strict.provision(order("mach_plain", url))
            assert refused.value.kind == "invalid_request"
        assert not [c for c in dockerd.containers() if c["name"] == "l9w-mach_plain"]
        started: Callable[[str], bool] = lambda name: any(c["name"] == name for c in dockerd.containers())  # noqa: E731
        assert strict.provision(order("mach_tls", "grpcs://127.0.0.1:1993"))["name"] == "l9w-mach_tls"
        assert loose.provision(order("mach_dev", "grpc://127.0.0.1:1993"))["name"] == "l9w-mach_dev"
        assert started("l9w-mach_tls")
        assert started("l9w-mach_dev")
    finally:
        strict.terminate({"machine_id": "mach_tls"})
        loose.terminate({"machine_id": "mach_dev"})
        strict.close()
        loose.close()
