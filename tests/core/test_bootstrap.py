"""The boot text every provider passes to a machine: valid, secret-tight, and it really starts a worker.

The script is run for real by ``/bin/sh`` under ``LEVERS9_BOOT_ROOT`` (a temporary directory), with a
``PATH`` holding only stand-ins that record how they were called: a ``levers9`` of the right version (or a
wrong one), ``docker``, ``python3``, and wrappers of the few host tools the script uses. What matters is
what an operator would check on the machine: where the token is, with which mode, and that no command
line and no environment file carries it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from levers9.bootstrap import (
    CA_PATH,
    ENV_PATH,
    SCRIPT_PATH,
    TOKEN_PATH,
    USER_DATA_MAX_BYTES,
    check_environment,
    cloud_init,
    container_spec,
    shell_script,
    worker_environment,
)
from levers9.hooks.types import WorkerBootstrap
from levers9.worker_container import docker_run_flags
from levers9.worker_variables import WORKER_VARIABLES

TOKEN = "l9_machine_" + "S" * 43
CA = "-----BEGIN CERTIFICATE-----\nMIIBfakefakefake\n-----END CERTIFICATE-----\n"
VERSION = "0.1.0"


def bootstrap(**fields: Any) -> WorkerBootstrap:
    values: dict[str, Any] = {
        "controlplane_url": "grpcs://cp-a.example:1993,grpcs://cp-b.example:1993",
        "controlplane_ca": CA,
        "token": TOKEN,
        "machine_id": "mach_0123",
        "pool": "gpu-h100",
        "levers9_version": VERSION,
        "worker_image": None,
        "environment": {"LEVERS9_CPU_MILLICORES": "4000", "LEVERS9_MEMORY_MIB": "16384", "LEVERS9_GPU_COUNT": "0"},
    }
    values.update(fields)
    return WorkerBootstrap(**values)


# --------------------------------------------------------------------------- rendering


def test_cloud_init_is_yaml_that_writes_the_script_root_only_and_runs_it() -> None:
    b = bootstrap()
    text = cloud_init(b)
    assert text.startswith("#cloud-config\n")
    assert len(text.encode()) <= USER_DATA_MAX_BYTES
    document = yaml.safe_load(text)
    [written] = document["write_files"]
    assert written == {"path": SCRIPT_PATH, "owner": "root:root", "permissions": "0700", "content": shell_script(b)}
    assert document["runcmd"] == [[SCRIPT_PATH]]


def test_user_data_over_the_ec2_limit_is_refused_with_its_size() -> None:
    bundle = "-----BEGIN CERTIFICATE-----\n" + "A" * 64 * 300 + "\n-----END CERTIFICATE-----\n"
    with pytest.raises(ValueError, match=rf"takes \d+ bytes, at most {USER_DATA_MAX_BYTES}.*controlplane_ca"):
        cloud_init(bootstrap(controlplane_ca=bundle))


def test_the_script_is_posix_sh() -> None:
    for shell in ("/bin/sh", shutil.which("dash"), shutil.which("bash")):
        if shell is None:
            continue
        checked = subprocess.run(
            [shell, "-n"],
            input=shell_script(bootstrap(worker_image="img:1")),
            text=True,
            capture_output=True,
            check=False,
        )
        assert checked.returncode == 0, f"{shell} -n: {checked.stderr}"


def test_the_worker_environment_and_the_container_spec_keep_the_token_apart() -> None:
    b = bootstrap(worker_image="ghcr.io/levers9/worker:0.1.0")
    env = worker_environment(b)
    assert env["LEVERS9_CONTROLPLANE_URL"] == b.controlplane_url
    assert env["LEVERS9_CONTROLPLANE_CA"] == CA
    assert (env["LEVERS9_MACHINE_ID"], env["LEVERS9_POOL"]) == ("mach_0123", "gpu-h100")
    assert env["LEVERS9_CPU_MILLICORES"] == "4000"
    assert TOKEN not in json.dumps(env)
    assert set(env) <= set(WORKER_VARIABLES)

    spec = container_spec(b)
    assert spec.image == "ghcr.io/levers9/worker:0.1.0"
    assert spec.command == ["levers9", "worker"]
    assert spec.env == env
    assert spec.secret_env == {"LEVERS9_TOKEN": TOKEN}
    assert TOKEN not in repr(spec)
    with pytest.raises(ValueError, match="worker_image is None"):
        container_spec(bootstrap(worker_image=None))


def test_environment_takes_only_the_worker_variables_no_field_carries() -> None:
    with pytest.raises(ValueError, match="LEVERS9_CPU_MILICORES") as caught:
        check_environment(bootstrap(environment={"LEVERS9_CPU_MILICORES": "1000"}))
    message = str(caught.value)
    assert "did you mean LEVERS9_CPU_MILLICORES" in message
    assert "accepted: " in message
    assert "LEVERS9_DISCONNECT_EXIT_S" in message
    assert "LEVERS9_TOKEN," not in message, "a variable a field carries is not offered"

    with pytest.raises(ValueError, match=r"EXAMPLE_SETTING.*accepted: "):
        check_environment(bootstrap(environment={"EXAMPLE_SETTING": "1"}))
    with pytest.raises(ValueError, match="LEVERS9_TOKEN is carried by the field 'token'"):
        check_environment(bootstrap(environment={"LEVERS9_TOKEN": "x"}))
    with pytest.raises(ValueError, match="LEVERS9_CONTROLPLANE_URL is carried by the field 'controlplane_url'"):
        shell_script(bootstrap(environment={"LEVERS9_CONTROLPLANE_URL": "grpc://elsewhere:1"}))
    with pytest.raises(ValueError, match=r"environment\['LEVERS9_LOG_LEVEL'\] holds a line break"):
        cloud_init(bootstrap(environment={"LEVERS9_LOG_LEVEL": "INFO\nLEVERS9_TOKEN=x"}))
    with pytest.raises(ValueError, match=r"LEVERS9_GPU_COUNT.*whole number"):
        check_environment(bootstrap(environment={"LEVERS9_GPU_COUNT": "two"}))
    with pytest.raises(ValueError, match="token must be a non-empty token without whitespace"):
        shell_script(bootstrap(token="two words"))
    check_environment(bootstrap(environment={"LEVERS9_DISCONNECT_EXIT_S": "120", "CUDA_VISIBLE_DEVICES": "0,1"}))


# --------------------------------------------------------------------------- booting for real


@dataclass
class Boot:
    root: Path
    bin: Path
    out: Path
    result: subprocess.CompletedProcess[str]

    def argv(self) -> str:
        path = self.out / "argv.log"
        return path.read_text() if path.exists() else ""

    def worker(self) -> dict[str, Any]:
        recorded: dict[str, Any] = json.loads((self.out / "levers9-worker.json").read_text())
        return recorded


def _tool(bin_dir: Path, name: str) -> None:
    """``name`` on the test's PATH: the host's own, after noting its arguments (to look for the token there)."""
    real = shutil.which(name)
    assert real is not None, f"the host's {name} is needed"
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nprintf \'{name} %s\\n\' "$*" >>"$BOOT_OUT/argv.log"\nexec {real} "$@"\n')
    path.chmod(0o755)


def _stub_levers9(bin_dir: Path, version: str) -> None:
    """A ``levers9`` whose ``worker`` records its arguments, its environment and the token file it was given."""
    program = f"""#!{sys.executable}
