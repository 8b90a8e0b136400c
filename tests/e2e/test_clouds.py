"""Three clouds behind one ``levers9 server``: a call fails over from EC2 and OCI to Lambda, and nothing is left.

Every cloud is a fake at the wire, and the real plugin talks to it from the
server subprocess: EC2 is a real moto server behind the fault proxy
(:mod:`tests.fakes.ec2_cloud`), OCI and Lambda are the fake APIs of
:mod:`tests.fakes.oci_cloud` and :mod:`tests.fakes.lambda_cloud`. The
:class:`~levers9.testing.cloud_boot.CloudBooter` plays the clouds'
hypervisors: each instance a fake reports running gets an emulated first boot
of the user data the plugin gave it, in a network namespace that reaches only
the controlplane's gRPC port, with the GPUs its instance type has (recorded
``nvidia-smi`` output). So the worker that runs the call is a real ``levers9
worker`` started by the plugin's cloud-init, registering with the join token
the plugin passed, and nothing else.

The pools, and why they are these: the call asks ``gpu=["H100", "A100-80",
"cpu"]``, and the scheduler's ranking rule (``levers9.scheduler.candidates``)
tries every pool of the first GPU type before any pool of the next. So the two
clouds that must miss offer H100 (``ec2-h100``: InsufficientInstanceCapacity
in every zone; ``oci-h100``: Out of host capacity) and the one that has room
offers the next type (``lambda-a100``). A Lambda H100 pool with room would
take the call before any A100 pool is asked, which is what the user asked for.

What is checked: the call's result; its placement history names each EC2
offer's miss with ``InsufficientInstanceCapacity``, the OCI miss with its
code, and the placement on ``lambda-a100``; each EC2 offer was asked once (the
launch is not retried by the SDK); Lambda's first launch answered 429 and was
retried on the same pool, not failed over; the idle Lambda machine is
terminated in the fake after the pool's ``idle_timeout_s``; an instance tagged
for a pool that levers9 has no record of is terminated by the reconciler; at
the end no fake holds a live instance; an EC2 machine's join token, copied from
its user data and shown by a worker on another instance (with that instance's
genuine signed identity document, from :mod:`tests.fakes.imds`), is refused
and stays unspent, and the machine's own worker then joins with it. The failover figures (each hop, and
request to registered worker) are printed for the closing note and measured by
``bench/clouds.py``; no time is asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from levers9.testing.cloud_boot import BootTarget, CloudBooter
from tests.fakes import CloudInstance
from tests.fakes.ec2_cloud import FakeEc2
from tests.fakes.imds import FakeImds
from tests.fakes.lambda_cloud import DEFAULT_API_KEY, DEFAULT_SSH_KEY, LambdaCloud
from tests.fakes.oci_cloud import FakeOci
from tests.fakes.oci_tenancy import COMPARTMENT, IMAGE, SUBNET, TENANCY, make_credentials
from tests.fixtures.ec2_boot import imds
from tests.fixtures.replicas import Replicas
from tests.fixtures.wait import wait_for

pytestmark = pytest.mark.timeout(900)

GPU_DATA = Path(__file__).parents[1] / "data" / "gpu" / "nvidia_smi"
#: an Amazon Linux AMI moto knows in every region
AMI = "ami-999844e0"
H100_TYPE, OCI_H100_SHAPE, LAMBDA_A100_TYPE = "p5.48xlarge", "BM.GPU.H100.8", "gpu_8x_a100_80gb_sxm4"
LAMBDA_REGION = "us-east-1"

__all__ = ["imds"]


def _a100_80gb_8x() -> str:
    """Eight A100 80GB SXM4, as their ``nvidia-smi --query-gpu`` prints them: the recorded 40 GB machine's lines
    with the 80 GB card's name and size (NVIDIA A100-SXM4-80GB, 81920 MiB, what the driver reports for it)."""
    lines = (GPU_DATA / "a100_sxm4_40gb_8x.csv").read_text().splitlines()
    return "".join(
        line.replace("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB").replace(", 40960", ", 81920") + "\n"
        for line in lines
    )


HARDWARE = {
    H100_TYPE: (GPU_DATA / "h100_sxm_8x.csv").read_text(),
    OCI_H100_SHAPE: (GPU_DATA / "h100_sxm_8x.csv").read_text(),
    LAMBDA_A100_TYPE: _a100_80gb_8x(),
}

