"""A sandbox's memory snapshot through the controlplane's REST API: taken on one worker, restored on another.

A real `levers9 up` whose pool runs gVisor on two workers, each serving one sandbox at a time, so a sandbox
restored while its original runs must go to the other worker; the checkpoint storage is `up`'s default (a
directory both local workers read). A Python process holds a random token and a counter in memory; after the
snapshot and the restore, the restored sandbox lists it running and its output goes on with the same token,
counting on from before the snapshot; a file written before is there; the original runs on. The snapshot is
listed, deleted, and a restore of it is then refused by name. REST and NDJSON only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.levers9_up import Up, _finish

pytestmark = pytest.mark.e2e

COUNTER = """
import secrets, time
token = secrets.token_hex(8)
n = 0
while True:
    n += 1
    print("tick", token, n, flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[Up, httpx.Client]]:
    up = Up(tmp_path)
    up.use_runtime("gvisor")
    up.sandboxes = 1
    up.min_workers = up.max_workers = 2
    try:
        up.start()
        with httpx.Client(
            base_url=f"http://127.0.0.1:{up.http_port}/api/v1",
            headers={"authorization": f"Bearer {up.token()}"},
            timeout=300,
        ) as client:
            yield up, client
            for sandbox in client.get("/sandboxes").json()["sandboxes"]:
                client.delete(f"/sandboxes/{sandbox['id']}")
    finally:
        _finish(up, tmp_path)


def _ticks(client: httpx.Client, sid: str, process: int, count: int) -> list[tuple[str, int]]:
    """The next ``count`` (token, n) the counter says (its output is handed out once)."""
    found = []
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if not line:
                continue
            piece = json.loads(line)
            word, token, n = piece["data"].split()
            assert word == "tick", piece
            found.append((token, int(n)))
            if len(found) == count:
                break
    return found


def test_a_snapshot_is_restored_on_the_other_worker_with_its_process_running(
    two_workers: tuple[Up, httpx.Client],
) -> None:
    up, client = two_workers
    stored = up.home / "data" / "checkpoints" / "sandbox-snapshots"  # the checkpoint storage `up` tells workers
    made = client.post("/sandboxes", json={"snapshots": True, "timeout_s": 300})
    assert made.status_code == 201, made.text
    original = made.json()
    sid = original["id"]
    started = client.post(f"/sandboxes/{sid}/processes", json={"code": COUNTER})
    assert started.status_code == 201, started.text
    process = started.json()["process"]
    wrote = client.put(f"/sandboxes/{sid}/files", params={"path": "/tmp/before.txt"}, content=b"from before")
    assert wrote.status_code == 200, wrote.text
    before = _ticks(client, sid, process, 3)
    token = before[0][0]

    taken = client.post(f"/sandboxes/{sid}/snapshots")
    assert taken.status_code == 201, taken.text
    snap = taken.json()["snapshot"]
    assert (snap["sandbox_id"], snap["runtime"]) == (sid, "gvisor")
    assert "key" not in snap  # where it is stored is the operator's business
    assert [s["id"] for s in client.get("/sandbox-snapshots").json()["snapshots"]] == [snap["id"]]
    assert [p.name for p in stored.rglob("*") if p.is_file()] == [f"{snap['id']}.tar"]  # in the storage

    restored = client.post("/sandboxes", json={"snapshot": snap["id"]})
    assert restored.status_code == 201, restored.text
    copy = restored.json()
    assert copy["worker_id"] != original["worker_id"]  # each worker runs one sandbox: the other took it
    listed = client.get(f"/sandboxes/{copy['id']}/processes").json()["processes"]
    assert [(p["process"], p["running"]) for p in listed] == [(process, True)]
    resumed = _ticks(client, copy["id"], process, 3)
    assert all(t == token for t, _ in resumed), (token, resumed)
    assert resumed[0][1] > before[-1][1]
    assert client.get(f"/sandboxes/{copy['id']}/files", params={"path": "/tmp/before.txt"}).content == b"from before"
    # the original runs on, its counter too
    after = _ticks(client, sid, process, 2)
    assert all(t == token for t, _ in after)
    assert after[0][1] > before[-1][1]

    deleted = client.delete(f"/sandbox-snapshots/{snap['id']}")
    assert deleted.status_code in (200, 204), deleted.text
    assert client.get("/sandbox-snapshots").json()["snapshots"] == []
    assert [p for p in stored.rglob("*") if p.is_file()] == []  # the object went too
    again = client.post("/sandboxes", json={"snapshot": snap["id"]})
    assert again.status_code == 404, again.text
    assert snap["id"] in again.text
