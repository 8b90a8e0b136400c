"""Joining a box over SSH: a real sshd on loopback, real paramiko; the box is this machine.

The agent is a stand-in (``agent_argv``, or a ``levers9`` script inside a tiny
image for the image path) that records how it was started, copies the token it
read and saves a fake credential, then sleeps: what is tested here is the SSH
side (connection, checks, shipping, start script, supervisor), not the agent.
Every supervisor, process, container, image and file a test starts is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import platform
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest

from levers9.__about__ import __version__
from levers9.cli.machine_install.box import AgentLayout, AgentSoftware, BoxFacts
from levers9.cli.machine_install.checks import check_box
from levers9.cli.machine_install.join import join_over_ssh
from levers9.cli.machine_install.remote import SshJoinError, SshTarget, connect
from levers9.cli.machine_install.service import start_script, supervisor_script, systemd_unit
from levers9.images.rootfs import ImageError
from levers9.images.wheel import build
from tests.fixtures.dockerd import Dockerd
from tests.fixtures.ports import free_port

if TYPE_CHECKING:
    from tests.fixtures.sshd import Sshd

TOKEN = "l9j_test-token-" + uuid.uuid4().hex
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"

#: stands for ``levers9`` on the box: "agent join|run ... --state-dir DIR [--token-file FILE]"
FAKE_LEVERS9 = """#!/bin/sh
mode=$2
shift 2
dir=
tf=
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir) dir=$2; shift 2 ;;
    --token-file) tf=$2; shift 2 ;;
    *) shift ;;
  esac
done
if [ "$mode" = join ]; then
  cat "$tf" > "$dir/token-seen"
  echo '{"agent_id": "agt_fake123", "token": "secret"}' > "$dir/agent.json"
fi
# the marker last: a test that sees it sees everything this run wrote
echo "$mode $$" >> "$dir/marker"
exec sleep 1000
"""

#: a stand-in that cannot join: exit status 1 (say the controlplane is unreachable), 3 once "refuse" exists
FAILING_LEVERS9 = """#!/bin/sh
mode=$2
shift 2
dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir) dir=$2; shift 2 ;;
    *) shift ;;
  esac
