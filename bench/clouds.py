"""Cloud failover: how long levers9 takes to go from one cloud's "no" to the next cloud, and to a registered worker.

Each run starts everything afresh (nothing is cached between runs): a private PostgreSQL and redis-server are
shared by the runs, but each run gets a new database, an emptied redis, a new ``levers9 server``
(``tests/fixtures/replicas.py``) and three new fake clouds at the wire, set up as the end-to-end test
``tests/e2e/test_clouds.py`` sets them up:

- EC2 (``tests/fakes/ec2_cloud.py``: a real moto server behind the fault proxy) answers every RunInstances of
  ``p5.48xlarge`` with ``InsufficientInstanceCapacity``;
- OCI (``tests/fakes/oci_cloud.py``) answers the ``BM.GPU.H100.8`` launch with 500 "Out of host capacity.";
- Lambda (``tests/fakes/lambda_cloud.py``) has room for ``gpu_8x_a100_80gb_sxm4`` in us-east-1 (the test's
  injected 429 is left out here: it adds a deliberate ``Retry-After`` wait that is not failover).

A program calls ``gpu=["H100", "A100-80", "cpu"]`` once; the call misses on EC2 (one RunInstances per zone),
misses on OCI and lands on Lambda, where :class:`levers9.testing.cloud_boot.CloudBooter` boots the instance's user
data (an *emulated* boot: no VM boots, the user data runs in a network namespace at once; a real VM adds its own
boot time, tens of seconds to minutes) so a real ``levers9 worker`` registers and runs the call.

What is measured, per run:

1. **Failover hops at the wire.** Each fake stamps (``time.time()``) every request as it arrives and every
   answer as it is sent (``call_log()``). A hop is from a launch's refusal being sent to the next launch request
   received: EC2 zone -> next EC2 zone (RunInstances answer -> next RunInstances), last EC2 zone -> OCI
   (-> LaunchInstance), OCI availability domain -> next domain, last OCI domain -> Lambda
   (-> ``POST /instance-operations/launch``). Anything levers9 asks between the two is inside the hop.
2. **Request to registered worker**: the task's ``created_at`` (REST ``GET /api/v1/tasks``, stamped by the
   controlplane when the SDK's submit arrives) to the Lambda worker's ``registered_at`` (``GET /api/v1/workers``),
   split into placement decisions (submit -> Lambda launch request), the launch (the Lambda request -> its
   answer), and the emulated boot (the answer, when the fake reports the instance ``active`` -> registered). The
   boot part includes the booter's 0.2 s polling of the fakes. The call is submitted once the new server's
   start-up discovery has its answers (:func:`_discovered`; moto takes seconds to list EC2's instance types), as
   a controlplane that has been up a while has them; no other state survives from one run to the next.
3. **levers9's own figures**: the same hops as the task's placement history (``GET /api/v1/tasks/{id}/history``)
   records them: the gaps between consecutive ``unavailable`` events' ``at``, and from the last to ``placed``.
4. **Peer: SkyPilot 0.14.1** (in its own virtualenv, made with ``uv venv /tmp/skyvenv && uv pip install -p
   /tmp/skyvenv/bin/python 'skypilot[aws]==0.14.1'``; ``--no-peer`` skips it), in the same run, against the same
   FakeEc2 with the same fault, once levers9's call is done: SkyPilot's own failover loop
   (``CloudVmRayBackend.provision``, so ``RetryingVmProvisioner``) asked for one ``p5.48xlarge`` in us-east-1, in
   a throwaway HOME (see :data:`SKY_DRIVER` for what of it is SkyPilot's and what is not). For a one-node AWS
   cluster SkyPilot hands all of a region's zones to ``run_instances``, which tries one zone's subnet after
   another with its fail-fast boto3 resource. The hop is the same as levers9's EC2 zone -> zone: a RunInstances
   refusal sent -> the next RunInstances received, stamped by the same proxy. Before SkyPilot runs, moto's account
   is made to look like a real one (:func:`_account_as_aws_has_it`).

Everything shares the machine's CPUs (the server, the fakes, moto, the boots, PostgreSQL, redis). Run:
``.venv/bin/python bench/clouds.py [--runs N] [--no-peer] [--write]``; ``--write`` appends the section to
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from bench.placement import machine, redis_server  # noqa: E402
from levers9.testing.cloud_boot import CloudBooter  # noqa: E402
from tests.e2e.test_clouds import (  # noqa: E402
    AMI,
    H100_TYPE,
    HARDWARE,
    LAMBDA_A100_TYPE,
    LAMBDA_REGION,
    OCI_H100_SHAPE,
    POOLS,
    PROGRAM,
)
from tests.fakes.ec2_cloud import FakeEc2  # noqa: E402
from tests.fakes.lambda_cloud import DEFAULT_API_KEY, DEFAULT_SSH_KEY, LambdaCloud  # noqa: E402
from tests.fakes.oci_cloud import FakeOci  # noqa: E402
from tests.fakes.oci_tenancy import COMPARTMENT, IMAGE, SUBNET, TENANCY, make_credentials  # noqa: E402
from tests.fixtures.levers9_up import _processes_mentioning  # noqa: E402
from tests.fixtures.postgres import running_postgres  # noqa: E402
from tests.fixtures.replicas import Replicas  # noqa: E402

SKY_PYTHON = Path("/tmp/skyvenv/bin/python")
LAMBDA_LAUNCH = "POST /instance-operations/launch"
Log = list[tuple[float, str, str]]

#: The driver run under SkyPilot's interpreter (argv: the zone names and their zone ids, comma-separated; the out
#: file), in a throwaway HOME. It is this benchmark's code calling SkyPilot's, not SkyPilot's code. It writes the
#: least catalog SkyPilot needs offline under ``~/.sky/catalogs`` (``p5.48xlarge`` in the six us-east-1 zones,
#: with made-up prices; the GPU and CPU image tags pointing at moto's AMI), marks AWS enabled in SkyPilot's state
#: (what ``sky check`` records), and calls ``CloudVmRayBackend.provision`` for one ``p5.48xlarge`` in us-east-1:
#: SkyPilot's own ``RetryingVmProvisioner`` then runs as ``sky launch`` runs it (cluster config templating,
#: ``bulk_provision``: ``bootstrap_instances``, then ``run_instances``, whose fail-fast ``max_attempts=0`` boto3
#: resource tries one zone's subnet after another for a one-node cluster; the failover handler; the teardown of
#: what was left), until it raises ``ResourcesUnavailableError``. What is not SkyPilot's: no API server (the
#: backend is called in process, as the server's executor does), the catalog rows, and the ``sky check`` step.
SKY_DRIVER = r"""
import json, os, sys, time
zones, zone_ids, out = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3]
catalog = os.path.expanduser("~/.sky/catalogs/v8/aws")
os.makedirs(catalog, exist_ok=True)
gpus = {"Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 8, "MemoryInfo": {"SizeInMiB": 81920}}],
        "TotalGpuMemoryInMiB": 655360}