POOLS = """\
  ec2-h100:
    provider: ec2
    runtime: process
    workspace: default
    gpu: H100
    gpu_count: 8
    region: us-east-1
    max_workers: 1
    idle_timeout_s: 5
    settings:
      ami: {ami}
      endpoint_url: {ec2_url}
      access_key_id_env: L9_E2E_AWS_KEY_ID
      secret_access_key_env: L9_E2E_AWS_SECRET
  oci-h100:
    provider: oci
    runtime: process
    workspace: default
    gpu: H100
    gpu_count: 8
    region: us-ashburn-1
    max_workers: 1
    idle_timeout_s: 5
    settings:
      config_file: {oci_config}
      compartment_id: {compartment}
      subnet_id: {subnet}
      image_id: {image}
      service_endpoint: {oci_url}
  lambda-a100:
    provider: lambda_labs
    runtime: process
    workspace: default
    gpu: A100-80
    gpu_count: 8
    region: {lambda_region}
    max_workers: 1
    idle_timeout_s: 5
    settings:
      api_url: {lambda_url}
      api_key_env: L9_E2E_LAMBDA_KEY
      ssh_key_names: [{ssh_key}]
"""

PROGRAM = """
import levers9

@levers9.function(gpu=["H100", "A100-80", "cpu"], cpu=0.25)
def answer() -> int:
    return 42

print("RESULT", answer.remote(), flush=True)
"""


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[tuple[FakeEc2, FakeOci, LambdaCloud, Path]]:
    """The three fakes, started; each must hold no live instance when the test ends."""
    credentials = make_credentials(tmp_path)
    with FakeEc2() as ec2, FakeOci(compartments=(COMPARTMENT, TENANCY), images=(IMAGE,), subnets=(SUBNET,)) as oci:
        oci.add_key(credentials.key_id, credentials.private_key.public_key())
        with LambdaCloud(requests_per_s=None) as lam:
            yield ec2, oci, lam, credentials.config_file
            left = {
                "ec2": [i.id for i in ec2.instances() if not i.gone],
                "oci": [i.id for i in oci.instances() if not i.gone],
                "lambda": [i.id for i in lam.instances() if not i.gone],
            }
            ec2.terminate_all()
            oci.terminate_all()
            lam.terminate_all()
    assert not any(left.values()), f"instances left in the fakes after the test: {left}"


