"""The worker image, built offline into a private dockerd: it runs this levers9, and its worker serves calls.

The image is built once per session (``worker_image``, tens of seconds) from
this machine's interpreter and packages; nothing is pulled. Then: the image's
``levers9`` is this version and its worker command is there; building again
with nothing changed imports nothing; the tarball ``--output -`` writes loads
with ``docker import``; and a container of it, started with the environment
:func:`levers9.bootstrap.container_spec` gives a provider, registers with a
real ``levers9 up`` and runs a call that proves where it ran (the image's
``sys.prefix`` is ``/usr/local``; the host's is not). The image carries the
OCI runtimes (this machine's ``runc`` and ``runsc``) and the network tools the
engine runs: a container of it, given :data:`RUNTIME_FLAGS`, runs a nested
container under each, and sets the host guard's iptables rules in a network
namespace of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from levers9.__about__ import __version__
from levers9.bootstrap import container_spec
from levers9.hooks.types import WorkerBootstrap
from levers9.images import rootfs
from levers9.images.rootfs import ImageError
from levers9.images.worker import DIGEST_LABEL, VERSION_LABEL, BuildResult, build_image, import_changes
from tests.fixtures.dockerd import Dockerd
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

MIB = 2**20
#: what a container of the image needs to run runc and runsc containers, found enough here (no --privileged:
#: this machine's own bounding set lacks CAP_SYS_RESOURCE, which --privileged asks for)
RUNTIME_FLAGS = (
    "--cap-add",
    "SYS_ADMIN",
    "--cap-add",
    "NET_ADMIN",
    "--cap-add",
    "SYS_PTRACE",
    "--security-opt",
    "seccomp=unconfined",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
)
#: a bundle whose root is the image's own /usr, run under runc, then under runsc (gVisor's ptrace platform)
NESTED = """
set -e
mkdir -p /tmp/b/rootfs/usr /tmp/b/rootfs/proc /tmp/b/rootfs/dev /tmp/b/rootfs/sys /tmp/b/rootfs/tmp
mount --bind /usr /tmp/b/rootfs/usr
cd /tmp/b
runc spec
python3 -c '
import json, os
for top in ("bin", "lib", "lib64", "sbin"):
    os.symlink("usr/" + top, "/tmp/b/rootfs/" + top)
