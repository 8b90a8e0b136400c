"""levers9.testing.FakeCloud: instances with states and faults, safe across threads, and a booter source as it is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.testing import CloudBooter, FakeCloud, FakeCloudError, nvidia_smi

SCRIPT = """#!/bin/sh
nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits > "$LEVERS9_BOOT_ROOT/gpus"
exec sleep 600
"""


def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _shown(booter: CloudBooter, instance_id: str) -> str:
    boot = booter.boots.get(instance_id)
    try:
        return (boot.root / "gpus").read_text() if boot is not None else ""
    except FileNotFoundError:
        return ""


def test_instances_have_ids_states_zones_user_data_and_tags() -> None:
    cloud = FakeCloud(prefix="vm-")
    first = cloud.create(user_data="#!/bin/sh\n", tags={"levers9:pool": "p"}, region="r-1", zone="r-1b", gpu="L4")
    second = cloud.create(instance_type="cpu.small")
    assert first.id != second.id
    assert first.id.startswith("vm-")
    assert (first.state, first.running, first.gone) == ("running", True, False)
    assert (first.zone, first.region, first.tags) == ("r-1b", "r-1", {"levers9:pool": "p"})
    assert first.gpu_count == 0  # a GPU type with no count is no GPU
    tagged = cloud.tag(second.id, {"levers9:machine-id": "m-2"})
    assert tagged.tags == {"levers9:machine-id": "m-2"}
    assert second.tags == {}  # what a caller held is a snapshot
    assert [i.id for i in cloud.instances()] == [first.id, second.id]

    cloud.terminate(first.id)
    cloud.terminate(first.id)  # idempotent
    assert cloud.get(first.id).state == "terminated"
    assert [i.id for i in cloud.live()] == [second.id]
    assert cloud.calls("terminate") == 2
    with pytest.raises(FakeCloudError, match=r"^not-found: no instance vm-nope") as error:
        cloud.terminate("vm-nope")
    assert error.value.code == "not-found"


def test_pending_instances_start_and_the_cloud_preempts_and_fails_them() -> None:
    cloud = FakeCloud(boot=False)
    a, b = cloud.create(), cloud.create()
    assert (a.state, a.running) == ("pending", False)
    assert cloud.start(a.id).running
    preempted = cloud.preempt(a.id)
    assert (preempted.state, preempted.gone, preempted.reason) == (
        "preempted",
        True,
        "the spot price rose above the bid",
    )
    assert cloud.terminate(a.id).state == "preempted"  # terminating what the cloud took back changes nothing
    assert cloud.fail(b.id, "disk lost").reason == "disk lost"
    assert cloud.live() == []
    with pytest.raises(ValueError, match="state 'sleeping': an instance is one of pending, running, stopping"):
        cloud.set_state(b.id, "sleeping")


def test_a_create_that_fails_after_creating_leaves_the_instance_running() -> None:
    cloud = FakeCloud()
    cloud.fail_next("create", code="RequestTimeout", message="the answer was lost", after=True)
    with pytest.raises(FakeCloudError, match=r"^RequestTimeout: the answer was lost$"):
        cloud.create(tags={"levers9:machine-id": "m-1"})
    [left] = cloud.live()  # what a provider must find and terminate
    assert left.tags == {"levers9:machine-id": "m-1"}
    assert cloud.create().running  # the fault fired once

    cloud.fail_next("create", code="InsufficientCapacity")
    with pytest.raises(FakeCloudError, match=r"^InsufficientCapacity"):
        cloud.create()
    assert len(cloud.instances()) == 2  # refused before creating: nothing new
    cloud.fail_next("tag", code="Throttled")
    with pytest.raises(FakeCloudError, match=r"^Throttled"):
        cloud.tag(left.id, {"a": "b"})
    assert cloud.get(left.id).tags == {"levers9:machine-id": "m-1"}
    assert cloud.calls("create") == 3
    with pytest.raises(ValueError, match="operation 'reboot': faults can be injected into create, start, tag"):
        cloud.fail_next("reboot")  # type: ignore[arg-type]


def test_threads_creating_at_once_get_distinct_instances() -> None:
    cloud = FakeCloud()
    made: list[str] = []
    lock = threading.Lock()

    def create_many() -> None:
        for _ in range(50):
            instance = cloud.create()
            with lock:
                made.append(instance.id)

    threads = [threading.Thread(target=create_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == len(made) == 400
    assert {i.id for i in cloud.instances()} == set(made)


def test_the_booter_boots_its_instances_with_their_gpus_and_stops_the_preempted(tmp_path: Path) -> None:
    cloud = FakeCloud()
    gpu_machine = cloud.create(user_data=SCRIPT, gpu="H100", gpu_count=2)
    with CloudBooter([cloud.instances], ports=[], root=tmp_path) as booter:
        _until(lambda: _shown(booter, gpu_machine.id).endswith("\n"), "the machine to boot and run nvidia-smi")
        shown = _shown(booter, gpu_machine.id)
        assert shown == nvidia_smi("H100", 2, machine=gpu_machine.id)
        assert [d.gpu for d in parse_query_gpu(shown)] == ["H100", "H100"]
        cloud.preempt(gpu_machine.id)
        _until(lambda: gpu_machine.id in booter.stopped, "the preempted instance's boot to stop")
        assert booter.alive() == []