def test_a_call_fails_over_from_ec2_and_oci_to_lambda_and_every_instance_is_gone_at_the_end(
    replicas: Replicas, clouds: tuple[FakeEc2, FakeOci, LambdaCloud, Path]
) -> None:
    ec2, oci, lam, oci_config = clouds
    ec2.fail_run_instances("InsufficientInstanceCapacity", instance_type=H100_TYPE)
    oci.fail_launch(500, "InternalError", "Out of host capacity.", shape=OCI_H100_SHAPE)
    lam.set_capacity(LAMBDA_A100_TYPE, [LAMBDA_REGION])
    # the first launch is refused with 429: the core must retry Lambda, not fail over to the CPU fallback
    lam.fail_launch(429, "global/rate-limited", "Too many requests", times=1, retry_after=1)

    replicas.count = 1
    replicas.min_workers = 0
    replicas.pools = POOLS.format(
        ami=AMI,
        ec2_url=ec2.url,
        oci_config=oci_config,
        compartment=COMPARTMENT,
        subnet=SUBNET,
        image=IMAGE,
        oci_url=oci.url,
        lambda_region=LAMBDA_REGION,
        lambda_url=lam.url,
        ssh_key=DEFAULT_SSH_KEY,
    )
    replicas.scheduler = "  unavailable_ttl_s: 600\n"
    replicas.extra_env = {
        "L9_E2E_AWS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "L9_E2E_AWS_SECRET": "l9-e2e-secret-not-a-real-key",
        "L9_E2E_LAMBDA_KEY": DEFAULT_API_KEY,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    replicas.write_config()
    sources: list[Callable[[], list[BootTarget]]] = [ec2.instances, oci.instances, lam.instances]  # type: ignore[list-item]
    with CloudBooter(
        sources, ports=[replicas.replicas[0].grpc_port], hardware=lambda i: HARDWARE.get(i.instance_type or "")
    ) as booter:
        replicas.start_all()
        started = time.monotonic()
        run = replicas.python(PROGRAM, timeout=600)
        elapsed = time.monotonic() - started
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{replicas.logs()}"
        assert "RESULT 42" in run.stdout

        tasks = replicas.api("/tasks")
        items = tasks["tasks"] if isinstance(tasks, dict) else tasks
        assert len(items) == 1, items
        history = replicas.api(f"/tasks/{items[0]['id']}/history")
        events = history["events"] if isinstance(history, dict) else history
        shown = json.dumps(events, indent=1)
        misses = [e for e in events if e["outcome"] == "unavailable"]
        ec2_misses = [e for e in misses if e["pool"] == "ec2-h100" and (e.get("reason") or "").startswith("offer ")]
        assert ec2_misses, shown
        assert all("InsufficientInstanceCapacity" in e["reason"] for e in ec2_misses), shown
        assert any(e["pool"] == "oci-h100" and "InternalError" in (e.get("reason") or "") for e in misses), shown
        # Lambda's 429 (and the plugin's own launch pacing after it) are noted as throttles, and the same pool
        # is asked again: never a miss that fails it over
        lambda_notes = [e["reason"] or "" for e in misses if e["pool"] == "lambda-a100"]
        assert lambda_notes, f"the 429 left no note: {shown}"
        assert all(note.startswith("throttled: ") for note in lambda_notes), f"Lambda was failed over: {shown}"
        placed = [e for e in events if e["outcome"] == "placed"]
        assert [e["pool"] for e in placed] == ["lambda-a100"], shown
        # each EC2 offer (zone) was asked once: no retry of the capacity answer inside the SDK
        zones = {e["reason"].split(":")[0] for e in ec2_misses}
        assert ec2.calls("RunInstances") == len(zones), (ec2.calls("RunInstances"), zones)
        assert lam.calls("/instance-operations/launch") == 2  # the 429, then the launch that worked
        print(f"call done in {elapsed:.1f} s; placement history:\n{shown}")

        # the Lambda machine goes once idle for the pool's idle_timeout_s
        lambda_ids = [i.id for i in lam.instances()]
        assert len(lambda_ids) == 1, lam.instances()
        wait_for(
            lambda: all(i.gone for i in lam.instances()),
            "the idle Lambda machine to be terminated",
            120,
            lambda: replicas.logs(),
        )
        wait_for(lambda: lambda_ids[0] in booter.stopped, "the terminated machine's boot to be stopped", 30)

        # an instance tagged for a pool, which levers9 has no record of, is terminated by the reconciler
        stray = ec2.client().run_instances(
            ImageId=AMI,
            InstanceType="t3.micro",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": "levers9:pool", "Value": "ec2-h100"},
                        {"Key": "levers9:machine-id", "Value": "mach_stray"},
                    ],
                }
            ],
        )["Instances"][0]["InstanceId"]
        wait_for(
            lambda: all(i.gone for i in ec2.instances() if i.id == stray),
            "the reconciler to terminate the stray EC2 instance",
            120,
            lambda: replicas.logs(),
        )
        assert booter.refused == {}, booter.refused
        # every instance levers9 started had its user data; the stray has none (its image would just start), and
        # the booter lists it only if it saw it running before the reconciler terminated it (on a loaded machine
        # the reconciler came first once: CI at stop 50's next run)
        assert set(booter.bare) <= {stray}, booter.bare


T4_POOL = """\
  ec2-t4:
    provider: ec2
    runtime: process
    workspace: default
    gpu: T4
    gpu_count: 1
    region: us-east-1
    max_workers: 2
    idle_timeout_s: 3
    settings:
      ami: {ami}
      endpoint_url: {ec2_url}
      instance_types: [g4dn.xlarge]
      availability_zones: [us-east-1a]
      access_key_id_env: L9_E2E_AWS_KEY_ID
      secret_access_key_env: L9_E2E_AWS_SECRET
      identity_certificate_file: {imds_certificate}
"""

T4_PROGRAM = """
import levers9

@levers9.function(gpu="T4", cpu=0.25)
def answer() -> int:
    return 7

print("RESULT", answer.remote(), flush=True)
"""


