"""A function through `levers9 up` in real containers: the pool's runtime comes from the config.

The local pool here runs its calls under runc (namespaces and cgroups) or gVisor
(a user-space kernel) instead of plain processes. Needs root, runc and runsc
(`scripts/setup` installs them); without them the test fails saying so.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_function_runs_in_a_container_of_the_pools_runtime(levers9_up: Up, runtime: str) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.start()
    done = levers9_up.python(
        """
        import os, levers9

        @levers9.function(cpu=0.5, memory=256, env={"GREETING": "hello"})
        def inside(x):
            # pid 1 inside its own pid namespace, its own hostname, and the env it was given
            with open("/proc/1/cmdline", "rb") as f:
                init = f.read().split(b"\\0")[0].decode()
            return x * 2, os.environ["GREETING"], os.getpid(), init, open("/proc/version").read()

        value, greeting, pid, init, version = inside.remote(21)
        print("RESULT", value, greeting, pid < 50, "runner" in init or "python" in init, version[:60].replace(" ", "_"))
        print("MAP", list(inside.map(range(5)))[4][0])
        """
    )
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    line = next(text for text in done.stdout.splitlines() if text.startswith("RESULT"))
    _, value, greeting, small_pid, python_init, version = line.split()
    assert (value, greeting, small_pid, python_init) == ("42", "hello", "True", "True")
    if runtime == "gvisor":
        assert "gVisor" in version or "4.4.0" in version  # gVisor's kernel reports itself, not the host's
    else:
        assert os.uname().release in version.replace("_", " ")  # runc shares the host kernel
    assert "MAP 8" in done.stdout
    tasks = json.loads(levers9_up.levers9("tasks", "--json").stdout)
    assert all(t["status"] == "complete" for t in tasks if t.get("function") == "inside")


def test_a_checkpointed_function_starts_its_next_container_from_the_snapshot(levers9_up: Up) -> None:
    """gVisor: the first container is snapshotted once its function is loaded; the next is restored from it.

    Loading the function builds state that takes 5 s (as importing a big library or loading a model
    would): a random token. A container started cold builds a new token; one restored from the
    snapshot has the first one's token without building it.
    """
    levers9_up.use_runtime("gvisor")
    levers9_up.start()
    database = levers9_up.home / "data" / "levers9.db"
    done = levers9_up.python(
        f"""
        import json, os, secrets, sqlite3, subprocess, time, levers9
        from pathlib import Path

        def build():
            time.sleep(5)  # the start-up a snapshot saves
            return secrets.token_hex(8)

        class Loaded:
            # pickled as "call build()": the state is built where the function is loaded, in its container
            def __reduce__(self):
                return (build, ())

        STATE = Loaded()
        INSTANCE = []

        @levers9.function(checkpoint=True, keep_warm=1)
        def whoami(_):
            if not INSTANCE:  # made on the first call, after any snapshot: one per container
                INSTANCE.append(secrets.token_hex(8))
            return STATE, INSTANCE[0]

        first = whoami.remote(0)
        deadline = time.monotonic() + 120
        with sqlite3.connect({str(database)!r}) as db:
            while not db.execute("select 1 from checkpoints where status = 'available'").fetchall():
                assert time.monotonic() < deadline, "no checkpoint became available"
                time.sleep(0.2)
            print("CHECKPOINTS", json.dumps(db.execute("select runtime, status from checkpoints").fetchall()))
        # wait for the first container to be reaped (idle longer than keep_warm): none left running under the
        # worker's runsc root (the checkpoint keeps the same container running; nothing else runs here)
        roots = [d for d in Path(os.environ["XDG_STATE_HOME"]).rglob("runsc") if d.is_dir()]
        assert roots, "no runsc root under the worker's state directory"

        def running():
            listed = [
                subprocess.run(["runsc", "--root", str(r), "list", "-format", "json"],
                               capture_output=True, text=True, check=True).stdout
                for r in roots
            ]
            return [c["id"] for out in listed for c in json.loads(out or "[]") or [] if c["status"] != "stopped"]

        deadline = time.monotonic() + 60
        while running():
            assert time.monotonic() < deadline, f"the idle container was not reaped: {{running()}}"
            time.sleep(0.2)
        second = whoami.remote(1)
        print("RESULT", json.dumps([first, second]))
        """
    )
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    out = done.stdout
    assert json.loads(out.split("CHECKPOINTS", 1)[1].splitlines()[0]) == [["gvisor", "available"]]
    (first_state, first_container), (second_state, second_container) = json.loads(
        out.split("RESULT", 1)[1].splitlines()[0]
    )
    assert second_container != first_container, "the second call ran in the first container: it was not reaped"
    assert second_state == first_state, "the second container was started cold, not restored from the snapshot"
