"""A call never reads its worker's credential, and `levers9 pools` says which pools isolate nothing.

Through a real `levers9 up`, a function tries every way it has to find the
machine token of the worker running it: its own environment, its parent's,
the environment and command line of every process it can see, the worker's
token file and everything under the local provider's state directory. It
must find no levers9 token (``l9_<kind>_<random>``) on the process runtime
(where nothing else separates a call from its worker) nor under runc.

Only processes of this test's `levers9 up` count (those that mention its
directory): other suites may run their own on the same machine at the same
time, and what they hold is not this worker's credential.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

HUNT = """
import os, re, sys, levers9

TOKEN = re.compile(r"(?<![A-Za-z0-9_-])l9_[a-z][a-z0-9]{0,15}_[A-Za-z0-9_-]{43}")

@levers9.function(cpu=0.5, memory=256)
def hunt(root, state):
    found, tried = [], []

    def look(where, data):
        tried.append(where)
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        found.extend(f"{where}: {m[:14]}..." for m in TOKEN.findall(text))

    def read(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    look("os.environ", "\\n".join(f"{k}={v}" for k, v in os.environ.items()))
    for who in ("self", str(os.getppid())):
        data = read(f"/proc/{who}/environ")
        if data is not None:
            look(f"/proc/{who}/environ", data)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        environ, cmdline = read(f"/proc/{pid}/environ"), read(f"/proc/{pid}/cmdline")
        seen = (environ or b"") + (cmdline or b"")
        if root.encode() not in seen:
            continue  # not this levers9's: another suite's processes on the same machine
        look(f"/proc/{pid}/environ+cmdline", seen)
        for line in (environ or b"").split(b"\\0"):
            key, _, value = line.decode(errors="replace").partition("=")
            if key in ("LEVERS9_TOKEN_FILE", "LEVERS9_WORKER_STATE_DIR") and read(value) is not None:
                look(value, read(value))
    for top, _, files in os.walk(state):
        for name in files:
            data = read(os.path.join(top, name))
            if data is not None:
                look(os.path.join(top, name), data)
    return os.getuid(), found, len(tried)

uid, found, tried = hunt.remote(ROOT, STATE)
print("HUNT", json.dumps({"uid": uid, "found": found, "tried": tried}))
"""


def hunt(levers9_up: Up) -> dict[str, object]:
    state = levers9_up.root / "state" / "levers9" / "local"
    code = HUNT.replace("ROOT", repr(str(levers9_up.root))).replace("STATE", repr(str(state)))
    done = levers9_up.python("import json\n" + code)
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    line = next(text for text in done.stdout.splitlines() if text.startswith("HUNT "))
    result: dict[str, object] = json.loads(line.removeprefix("HUNT "))
    return result


@pytest.mark.parametrize("runtime", ["process", "runc"])
def test_a_call_finds_no_token_of_its_worker_anywhere_it_can_look(levers9_up: Up, runtime: str) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.start()
    result = hunt(levers9_up)
    assert result["found"] == [], f"a call of the {runtime} runtime found a levers9 token: {result['found']}"
    assert isinstance(result["tried"], int)
    assert result["tried"] >= 2, "the hunt must at least have read its own environment"
    # the worker handed its token over and kept none of it on disk
    assert not list((levers9_up.root / "state").rglob("*.token"))


@pytest.mark.parametrize(("runtime", "isolation"), [("process", "none"), ("runc", "namespaces")])
def test_pools_say_how_isolated_their_calls_are(levers9_up: Up, runtime: str, isolation: str) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.min_workers = 0
    levers9_up.start(wait_workers=0)

    table = levers9_up.levers9("pools")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()[:2]
    assert "isolation" in header.split()
    assert row.split()[header.split().index("isolation")] == isolation

    listed = levers9_up.levers9("pools", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(p["name"], p["isolation"]) for p in json.loads(listed.stdout)] == [("local", isolation)]

    answer = httpx.get(
        f"http://127.0.0.1:{levers9_up.http_port}/api/v1/pools",
        headers={"authorization": f"Bearer {levers9_up.token()}"},
        timeout=30,
    )
    answer.raise_for_status()
    assert [(p["name"], p["isolation"]) for p in answer.json()] == [("local", isolation)]