def _join_token(user_data: str) -> str:
    """The join token as anyone who reads the instance's user data finds it (the boot script's heredoc)."""
    found = re.search(r"cat >\"\$TOKEN_FILE\" <<'(\w+)'\n\s*(\S+)\n", user_data)
    assert found is not None, user_data
    return found.group(2)


def _worker_elsewhere(replicas: Replicas, token: str, machine_id: str, imds: str, state: Path) -> str:
    """``levers9 worker`` with a copied join token on another EC2 instance (its own genuine metadata service)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(state),
        "LEVERS9_CONTROLPLANE_URL": f"grpc://127.0.0.1:{replicas.replicas[0].grpc_port}",
        "LEVERS9_TOKEN": token,
        "LEVERS9_MACHINE_ID": machine_id,
        "LEVERS9_MACHINE_IDENTITY": "ec2",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds,
        "LEVERS9_WORKER_STATE_DIR": str(state / "worker"),
        "LEVERS9_DISCONNECT_EXIT_S": "30",
    }
    done = subprocess.run(
        [sys.executable, "-m", "levers9", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, f"the worker with a copied token was not refused:\n{done.stdout}\n{done.stderr}"
    return done.stderr


def test_a_launch_whose_answer_was_lost_after_the_create_starts_one_machine_not_two(
    replicas: Replicas, clouds: tuple[FakeEc2, FakeOci, LambdaCloud, Path], imds: FakeImds, tmp_path: Path
) -> None:
    """Also: the machine's join token, copied from its user data and shown by a worker on another instance,
    is refused and stays unspent; the machine's own worker then joins with it and runs the call."""
    ec2 = clouds[0]
    ec2.timeout_after_create(1)  # moto creates the instance; the plugin never hears back
    replicas.count = 1
    replicas.min_workers = 0
    replicas.pools = T4_POOL.format(ami=AMI, ec2_url=ec2.url, imds_certificate=imds.certificate_file)
    replicas.extra_env = {
        "L9_E2E_AWS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "L9_E2E_AWS_SECRET": "l9-e2e-secret-not-a-real-key",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    replicas.write_config()
    hardware = {"g4dn.xlarge": (GPU_DATA / "t4_1x.csv").read_text()}
    released = threading.Event()  # the instance boots only once the copied token was tried elsewhere
    with (
        CloudBooter(
            [lambda: ec2.instances() if released.is_set() else []],
            ports=[replicas.replicas[0].grpc_port, imds.port],
            hardware=lambda i: hardware.get(i.instance_type or ""),
            platform=imds.platform,  # type: ignore[arg-type]
        ) as booter,
        ThreadPoolExecutor(1) as pool,
    ):
        replicas.start_all()
        running = pool.submit(replicas.python, T4_PROGRAM, timeout=600)
        [launched] = wait_for(lambda: [i for i in ec2.instances() if i.user_data], "the T4 instance", 300)
        token, machine_id = _join_token(launched.user_data), launched.tags["levers9:machine-id"]
        thief = CloudInstance(
            id="i-0bad0bad0bad0bad0",
            state="running",
            running=True,
            gone=False,
            instance_type="t3.micro",
            region="us-east-1",
            zone="us-east-1a",
        )
        said = _worker_elsewhere(replicas, token, machine_id, imds.endpoint(thief), tmp_path / "thief")
        assert "did not prove it runs on that machine" in said, said
        assert "names EC2 instance 'i-0bad0bad0bad0bad0'" in said, said
        released.set()
        run = running.result(timeout=600)
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{replicas.logs()}"
        assert "RESULT 7" in run.stdout
        instances = ec2.instances()
        assert len(instances) == 1, instances  # the retry with the same ClientToken found the first launch's
        assert ec2.calls("RunInstances") >= 2  # the lost answer, then the retry
        wait_for(
            lambda: all(i.gone for i in ec2.instances()), "the idle T4 machine to be terminated", 120, replicas.logs
        )
        assert list(booter.boots) == [instances[0].id]
        # the machine's own worker showed its instance's identity: the metadata service served that instance
        served = {path.split("/")[1] for method, path, status in imds.requests if status == 200}
        assert served == {instances[0].id, thief.id}, imds.requests
