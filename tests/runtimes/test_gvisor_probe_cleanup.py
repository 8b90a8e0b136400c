"""The gVisor plugin's network probe leaves nothing when runsc hangs (its KVM platform did here once).

A real network namespace with a process in it, and a process naming the probe's id, stand for a probe
sandbox and its gofer that ``runsc delete`` cannot end; the runsc given is a script that hangs, as runsc did.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from levers9_gvisor import remove_probe


def test_a_hung_probe_is_killed_and_its_namespace_removed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces): run it as root, as scripts/test does")
    hung = tmp_path / "runsc"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    probe_id, netns = f"l9-probe-{secrets.token_hex(5)}", f"l9p-{secrets.token_hex(5)}"
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(subprocess.Popen(["ip", "netns", "exec", netns, "sleep", "600"], start_new_session=True))
        started.append(subprocess.Popen(["sh", "-c", "sleep 600", probe_id], start_new_session=True))
        shell = started[1].pid
        children = Path(f"/proc/{shell}/task/{shell}/children")
        while not children.read_text().split():  # the shell's sleep, which names no probe id: a gofer's stand-in
            assert started[1].poll() is None
            time.sleep(0.01)
        [child] = [int(pid) for pid in children.read_text().split()]
        remove_probe(str(hung), tmp_path / "root", probe_id, netns, timeout_s=1)
        for process in started:
            assert process.wait(timeout=30) == -9
        for _ in range(300):
            if not Path(f"/proc/{child}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{child}").exists(), "the probe's descendant outlived it"
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert netns not in listed
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