import json, os, stat, sys
out = os.environ["BOOT_OUT"]
if sys.argv[1:] == ["--version"]:
    print("levers9 {version}")
    sys.exit(0)
with open(os.path.join(out, "argv.log"), "a") as log:
    log.write("levers9 " + " ".join(sys.argv[1:]) + "\\n")
token_file = os.environ.get("LEVERS9_TOKEN_FILE", "")
info = os.stat(token_file) if token_file and os.path.exists(token_file) else None
with open(os.path.join(out, "levers9-worker.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ),
               "token_mode": stat.S_IMODE(info.st_mode) if info else None,
               "token": open(token_file).read().strip() if info else None}}, f)
"""
    path = bin_dir / "levers9"
    path.write_text(program)
    path.chmod(0o755)


def _stub(bin_dir: Path, name: str, status: int) -> None:
    """A ``name`` that notes its arguments and exits with ``status`` (docker that starts, python3 without pip)."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nprintf \'{name} %s\\n\' "$*" >>"$BOOT_OUT/argv.log"\nexit {status}\n')
    path.chmod(0o755)


def boot(
    tmp_path: Path,
    b: WorkerBootstrap,
    *,
    levers9: str | None = VERSION,
    stubs: dict[str, int] | None = None,
    existing_bin: bool = False,
) -> Boot:
    root, bin_dir, out = tmp_path / "root", tmp_path / "bin", tmp_path / "out"
    for path in (root, out) if existing_bin else (root, bin_dir, out):
        path.mkdir()
    for name in ("mkdir", "cat", "date"):
        _tool(bin_dir, name)
    if levers9 is not None:
        _stub_levers9(bin_dir, levers9)
    for name, status in (stubs or {}).items():
        _stub(bin_dir, name, status)
    script = tmp_path / "bootstrap.sh"
    script.write_text(shell_script(b))
    env = {"PATH": str(bin_dir), "LEVERS9_BOOT_ROOT": str(root), "BOOT_OUT": str(out), "HOME": str(tmp_path)}
    result = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    return Boot(root, bin_dir, out, result)


