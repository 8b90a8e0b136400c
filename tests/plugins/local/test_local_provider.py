"""The local provider's hooks, against real processes: a fake worker script stands in for ``levers9 worker``.

What matters about a local worker is what an operator would check with ``ps``
and ``/proc``: it runs detached in its own session, is not the controlplane's
child, carries its identity in its environment and not its argv, is found
again by a controlplane that was killed and restarted, stops when terminated
(by SIGKILL if it must), and a pid that now belongs to someone else is never
touched.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from levers9.discovery import nvidia_smi
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginSet
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import Availability, GpuDevice, Machine, MachineState, Pool
from levers9.worker_variables import WORKER_VARIABLES
from levers9_local.processes import boot_id, read_stat
from levers9_local.provider import LOG_RETENTION_S, LocalProvider, default_state_dir
from tests.plugins.local.conftest import TOKEN_PREFIX, Workers, alive, known, wait_for


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().split("=", 1) for entry in raw.split(b"\0") if entry)


def worker_pid(workers: Workers, machine_id: str | None) -> int:
    return int((workers.out / f"{machine_id}.ready").read_text())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- provisioning


def test_provision_starts_a_detached_worker_that_gets_everything_through_its_environment(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the controlplane's own settings are not the worker's; the host-wide worker ones are
    monkeypatch.setenv("LEVERS9_CONFIG", "/etc/levers9/test.yaml")
    monkeypatch.setenv("LEVERS9_SECRET_KEY", "controlplane-secret-key")
    monkeypatch.setenv("LEVERS9_PLUGINS_BLOCK", "ec2")
    # An inheritable descriptor of the controlplane (a listening socket, say) must not reach the worker.
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    pool = workers.pool()
    request = workers.request(pool)
    try:
        machine = workers.provider.levers9_provision(request)
    finally:
        os.close(read_end)
        os.close(write_end)
    workers.started.append((pool, machine.provider_id))
    assert machine.provider_id == request.machine_id
    assert machine.machine_id == request.machine_id
    assert machine.pool == pool.name
    assert machine.state is MachineState.RUNNING
    assert machine.created_at is not None
    wait_for("the worker is ready", lambda: workers.ready(machine).exists())
    pid = worker_pid(workers, machine.machine_id)
    assert machine.labels["pid"] == str(pid)

    proc = read_stat(pid)
    assert proc is not None
    assert proc.session == proc.pgrp == pid, "the worker must lead its own session and process group"
    assert proc.ppid != os.getpid(), "the worker must not be the controlplane's child (it would become its zombie)"

    env = environ(pid)
    assert env["LEVERS9_CONTROLPLANE_URL"] == "grpc://127.0.0.1:1993"
    # the token is never in the worker's environment (its calls could read that): a 0600 file names it
    assert "LEVERS9_TOKEN" not in env
    token = request.bootstrap.token
    assert token not in "".join(env.values())
    token_file = Path(env["LEVERS9_TOKEN_FILE"])
    assert mode(token_file) == 0o600
    assert token_file.read_text() == token
    assert env["LEVERS9_MACHINE_ID"] == request.machine_id
    assert env["LEVERS9_POOL"] == pool.name
    assert env["LEVERS9_CPU_MILLICORES"] == "1500"
    assert env["LEVERS9_MEMORY_MIB"] == "3072"
    assert env["LEVERS9_GPU_COUNT"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["LEVERS9_DISCONNECT_EXIT_S"] == "120"
    assert env["LEVERS9_WORKER_STATE_DIR"] == str(workers.state_dir / pool.name / f"{request.machine_id}.worker")
    assert env["LEVERS9_STOP_GRACE_S"] == "10.0"
    assert "LEVERS9_CONFIG" not in env
    assert "LEVERS9_SECRET_KEY" not in env
    assert env["LEVERS9_PLUGINS_BLOCK"] == "ec2"
    # the worker reads every LEVERS9_* variable it is given: none is a provider's invention
    assert {key for key in env if key.startswith("LEVERS9_")} <= set(WORKER_VARIABLES)
    assert env["PATH"] == os.environ["PATH"]

    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert TOKEN_PREFIX.encode() not in cmdline
    assert cmdline.split(b"\0")[:2] == [sys.executable.encode(), str(Path(workers.command()[1])).encode()]

    pool_dir = workers.state_dir / pool.name
    log = pool_dir / f"{request.machine_id}.log"
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(log)
    assert os.readlink(f"/proc/{pid}/fd/2") == str(log)
    assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]

    record_path = pool_dir / f"{request.machine_id}.json"
    record = json.loads(record_path.read_text())
    assert record["pid"] == record["pgid"] == pid
    assert record["start_time"] == proc.start_time
    assert record["boot_id"] == boot_id()
    assert record["pool"] == pool.name
    assert record["gpu_indices"] == []
    assert record["created_at"]
    wait_for("the worker's output reaches its log", lambda: f"running as pid {pid}" in log.read_text())
    for path in (record_path, log):
        assert token not in path.read_text(), f"the token leaked into {path.name}"
        assert mode(path) == 0o600
    assert mode(pool_dir) == 0o700
    assert mode(workers.state_dir) == 0o700


def test_provisioning_the_same_machine_id_twice_starts_one_worker(workers: Workers) -> None:
    pool = workers.pool()
    first = workers.provision(pool, machine_id="m-retried")
    again = workers.provider.levers9_provision(workers.request(pool, machine_id="m-retried"))
    assert again.labels["pid"] == first.labels["pid"]
    assert len(workers.provider.levers9_list_machines(pool)) == 1


def test_a_worker_command_that_cannot_run_is_an_invalid_request(workers: Workers) -> None:
    pool = workers.pool(worker_command=[str(workers.tmp / "no-such-levers9")])
    with pytest.raises(InvalidRequest, match="no-such-levers9") as caught:
        workers.provider.levers9_provision(workers.request(pool, machine_id="m-broken"))
    assert caught.value.code == "worker-command"
    assert not (workers.state_dir / pool.name / "m-broken.json").exists()
    assert workers.provider.levers9_list_machines(pool) == []


def test_a_machine_id_that_is_not_a_file_name_is_refused(workers: Workers) -> None:
    with pytest.raises(InvalidRequest):
        workers.provider.levers9_provision(workers.request(workers.pool(), machine_id="../escape"))


def test_state_dir_defaults_to_the_xdg_state_directory(
    workers: Workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "levers9" / "local"
    pool = Pool(
        name="xdg-pool",
        provider="local",
        runtime="process",
        settings={"worker_command": workers.command()},
    )
    machine = workers.provision(pool)
    assert (tmp_path / "xdg" / "levers9" / "local" / "xdg-pool" / f"{machine.machine_id}.json").exists()
    workers.provider.levers9_terminate(pool, machine)  # while the default still points there

    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "levers9" / "local"


# --------------------------------------------------------------------------- listing and terminating


def test_listed_then_terminated_with_sigterm(workers: Workers) -> None:
    pool = workers.pool()
    machine = workers.provision(pool)
    pid = worker_pid(workers, machine.machine_id)

    [listed] = workers.provider.levers9_list_machines(pool)
    assert listed.provider_id == machine.provider_id
    assert listed.machine_id == machine.machine_id
    assert listed.state is MachineState.RUNNING
    assert listed.created_at == machine.created_at
    assert workers.provider.levers9_list_machines(workers.pool("other-pool")) == []

    workers.provider.levers9_terminate(pool, machine)
    assert not alive(pid)
    assert workers.events(machine) == [f"TERM {pid}"], "the worker must be asked with SIGTERM first"
    assert workers.provider.levers9_list_machines(pool) == []
    pool_dir = workers.state_dir / pool.name
    assert not (pool_dir / f"{machine.machine_id}.json").exists()
    assert (pool_dir / f"{machine.machine_id}.log").exists(), "the log is kept after terminate"


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(workers: Workers) -> None:
    pool = workers.pool(mode="ignore", stop_grace_s=0.5)
    machine = workers.provision(pool)
    pid = worker_pid(workers, machine.machine_id)
    started = time.monotonic()
    workers.provider.levers9_terminate(pool, machine)
    took = time.monotonic() - started
    assert not alive(pid)
    assert workers.events(machine) == [f"TERM {pid}"]
    assert 0.5 <= took < 5, f"terminate took {took:.2f} s with stop_grace_s 0.5"
    assert workers.provider.levers9_list_machines(pool) == []


def test_terminate_stops_what_the_worker_started_too(workers: Workers) -> None:
    pool = workers.pool(mode="child", stop_grace_s=0.5)
    machine = workers.provision(pool)
    pid = worker_pid(workers, machine.machine_id)
    child = int((workers.out / f"{machine.machine_id}.child").read_text())
    assert alive(child)
    workers.provider.levers9_terminate(pool, machine)
    assert not alive(pid)
    assert not alive(child), "a process the worker started and that ignores SIGTERM must be SIGKILLed"


def test_a_session_whose_worker_died_is_stopping_until_its_leftovers_are_terminated(workers: Workers) -> None:
    pool = workers.pool(mode="child", stop_grace_s=0.2)
    machine = workers.provision(pool)
    pid = worker_pid(workers, machine.machine_id)
    child = int((workers.out / f"{machine.machine_id}.child").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for("the worker is gone", lambda: not alive(pid))
    [listed] = workers.provider.levers9_list_machines(pool)
    assert listed.state is MachineState.STOPPING, "a leftover of the worker still runs"
    workers.provider.levers9_terminate(pool, machine)
    assert not alive(child)
    assert workers.provider.levers9_list_machines(pool) == []


def test_terminate_is_idempotent_and_unknown_machines_are_success(workers: Workers) -> None:
    pool = workers.pool()
    machine = workers.provision(pool)
    workers.provider.levers9_terminate(pool, machine)
    workers.provider.levers9_terminate(pool, machine)
    workers.provider.levers9_terminate(pool, known(pool, "m-never-existed"))
    workers.provider.levers9_terminate(pool, known(pool, "../../etc/passwd"))
    workers.provider.levers9_terminate(
        workers.pool("pool-without-a-directory"), known(workers.pool("pool-without-a-directory"), "m-never-existed")
    )


def test_a_worker_that_died_is_listed_failed_in_its_logs_words_until_terminated(workers: Workers) -> None:
    pool = workers.pool("t4-fail", mode="fail", gpu="T4", gpu_count=1, visible_gpus=[0])
    machine = workers.provision(pool, ready=False)
    pool_dir = workers.state_dir / pool.name
    wait_for("the worker exits", lambda: workers.provider.levers9_list_machines(pool)[0].state is MachineState.FAILED)
    [listed] = workers.provider.levers9_list_machines(pool)
    assert listed.machine_id == machine.machine_id
    assert listed.reason == (
        "the worker exited: levers9 worker: the controlplane refused this worker: the join token was already used"
    )
    assert not (pool_dir / f"{machine.machine_id}.token").exists(), "its unread token is removed at once"
    # a failed worker holds no GPU: the only visible one can be given again
    replacement = workers.provision(pool, ready=False)
    assert replacement.gpu_count == 1

    workers.provider.levers9_terminate(pool, machine)
    assert machine.machine_id not in {m.machine_id for m in workers.provider.levers9_list_machines(pool)}
    assert not (pool_dir / f"{machine.machine_id}.json").exists()
    assert (pool_dir / f"{machine.machine_id}.log").exists(), "the log is kept after terminate"


def test_a_worker_killed_without_a_word_is_failed_with_its_last_line(workers: Workers) -> None:
    pool = workers.pool()
    machine = workers.provision(pool)
    pid = worker_pid(workers, machine.machine_id)
    os.kill(pid, signal.SIGKILL)
    wait_for("the worker is gone", lambda: not alive(pid))
    [listed] = workers.provider.levers9_list_machines(pool)
    assert listed.state is MachineState.FAILED
    assert listed.reason == f"the worker exited: fake worker {machine.machine_id} running as pid {pid}"
    workers.provider.levers9_terminate(pool, machine)
    assert workers.provider.levers9_list_machines(pool) == []


def test_a_reused_pid_is_neither_listed_nor_signalled(workers: Workers) -> None:
    # An unrelated process that even leads its own session, like a worker; only its start time differs.
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        real = read_stat(unrelated.pid)
        assert real is not None
        pool = workers.pool(stop_grace_s=0.2)
        pool_dir = workers.state_dir / pool.name
        pool_dir.mkdir(parents=True)

        def fake_record(machine_id: str, start_time: int, boot: str) -> None:
            record = {
                "machine_id": machine_id,
                "pool": pool.name,
                "pid": unrelated.pid,
                "pgid": unrelated.pid,
                "start_time": start_time,
                "boot_id": boot,
                "created_at": "2024-01-01T00:00:00Z",
                "command": ["levers9", "worker"],
                "log": str(pool_dir / f"{machine_id}.log"),
            }
            (pool_dir / f"{machine_id}.json").write_text(json.dumps(record))

        fake_record("m-reused", real.start_time - 1, boot_id())
        fake_record("m-other-boot", real.start_time, "00000000-0000-0000-0000-000000000000")
        listed = workers.provider.levers9_list_machines(pool)
        assert {m.machine_id: m.state for m in listed} == {
            "m-reused": MachineState.FAILED,
            "m-other-boot": MachineState.FAILED,
        }, "the recorded workers are gone: the process holding the pid is not theirs"

        workers.provider.levers9_terminate(pool, known(pool, "m-reused"))
        workers.provider.levers9_terminate(pool, known(pool, "m-other-boot"))
        time.sleep(0.3)
        assert unrelated.poll() is None, "terminate signalled a process that merely has the recorded pid"
        assert alive(unrelated.pid)
        assert not list(pool_dir.glob("*.json")), "terminate removes the records of processes that are gone"
        assert workers.provider.levers9_list_machines(pool) == []
    finally:
        unrelated.kill()
        unrelated.wait()


def test_a_new_controlplane_finds_the_workers_a_killed_one_started(workers: Workers) -> None:
    pool = workers.pool(mode="exit")
    settings = pool.settings.model_dump(mode="json")
    controlplane = textwrap.dedent(
        """
        import json, sys, time
        from levers9.hooks.types import Pool, ProvisionRequest, Resources, WorkerBootstrap
        from levers9_local import LocalProvider, LocalSettings

        pool = Pool(name=sys.argv[1], provider="local", runtime="process", settings=LocalSettings(**json.loads(sys.argv[2])))
        provider = LocalProvider()
        if sys.argv[3] == "provision":
            ids = []
            for n in range(2):
                machine_id = f"m-restart-{n}"
                bootstrap = WorkerBootstrap(controlplane_url="grpc://x", token="t", machine_id=machine_id,
                                            pool=pool.name, levers9_version="0")
                request = ProvisionRequest(pool=pool, resources=Resources(), machine_id=machine_id, bootstrap=bootstrap)
                ids.append(provider.levers9_provision(request).provider_id)
            print(json.dumps(ids), flush=True)
            time.sleep(120)
        else:
            print(json.dumps(sorted(m.machine_id for m in provider.levers9_list_machines(pool))), flush=True)
        """
    )
    first = subprocess.Popen(
        [sys.executable, "-c", controlplane, pool.name, json.dumps(settings), "provision"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        ids = json.loads(first.stdout.readline())
    finally:
        first.kill()  # SIGKILL: the controlplane gets no chance to clean anything up
        first.wait()
    workers.started.extend((pool, provider_id) for provider_id in ids)
    assert ids == ["m-restart-0", "m-restart-1"]
    for machine_id in ids:
        wait_for(f"worker {machine_id} ready", (workers.out / f"{machine_id}.ready").exists)
        pid = worker_pid(workers, machine_id)
        assert alive(pid), "a worker must outlive the controlplane that started it"
        proc = read_stat(pid)
        assert proc is not None
        assert proc.ppid != first.pid

    # A fresh provider instance in this process, and a fresh process, both find them.
    assert sorted(m.machine_id or "" for m in LocalProvider().levers9_list_machines(pool)) == ids
    second = subprocess.run(
        [sys.executable, "-c", controlplane, pool.name, json.dumps(settings), "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(second.stdout) == ids

    for machine_id in ids:
        LocalProvider().levers9_terminate(pool, known(pool, machine_id))
    assert LocalProvider().levers9_list_machines(pool) == []


def test_logs_of_workers_long_gone_are_pruned_when_the_pool_is_listed(workers: Workers) -> None:
    pool = workers.pool()
    pool_dir = workers.state_dir / pool.name
    pool_dir.mkdir(parents=True)
    old = pool_dir / "m-old.log"
    recent = pool_dir / "m-recent.log"
    for path in (old, recent):
        path.write_text("worker output\n")
    stale = time.time() - LOG_RETENTION_S - 60
    os.utime(old, (stale, stale))
    workers.provider.levers9_list_machines(pool)
    assert not old.exists()
    assert recent.exists()


# --------------------------------------------------------------------------- GPUs


def test_each_gpu_goes_to_one_live_worker(workers: Workers) -> None:
    pool = workers.pool("t4-pool", gpu="T4", gpu_count=1, visible_gpus=[0, 1])
    first = workers.provision(pool)
    second = workers.provision(pool)
    devices = {environ(worker_pid(workers, machine.machine_id))["CUDA_VISIBLE_DEVICES"] for machine in (first, second)}
    assert devices == {"0", "1"}
    assert environ(worker_pid(workers, first.machine_id))["LEVERS9_GPU_COUNT"] == "1"
    assert (first.gpu, first.gpu_count) == ("T4", 1)

    with pytest.raises(InsufficientCapacity) as caught:
        workers.provider.levers9_provision(workers.request(pool))
    assert caught.value.code == "gpus-taken"
    # GPUs belong to the host: another pool on the same state dir cannot have them either.
    other = workers.pool("t4-other", gpu="T4", gpu_count=1, visible_gpus=[0, 1])
    with pytest.raises(InsufficientCapacity):
        workers.provider.levers9_provision(workers.request(other))

    listed = {m.machine_id: m for m in workers.provider.levers9_list_machines(pool)}
    assert listed[first.machine_id].gpu_count == 1

    freed = environ(worker_pid(workers, first.machine_id))["CUDA_VISIBLE_DEVICES"]
    workers.provider.levers9_terminate(pool, first)
    third = workers.provision(pool)
    assert environ(worker_pid(workers, third.machine_id))["CUDA_VISIBLE_DEVICES"] == freed


def test_concurrent_provisions_never_share_a_gpu(workers: Workers) -> None:
    # The core calls hooks from a thread pool; the record lock must hold between threads of one process too.
    pool = workers.pool("t4-race", gpu="T4", gpu_count=1, visible_gpus=[0, 1])

    def attempt(_: int) -> Machine | InsufficientCapacity:
        try:
            return workers.provision(pool)
        except InsufficientCapacity as exc:
            return exc

    with ThreadPoolExecutor(max_workers=6) as pool_of_threads:
        results = list(pool_of_threads.map(attempt, range(6)))
    machines = [result for result in results if isinstance(result, Machine)]
    assert len(machines) == 2
    assert sum(isinstance(result, InsufficientCapacity) for result in results) == 4
    devices = {environ(worker_pid(workers, machine.machine_id))["CUDA_VISIBLE_DEVICES"] for machine in machines}
    assert devices == {"0", "1"}


def test_a_worker_can_get_several_gpus(workers: Workers) -> None:
    pool = workers.pool("t4-pair", gpu="T4", gpu_count=2, visible_gpus=[1, 3])
    machine = workers.provision(pool)
    env = environ(worker_pid(workers, machine.machine_id))
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["LEVERS9_GPU_COUNT"] == "2"


def test_more_gpus_than_the_host_has_is_insufficient_capacity(workers: Workers) -> None:
    pool = workers.pool("t4-many", gpu="T4", gpu_count=4, visible_gpus=[0, 1])
    with pytest.raises(InsufficientCapacity) as caught:
        workers.provider.levers9_provision(workers.request(pool))
    assert caught.value.code == "too-few-gpus"
    # An index discovery does not find is never handed out.
    missing = workers.pool("t4-missing", gpu="T4", gpu_count=1, visible_gpus=[7])
    with pytest.raises(InsufficientCapacity):
        workers.provider.levers9_provision(workers.request(missing))
    h100 = workers.pool("h100", gpu="H100", gpu_count=1)
    with pytest.raises(InsufficientCapacity):
        workers.provider.levers9_provision(workers.request(h100))


def test_gpu_offers_are_this_hosts_gpus_of_the_pools_type(workers: Workers) -> None:
    pool = workers.pool("t4-offers", gpu="T4", gpu_count=1, visible_gpus=[0, 1])
    [offer] = workers.provider.levers9_gpu_offers(pool)
    assert (offer.gpu, offer.gpu_count, offer.gpu_memory_mib) == ("T4", 1, 15360)
    assert offer.availability is Availability.AVAILABLE
    workers.provision(pool)
    workers.provision(pool)
    [offer] = workers.provider.levers9_gpu_offers(pool)
    assert offer.availability is Availability.UNAVAILABLE, "both visible GPUs are taken"

    assert workers.provider.levers9_gpu_offers(workers.pool("h100-offers", gpu="H100", gpu_count=1)) == []
    assert workers.provider.levers9_gpu_offers(workers.pool("t4-eight", gpu="T4", gpu_count=8)) == []
    [four] = workers.provider.levers9_gpu_offers(workers.pool("t4-four", gpu="T4", gpu_count=4))
    assert four.gpu_count == 4


def test_a_cpu_pool_neither_offers_nor_asks_for_gpus(workers: Workers) -> None:
    def broken() -> list[GpuDevice]:
        raise AssertionError("a CPU pool must not run GPU discovery")

    provider = LocalProvider(discover=broken)
    workers.provider = provider
    pool = workers.pool()
    assert provider.levers9_gpu_offers(pool) == []
    workers.provision(pool)


def test_gpu_discovery_failing_is_insufficient_capacity(workers: Workers) -> None:
    def failing() -> list[GpuDevice]:
        raise RuntimeError("nvidia-smi exited with status 9: driver not loaded")

    workers.provider = LocalProvider(discover=failing)
    with pytest.raises(InsufficientCapacity, match="driver not loaded"):
        workers.provider.levers9_provision(workers.request(workers.pool("t4", gpu="T4", gpu_count=1)))


def test_discovery_goes_through_the_facade_to_the_hosts_nvidia_smi(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A started provider asks every GPU discovery plugin through the facade, never the nvidia_smi module."""
    smi = workers.tmp / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, GPU-a, Tesla T4, 15360\\n1, GPU-b, NVIDIA H100 80GB HBM3, 81559\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("LEVERS9_NVIDIA_SMI", str(smi))
    provider = LocalProvider()
    plugins = PluginSet()
    plugins.add("nvidia_smi", nvidia_smi)
    plugins.add("local", provider)
    hooks = Hooks(plugins)
    asyncio.run(hooks.startup())
    try:
        workers.provider = provider
        pool = workers.pool("h100-smi", gpu="H100", gpu_count=1)
        # the hook runs on its plugin's thread, as the facade runs it, with no event loop running here
        [offer] = asyncio.run(hooks.gpu_offers(pool))
        assert (offer.gpu, offer.gpu_memory_mib) == ("H100", 81559)
        machine = workers.provision(pool)
        assert environ(worker_pid(workers, machine.machine_id))["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        asyncio.run(hooks.shutdown())


def test_discovery_failing_in_the_facade_reaches_the_provider(workers: Workers, tmp_path: Path) -> None:
    class BrokenDiscovery:
        @hookimpl
        def levers9_gpu_devices(self) -> list[GpuDevice]:
            raise RuntimeError("driver not loaded")

    provider = LocalProvider()
    plugins = PluginSet()
    plugins.add("broken_gpus", BrokenDiscovery())
    plugins.add("local", provider)
    hooks = Hooks(plugins)
    asyncio.run(hooks.startup())
    try:
        workers.provider = provider
        result = asyncio.run(hooks.check(workers.pool("t4", gpu="T4", gpu_count=1)))
        assert result is not None
        assert not result.ok
        assert "plugin 'broken_gpus', hook levers9_gpu_devices: raised RuntimeError: driver not loaded" in (
            result.message
        )
    finally:
        asyncio.run(hooks.shutdown())


def test_an_unstarted_provider_says_it_cannot_list_gpus(workers: Workers) -> None:
    workers.provider = LocalProvider()
    with pytest.raises(InsufficientCapacity, match="was not started: GPU discovery goes through the plugin manager"):
        workers.provider.levers9_provision(workers.request(workers.pool("t4", gpu="T4", gpu_count=1)))


# --------------------------------------------------------------------------- levers9 check


def test_check_says_what_this_host_lacks_for_the_pool(workers: Workers) -> None:
    good = workers.provider.levers9_check(workers.pool())
    assert good.ok, good.message
    assert f"state_dir {workers.state_dir} is writable" in good.message

    blocker = workers.tmp / "a-file"
    blocker.write_text("")
    unwritable = workers.provider.levers9_check(workers.pool(state_dir=blocker / "state"))
    assert not unwritable.ok
    assert f"state_dir {blocker / 'state'} is not writable" in unwritable.message
    assert unwritable.hint is not None

    missing = workers.provider.levers9_check(workers.pool(worker_command=["no-such-levers9-here", "worker"]))
    assert not missing.ok
    assert missing.message == "worker_command cannot be run: no-such-levers9-here is not an executable file on PATH"
    assert missing.hint is not None

    four = workers.provider.levers9_check(workers.pool("t4-check", gpu="T4", gpu_count=2))
    assert four.ok, four.message
    assert four.message.endswith("4 T4 GPU(s) usable")
    few = workers.provider.levers9_check(workers.pool("t4-few", gpu="T4", gpu_count=2, visible_gpus=[3]))
    assert not few.ok
    assert few.message == "this host has 1 usable T4 GPU(s); a worker needs 2"
    none = workers.provider.levers9_check(workers.pool("h100-check", gpu="H100", gpu_count=1))
    assert not none.ok
    assert none.message == "this host has 0 usable H100 GPU(s); a worker needs 1"


def test_check_reports_gpu_discovery_failing(workers: Workers) -> None:
    def failing() -> list[GpuDevice]:
        raise RuntimeError("nvidia-smi exited with status 9: driver not loaded")

    workers.provider = LocalProvider(discover=failing)
    result = workers.provider.levers9_check(workers.pool("t4", gpu="T4", gpu_count=1))
    assert not result.ok
    assert "driver not loaded" in result.message
    assert workers.provider.levers9_check(workers.pool()).ok, "a CPU pool runs no GPU discovery"
