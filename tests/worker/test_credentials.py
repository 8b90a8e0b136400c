"""A worker takes its token from a file it then deletes, keeps none in its environment, and is not dumpable."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.worker.credentials import (
    SESSION_FILE,
    read_session_credential,
    save_session_credential,
    take_token_file,
    write_token_file,
)
from levers9.worker.session import options_from_env

TOKEN = "l9_machine_" + "A" * 43


def test_the_token_file_is_read_once_and_deleted(tmp_path: Path) -> None:
    path = write_token_file(tmp_path / "w.token", TOKEN)
    assert path.stat().st_mode & 0o777 == 0o600
    options = options_from_env({"LEVERS9_TOKEN_FILE": str(path), "LEVERS9_CONTROLPLANE_URL": "grpc://cp:1993"})
    assert options["token"] == TOKEN
    assert options["controlplane"] == "grpc://cp:1993"
    assert not path.exists()


def test_a_token_file_others_may_read_or_that_is_missing_is_refused_by_name(tmp_path: Path) -> None:
    loose = tmp_path / "loose.token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    with pytest.raises(ValueError, match=r"LEVERS9_TOKEN_FILE=.*loose\.token.*mode 0600"):
        take_token_file(str(loose))
    assert loose.exists(), "a refused file is left for the operator to fix"
    with pytest.raises(ValueError, match=r"LEVERS9_TOKEN_FILE=.*missing\.token.*cannot read"):
        take_token_file(str(tmp_path / "missing.token"))


SESSION = "l9_machine_" + "B" * 43


def test_a_restarted_worker_registers_with_its_saved_session_credential_not_the_spent_join_token(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    saved = save_session_credential(state, SESSION, "wkr_0123")
    assert saved == state / SESSION_FILE
    assert saved.stat().st_mode & 0o777 == 0o600
    assert read_session_credential(state) == (SESSION, "wkr_0123")
    join = write_token_file(tmp_path / "w.token", TOKEN)  # a read-only mount, say, that still holds it
    env = {"LEVERS9_TOKEN_FILE": str(join), "LEVERS9_WORKER_STATE_DIR": str(state)}
    options = options_from_env(env)
    assert (options["token"], options["worker_id"]) == (SESSION, "wkr_0123"), "it registers as the same worker"
    assert not join.exists(), "the spent join token file is removed all the same"
    # the --state-dir option names the directory as well as the variable does
    assert options_from_env({"LEVERS9_TOKEN": TOKEN}, state_dir=state)["token"] == SESSION
    # without one, the join token as before
    assert options_from_env({"LEVERS9_TOKEN": TOKEN}, state_dir=tmp_path / "fresh")["token"] == TOKEN


def test_a_session_credential_file_others_may_read_is_refused(tmp_path: Path) -> None:
    save_session_credential(tmp_path, SESSION, "wkr_0123")
    (tmp_path / SESSION_FILE).chmod(0o640)
    with pytest.raises(ValueError, match=r"session credential .*session-credential.*mode 0600"):
        options_from_env({"LEVERS9_WORKER_STATE_DIR": str(tmp_path), "LEVERS9_TOKEN": TOKEN})


def test_the_worker_names_a_variable_it_does_not_read_that_is_a_near_miss(caplog: pytest.LogCaptureFixture) -> None:
    env = {"LEVERS9_TOKEN": TOKEN, "LEVERS9_DISCONECT_EXIT_S": "60", "LEVERS9_CONTEXT": "prod"}
    with caplog.at_level("WARNING", logger="levers9.worker.environment"):
        options = options_from_env(env)
    assert "disconnect_exit_s" not in options
    [warning] = [r.getMessage() for r in caplog.records]
    assert "LEVERS9_DISCONECT_EXIT_S is not a variable the worker reads" in warning
    assert "did you mean LEVERS9_DISCONNECT_EXIT_S?" in warning
    with pytest.raises(
        ValueError, match=r"LEVERS9_MEMORY_MIB='4GiB' is not a whole number \(memory this worker offers, in MiB"
    ):
        options_from_env({"LEVERS9_MEMORY_MIB": "4GiB"})


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory ``nobody`` owns, outside pytest's root-only temporary directory."""
    if os.geteuid() != 0:
        pytest.fail("this test starts a worker as another user: run it as root (scripts/setup does)")
    path = Path(tempfile.mkdtemp(prefix="levers9-cred-", dir="/tmp"))
    entry = pwd.getpwnam("nobody")
    os.chown(path, entry.pw_uid, entry.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_worker_deletes_its_token_file_and_its_own_user_cannot_read_its_proc_files(nobody_dir: Path) -> None:
    """Run as nobody, so that "its own user" is not root (root may read any process's files)."""
    entry = pwd.getpwnam("nobody")
    token_file = write_token_file(nobody_dir / "worker.token", TOKEN)
    os.chown(token_file, entry.pw_uid, entry.pw_gid)
    # The interpreter of this virtualenv may live where nobody cannot go (under /root): the system's own
    # Python of the same version runs the same installed code from the virtualenv's readable directories.
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None, "the host's python3 is needed to run a worker as nobody"
    core = Path(__file__).resolve().parents[2] / "core"
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(nobody_dir),
        "PYTHONPATH": f"{core}:{site}",
        "LEVERS9_CONTROLPLANE_URL": "grpc://127.0.0.1:9",  # nothing listens: it keeps retrying
        "LEVERS9_TOKEN_FILE": str(token_file),
        "LEVERS9_POOL": "cred",
        "LEVERS9_MACHINE_ID": "m-cred",
        "LEVERS9_WORKER_STATE_DIR": str(nobody_dir / "state"),
    }
    worker = subprocess.Popen(
        [python, "-m", "levers9", "worker"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while token_file.exists():
            if worker.poll() is not None:
                out = worker.stdout.read().decode(errors="replace") if worker.stdout else ""
                pytest.fail(f"the worker exited with {worker.returncode} before reading its token:\n{out}")
            assert time.monotonic() < deadline, "the worker did not take its token file within 60 s"
            time.sleep(0.05)
        assert worker.poll() is None
        # Non-dumpable: its /proc files belong to root, so a call running as the worker's user cannot read
        # its environment or memory, nor attach to it.
        assert Path(f"/proc/{worker.pid}/environ").stat().st_uid == 0
        probe = subprocess.run(
            ["cat", f"/proc/{worker.pid}/environ"],
            user=entry.pw_uid,
            group=entry.pw_gid,
            extra_groups=[],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert probe.returncode != 0
        assert b"Permission denied" in probe.stderr
        assert TOKEN.encode() not in Path(f"/proc/{worker.pid}/environ").read_bytes()  # not even for root
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()
