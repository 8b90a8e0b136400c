"""A serving container dies under load, against a real `levers9 up`: only the requests it had fail.

A request whose container refuses the connection (nothing of it reached the
container) goes to another ready container, or waits for one; the dead
container gets no more requests and the scaler replaces it. Only the requests
the container already had when it died are answered 502.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.fixtures.levers9_up import Up, _processes_mentioning

APP = """
import os
import time

import levers9

@levers9.endpoint(min_containers=2, max_containers={max_containers}, tasks_per_container={tasks}, keep_warm=60)
def whoami(sleep: float = 0.0) -> int:
    time.sleep(sleep)
    return os.getpid()
"""


@dataclass
class Answer:
    sent_at: float
    status: int
    pid: int | None
    error_type: str | None
    message: str = ""


def _deploy(up: Up, *, max_containers: int, tasks: int) -> None:
    app = up.root / "failover.py"
    app.write_text(textwrap.dedent(APP.format(max_containers=max_containers, tasks=tasks)))
    done = up.levers9("deploy", str(app), "--json")
    assert done.returncode == 0, done.stderr + up.log()[-3000:]


def _call(client: httpx.Client, sleep: float) -> Answer:
    sent_at = time.monotonic()
    response = client.post("/endpoint/whoami", json={"sleep": sleep})
    if response.status_code == 200:
        return Answer(sent_at, 200, int(response.json()), None)
    error = response.json()["error"]  # every error is JSON, a 502 too
    return Answer(sent_at, response.status_code, None, str(error["type"]), str(error["message"]))


def _two_containers(up: Up, client: httpx.Client, pool: ThreadPoolExecutor) -> set[int]:
    """Send concurrent requests until two containers (the floor) have answered; their runners' pids."""
    deadline = time.monotonic() + 90
    pids: set[int] = set()
    while len(pids) < 2:
        assert time.monotonic() < deadline, f"two containers did not answer within 90 s:\n{up.log()[-3000:]}"
        answers = list(pool.map(lambda _: _call(client, 0.3), range(8)))
        assert all(a.status == 200 for a in answers), answers
        pids = {a.pid for a in answers if a.pid is not None}
    return pids


def _kill_and_wait(pid: int) -> None:
    """SIGKILL a container's runner and wait until it is gone (its sockets closed by the kernel)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs 10 s after SIGKILL"
        time.sleep(0.005)


def _alive(pid: int) -> bool:
    """Whether any thread of ``pid`` may still hold its sockets.

    The leader of a multi-threaded process (the runner serves from threads) turns zombie as soon as it has
    exited itself, while its other threads may still be exiting with the shared descriptors open: a
    connection made then is accepted and reset. Only a zombie leader with no other thread left has closed
    them all.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X") or len(threads) > 1


def _client(up: Up) -> httpx.Client:
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    return httpx.Client(
        base_url=f"http://127.0.0.1:{up.http_port}",
        limits=limits,
        timeout=120,
        headers={"authorization": f"Bearer {up.token()}"},
    )


def test_a_killed_container_fails_only_the_requests_it_had(levers9_up: Up) -> None:
    """200 requests, 8 at a time, over two containers; one is SIGKILLed half-way. At most the requests in
    flight on it (at most its tasks_per_container) fail, and every request sent after it died is answered."""
    tasks = 4
    levers9_up.start()
    _deploy(levers9_up, max_containers=3, tasks=tasks)
    answers: list[Answer] = []
    dead_at: list[float] = []
    victim: list[int] = []
    with _client(levers9_up) as client, ThreadPoolExecutor(8) as pool:
        _two_containers(levers9_up, client, pool)

        def one(i: int) -> Answer:
            if i == 100:  # half-way: kill the container that answered most lately, while the others keep sending
                recent = [a.pid for a in answers[-16:] if a.pid is not None]
                victim.append(max(set(recent), key=recent.count))
                _kill_and_wait(victim[0])
                dead_at.append(time.monotonic())
            answer = _call(client, 0.05)
            answers.append(answer)
            return answer

        results = list(pool.map(one, range(200)))
    failed = [a for a in results if a.status != 200]
    assert len(failed) <= tasks, f"{len(failed)} failed: {failed}\n{levers9_up.log()[-3000:]}"
    assert all((a.status, a.error_type) == (502, "bad_gateway") for a in failed), failed
    after = [a for a in results if a.sent_at > dead_at[0]]
    assert after, "no request was sent after the kill"
    assert all(a.status == 200 for a in after), [a for a in after if a.status != 200]
    assert victim[0] not in {a.pid for a in after}


def test_a_container_that_refuses_is_passed_over_before_its_worker_reports_it_dead(levers9_up: Up) -> None:
    """The container's runner is SIGKILLed while its worker is paused (SIGSTOP), so the controlplane cannot
    learn of the death from the worker: requests still routed to it are refused at connect, and each goes to
    the other container instead of being answered 502. Once the worker resumes, a new container replaces it."""
    levers9_up.start()
    _deploy(levers9_up, max_containers=2, tasks=8)
    with _client(levers9_up) as client, ThreadPoolExecutor(8) as pool:
        first, second = sorted(_two_containers(levers9_up, client, pool))
        workers = [pid for pid, cmd in _processes_mentioning(str(levers9_up.root)) if "levers9 worker" in cmd]
        assert workers, f"no worker process found:\n{levers9_up.log()[-3000:]}"
        try:
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)
            _kill_and_wait(first)
            # 8 at once: the gateway hands out the two containers' slots evenly, so some go to the dead one
            answers = list(pool.map(lambda _: _call(client, 0.2), range(8)))
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert [a.status for a in answers] == [200] * 8, [a for a in answers if a.status != 200]
        assert {a.pid for a in answers} == {second}
        deadline = time.monotonic() + 90
        while True:  # the scaler replaces the dead container: two answer again, neither of them the dead one
            pids = {a.pid for a in pool.map(lambda _: _call(client, 0.3), range(8))}
            if len(pids) == 2:
                break
            assert time.monotonic() < deadline, f"no new container within 90 s:\n{levers9_up.log()[-3000:]}"
        assert first not in pids