def _env_file(root: Path) -> dict[str, str]:
    lines = (root / ENV_PATH.lstrip("/")).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_an_installed_levers9_of_the_right_version_is_started_with_the_token_in_a_0600_file(tmp_path: Path) -> None:
    ran = boot(tmp_path, bootstrap())
    assert ran.result.returncode == 0, ran.result.stderr
    token_file = ran.root / TOKEN_PATH.lstrip("/")
    assert token_file.read_text().strip() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    ca_file = ran.root / CA_PATH.lstrip("/")
    assert ca_file.read_text() == CA
    assert stat.S_IMODE(ca_file.stat().st_mode) == 0o600

    env_file = ran.root / ENV_PATH.lstrip("/")
    assert TOKEN not in env_file.read_text()
    assert _env_file(ran.root) == {
        "LEVERS9_CONTROLPLANE_URL": "grpcs://cp-a.example:1993,grpcs://cp-b.example:1993",
        "LEVERS9_MACHINE_ID": "mach_0123",
        "LEVERS9_POOL": "gpu-h100",
        "LEVERS9_CPU_MILLICORES": "4000",
        "LEVERS9_MEMORY_MIB": "16384",
        "LEVERS9_GPU_COUNT": "0",
        "LEVERS9_CONTROLPLANE_CA_FILE": str(ca_file),
        "LEVERS9_WORKER_STATE_DIR": str(ran.root / "var/lib/levers9/worker"),
    }

    worker = ran.worker()
    assert worker["argv"] == ["worker"]
    assert worker["token"] == TOKEN, "the worker finds its token file"
    assert worker["token_mode"] == 0o600
    env = worker["env"]
    assert env["LEVERS9_TOKEN_FILE"] == str(token_file)
    assert "LEVERS9_TOKEN" not in env
    assert TOKEN not in json.dumps(env)
    for name, value in _env_file(ran.root).items():
        assert env[name] == value
    assert {k for k in env if k.startswith("LEVERS9_")} <= set(WORKER_VARIABLES) | {"LEVERS9_BOOT_ROOT"}

    argv = ran.argv()
    assert "levers9 worker" in argv
    assert "mkdir" in argv
    assert TOKEN not in argv, "the token was on a command line"
    log = (ran.root / "var/log/levers9-bootstrap.log").read_text()
    assert f"starting the installed levers9 {VERSION} worker" in log
    assert TOKEN not in log