config = json.load(open("config.json"))
config["process"].update(terminal=False, args=["/bin/sh", "-c", "echo nested"])
config["root"]["readonly"] = True
json.dump(config, open("config.json", "w"))
'
runc --root /tmp/runc run -b /tmp/b one
echo ran under runc
runsc --root /tmp/runsc --network=none --platform=ptrace run -bundle /tmp/b two
echo ran under runsc
umount /tmp/b/rootfs/usr
"""


def test_the_image_runs_this_levers9_and_its_worker_command(dockerd: Dockerd, worker_image: BuildResult) -> None:
    print(f"worker image: {worker_image.size_bytes / MIB:.0f} MiB, built in {worker_image.seconds:.1f} s")
    assert worker_image.tag == f"levers9/worker:{__version__}"
    assert worker_image.size_bytes < 400 * MIB, f"the worker image takes {worker_image.size_bytes / MIB:.0f} MiB"

    version = dockerd.cli("run", "--rm", "--network", "host", worker_image.tag, "levers9", "--version")
    assert version.stdout.strip() == f"levers9 {__version__}"
    usage = dockerd.cli("run", "--rm", "--network", "host", worker_image.tag, "levers9", "worker", "--help")
    assert "Run a worker" in usage.stdout
    assert "LEVERS9_CONTROLPLANE_URL" in usage.stdout

    config = json.loads(dockerd.cli("image", "inspect", worker_image.tag).stdout)[0]["Config"]
    assert config["Cmd"] == ["levers9", "worker"]
    assert not config.get("Entrypoint")
    assert config["Labels"][VERSION_LABEL] == __version__
    assert config["Labels"][DIGEST_LABEL] == worker_image.digest
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]

    # the interpreter lives where nobody (who runs a root worker's process calls) can reach it, TLS has its
    # CAs, the plugins are found through the entry points, and the shim's tools are there
    probe = (
        "import json, ssl, sys; from importlib import metadata; import levers9_process; "
        "print(json.dumps({'prefix': sys.prefix, 'cas': ssl.create_default_context().cert_store_stats()['x509_ca'],"
        " 'plugins': sorted(e.name for e in metadata.entry_points(group='levers9'))}))"
    )
    seen = json.loads(
        dockerd.cli("run", "--rm", "--user", "65534:65534", worker_image.tag, "python3", "-c", probe).stdout
    )
    assert seen["prefix"] == "/usr/local"
    assert seen["cas"] > 0
    assert {"process", "local", "nvidia_smi"} <= set(seen["plugins"])
    tools = dockerd.cli(
        "run", "--rm", worker_image.tag, "sh", "-c", "for t in setsid sed date mv; do command -v $t; done; id -un 65534"
    )
    assert tools.stdout.split() == ["/usr/bin/setsid", "/usr/bin/sed", "/usr/bin/date", "/usr/bin/mv", "nobody"]


def _first_line(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines()[0]


def test_the_image_carries_this_machines_runc_runsc_ip_and_iptables(
    dockerd: Dockerd, worker_image: BuildResult
) -> None:
    shown = dockerd.cli(
        "run",
        "--rm",
        worker_image.tag,
        "sh",
        "-c",
        "for t in runc runsc iptables ip; do command -v $t; done; runc --version; runsc --version; iptables --version",
    )
    lines = shown.stdout.splitlines()
    assert lines[:4] == ["/usr/sbin/runc", "/usr/bin/runsc", "/usr/sbin/iptables", "/usr/sbin/ip"]
    for tool in ("runc", "runsc", "iptables"):
        assert _first_line([tool, "--version"]) in lines, f"the image's {tool} is not this machine's"
    listed = dockerd.cli(
        "run",
        "--rm",
        worker_image.tag,
        "python3",
        "-c",
        "import json, os; print(json.dumps(os.listdir('/usr/lib/x86_64-linux-gnu/xtables')))",
    )
    assert {"libxt_conntrack.so", "libxt_tcp.so", "libxt_standard.so"} <= set(json.loads(listed.stdout))


#: volumes' tools in a container of the image: JuiceFS (where levers9 looks for it) and rclone, each through FUSE
FUSE_MOUNTS = """
set -e
python3 -c 'from levers9.volumes.juicefs import juicefs_binary; print(juicefs_binary())'
for t in rclone fusermount3; do command -v $t; done
mkdir -p /tmp/jfs /tmp/data /tmp/src /tmp/rc
juicefs format --no-update --storage file --bucket /tmp/data/ sqlite3:///tmp/meta.db vols >&2
juicefs mount -d --no-usage-report --no-syslog sqlite3:///tmp/meta.db /tmp/jfs >&2
echo through juicefs >/tmp/jfs/f
cat /tmp/jfs/f
juicefs umount /tmp/jfs
echo through rclone >/tmp/src/g
rclone mount --config '' /tmp/src /tmp/rc &
i=0; while [ ! -e /tmp/rc/g ] && [ $i -lt 300 ]; do i=$((i+1)); sleep 0.2; done
cat /tmp/rc/g
fusermount3 -u /tmp/rc
wait
"""


def test_volumes_mount_with_fuse_inside_a_container_of_the_image(dockerd: Dockerd, worker_image: BuildResult) -> None:
    done = dockerd.cli(
        "run",
        "--rm",
        *RUNTIME_FLAGS,
        "--device",
        "/dev/fuse",
        worker_image.tag,
        "sh",
        "-c",
        FUSE_MOUNTS,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "/usr/local/bin/juicefs",
        "/usr/bin/rclone",
        "/usr/bin/fusermount3",
        "through juicefs",
        "through rclone",
    ]


def test_runc_and_runsc_run_containers_inside_a_container_of_the_image(
    dockerd: Dockerd, worker_image: BuildResult
) -> None:
    done = dockerd.cli(
        "run",
        "--rm",
        *RUNTIME_FLAGS,
        "--network",
        "host",
        worker_image.tag,
        "sh",
        "-c",
        NESTED,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines() == ["nested", "ran under runc", "nested", "ran under runsc"]


def test_the_host_guard_rules_load_inside_a_container_of_the_image(dockerd: Dockerd, worker_image: BuildResult) -> None:
    # a network namespace of its own (--network none): the rules go nowhere near this machine's
    guard = (
        "ip link add l9test0 type bridge && python3 -c 'from levers9.engine import host_guard as g; "
        'g.guard("l9test0"); print(g.is_guarded("l9test0"))\' && iptables -w -S'
    )
    done = dockerd.cli(
        "run",
        "--rm",
        "--network",
        "none",
        "--cap-add",
        "NET_ADMIN",
        "--security-opt",
        "systempaths=unconfined",
        worker_image.tag,
        "sh",
        "-c",
        guard,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "True"
    assert "-A L9IN-l9test0 -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN" in done.stdout
    assert "-A L9IN-l9test0 -p tcp -j REJECT --reject-with tcp-reset" in done.stdout


def test_building_again_with_nothing_changed_reuses_the_image(
    dockerd: Dockerd,
    worker_image: BuildResult,
    worker_image_cache: Path,
) -> None:
    # the session's image, or a new one if the checkout changed since the fixture built it (others edit it)
    first = build_image(dockerd.host, None, worker_image_cache)
    images_before = dockerd.cli("images", "-aq", "--no-trunc").stdout.split()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "levers9",
            "worker-image",
            "build",
            "--docker-host",
            dockerd.host,
            "--json",
            "--cache-dir",
            str(worker_image_cache),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    print(f"rebuild with nothing changed: {again['seconds']} s (reused: {again['reused']})")
    assert again["reused"] is True, "the digest changed between two builds of the same installation"
    assert (again["id"], again["digest"], again["image"]) == (first.image_id, first.digest, first.tag)
    assert dockerd.cli("images", "-aq", "--no-trunc").stdout.split() == images_before


def test_an_unreachable_docker_is_named() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "levers9", "worker-image", "build", "--docker-host", "unix:///nonexistent/docker.sock"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot reach Docker at unix:///nonexistent/docker.sock" in done.stderr
    assert done.stdout == ""


def test_the_tarball_on_standard_output_loads_with_docker_import(
    dockerd: Dockerd,
    tmp_path: Path,
    worker_image_cache: Path,
) -> None:
    tarball = tmp_path / "rootfs.tar"
    with tarball.open("wb") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "levers9",
                "worker-image",
                "build",
                "--output",
                "-",
                "--cache-dir",
                str(worker_image_cache),
            ],
            stdout=out,
            stderr=subprocess.PIPE,
            text=False,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert "docker import" in done.stderr.decode()
    tag = f"levers9-test/shipped:{uuid.uuid4().hex[:8]}"
    changes = [arg for line in import_changes(__version__) for arg in ("--change", line)]
    dockerd.cli("import", *changes, str(tarball), tag, timeout=600)
    try:
        shipped = dockerd.cli("run", "--rm", tag, "levers9", "--version")
        assert shipped.stdout.strip() == f"levers9 {__version__}"
    finally:
        dockerd.cli("rmi", "-f", tag, check=False)


def test_a_container_of_the_image_registers_and_serves_a_call(
    dockerd: Dockerd,
    worker_image: BuildResult,
    levers9_up: Up,
) -> None:
    # no local worker: the only worker the pool can have is the container's
    levers9_up.min_workers = 0
    levers9_up.max_workers = 0
    levers9_up.start(wait_workers=0)
    made = levers9_up.levers9("token", "create", "--kind", "worker", "--pool", "local")
    assert made.returncode == 0, made.stderr
    bootstrap = WorkerBootstrap(
        controlplane_url=f"grpc://127.0.0.1:{levers9_up.grpc_port}",
        token=made.stdout.strip(),
        machine_id=f"img-{uuid.uuid4().hex[:8]}",
        pool="local",
        levers9_version=__version__,
        worker_image=worker_image.tag,
    )
    spec = container_spec(bootstrap)
    name = f"l9-test-worker-{uuid.uuid4().hex[:8]}"
    env = [arg for key, value in {**spec.env, **spec.secret_env}.items() for arg in ("-e", f"{key}={value}")]
    dockerd.cli("run", "-d", "--name", name, "--network", "host", *env, spec.image, *spec.command)
    try:
        workers = levers9_up.wait_workers(1, timeout=90)
        assert [w["pool"] for w in workers] == ["local"]
        done = levers9_up.python(
            """
            import json, sys, levers9

            @levers9.function(cpu=0.5, memory=256)
            def where():
                import os, sys
                return {"prefix": sys.prefix, "uid": os.getuid()}

            print("WHERE", json.dumps(where.remote()))
            """
        )
        logs = dockerd.cli("logs", name, check=False)
        assert done.returncode == 0, f"{done.stderr}\n--- worker:\n{logs.stderr[-3000:]}\n{levers9_up.log()[-3000:]}"
        line = next(text for text in done.stdout.splitlines() if text.startswith("WHERE "))
        where = json.loads(line.removeprefix("WHERE "))
        assert where["prefix"] == "/usr/local", f"the call ran outside the image: {where}"
        assert where["uid"] == 65534  # the root worker's process runtime runs calls as nobody
    finally:
        dockerd.cli("rm", "-f", name, check=False)
    deadline = time.monotonic() + 30
    while dockerd.containers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [c for c in dockerd.containers() if c["name"] == name]


def test_a_missing_runtime_is_named_with_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every tool the image takes, from a directory that lacks the two runtimes
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in rootfs.TOOLS:
        found = shutil.which(name, path=rootfs._TOOL_PATH)
        if found is not None and name not in ("runc", "runsc"):
            (tools / name).symlink_to(found)
    monkeypatch.setattr(rootfs, "_TOOL_PATH", str(tools))
    with pytest.raises(
        ImageError, match=r"lacks: runc \(apt-get install -y runc\), runsc \(apt-get install -y runsc\)$"
    ):
        rootfs.plan()
