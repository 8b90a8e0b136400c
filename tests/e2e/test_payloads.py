"""Arguments and results of any size up to the cap, through `levers9 up`, on every path that carries them.

Before payloads travelled in chunks, a result over 64 MiB took the whole pool
down: the worker's message was refused by its own channel, the session died,
the worker re-sent the same message on every reconnect, and ``.get()`` hung.
Here a 200 MB result comes back while other calls run, big arguments travel on
``.remote``, ``.map`` and ``.spawn`` and through a queue, and a payload over
the cap fails its own call, naming the size and the cap, and nothing else.

The tests that run with the default config (two workers at most, no cap set)
share one `levers9 up` (:func:`shared_up`); those that change the cap or the
pool's size start their own.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)


def _start(up: Up, *, max_payload: str | None = None) -> None:
    up.home.mkdir(parents=True, exist_ok=True)
    text = up.config_text()
    if max_payload is not None:
        text += f"limits:\n  max_payload_bytes: {max_payload}\n"
    (up.home / "levers9.yaml").write_text(text)
    up.start()


def _json_line(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    result: dict[str, object] = json.loads(lines[-1])
    return result


def test_a_200_mb_result_comes_back_while_other_calls_keep_running(levers9_up: Up) -> None:
    levers9_up.max_workers = 1
    _start(levers9_up)
    done = levers9_up.python(
        """
        import hashlib, json, time
        import levers9

        @levers9.function(memory=2048, cpu=0.5)
        def big():
            return b"0123456789" * (20 << 20)

        @levers9.function(cpu=0.25)
        def small(i):
            return i * 2

        call = big.spawn()
        t0 = time.monotonic()
        smalls = list(small.map(range(50)))
        small_s = time.monotonic() - t0
        value = call.get(timeout=300)
        print(json.dumps({
            "size": len(value),
            "same": hashlib.sha256(value).hexdigest() == hashlib.sha256(b"0123456789" * (20 << 20)).hexdigest(),
            "smalls": smalls == [i * 2 for i in range(50)],
            "small_s": small_s,
        }))
        """
    )
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    out = _json_line(done.stdout)
    assert out["size"] == 200 << 20
    assert out["same"] is True
    assert out["smalls"] is True
    log = levers9_up.log()
    assert "RESOURCE_EXHAUSTED" not in log
    assert "unreachable" not in log  # the worker's session never broke


def test_big_arguments_travel_on_remote_map_and_spawn(shared_up: Up) -> None:
    up = shared_up
    done = up.python(
        """
        import hashlib, json
        import levers9

        @levers9.function(memory=1024)
        def digest(data, tag=""):
            return tag + hashlib.sha256(data).hexdigest()

        blobs = [bytes([i]) * (30 << 20) for i in range(3)]
        want = [hashlib.sha256(b).hexdigest() for b in blobs]
        remote = digest.remote(blobs[0], tag="r:")
        mapped = list(digest.map(blobs))
        spawned = digest.spawn(blobs[1], tag="s:").get(timeout=300)
        print(json.dumps({
            "remote": remote == "r:" + want[0],
            "map": mapped == want,
            "spawn": spawned == "s:" + want[1],
        }))
        """
    )
    assert done.returncode == 0, done.stderr + up.log()[-3000:]
    assert _json_line(done.stdout) == {"remote": True, "map": True, "spawn": True}


def test_a_payload_over_the_cap_fails_its_own_call_naming_the_size_and_the_cap(levers9_up: Up) -> None:
    _start(levers9_up, max_payload="8MiB")
    done = levers9_up.python(
        """
        import json
        import levers9
        from levers9.payloads import PayloadTooLarge

        @levers9.function(memory=512)
        def echo_len(data):
            return len(data)

        @levers9.function(memory=512)
        def make(n):
            return b"x" * n

        out = {}
        try:
            echo_len.remote(b"y" * (10 << 20))
        except PayloadTooLarge as exc:
            out["args"] = str(exc)
        try:
            make.remote(10 << 20)
        except Exception as exc:
            out["result_type"] = type(exc).__name__
            out["result"] = str(exc)
        out["under"] = len(make.remote(6 << 20))
        out["after"] = echo_len.remote(b"z" * (5 << 20))
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    out = _json_line(done.stdout)
    assert re.search(r"arguments is 10,48\d,\d{3} bytes", str(out["args"])), out  # pickled: a few bytes more
    assert "over the cap of 8,388,608 bytes" in str(out["args"]), out
    assert "limits.max_payload_bytes" in str(out["args"])
    assert out["result_type"] == "RemoteError", out
    assert "PayloadTooLarge" in str(out["result"]) or "over the cap" in str(out["result"]), out
    assert "8,388,608" in str(out["result"]), out
    assert out["under"] == 6 << 20
    assert out["after"] == 5 << 20


def test_a_queue_item_with_a_big_body_and_a_big_json_result(shared_up: Up) -> None:
    up = shared_up
    app = up.root / "app.py"
    app.write_text(
        "import levers9\n\n"
        "@levers9.queue(memory=512)\n"
        "def upper(text):\n"
        "    return {'n': len(text), 'text': text.upper()}\n"
    )
    deployed = up.levers9("deploy", str(app))
    assert deployed.returncode == 0, deployed.stderr
    headers = {"authorization": f"Bearer {up.token()}"}
    base = f"http://127.0.0.1:{up.http_port}"
    text = "abc" * (1 << 20)  # 3 MiB each way: over the inline limit
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        queued = http.post("/queue/upper", json={"text": text})
        assert queued.status_code == 202, queued.text
        task_id = queued.json()["task_id"]
        for _ in range(600):
            answer = http.get(f"/queue/upper/tasks/{task_id}")
            assert answer.status_code == 200, answer.text
            if answer.json()["status"] not in ("pending", "running"):
                break
            time.sleep(0.2)
    body = answer.json()
    assert body["status"] == "complete", body
    assert body["result"]["n"] == len(text)
    assert body["result"]["text"] == text.upper()
