"""A full data directory: health fails naming it, new work is refused clearly, reads go on, and it recovers alone.

The data directory of a real `levers9 up` is a small tmpfs, filled with a file
while it runs: SQLite's file, its log and the embedded Redis's socket live
there, as on a real machine whose disk filled up.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.levers9_up import Up
from tests.fixtures.tmpfs import fill, tmpfs

pytestmark = pytest.mark.timeout(600)

#: a program that registers a function never seen before and calls it once
NEW_CALL = """
import levers9

@levers9.function(cpu=0.25, memory=64)
def after_the_disk_filled(x):
    return x * 3

print("RESULT", after_the_disk_filled.remote(14))
"""


def test_a_full_data_directory_fails_health_refuses_new_work_keeps_reads_and_recovers_once_freed(
    levers9_up: Up,
) -> None:
    data = levers9_up.home / "data"
    with tmpfs(data, 128 * 1024 * 1024):
        levers9_up.start()
        api = f"http://127.0.0.1:{levers9_up.http_port}/api/v1"
        done = levers9_up.python(
            """
            import levers9

            @levers9.function(cpu=0.25, memory=64)
            def before(x):
                return x + 1

            print("RESULT", before.remote(1))
            """
        )
        assert done.returncode == 0, done.stderr
        assert "RESULT 2" in done.stdout
        [task] = [t for t in json.loads(levers9_up.levers9("tasks", "--json").stdout) if t["function"] == "before"]
        assert httpx.get(f"{api}/health", timeout=10).status_code == 200
        # a token first used once the disk is full: its first use is when its "last used" is stamped
        issued = levers9_up.levers9("token", "create", "--workspace", "default")
        assert issued.returncode == 0, issued.stderr
        auth = {"authorization": f"Bearer {issued.stdout.strip()}"}

        filler = fill(data)
        health = httpx.get(f"{api}/health", timeout=10)
        assert health.status_code == 503, health.text
        body = health.json()
        assert body["status"] == "degraded"
        assert body["disk"].startswith(f"data directory full: {data} has "), body
        assert (body["database"], body["redis"]) == ("ok", "ok")

        refused = levers9_up.python(NEW_CALL)
        assert refused.returncode != 0, refused.stdout
        assert f"data directory full: {data} has " in refused.stderr, refused.stderr
        assert "internal error" not in refused.stderr, refused.stderr

        # reads go on: an existing task, and its listing
        read = httpx.get(f"{api}/tasks/{task['id']}", headers=auth, timeout=10)
        assert read.status_code == 200, read.text
        assert (read.json()["id"], read.json()["status"]) == (task["id"], "complete")
        listed = httpx.get(f"{api}/tasks", headers=auth, timeout=10)
        assert listed.status_code == 200, listed.text

        filler.unlink()  # no restart, nothing else: the next requests just work
        assert httpx.get(f"{api}/health", timeout=10).json() == {
            "status": "ok",
            "database": "ok",
            "redis": "ok",
            "disk": "ok",
        }
        accepted = levers9_up.python(NEW_CALL)
        assert accepted.returncode == 0, accepted.stderr + levers9_up.log()[-3000:]
        assert "RESULT 42" in accepted.stdout
        assert levers9_up.process is not None
        assert levers9_up.process.poll() is None  # the same `levers9 up` served it all
        levers9_up.stop()