def test_with_another_levers9_the_worker_image_runs_in_docker_on_the_host_network(tmp_path: Path) -> None:
    b = bootstrap(
        worker_image="ghcr.io/levers9/worker:0.1.0",
        environment={"LEVERS9_GPU_COUNT": "8", "LEVERS9_DISCONNECT_EXIT_S": "300"},
    )
    ran = boot(tmp_path, b, levers9="0.0.9", stubs={"docker": 0})
    assert ran.result.returncode == 0, ran.result.stderr
    assert not (ran.out / "levers9-worker.json").exists(), "the wrong version must not be run"
    calls = [line for line in ran.argv().splitlines() if line.startswith("docker run")]
    assert len(calls) == 1
    args = calls[0].split()
    etc = ran.root / "etc/levers9"
    # never restarted: the join token is spent, a restarted worker could only be refused
    assert "--restart" not in args
    for expected in (
        ["--network", "host"],
        ["--gpus", "all"],
        ["--env-file", str(etc / "worker.env")],
        ["-e", f"LEVERS9_TOKEN_FILE={etc / 'token'}"],
        ["-v", f"{etc}:{etc}:ro"],
    ):
        at = args.index(expected[0])
        assert args[at : at + len(expected)] == expected
    assert args[-3:] == ["ghcr.io/levers9/worker:0.1.0", "levers9", "worker"]
    assert TOKEN not in ran.argv()
    assert _env_file(ran.root)["LEVERS9_DISCONNECT_EXIT_S"] == "300"

    (tmp_path / "cpu").mkdir()
    cpu_only = boot(tmp_path / "cpu", bootstrap(worker_image="img:1"), levers9=None, stubs={"docker": 0})
    assert cpu_only.result.returncode == 0, cpu_only.result.stderr
    assert "docker run" in cpu_only.argv()
    assert "--gpus" not in cpu_only.argv()


WHEEL = "levers9-0.1.0-py3-none-any.whl"
WHEEL_SHA = "0" * 64


def test_no_levers9_no_docker_and_no_python_fails_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    served = bootstrap(wheel_url=f"https://cp-a.example:8080/api/v1/wheels/{WHEEL}", wheel_sha256=WHEEL_SHA)
    ran = boot(tmp_path / "bare", served, levers9="0.0.9")
    assert ran.result.returncode != 0
    assert f"no levers9 {VERSION} on PATH, and no python3 to install it with" in ran.result.stderr
    assert not (ran.out / "levers9-worker.json").exists()

    # no wheel to install from: never levers9 by name from an index (another project's name there)
    (tmp_path / "nowheel").mkdir()
    ran = boot(tmp_path / "nowheel", bootstrap(), levers9=None, stubs={"python3": 0})
    assert ran.result.returncode != 0
    assert "the controlplane gave no wheel to install it from" in ran.result.stderr
    assert "pip" not in ran.argv()
    assert TOKEN not in ran.argv()