gpu_info = json.dumps(gpus).replace('"', '""')
with open(os.path.join(catalog, "vms.csv"), "w") as f:
    f.write("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
            "AvailabilityZone,Arch,MaximumEfaInterfaces\n")
    for zone_id in zone_ids:
        f.write(f'p5.48xlarge,H100,8.0,192.0,2048.0,"{gpu_info}",98.32,40.0,us-east-1,{zone_id},x86_64,32\n')
with open(os.path.join(catalog, "images.csv"), "w") as f:
    f.write("Tag,Region,OS,OSVersion,ImageId,CreationDate\n")
    for tag in ("skypilot:custom-gpu-ubuntu-cuda13", "skypilot:custom-cpu-ubuntu", "skypilot:custom-gpu-ubuntu"):
        f.write(f"{tag},us-east-1,ubuntu,22.04,ami-999844e0,20260101\n")
with open(os.path.join(catalog, "instance_quota_mapping.csv"), "w") as f:
    f.write("InstanceType,QuotaCode\np5.48xlarge,L-417A185B\n")
import sky
from sky import clouds, exceptions, global_user_state
from sky.backends import cloud_vm_ray_backend
from sky.clouds import cloud as cloud_lib
global_user_state.set_enabled_clouds(["AWS"], cloud_lib.CloudCapability.COMPUTE, "default")
with sky.Dag() as dag:
    task = sky.Task(run="nvidia-smi")
    task.set_resources(sky.Resources(infra="aws/us-east-1", instance_type="p5.48xlarge"))
