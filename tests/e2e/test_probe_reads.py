"""What a call can reach on each runtime: the reads a security probe made from a call, refused everywhere.

On the default install the probe's call ran as root and read the controlplane's SQLite database and secret key
(and so decrypted every workspace's secrets), the memory and environment of the controlplane and the worker
(user tokens, the worker's session credential), the embedded Redis socket, and other calls' environments.
Here a call of a real `levers9 up` tries each, on the process runtime (calls as nobody), runc and gVisor;
another call of the same function holds a secret in its environment meanwhile. On runc and gVisor it is another
container, which the probe must not see; on the process runtime the two share a user, which is why a pool of it
serves one workspace only, and a call of any other workspace is refused there.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time

import pytest

from tests.fixtures.levers9_up import Up, _processes_mentioning

pytestmark = pytest.mark.timeout(600)

PROBE = """
import json, os, socket, sys, time
import levers9

SECRET = {secret!r}

@levers9.function(cpu=0.25, memory=256, env={{"PROBE_SECRET": SECRET}}, timeout=300)
def hold(seconds):
    time.sleep(seconds)
    return "held"

@levers9.function(cpu=0.25, memory=256, timeout=300)
def probe(files, pids, sock):
    def attempt(what):
        try:
            what()
            return "REACHED"
        except Exception as exc:
            return type(exc).__name__
    out = {{"whoami": os.geteuid()}}
    for path in files:
        out[path] = attempt(lambda p=path: open(p, "rb").read(1))
    for pid in pids:
        # opening mem is the access check (ptrace's); offset 0 is never mapped, so nothing is read
        out[f"/proc/{{pid}}/mem"] = attempt(lambda p=f"/proc/{{pid}}/mem": open(p, "rb").close())
        out[f"/proc/{{pid}}/environ"] = attempt(lambda p=f"/proc/{{pid}}/environ": open(p, "rb").read(1))
    def redis():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
        finally:
            s.close()
    out[sock] = attempt(redis)
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if SECRET.encode() in open(f"/proc/{{entry}}/environ", "rb").read():
                    seen.append(int(entry))
            except OSError:
                pass
    out["sees the other call's environment"] = bool(seen)
    return out

import subprocess

def running_holds():
    listed = subprocess.run([sys.executable, "-m", "levers9", "tasks", "--status", "running", "--json"],
                            capture_output=True, text=True, check=True).stdout
    return [t for t in json.loads(listed or "[]") if t.get("function") == "hold"]

held = hold.spawn(120)
deadline = time.time() + 120
while not running_holds():  # the other call holds its secret before the probe looks for it
    assert time.time() < deadline, "the holding call never ran"
    time.sleep(0.2)
print("PROBE", json.dumps(probe.remote({files!r}, {pids!r}, {sock!r})))
held.cancel()
"""


@pytest.mark.parametrize("runtime", ["process", "runc", "gvisor"])
def test_a_call_reaches_neither_the_controlplane_nor_the_worker_nor_another_call(levers9_up: Up, runtime: str) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.start(wait_workers=1)
    assert levers9_up.process is not None
    data = levers9_up.home / "data"
    files = [str(data / "levers9.db"), str(data / "secret.key")]
    for path in files:
        with open(path, "rb") as f:  # they exist: a refusal below is not for want of a file
            assert f.read(1)
    workers = [pid for pid, cmd in _processes_mentioning(str(levers9_up.root)) if cmd.endswith("levers9 worker")]
    assert workers, "the local pool's worker process"
    pids = [levers9_up.process.pid, *workers]
    sock = str(data / "redis" / "redis.sock")
    secret = f"levers9-probe-{secrets.token_hex(8)}"
    code = PROBE.format(secret=secret, files=files, pids=pids, sock=sock)
    done = levers9_up.python(code, timeout=400)
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    line = next(text for text in done.stdout.splitlines() if text.startswith("PROBE "))
    answers = json.loads(line.removeprefix("PROBE "))
    seen = answers.pop("sees the other call's environment")
    reached = {what: answer for what, answer in answers.items() if answer == "REACHED"}
    assert reached == {}, f"a {runtime} call reached {reached} (all answers: {answers})"
    if runtime == "process":
        assert answers["whoami"] != 0, "a process call runs as nobody, never as root"
        # calls of one process pool share the user nobody, so they see each other: the pool serves one
        # workspace (test_a_pool_that_isolates_nothing_refuses_another_workspaces_calls)
        assert seen, "the holding call ran as nobody too"
    else:
        assert not seen, f"a {runtime} call saw another container's environment"


def test_a_pool_that_isolates_nothing_refuses_another_workspaces_calls(levers9_up: Up) -> None:
    """The process pool serves the workspace `up` made (its config says so): a call of another is refused."""
    levers9_up.start(wait_workers=1)
    made = levers9_up.levers9("token", "create", "--workspace", "team-b")
    assert made.returncode == 0, made.stderr
    other = re.findall(r"l9_user_[A-Za-z0-9_-]+", made.stdout)[-1]
    env = {**levers9_up.env, "LEVERS9_TOKEN": other}
    path = levers9_up.root / f"other_{int(time.time() * 1e6)}.py"
    path.write_text(
        "import levers9\n\n@levers9.function(cpu=0.25, memory=256)\ndef f():\n    return 1\n\n"
        "try:\n    f.remote()\nexcept Exception as exc:\n    print('REFUSED', type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120, cwd=levers9_up.root
    )
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout, done.stdout
    assert "Unschedulable" in done.stdout or "no pool" in done.stdout.lower(), done.stdout