def _python3(bin_dir: Path) -> None:
    """A ``python3`` that cannot make a virtualenv, whose ``pip`` and ``-m levers9`` only note their arguments, and
    that runs anything else (the script's fetch of the wheel) with this interpreter."""
    path = bin_dir / "python3"
    path.write_text(
        "#!/bin/sh\n"
        'printf \'python3 %s\\n\' "$*" >>"$BOOT_OUT/argv.log"\n'
        'case "$1 $2" in "-m venv") exit 1;; "-m pip"|"-m levers9") exit 0;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)


@pytest.fixture
def wheel_server(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A plain HTTP server answering the wheel's bytes at /api/v1/wheels/<WHEEL> (and 404 elsewhere)."""
    import http.server
    import threading

    data = b"PK not really a wheel, but bytes with a hash"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != f"/api/v1/wheels/{WHEEL}":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/wheels/{WHEEL}", data
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_without_levers9_or_docker_the_controlplanes_wheel_is_fetched_checked_and_installed(
    tmp_path: Path, wheel_server: tuple[str, bytes]
) -> None:
    url, data = wheel_server
    good = bootstrap(controlplane_ca="", wheel_url=url, wheel_sha256=hashlib.sha256(data).hexdigest())
    assert "levers9==" not in shell_script(good)
    (tmp_path / "good").mkdir()
    bin_dir = tmp_path / "good" / "bin"
    bin_dir.mkdir()
    _python3(bin_dir)
    ran = boot(tmp_path / "good", good, levers9=None, existing_bin=True)
    assert ran.result.returncode == 0, ran.result.stderr
    wheel = ran.root / "etc/levers9" / WHEEL
    assert wheel.read_bytes() == data
    argv = ran.argv()
    assert f"python3 -m pip install --quiet levers9 @ file://{wheel}" in argv
    assert "python3 -m levers9 worker" in argv
    assert "levers9==" not in argv
    assert TOKEN not in argv

    # a wheel whose hash is not the one the controlplane gave is not kept, nor installed
    bad = bootstrap(controlplane_ca="", wheel_url=url, wheel_sha256="f" * 64)
    (tmp_path / "bad").mkdir()
    bin_dir = tmp_path / "bad" / "bin"
    bin_dir.mkdir()
    _python3(bin_dir)
    ran = boot(tmp_path / "bad", bad, levers9=None, existing_bin=True)
    assert ran.result.returncode != 0
    assert "could not fetch levers9's wheel" in ran.result.stderr
    assert not (ran.root / "etc/levers9" / WHEEL).exists()
    assert "-m pip" not in ran.argv()
    log = (ran.root / "var/log/levers9-bootstrap.log").read_text()
    assert f"not {'f' * 64}: not installed" in log


def test_a_wheel_url_and_hash_are_checked() -> None:
    with pytest.raises(ValueError, match=r"wheel_sha256 .* 64 hex digits"):
        check_environment(bootstrap(wheel_url=f"https://cp/api/v1/wheels/{WHEEL}", wheel_sha256="abc"))
    with pytest.raises(ValueError, match=r"wheel_url .* https:// or http://"):
        check_environment(bootstrap(wheel_url=f"file:///{WHEEL}", wheel_sha256=WHEEL_SHA))
    with pytest.raises(ValueError, match="must end in a wheel's file name"):
        check_environment(bootstrap(wheel_url="https://cp/x;rm -rf", wheel_sha256=WHEEL_SHA))


def test_a_script_run_again_rewrites_its_files_and_starts_again(tmp_path: Path) -> None:
    first = boot(tmp_path, bootstrap())
    assert first.result.returncode == 0, first.result.stderr
    script = tmp_path / "bootstrap.sh"
    env = {"PATH": str(first.bin), "LEVERS9_BOOT_ROOT": str(first.root), "BOOT_OUT": str(first.out)}
    again = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert (first.root / TOKEN_PATH.lstrip("/")).read_text().strip() == TOKEN
    assert first.argv().count("levers9 worker") == 2
    assert sorted(os.listdir(first.root / "etc/levers9")) == ["ca.pem", "token", "worker.env"]
    assert len(_env_file(first.root)) == 8, "the environment file is written anew, not appended to"


# --------------------------------------------------------------------------- the pool's runtime

#: what a runc or gvisor worker container is given on a booted VM: the agent's list (levers9.agent.runtime_access)
OCI_FLAGS = [
    "--cap-add",
    "SYS_ADMIN",
    "--cap-add",
    "NET_ADMIN",
    "--cap-add",
    "SYS_PTRACE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--security-opt",
    "systempaths=unconfined",
    "--cgroupns",
    "host",
    "--init",
    "-v",
    "l9w-mach_0123-state:/var/lib/levers9:rw",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "-v",
    "/run/levers9/network:/run/levers9/network:rw",
    "-e",
    "LEVERS9_WORKER_STATE_DIR=/var/lib/levers9/worker",
]


def _docker_run(tmp_path: Path, runtime: str) -> list[str]:
    (tmp_path / runtime).mkdir()
    b = bootstrap(worker_image="ghcr.io/levers9/worker:0.1.0", runtime=runtime)
    ran = boot(tmp_path / runtime, b, levers9=None, stubs={"docker": 0})
    assert ran.result.returncode == 0, ran.result.stderr
    [call] = [line for line in ran.argv().splitlines() if line.startswith("docker run")]
    return call.split()


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_an_oci_pools_worker_container_gets_what_running_containers_needs(tmp_path: Path, runtime: str) -> None:
    args = _docker_run(tmp_path, runtime)
    at = args.index("--cap-add")
    assert args[at : at + len(OCI_FLAGS)] == OCI_FLAGS, args
    assert args[args.index("--network") + 1] == "host"
    # the state directory the volume holds wins over the environment file's (an -e after --env-file)
    assert args.index("--env-file") < args.index("LEVERS9_WORKER_STATE_DIR=/var/lib/levers9/worker")
    assert args[-3:] == ["ghcr.io/levers9/worker:0.1.0", "levers9", "worker"]
    assert "--privileged" not in args
    # FUSE, which its worker mounts volumes with: given where the machine has it (this one does)
    assert os.path.exists("/dev/fuse"), "this test needs /dev/fuse: modprobe fuse"
    assert "--device=/dev/fuse:/dev/fuse:rwm" in args, args


def test_a_process_pools_worker_container_is_unchanged(tmp_path: Path) -> None:
    args = _docker_run(tmp_path, "process")
    for flag in ("--cap-add", "--security-opt", "--cgroupns", "--init"):
        assert flag not in args, args
    assert not [a for a in args if a.startswith("--device")], args
    assert not [a for a in args if "/sys/fs/cgroup" in a or "l9w-" in a or "/run/levers9" in a], args
    assert bootstrap().runtime == "process", "a bootstrap made without a runtime is a process one"


def test_the_docker_flags_and_the_agents_options_are_one_list() -> None:
    from levers9.agent.runtime_access import worker_access

    options = worker_access("runc", "mach_0123").options
    flags = docker_run_flags("runc", "mach_0123")
    caps = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--cap-add"]
    assert caps == options["cap_add"]
    opts = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--security-opt"]
    assert opts == [*options["security_opt"], "systempaths=unconfined"]
    devices = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--device"]
    assert devices == options["devices"] == ["/dev/fuse:/dev/fuse:rwm"]
    binds = [flags[i + 1] for i, flag in enumerate(flags) if flag == "-v"]
    assert binds == [f"{source}:{b['bind']}:{b['mode']}" for source, b in options["volumes"].items()]
    assert docker_run_flags("process", "mach_0123") == []


def test_a_runc_machine_without_runc_installs_it_with_apt_get(tmp_path: Path) -> None:
    ran = boot(tmp_path, bootstrap(runtime="runc"), stubs={"apt-get": 0})
    assert ran.result.returncode == 0, ran.result.stderr
    assert "apt-get install -y runc" in ran.argv()
    assert ran.worker()["argv"] == ["worker"], "the worker starts after the install"
    log = (ran.root / "var/log/levers9-bootstrap.log").read_text()
    assert "runc is not on PATH and this pool runs runc: apt-get install -y runc" in log

    (tmp_path / "has").mkdir()
    has = boot(tmp_path / "has", bootstrap(runtime="runc"), stubs={"apt-get": 0, "runc": 0})
    assert has.result.returncode == 0, has.result.stderr
    assert "apt-get" not in has.argv(), "runc is there: nothing is installed"

    (tmp_path / "process").mkdir()
    process = boot(tmp_path / "process", bootstrap(), stubs={"apt-get": 0})
    assert "apt-get" not in process.argv(), "a process pool needs no runc"


def test_a_failed_runc_install_retries_after_an_update_and_says_so(tmp_path: Path) -> None:
    ran = boot(tmp_path, bootstrap(runtime="runc"), stubs={"apt-get": 100})
    assert ran.result.returncode == 0, ran.result.stderr
    apt = [line for line in ran.argv().splitlines() if line.startswith("apt-get")]
    assert apt == ["apt-get install -y runc", "apt-get update", "apt-get install -y runc"]
    log = (ran.root / "var/log/levers9-bootstrap.log").read_text()
    assert "apt-get could not install runc" in log
    assert ran.worker()["argv"] == ["worker"], "the worker starts anyway and reports its runtime unavailable"

    (tmp_path / "bare").mkdir()
    bare = boot(tmp_path / "bare", bootstrap(runtime="runc"))
    log = (bare.root / "var/log/levers9-bootstrap.log").read_text()
    assert "no apt-get to install it: the worker will refuse this runc pool" in log


def test_a_gvisor_machine_without_runsc_is_told_what_its_image_needs(tmp_path: Path) -> None:
    ran = boot(tmp_path, bootstrap(runtime="gvisor"), stubs={"apt-get": 0})
    assert ran.result.returncode == 0, ran.result.stderr
    assert "apt-get" not in ran.argv(), "runsc is not installed by the script"
    log = (ran.root / "var/log/levers9-bootstrap.log").read_text()
    assert "runsc is not on PATH and this pool runs gvisor" in log
    assert "apt-get install -y runsc" in log


def test_a_runc_bootstrap_with_a_full_ca_fits_the_user_data_limit() -> None:
    ca = CA * 12  # about a real CA certificate's size and more
    text = cloud_init(bootstrap(runtime="runc", worker_image="ghcr.io/levers9/worker:0.1.0", controlplane_ca=ca))
    assert len(text.encode()) <= USER_DATA_MAX_BYTES
    with pytest.raises(ValueError, match=r"WorkerBootstrap\.runtime"):
        cloud_init(bootstrap(runtime="runc\nrm -rf /"))