backend = cloud_vm_ray_backend.CloudVmRayBackend()
backend.register_info(dag=dag, optimize_target=sky.OptimizeTarget.COST)
to_provision = sky.Resources(infra="aws/us-east-1", instance_type="p5.48xlarge")
started = time.time()
error = None
try:
    backend.provision(task, to_provision, dryrun=False, stream_logs=False, cluster_name="sky-bench")
except exceptions.ResourcesUnavailableError as exc:
    error = f"ResourcesUnavailableError: {exc}"[:300]
json.dump({"started": started, "surfaced": time.time(), "error": error}, open(out, "w"))
"""


@dataclass
class Run:
    """One run's figures (seconds)."""

    ec2_hops: list[float] = field(default_factory=list)
    ec2_to_oci: float = 0.0
    oci_hops: list[float] = field(default_factory=list)
    oci_to_lambda: float = 0.0
    own_ec2_hops: list[float] = field(default_factory=list)
    own_ec2_to_oci: float = 0.0
    own_oci_hops: list[float] = field(default_factory=list)
    own_last_to_placed: float = 0.0
    #: for each refused offer: the refusal sent at the wire -> the ``at`` levers9's history gives the miss
    record_lag: list[float] = field(default_factory=list)
    submit_to_registered: float = 0.0
    decisions: float = 0.0
    first_launch: float = 0.0
    launch: float = 0.0
    boot: float = 0.0
    call_s: float = 0.0
    zones: int = 0
    domains: int = 0
    peer_hops: list[float] = field(default_factory=list)
    peer_zones: int = 0
    #: from the driver's call of ``CloudVmRayBackend.provision`` to its first RunInstances
    peer_first_call: float = 0.0
    #: from the last refusal sent to SkyPilot raising ``ResourcesUnavailableError``
    peer_surface: float = 0.0
    peer_note: str = ""
    #: every fake's call log merged, for the first run's printout
    trace: list[str] = field(default_factory=list)


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _launches(log: Log, op: str) -> list[tuple[float, float]]:
    """(request received, its answer sent) of each ``op`` in a fake's call log, in order."""
    pairs: list[tuple[float, float]] = []
    open_at: list[float] = []
    for stamp, name, detail in log:
        if name != op:
            continue
        if detail.startswith("request"):
            open_at.append(stamp)
        elif open_at:
            pairs.append((open_at.pop(0), stamp))
    return pairs