done
echo "$mode $$" >> "$dir/marker"
if [ -f "$dir/refuse" ]; then exit 3; fi
if [ -f "$dir/plain" ]; then exit 2; fi
exit 1
"""


def target_for(server: Sshd, **overrides: object) -> SshTarget:
    fields: dict[str, object] = {
        "user": server.user,
        "host": server.host,
        "port": server.port,
        "key_file": server.client_key,
        "known_hosts_file": server.known_hosts,
        "connect_timeout_s": 10.0,
    }
    fields.update(overrides)
    return SshTarget(**fields)  # type: ignore[arg-type]


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_running(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if fragment in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    members.append(int(entry.name))
    return members


class Box:
    """A layout under a temporary directory, and the cleanup of whatever ran from it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout = AgentLayout(
            state_dir=str(root / "state"),
            lib_dir=str(root / "lib"),
            log_file=str(root / "log" / "agent.log"),
            pid_file=str(root / "run" / "supervise.pid"),
            container_name=f"l9-agent-test-{uuid.uuid4().hex[:8]}",
            service="supervisor",
        )
        self.state = root / "state"
        self.sessions: set[int] = set()

    def supervisor_pid(self) -> int | None:
        path = Path(self.layout.pid_file)
        with contextlib.suppress(OSError, ValueError):
            pid = int(path.read_text().strip())
            if alive(pid):
                self.sessions.add(os.getsid(pid))
                return pid
        return None

    def markers(self) -> list[tuple[str, int]]:
        path = self.state / "marker"
        lines = path.read_text().split("\n") if path.exists() else []
        return [(mode, int(pid)) for mode, pid in (line.split() for line in lines if line.strip())]

    def cleanup(self) -> None:
        self.supervisor_pid()
        for sid in self.sessions:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in session_members(sid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
                with contextlib.suppress(AssertionError):
                    wait_until("the supervisor's session ended", lambda s=sid: not session_members(s), 15)  # type: ignore[misc]
        for pid in processes_running(str(self.root)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path / "box")
    made.root.mkdir()
    try:
        yield made
    finally:
        made.cleanup()
    assert not processes_running(str(made.root)), "a process started from the test's box outlived its cleanup"
    assert not [pid for sid in made.sessions for pid in session_members(sid)], "a supervised process outlived cleanup"


# -- connecting -----------------------------------------------------------------------------------------------


def test_key_auth_with_a_verified_host_key_runs_commands_on_the_box(sshd: Sshd) -> None:
    remote = connect(target_for(sshd))
    try:
        done = remote.run("echo from-the-box; id -u")
        assert done.ok
        assert done.out.split() == ["from-the-box", "0"]
        assert remote.run("cat", stdin=b"through stdin").out == "through stdin"
    finally:
        remote.close()


def test_an_unknown_host_key_is_refused_naming_known_hosts_and_ssh_keyscan(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SshJoinError) as refused:
        connect(target_for(sshd, known_hosts_file=empty))
    message = str(refused.value)
    assert "[1/6]" in message
    assert "unknown" in message
    assert str(empty) in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in message


def test_a_changed_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    kind, key = (tmp_path / "k.pub").read_text().split()[:2]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    with pytest.raises(SshJoinError, match="does not match the one in") as refused:
        connect(target_for(sshd, known_hosts_file=wrong))
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in str(refused.value)


def test_an_unknown_host_key_is_accepted_with_a_warning_when_not_strict(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    said: list[str] = []
    remote = connect(target_for(sshd, known_hosts_file=empty, strict_host_key_checking=False), said.append)
    try:
        assert remote.run("echo ok").out.strip() == "ok"
    finally:
        remote.close()
    assert any("NOT verified" in line for line in said)
    assert empty.read_text() == "", "an unverified key must not be saved to known_hosts"


def test_a_key_the_box_does_not_accept_is_refused(sshd: Sshd) -> None:
    with pytest.raises(SshJoinError, match=r"authentication as root on 127\.0\.0\.1:\d+ failed") as refused:
        connect(target_for(sshd, key_file=sshd.other_key))
    assert str(sshd.other_key) in str(refused.value)


def test_a_port_nobody_listens_on_is_unreachable(sshd: Sshd) -> None:
    with pytest.raises(SshJoinError, match=r"cannot reach root@127\.0\.0\.1"):
        connect(target_for(sshd, port=free_port()))


def test_the_box_is_reached_through_a_jump_host(sshd: Sshd, sshd_factory: Callable[..., Sshd], tmp_path: Path) -> None:
    bastion = sshd_factory(verbose=True)
    # one user, one key and one known_hosts file for both, as on an operator's laptop
    with (bastion.root / "authorized_keys").open("a") as keys:
        keys.write((sshd.root / "client_key.pub").read_text())
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text() + bastion.known_hosts.read_text())
    target = target_for(sshd, known_hosts_file=known, jump=("root", bastion.host, bastion.port))
    remote = connect(target)
    try:
        assert remote.run("echo through-the-bastion").out.strip() == "through-the-bastion"
    finally:
        remote.close()
    wait_until(
        "the bastion's sshd logged the forward to the box",
        lambda: f"target 127.0.0.1 port {sshd.port}" in bastion.log(),
    )
    assert "direct-tcpip" in bastion.log()


# -- checking the box -----------------------------------------------------------------------------------------


def test_docker_unreachable_names_docker_io(sshd: Sshd, box: Box) -> None:
    missing = box.root / "no-such-docker.sock"
    with pytest.raises(SshJoinError) as refused:
        join_over_ssh(
            target_for(sshd),
            controlplane="grpcs://127.0.0.1:1",
            join_token=TOKEN,
            ca_pem=CA_PEM,
            docker_host=f"unix://{missing}",
            echo=lambda _line: None,
            agent_argv=["true"],
            layout=box.layout,
        )
    message = str(refused.value)
    assert "[2/6]" in message
    assert "apt-get install -y docker.io" in message
    assert str(missing) in message
    assert not (box.state / "join-token").exists()


def test_the_box_checks_pass_on_this_machine(sshd: Sshd, dockerd: Dockerd) -> None:
    remote = connect(target_for(sshd))
    try:
        facts = check_box(remote, docker_host=dockerd.host, min_free_gib=1.0)
        assert facts.arch == platform.machine()
        assert facts.uid == 0
        assert facts.docker_version == dockerd.cli("version", "--format", "{{.Server.Version}}").stdout.strip()
        assert facts.docker_root == str(dockerd.root / "data")
        assert facts.free_gib > 1.0
        assert facts.gpus == ()  # this machine has no nvidia-smi
        with pytest.raises(SshJoinError, match=r"only [\d.]+ GiB free in Docker's root .* at least 1e\+09 GiB"):
            check_box(remote, docker_host=dockerd.host, min_free_gib=1e9)
    finally:
        remote.close()


def test_sudo_on_the_box_is_checked(sshd: Sshd, dockerd: Dockerd) -> None:
    """Without sudo on the box the message says to install it; with it (we log in as root), the checks pass."""
    has_sudo = any(Path(d, "sudo").exists() for d in ("/usr/local/bin", "/usr/bin", "/bin"))
    remote = connect(target_for(sshd, sudo=True))
    try:
        if has_sudo:
            assert check_box(remote, docker_host=dockerd.host, min_free_gib=1.0).uid == 0
        else:
            with pytest.raises(SshJoinError, match=r"sudo is not installed on the box: install it"):
                check_box(remote, docker_host=dockerd.host, min_free_gib=1.0)
    finally:
        remote.close()


# -- the service without systemd ------------------------------------------------------------------------------


def _join(server: Sshd, box: Box, dockerd: Dockerd, said: list[str], **kwargs: object) -> object:
    return join_over_ssh(
        target_for(server),
        controlplane=CONTROLPLANE,
        join_token=TOKEN,
        ca_pem=CA_PEM,
        docker_host=dockerd.host,
        echo=said.append,
        layout=box.layout,
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_supervised_agent_joins_outlives_the_session_restarts_and_is_not_doubled(
    sshd: Sshd, dockerd: Dockerd, box: Box
) -> None:
    fake = box.root / "fake-levers9"
    fake.write_text(FAKE_LEVERS9)
    fake.chmod(0o755)
    said: list[str] = []
    first = _join(sshd, box, dockerd, said, agent_argv=[str(fake)])
    assert first.already_joined is False  # type: ignore[attr-defined]
    assert [line[:5] for line in said if line.endswith("... ok") or "... ok:" in line] == [
        "[1/6]",
        "[2/6]",
        "[3/6]",
        "[4/6]",
        "[5/6]",
    ]
    assert all(TOKEN not in line for line in said)

    # the SSH session is closed: the supervisor runs on, and the agent joined with the token from the file
    supervisor = box.supervisor_pid()
    assert supervisor is not None
    wait_until("the agent joined", lambda: [m for m, _ in box.markers()] == ["join"])
    assert (box.state / "token-seen").read_text() == TOKEN
    wait_until("the token file is deleted", lambda: not (box.state / "join-token").exists())
    for written in (box.layout.start_script, box.layout.supervisor_script):
        assert TOKEN not in Path(written).read_text()
    assert "--ca-b64" in Path(box.layout.start_script).read_text()

    # the agent killed: the supervisor starts it again, now from the saved credential
    agent = box.markers()[0][1]
    os.kill(agent, signal.SIGKILL)
    wait_until("the agent was restarted with 'agent run'", lambda: [m for m, _ in box.markers()] == ["join", "run"])
    assert alive(box.markers()[1][1])
    assert "exited with status" in Path(box.layout.log_file).read_text()

    # joined and running: a second run leaves it as it is
    said.clear()
    second = _join(sshd, box, dockerd, said, agent_argv=[str(fake)])
    assert second.already_joined is True  # type: ignore[attr-defined]
    assert second.agent_id == "agt_fake123"  # type: ignore[attr-defined]
    assert any("already running, left as it is" in line for line in said)
    assert box.supervisor_pid() == supervisor
    assert processes_running(box.layout.supervisor_script) == [supervisor]
    assert [m for m, _ in box.markers()] == ["join", "run"]
    assert not (box.state / "join-token").exists()


def test_a_joined_box_whose_service_is_down_gets_it_back_without_a_token(
    sshd: Sshd, dockerd: Dockerd, box: Box
) -> None:
    fake = box.root / "fake-levers9"
    fake.write_text(FAKE_LEVERS9)
    fake.chmod(0o755)
    box.state.mkdir(mode=0o700)
    (box.state / "agent.json").write_text('{"agent_id": "agt_before", "token": "secret"}')
    said: list[str] = []
    result = _join(sshd, box, dockerd, said, agent_argv=[str(fake)])
    assert result.already_joined is False  # type: ignore[attr-defined]
    assert result.agent_id == "agt_before"  # type: ignore[attr-defined]
    assert not (box.state / "join-token").exists()
    wait_until("the agent runs from its credential", lambda: [m for m, _ in box.markers()] == ["run"])


def test_the_token_file_waits_for_a_join_that_failed_and_goes_when_the_token_is_refused(
    sshd: Sshd, dockerd: Dockerd, box: Box
) -> None:
    fake = box.root / "failing-levers9"
    fake.write_text(FAILING_LEVERS9)
    fake.chmod(0o755)
    _join(sshd, box, dockerd, [], agent_argv=[str(fake)])
    supervisor = box.supervisor_pid()
    assert supervisor is not None
    wait_until("the join was tried again", lambda: [m for m, _ in box.markers()][:2] == ["join", "join"])
    token = box.state / "join-token"
    assert token.read_text() == TOKEN  # kept for the next try
    assert token.stat().st_mode & 0o777 == 0o600
    assert box.state.stat().st_mode & 0o777 == 0o700

    (box.state / "refuse").touch()
    wait_until("the supervisor stopped after exit status 3", lambda: not alive(supervisor), 90)
    assert not token.exists()
    assert not Path(box.layout.pid_file).exists()
    assert "exited with status 3" in Path(box.layout.log_file).read_text()


def test_an_agent_that_exits_with_status_2_is_not_restarted(sshd: Sshd, dockerd: Dockerd, box: Box) -> None:
    """Status 2: the agent's command or the controlplane's address was refused; restarting changes nothing."""
    fake = box.root / "failing-levers9"
    fake.write_text(FAILING_LEVERS9)
    fake.chmod(0o755)
    box.state.mkdir(parents=True, exist_ok=True)
    (box.state / "plain").touch()
    _join(sshd, box, dockerd, [], agent_argv=[str(fake)])
    # the supervisor may have stopped already (the agent fails at once): then its pid file names no live process
    supervisor = box.supervisor_pid()
    if supervisor is not None:
        wait_until("the supervisor stopped after exit status 2", lambda: not alive(supervisor), 90)
    wait_until("the log to say why", lambda: "exited with status 2" in Path(box.layout.log_file).read_text(), 30)
    assert [m for m, _ in box.markers()] == ["join"]
    assert "exited with status 2" in Path(box.layout.log_file).read_text()


def _fake(box: Box) -> str:
    fake = box.root / "fake-levers9"
    fake.write_text(FAKE_LEVERS9)
    fake.chmod(0o755)
    return str(fake)


CONTROLPLANE = "grpcs://controlplane.example:8443"


def test_a_box_whose_machine_was_removed_joins_again_with_the_new_token(sshd: Sshd, dockerd: Dockerd, box: Box) -> None:
    """Issue 35 item 14: the revoked credential of a removed machine is replaced, not reused (before, the box kept
    it, 'already joined', and the new machine waited its 300 s pending)."""
    fake = _fake(box)
    first = _join(sshd, box, dockerd, [], agent_argv=[fake])
    assert first.already_joined is False  # type: ignore[attr-defined]
    wait_until("the agent joined", lambda: [m for m, _ in box.markers()] == ["join"])
    before = box.supervisor_pid()
    # what a join saves names its controlplane: the check for another controlplane reads it
    (box.state / "agent.json").write_text(f'{{"agent_id": "agt_fake123", "controlplane": "{CONTROLPLANE}"}}')
    (box.state / "token-seen").unlink()

    said: list[str] = []
    asked: list[str] = []

    def removed(agent_id: str) -> bool:  # the controlplane no longer lists the machine
        asked.append(agent_id)
        return False

    again = _join(sshd, box, dockerd, said, agent_argv=[fake], is_live=removed)
    assert asked == ["agt_fake123"]
    assert again.already_joined is False  # type: ignore[attr-defined]
    assert again.agent_id is None  # type: ignore[attr-defined]
    assert any("which this controlplane no longer has" in line for line in said), said
    assert "agt_fake123" in (box.state / "agent.json.replaced").read_text()
    wait_until("the agent joined again with the new token", lambda: [m for m, _ in box.markers()] == ["join", "join"])
    assert (box.state / "token-seen").read_text() == TOKEN
    assert before is not None
    assert not alive(before), "the revoked agent's supervisor was stopped"
    assert box.supervisor_pid() not in (None, before)

    # the same again with the machine live: left as it is
    said.clear()
    kept = _join(sshd, box, dockerd, said, agent_argv=[fake], is_live=lambda agent_id: True)
    assert kept.already_joined is True  # type: ignore[attr-defined]
    assert [m for m, _ in box.markers()] == ["join", "join"]


def test_a_box_joined_to_another_controlplane_is_not_taken_over(sshd: Sshd, dockerd: Dockerd, box: Box) -> None:
    box.state.mkdir(mode=0o700, parents=True)
    credential = '{"agent_id": "agt_elsewhere", "controlplane": "grpcs://other.example:50051"}'
    (box.state / "agent.json").write_text(credential)
    with pytest.raises(SshJoinError, match=r"joined to another controlplane .grpcs://other.example:50051") as caught:
        _join(sshd, box, dockerd, [], agent_argv=[_fake(box)], is_live=lambda agent_id: False)
    assert "agt_elsewhere" in str(caught.value)
    assert (box.state / "agent.json").read_text() == credential
    assert box.supervisor_pid() is None


def test_without_a_join_token_a_box_that_is_not_joined_is_refused(sshd: Sshd, dockerd: Dockerd, box: Box) -> None:
    """What ``machine create --ssh`` of an existing machine does on a box that lost (or never had) its credential."""
    said: list[str] = []
    with pytest.raises(SshJoinError, match=r"the box is not joined .* and no join token was given"):
        join_over_ssh(
            target_for(sshd),
            controlplane=CONTROLPLANE,
            join_token=None,
            ca_pem=CA_PEM,
            docker_host=dockerd.host,
            echo=said.append,
            layout=box.layout,
            agent_argv=[_fake(box)],
            is_live=lambda agent_id: True,
        )
    assert box.supervisor_pid() is None
    assert not (box.state / "join-token").exists()


@pytest.fixture
def wheel_server() -> Iterator[tuple[str, bytes]]:
    """levers9's own wheel over plain HTTP at /api/v1/wheels/<name>, as the controlplane serves it."""
    import http.server
    import threading

    wheel = build()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != f"/api/v1/wheels/{wheel.filename}":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(wheel.size))
            self.end_headers()
            self.wfile.write(wheel.data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/wheels/{wheel.filename}", wheel.data
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _box_python(box: Box) -> str:
    """Stands for the box's ``python3``: its ``-m venv`` makes a virtualenv whose python is this interpreter but for
    ``-m pip``, which notes its arguments and installs a stand-in ``levers9`` (of this version) beside it."""
    levers9 = box.root / "levers9-from-wheel"
    levers9.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "levers9 {__version__}"; exit 0; fi\nexec {_fake(box)} "$@"\n'
    )
    venv_python = box.root / "venv-python"
    venv_python.write_text(
        '#!/bin/sh\nbin=$(dirname "$0")\n'
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> "$bin/../pip.log"; cp {levers9} "$bin/levers9"; '
        "exit 0; fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python = box.root / "box-python3"
    python.write_text(
        '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && '
        f'cp {venv_python} "$3/bin/python"; exit $?; fi\nexec {sys.executable} "$@"\n'
    )
    for made in (levers9, venv_python, python):
        made.chmod(0o755)
    return str(python)


def _unsendable(out: BinaryIO) -> None:
    raise ImageError("the worker image needs runc on this machine: apt-get install -y runc")


def test_where_the_image_cannot_be_sent_the_controlplanes_wheel_is_installed_its_hash_checked(
    sshd: Sshd, dockerd: Dockerd, box: Box, wheel_server: tuple[str, bytes]
) -> None:
    """Issue 35 item 16: levers9 on the box from the controlplane's own wheel (never by name from an index); before,
    the step failed telling to 'pip install levers9==0.1.0', another project's package on the public index."""
    url, data = wheel_server
    python = _box_python(box)
    lib = Path(box.layout.lib_dir)
    said: list[str] = []

    def join(sha256: str) -> object:
        return join_over_ssh(
            target_for(sshd),
            controlplane=CONTROLPLANE,
            join_token=TOKEN,
            ca_pem="",
            docker_host=dockerd.host,
            echo=said.append,
            layout=box.layout,
            image_tar=_unsendable,
            image_tag="levers9-test/unsendable:1",
            image_changes=[],
            wheel=(url, sha256),
            python=python,
        )

    with pytest.raises(SshJoinError, match=r"has sha256 [0-9a-f]{64}, not f{64}: not installed"):
        join("f" * 64)
    # what docker import made of the broken stream is not left tagged (it would be 'not sent again' next time)
    assert dockerd.cli("image", "inspect", "levers9-test/unsendable:1", check=False).returncode != 0
    assert not (lib / url.rsplit("/", 1)[-1]).exists()
    assert not (lib / "venv" / "pip.log").exists()
    assert box.supervisor_pid() is None

    said.clear()
    join(hashlib.sha256(data).hexdigest())
    assert any("could not be built here" in line and "controlplane's wheel instead" in line for line in said), said
    assert any(f"ok: levers9 {__version__} installed from the controlplane's wheel" in line for line in said), said
    wheel = lib / url.rsplit("/", 1)[-1]
    assert wheel.read_bytes() == data
    assert (lib / "venv" / "pip.log").read_text().split() == [
        "-m",
        "pip",
        "install",
        "--quiet",
        "levers9[agent]",
        "@",
        f"file://{wheel}",
    ]
    assert f"{lib}/venv/bin/levers9 agent join" in Path(box.layout.start_script).read_text()
    wait_until("the agent installed from the wheel joined", lambda: [m for m, _ in box.markers()] == ["join"])
    assert all("levers9==" not in line for line in said)


# -- shipping the worker image ----------------------------------------------------------------------------------


def _libraries(binary: str) -> list[str]:
    done = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    return [part for line in done.stdout.splitlines() for part in line.split() if part.startswith("/")]


def _write_rootfs(out: BinaryIO) -> None:
    """A tiny root filesystem whose ``levers9`` is the stand-in agent (streamed: ``w|``)."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        added: set[str] = set()
        for tool in ("/bin/sh", "/bin/sleep", "/bin/cat"):
            for path in (tool, *_libraries(tool)):
                if path not in added:
                    added.add(path)
                    tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
        for directory in ("tmp", "proc", "sys", "dev", "etc", "usr/local/bin"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        script = FAKE_LEVERS9.encode()
        info = tarfile.TarInfo("usr/local/bin/levers9")
        info.size = len(script)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(script))


def test_the_worker_image_is_shipped_once_and_the_agent_runs_in_it(sshd: Sshd, dockerd: Dockerd, box: Box) -> None:
    tag = f"levers9-test/ssh-agent:{uuid.uuid4().hex[:8]}"
    sent: list[int] = []

    def image_tar(out: BinaryIO) -> None:
        sent.append(1)
        _write_rootfs(out)

    try:
        said: list[str] = []
        first = _join(
            sshd, box, dockerd, said, image_tar=image_tar, image_tag=tag, image_changes=["ENV PATH=/usr/local/bin:/bin"]
        )
        assert first.already_joined is False  # type: ignore[attr-defined]
        assert sent == [1]
        image_id = dockerd.cli("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        assert "PATH=/usr/local/bin:/bin" in dockerd.cli("image", "inspect", "--format", "{{.Config.Env}}", tag).stdout
        assert any(f"container of {tag}" in line for line in said)
        wait_until("the agent joined in its container", lambda: [m for m, _ in box.markers()] == ["join"])
        assert (box.state / "token-seen").read_text() == TOKEN
        wait_until("the token file is deleted", lambda: not (box.state / "join-token").exists())
        running = [c for c in dockerd.containers() if c["name"] == box.layout.container_name]
        assert [c["state"] for c in running] == ["running"]

        said.clear()
        second = _join(sshd, box, dockerd, said, image_tar=image_tar, image_tag=tag, image_changes=[])
        assert second.already_joined is True  # type: ignore[attr-defined]
        assert sent == [1], "the image was sent again"
        assert any("has " + tag + " already" in line for line in said)
        assert dockerd.cli("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip() == image_id
    finally:
        dockerd.cli("rm", "-f", box.layout.container_name, check=False)
        box.cleanup()
        dockerd.cli("rmi", "-f", tag, check=False)


# -- what is written for systemd (this machine has none to run it) ----------------------------------------------


def test_the_systemd_unit_restarts_the_agent_but_not_after_a_refused_credential() -> None:
    layout = AgentLayout()
    unit = systemd_unit(layout)
    assert "ExecStart=/bin/sh /usr/local/lib/levers9/agent-start\n" in unit
    assert "Restart=always\n" in unit
    assert "RestartPreventExitStatus=2 3\n" in unit
    assert "WantedBy=multi-user.target" in unit
    facts = BoxFacts(0, "/root", "x86_64", True, None, "24.0", "/var/lib/docker", "{}", 50.0)
    software = AgentSoftware(("/usr/local/bin/levers9",), "installed")
    script = start_script(layout, software, facts, controlplane="grpcs://cp:8443", ca_pem=CA_PEM)
    assert "--token-file /var/lib/levers9/agent/join-token" in script
    assert "agent run --state-dir /var/lib/levers9/agent" in script
    assert "--insecure" not in script
    # a plain-text controlplane (development): the agent must be told, or it refuses to join (exit status 2)
    plain = start_script(layout, software, facts, controlplane="grpc://10.0.0.5:8443", ca_pem="")
    assert "agent join --controlplane grpc://10.0.0.5:8443 --insecure --state-dir" in plain, plain
    assert "supervisor" in supervisor_script(layout)
