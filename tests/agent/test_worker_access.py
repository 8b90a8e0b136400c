"""What the agent gives a worker container by runtime: nothing more for ``process``, what runc needs for runc and gVisor.

Real containers on the session's private dockerd (tests/fixtures/dockerd.py), of the tiny image: the
options are Docker's to check, and the containers here only sleep. That a worker in such a container
runs runc containers is tests/e2e/test_agent_blueprints.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from levers9 import worker_container
from levers9.agent.docker_workers import LABEL_MACHINE, DockerWorkers, OrderRefused
from levers9.engine.node import NETWORK_STATE
from tests.fixtures.dockerd import Dockerd


def order(machine_id: str, image: str, **fields: Any) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "pool": "box",
        "workspace": None,
        "image": image,
        "command": ["sleep", "600"],
        "env": {"LEVERS9_WORKER_STATE_DIR": "/elsewhere"},
        "secret_env": {},
        "cpu_millicores": 0,
        "memory_mib": 0,
        "gpu": None,
        "gpu_count": 0,
        "network_mode": "host",
        "gpu_runtime": None,
    } | fields


@pytest.fixture
def workers(dockerd: Dockerd) -> Iterator[DockerWorkers]:
    made = DockerWorkers("agt_access", docker_host=dockerd.host, stop_grace_s=0, insecure=True)
    try:
        yield made
    finally:
        made.remove_mine()
        made.close()


def _inspect(dockerd: Dockerd, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(dockerd.cli("inspect", name).stdout)[0]
    return found


def _volumes(dockerd: Dockerd) -> list[str]:
    return [v for v in dockerd.cli("volume", "ls", "--format", "{{.Name}}").stdout.split() if v.startswith("l9w-")]


def test_a_process_worker_gets_nothing_more(dockerd: Dockerd, tiny_image: str, workers: DockerWorkers) -> None:
    workers.provision(order("mach_proc", tiny_image, runtime="process"))
    host = _inspect(dockerd, "l9w-mach_proc")["HostConfig"]
    assert (host["CapAdd"], host["SecurityOpt"], host.get("Init"), host["Privileged"]) == (None, None, None, False)
    assert host["MaskedPaths"], "Docker's masked paths are kept"
    assert not host["Binds"]
    assert _volumes(dockerd) == []
    env = _inspect(dockerd, "l9w-mach_proc")["Config"]["Env"]
    assert "LEVERS9_WORKER_STATE_DIR=/elsewhere" in env  # the order's, untouched
    # an order from before runtimes were named is a process worker's
    workers.provision({k: v for k, v in order("mach_old", tiny_image).items()})
    assert _inspect(dockerd, "l9w-mach_old")["HostConfig"]["CapAdd"] is None


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_an_oci_worker_gets_what_runc_needs_and_its_volume_goes_with_it(
    dockerd: Dockerd, tiny_image: str, workers: DockerWorkers, runtime: str
) -> None:
    workers.provision(order("mach_oci", tiny_image, runtime=runtime))
    inspected = _inspect(dockerd, "l9w-mach_oci")
    host = inspected["HostConfig"]
    assert sorted(host["CapAdd"]) == ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"]
    assert sorted(host["SecurityOpt"]) == ["apparmor=unconfined", "seccomp=unconfined"]
    assert (host["MaskedPaths"], host["ReadonlyPaths"]) == ([], [])
    assert (host["NetworkMode"], host["CgroupnsMode"], host["Init"], host["Privileged"]) == (
        "host",
        "host",
        True,
        False,
    )
    assert sorted(host["Binds"]) == sorted(
        [
            "l9w-mach_oci-state:/var/lib/levers9:rw",
            "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "/run/levers9/network:/run/levers9/network:rw",
        ]
    )
    # FUSE, which its worker mounts volumes with
    devices = [(d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in host["Devices"]]
    assert devices == [("/dev/fuse", "/dev/fuse", "rwm")], host["Devices"]
    env = inspected["Config"]["Env"]
    assert "LEVERS9_WORKER_STATE_DIR=/var/lib/levers9/worker" in env  # the agent's, over the order's
    [volume] = json.loads(dockerd.cli("volume", "inspect", "l9w-mach_oci-state").stdout)
    assert volume["Labels"][LABEL_MACHINE] == "mach_oci"
    # /proc/sys is writable in it, as the engine's sysctls need; Docker's default keeps it read-only
    probe = dockerd.cli("exec", "l9w-mach_oci", "sh", "-c", "cat /proc/mounts", check=False)
    assert not any(line.split()[1] == "/proc/sys" for line in probe.stdout.splitlines()), probe.stdout

    workers.terminate({"machine_id": "mach_oci"})
    assert not [c for c in dockerd.containers() if c["name"] == "l9w-mach_oci"]
    assert _volumes(dockerd) == []
    # a volume left by a container removed some other way goes with the next terminate order
    dockerd.cli("volume", "create", "l9w-mach_gone-state")
    workers.terminate({"machine_id": "mach_gone"})
    assert _volumes(dockerd) == []


def test_a_device_the_machine_lacks_is_left_out_and_the_worker_starts(
    dockerd: Dockerd, tiny_image: str, workers: DockerWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker refuses a ``--device`` that is not there; FUSE only mounts volumes, so the worker starts without it."""
    from levers9.agent import runtime_access

    monkeypatch.setattr(runtime_access, "DEVICES", ("/dev/fuse", "/dev/l9-not-here"))
    workers.provision(order("mach_nodev", tiny_image, runtime="runc"))
    host = _inspect(dockerd, "l9w-mach_nodev")["HostConfig"]
    assert [d["PathOnHost"] for d in host["Devices"]] == ["/dev/fuse"], host["Devices"]
    assert _inspect(dockerd, "l9w-mach_nodev")["State"]["Running"]
    assert [c["name"] for c in dockerd.containers()].count("l9w-mach_nodev") == 1


def test_an_oci_worker_needs_the_hosts_network(dockerd: Dockerd, tiny_image: str, workers: DockerWorkers) -> None:
    for fields, named in [
        ({"runtime": "runc", "network_mode": "bridge"}, "docker_network_mode: host"),
        ({"runtime": "gvisor", "network_mode": "l9net"}, "docker_network_mode: host"),
        ({"runtime": "run c"}, "runtime"),
    ]:
        with pytest.raises(OrderRefused, match=named) as refused:
            workers.provision(order("mach_bad", tiny_image, **fields))
        assert refused.value.kind == "invalid_request"
    assert not [c for c in dockerd.containers() if c["name"] == "l9w-mach_bad"]
    assert _volumes(dockerd) == []


def test_the_worker_container_names_what_the_engine_names() -> None:
    # levers9.worker_container may not import the engine (docs/architecture.md §4): the path is written twice
    # and must agree (the runtimes' list has one definition, which the agent and the providers import)
    assert str(NETWORK_STATE) == worker_container.NETWORK_STATE