@contextlib.contextmanager
def _server(pg: str, redis_url: str, root: Path) -> Iterator[Replicas]:
    """A fresh database and an emptied redis for a new ``levers9 server`` (started by the caller); stopped,
    with everything that mentions ``root``, however the run ends."""
    import psycopg
    import redis

    name = f"bench_clouds_{time.monotonic_ns()}"
    with psycopg.connect(pg.replace("postgresql+psycopg", "postgresql") + "postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    redis.Redis(unix_socket_path=redis_url.removeprefix("unix://")).flushall()
    group = Replicas(root, pg + name, redis_url, count=1, min_workers=0)
    try:
        yield group
    finally:
        for replica in group.replicas:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
                try:
                    replica.process.wait(30)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                    replica.process.wait(10)
        for pid, _ in _processes_mentioning(str(root)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _processes_mentioning(str(root)) and time.monotonic() < deadline:
            time.sleep(0.25)
        for pid, _ in _processes_mentioning(str(root)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def one_run(pg: str, redis_url: str, peer: bool) -> tuple[Run, list[dict[str, Any]]]:
    run = Run()
    root = Path(tempfile.mkdtemp(prefix="l9-bench-clouds-"))
    try:
        credentials = make_credentials(root)
        with (
            FakeEc2() as ec2,
            FakeOci(compartments=(COMPARTMENT, TENANCY), images=(IMAGE,), subnets=(SUBNET,)) as oci,
            LambdaCloud(requests_per_s=None) as lam,
            _server(pg, redis_url, root) as group,
        ):
            oci.add_key(credentials.key_id, credentials.private_key.public_key())
            ec2.fail_run_instances("InsufficientInstanceCapacity", instance_type=H100_TYPE)
            oci.fail_launch(500, "InternalError", "Out of host capacity.", shape=OCI_H100_SHAPE)
            lam.set_capacity(LAMBDA_A100_TYPE, [LAMBDA_REGION])
            group.pools = POOLS.format(
                ami=AMI,
                ec2_url=ec2.url,
                oci_config=credentials.config_file,
                compartment=COMPARTMENT,
                subnet=SUBNET,
                image=IMAGE,
                oci_url=oci.url,
                lambda_region=LAMBDA_REGION,
                lambda_url=lam.url,
                ssh_key=DEFAULT_SSH_KEY,
            ).replace("idle_timeout_s: 5", "idle_timeout_s: 600")
            group.scheduler = "  unavailable_ttl_s: 600\n"
            group.extra_env = {
                "L9_E2E_AWS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
                "L9_E2E_AWS_SECRET": "l9-e2e-secret-not-a-real-key",
                "L9_E2E_LAMBDA_KEY": DEFAULT_API_KEY,
                "AWS_EC2_METADATA_DISABLED": "true",
            }
            group.write_config()
            sources = [ec2.instances, oci.instances, lam.instances]
            try:
                with CloudBooter(
                    sources,  # type: ignore[arg-type]
                    ports=[group.replicas[0].grpc_port],
                    hardware=lambda i: HARDWARE.get(i.instance_type or ""),
                ):
                    group.start_all()
                    _discovered(ec2, oci, lam)
                    started = time.monotonic()
                    done = group.python(PROGRAM, timeout=600)
                    run.call_s = time.monotonic() - started
                    if done.returncode != 0 or "RESULT 42" not in done.stdout:
                        raise RuntimeError(f"the call failed:\n{done.stdout}\n{done.stderr}\n{group.logs()}")
                    tasks = group.api("/tasks")
                    workers = [w for w in group.api("/workers") if w["pool"] == "lambda-a100"]
                    history = group.api(f"/tasks/{tasks[0]['id']}/history")
                    logs = ec2.call_log(), oci.call_log(), lam.call_log()
                    measure(run, tasks[0], workers, history, *logs)
                    first = _stamp(tasks[0]["created_at"])
                    merged = sorted(
                        (stamp, cloud, op, detail)
                        for cloud, log in zip(("ec2", "oci", "lambda"), logs, strict=True)
                        for stamp, op, detail in log
                    )
                    run.trace = [f"{(t - first) * 1000:8.1f} ms {c:6} {o} {d}" for t, c, o, d in merged]
                    if peer:
                        sky_peer(run, ec2, root)
            finally:
                ec2.terminate_all()
                oci.terminate_all()
                lam.terminate_all()
        return run, history
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _discovered(ec2: FakeEc2, oci: FakeOci, lam: LambdaCloud, timeout: float = 120) -> None:
    """Wait until the server's start-up discovery has its answers from every fake (EC2 DescribeInstanceTypes,
    which takes moto seconds; OCI ListShapes; Lambda's instance types), and one second more: a call submitted
    earlier would wait for it, which a controlplane that has been up a while never does."""

    def answered(log: Log, op: str) -> bool:
        return any(name == op and detail.startswith("response") for _, name, detail in log)

    deadline = time.monotonic() + timeout
    while not (
        answered(ec2.call_log(), "DescribeInstanceTypes")
        and answered(oci.call_log(), "ListShapes")
        and answered(lam.call_log(), "GET /instance-types")
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not ask every fake for its offers within {timeout} s")
        time.sleep(0.1)
    time.sleep(1.0)


def measure(
    run: Run,
    task: dict[str, Any],
    workers: list[dict[str, Any]],
    history: list[dict[str, Any]],
    ec2_log: Log,
    oci_log: Log,
    lambda_log: Log,
) -> None:
    ec2 = _launches(ec2_log, "RunInstances")
    oci = _launches(oci_log, "LaunchInstance")
    lam = _launches(lambda_log, LAMBDA_LAUNCH)
    if not ec2 or not oci or len(lam) != 1 or len(workers) != 1:
        raise RuntimeError(f"unexpected calls: ec2 {ec2}, oci {oci}, lambda {lam}, workers {workers}")
    run.zones = len(ec2)
    run.domains = len(oci)
    run.ec2_hops = [b[0] - a[1] for a, b in itertools.pairwise(ec2)]
    run.ec2_to_oci = oci[0][0] - ec2[-1][1]
    run.oci_hops = [b[0] - a[1] for a, b in itertools.pairwise(oci)]
    run.oci_to_lambda = lam[0][0] - oci[-1][1]
    submit = _stamp(task["created_at"])
    registered = _stamp(workers[0]["registered_at"])
    run.submit_to_registered = registered - submit
    run.decisions = lam[0][0] - submit
    run.first_launch = ec2[0][0] - submit
    run.launch = lam[0][1] - lam[0][0]
    run.boot = registered - lam[0][1]
    # one event per offer (zone, domain) refused, then a summary with the same ``at`` ("every offer is unavailable")
    misses = [e for e in history if e["outcome"] == "unavailable" and (e.get("reason") or "").startswith("offer ")]
    placed = [e for e in history if e["outcome"] == "placed"]
    ec2_misses = [_stamp(e["at"]) for e in misses if e["pool"] == "ec2-h100"]
    oci_misses = [_stamp(e["at"]) for e in misses if e["pool"] == "oci-h100"]
    if len(ec2_misses) != run.zones or len(oci_misses) != run.domains or len(placed) != 1:
        raise RuntimeError(f"unexpected placement history: {json.dumps(history, indent=1)}")
    run.record_lag = [at - sent[1] for at, sent in zip(ec2_misses + oci_misses, ec2 + oci, strict=True)]
    run.own_ec2_hops = [b - a for a, b in itertools.pairwise(ec2_misses)]
    run.own_ec2_to_oci = oci_misses[0] - ec2_misses[-1]
    run.own_oci_hops = [b - a for a, b in itertools.pairwise(oci_misses)]
    # the history's last miss is OCI's: the next recorded event is the placement on the Lambda worker
    run.own_last_to_placed = _stamp(placed[0]["at"]) - oci_misses[-1]


def _account_as_aws_has_it(ec2: FakeEc2) -> None:
    """Make moto's account look like a real one SkyPilot has used before (directly in moto: not counted, not
    faulted): the default VPC routes to an internet gateway (moto's has none, and SkyPilot only uses public
    subnets), and the ``skypilot-v1`` instance profile with its role exists (SkyPilot creates it on its first
    launch in an account, and sleeps 2 x 15 s for IAM to propagate; moto also rejects the inline policy it
    attaches)."""
    client = ec2.client()
    vpc = client.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    gateway = client.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    client.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    main = client.describe_route_tables(
        Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "association.main", "Values": ["true"]}]
    )["RouteTables"][0]["RouteTableId"]
    client.create_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    iam = ec2.client(service="iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    iam.create_role(RoleName="skypilot-v1", AssumeRolePolicyDocument=json.dumps(trust))
    iam.create_instance_profile(InstanceProfileName="skypilot-v1")
    iam.add_role_to_instance_profile(InstanceProfileName="skypilot-v1", RoleName="skypilot-v1")


def sky_peer(run: Run, ec2: FakeEc2, root: Path) -> None:
    """SkyPilot's provisioning loop against the same FakeEc2 (see :data:`SKY_DRIVER`)."""
    if not SKY_PYTHON.exists():
        run.peer_note = f"{SKY_PYTHON} not found"
        return
    _account_as_aws_has_it(ec2)
    found = sorted(ec2.client().describe_availability_zones()["AvailabilityZones"], key=lambda z: z["ZoneName"])
    zones, zone_ids = [z["ZoneName"] for z in found], [z["ZoneId"] for z in found]
    home = root / "sky-home"  # SkyPilot writes ~/.sky: a throwaway HOME, removed with root
    (home / "bin").mkdir(parents=True)
    (home / "tmp").mkdir()  # SkyPilot's temporary files (its wheel, cluster YAMLs) go here, not to /tmp
    # SkyPilot checks `rsync --version` before provisioning (rsync is used only once a node is up: never here)
    rsync = home / "bin" / "rsync"
    rsync.write_text("#!/bin/sh\necho 'rsync  version 3.2.7  protocol version 31 (stub: version check only)'\n")
    rsync.chmod(0o755)
    driver, out = root / "sky_driver.py", root / "sky_out.json"
    driver.write_text(SKY_DRIVER)
    env = {
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "PATH": f"{home / 'bin'}:{SKY_PYTHON.parent}:/usr/bin:/bin",
        "AWS_ENDPOINT_URL": ec2.url,
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "sky-bench-secret-not-a-real-key",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
    }
    since = time.time()
    done = subprocess.run(
        [str(SKY_PYTHON), str(driver), ",".join(zones), ",".join(zone_ids), str(out)],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not out.exists():
        run.peer_note = f"the SkyPilot driver failed ({done.returncode}): {done.stderr[-1500:]}"
        return
    result = json.loads(out.read_text())
    calls = _launches([e for e in ec2.call_log() if e[0] >= since], "RunInstances")
    if not calls:
        run.peer_note = f"SkyPilot made no RunInstances: {result['error']}\n{done.stderr[-1500:]}"
        return
    run.peer_zones = len(calls)
    run.peer_hops = [b[0] - a[1] for a, b in itertools.pairwise(calls)]
    run.peer_first_call = calls[0][0] - result["started"]
    run.peer_surface = result["surfaced"] - calls[-1][1]
    raised = re.sub(r"\x1b\[[0-9;]*m", "", str(result["error"]))
    run.peer_note = f"{len(calls)} RunInstances for {len(zones)} zones; raised {raised}"


def _ms(values: list[float]) -> str:
    """``median | max`` in milliseconds (one decimal below 10 ms)."""
    if not values:
        return "-"

    def shown(value: float) -> str:
        return f"{value * 1000:.1f} ms" if abs(value) < 0.01 else f"{value * 1000:.0f} ms"

    return f"{shown(statistics.median(values))} | {shown(max(values))}"


def report(runs: list[Run], peer: bool) -> str:
    lines = [
        "| hop | at the wire: median | max | levers9's history: median | max | SkyPilot 0.14.1 at the wire: median "
        "| max |",
        "|--|--:|--:|--:|--:|--:|--:|",
    ]
    peer_hops = [h for r in runs for h in r.peer_hops]
    rows = (
        (
            "EC2 zone -> next EC2 zone",
            [h for r in runs for h in r.ec2_hops],
            [h for r in runs for h in r.own_ec2_hops],
            peer_hops if peer else [],
        ),
        ("last EC2 zone -> OCI", [r.ec2_to_oci for r in runs], [r.own_ec2_to_oci for r in runs], []),
        (
            "OCI domain -> next OCI domain",
            [h for r in runs for h in r.oci_hops],
            [h for r in runs for h in r.own_oci_hops],
            [],
        ),
        ("last OCI domain -> Lambda", [r.oci_to_lambda for r in runs], [], []),
    )
    for name, wire, own, other in rows:
        lines.append(f"| {name} | {_ms(wire)} | {_ms(own) if own else '- | -'} | {_ms(other) if other else '- | -'} |")
    lines += [
        "",
        "| request to registered worker | median | max |",
        "|--|--:|--:|",
    ]
    for name, values in (
        ("submit -> first EC2 RunInstances received", [r.first_launch for r in runs]),
        ("placement decisions: submit -> Lambda launch request (all the misses included)", [r.decisions for r in runs]),
        ("the launch: Lambda request -> its answer", [r.launch for r in runs]),
        ("emulated boot: instance active -> worker registered", [r.boot for r in runs]),
        ("total: submit -> worker registered", [r.submit_to_registered for r in runs]),
        ("levers9's history: OCI miss -> placed (launch + boot + placement)", [r.own_last_to_placed for r in runs]),
        ("a refusal sent at the wire -> the history's `at` for that miss", [x for r in runs for x in r.record_lag]),
        ("the program's call, end to end (process start to result)", [r.call_s for r in runs]),
    ):
        lines.append(f"| {name} | {_ms(values)} |")
    if peer:
        done = [r for r in runs if r.peer_zones]
        lines += [
            "",
            "| SkyPilot 0.14.1, CloudVmRayBackend.provision (RetryingVmProvisioner) | median | max |",
            "|--|--:|--:|",
        ]
        if done:
            for name, values in (
                ("RunInstances made (one per zone)", [float(r.peer_zones) for r in done]),
                (
                    "provision() called -> first RunInstances (templating, optimizer check, bootstrap)",
                    [r.peer_first_call for r in done],
                ),
                ("last refusal sent -> ResourcesUnavailableError raised", [r.peer_surface for r in done]),
            ):
                shown = (
                    _ms(values)
                    if "RunInstances made" not in name
                    else f"{statistics.median(values):.0f} | {max(values):.0f}"
                )
                lines.append(f"| {name} | {shown} |")
        else:
            lines.append(f"| not measured: {runs[0].peer_note[:300]} | - | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs, each with a fresh server and fresh fakes")
    parser.add_argument("--no-peer", action="store_true", help="skip the SkyPilot measurement")
    parser.add_argument("--write", action="store_true", help="append the results to bench/RESULTS.md")
    args = parser.parse_args()
    peer = not args.no_peer
    info = machine()
    for key, value in info.items():
        print(f"- {key}: {value}")
    runs: list[Run] = []
    with redis_server() as redis_url, running_postgres() as pg:
        for i in range(args.runs):
            run, history = one_run(pg, redis_url, peer)
            runs.append(run)
            print(
                f"run {i + 1}: {run.zones} EC2 zones, hops {[round(h * 1000) for h in run.ec2_hops]} ms, "
                f"EC2->OCI {run.ec2_to_oci * 1000:.0f} ms, OCI->Lambda {run.oci_to_lambda * 1000:.0f} ms, "
                f"submit->registered {run.submit_to_registered:.2f} s; peer {[round(h * 1000) for h in run.peer_hops]}"
                f" ms; {run.peer_note}",
                file=sys.stderr,
                flush=True,
            )
            if i == 0:
                print(json.dumps(history, indent=1), file=sys.stderr)
                print("\n".join(run.trace), file=sys.stderr)
    table = report(runs, peer)
    print()
    print(table)
    if args.write:
        write(info, args, runs, table)


def _machine_line(info: dict[str, str]) -> str:
    from importlib.metadata import version

    found = re.search(r"v=([0-9.]+)", info.get("redis", ""))
    sky = subprocess.run(
        [str(SKY_PYTHON), "-c", "import sky, boto3; print(sky.__version__, boto3.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    peer = f"; SkyPilot {sky[0]} with boto3 {sky[1]} in its own venv" if len(sky) == 2 else ""
    return (
        f"vm: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}, Python {info['python']}, "
        f"Redis {found.group(1) if found else info.get('redis')}, PostgreSQL 15 (private, fsync off); "
        f"moto {version('moto')} and boto3 {version('boto3')} for levers9{peer}."
    )


def write(info: dict[str, str], args: argparse.Namespace, runs: list[Run], table: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text().rstrip("\n")
    section = [
        f"## Cloud failover (issue 18, {info['date']})",
        "",
        f"- Machine: {_machine_line(info)}",
        f"- Command: `.venv/bin/python bench/clouds.py --runs {args.runs}"
        f"{' --no-peer' if args.no_peer else ''} --write`; {len(runs)} runs, each with a fresh `levers9 server` "
        "and fresh fakes.",
        "",
        table,
        "",
    ]
    path.write_text(text + "\n\n" + "\n".join(section))


if __name__ == "__main__":
    main()
