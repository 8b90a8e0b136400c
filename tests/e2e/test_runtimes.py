"""A function through `levers9 up` in real containers: the pool's runtime comes from the config.

The local pool here runs its calls under runc (namespaces and cgroups) or gVisor
(a user-space kernel) instead of plain processes. Needs root, runc and runsc
(`scripts/setup` installs them); without them the test fails saying so.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_function_runs_in_a_container_of_the_pools_runtime(levers9_up: Up, runtime: str) -> None:
    binary = {"runc": "runc", "gvisor": "runsc"}[runtime]
    if shutil.which(binary) is None or os.geteuid() != 0:
        pytest.fail(f"this test needs root and {binary}: run scripts/setup as root")
    levers9_up.runtime = runtime
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
