"""The gateway over HTTP against a real `levers9 up`: endpoints, versions, queues, jobs, boxes, scaling, auth.

The tests that only deploy and call, under deployment names no other test of
this module uses, share one `levers9 up` (:func:`shared_up`); those that count
what every call left (metrics, running tasks), need a free worker, kill the
controlplane or change its runtime start their own.
"""

from __future__ import annotations

import json
import socket
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fixtures.levers9_up import Up, free_port

APP = """
import time

import levers9

@levers9.endpoint(keep_warm={keep_warm}, max_containers=2, tasks_per_container=4)
def greet(name: str = "you") -> dict:
    return {{"greeting": "{greeting}, " + name}}

@levers9.endpoint(public=True)
def open_door() -> str:
    return "open"

@levers9.endpoint
def ticks(n: int = 3):
    for i in range(n):
        yield {{"tick": i}}
        time.sleep(0.3)
"""


def _deploy(up: Up, source: str, file: str = "webapp.py") -> dict[str, dict[str, Any]]:
    app = up.root / file
    app.write_text(textwrap.dedent(source))
    done = up.levers9("deploy", str(app), "--json")
    assert done.returncode == 0, done.stderr + up.log()[-3000:]
    return {d["name"]: d for d in json.loads(done.stdout)}


def _client(up: Up, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token or up.token()}"} if token != "" else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{up.http_port}", headers=headers, timeout=60)


def _eventually(check: Callable[[], bool], timeout: float, what: str, up: Up) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s:\n{up.log()[-4000:]}")
        time.sleep(0.2)


def _serving_containers(up: Up) -> int:
    """Serving tasks still running, as the REST API lists them."""
    with _client(up) as client:
        tasks = client.get("/api/v1/tasks", params={"status": "running"}).json()
    return len(tasks)


def test_versions_answer_until_stopped_and_a_cold_call_waits_for_its_container(levers9_up: Up) -> None:
    levers9_up.start()
    _deploy(levers9_up, APP.format(greeting="hello", keep_warm=60))
    with _client(levers9_up) as client:
        # nothing runs yet: the first call waits for a container to start, then is answered
        cold = client.post("/endpoint/greet/v1", json={"name": "ada"})
        assert cold.status_code == 200, cold.text + levers9_up.log()[-3000:]
        assert cold.json() == {"greeting": "hello, ada"}
        _deploy(levers9_up, APP.format(greeting="howdy", keep_warm=60))
        assert client.post("/endpoint/greet/v1", json={"name": "bo"}).json() == {"greeting": "hello, bo"}
        assert client.post("/endpoint/greet/v2", json={"name": "bo"}).json() == {"greeting": "howdy, bo"}
        assert client.post("/endpoint/greet", json={"name": "cy"}).json() == {"greeting": "howdy, cy"}
        assert client.get("/endpoint/greet/v2", params={"name": "di"}).json() == {"greeting": "howdy, di"}
        stopped = levers9_up.levers9("stop", "greet", "--version", "1")
        assert stopped.returncode == 0, stopped.stderr
        gone = client.post("/endpoint/greet/v1", json={"name": "bo"})
        assert gone.status_code == 404, gone.text
        assert "greet v1" in gone.json()["error"]["message"]
        assert client.post("/endpoint/greet/v2", json={}).json() == {"greeting": "howdy, you"}
        bad = client.post("/endpoint/greet/v2", content=b"{not json")
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_json"
        wrong = client.post("/endpoint/greet/v2", json={"nobody": 1})
        assert wrong.status_code == 422  # the caller's mistake, with what the function takes
        assert wrong.json()["error"]["type"] == "invalid_arguments"
        assert "unexpected keyword argument 'nobody'; it takes greet(" in wrong.json()["error"]["message"]


def test_a_generator_endpoint_streams_its_items_as_they_come(shared_up: Up) -> None:
    up = shared_up
    _deploy(up, APP.format(greeting="hello", keep_warm=60))
    arrivals: list[tuple[float, bytes]] = []
    with _client(up) as client:
        assert client.post("/endpoint/ticks", json={"n": 1}).status_code == 200  # warm
        started = time.monotonic()
        with client.stream("POST", "/endpoint/ticks", json={"n": 3}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            for line in response.iter_lines():
                arrivals.append((time.monotonic() - started, line.encode()))
    assert [json.loads(line) for _, line in arrivals] == [{"tick": 0}, {"tick": 1}, {"tick": 2}]
    # the first item came before the generator had finished (it sleeps 0.3 s after each)
    assert arrivals[0][0] < arrivals[-1][0] - 0.4


def test_tokens_decide_who_may_call_and_another_workspace_gets_404(levers9_up: Up) -> None:
    levers9_up.start()
    _deploy(levers9_up, APP.format(greeting="hello", keep_warm=60))
    other = levers9_up.levers9("token", "create", "--workspace", "team-b")
    assert other.returncode == 0, other.stderr
    with _client(levers9_up, other.stdout.strip()) as as_b, _client(levers9_up, "") as anonymous:
        assert as_b.post("/endpoint/greet/v1").status_code == 404
        assert as_b.post("/endpoint/nothing/v1").status_code == 404
        assert as_b.post("/endpoint/@default/greet/v1").status_code == 404
        assert anonymous.post("/endpoint/greet/v1").status_code == 401
        assert anonymous.post("/endpoint/@default/greet/v1").status_code == 401
        # a public endpoint answers anyone who names its workspace
        assert anonymous.post("/endpoint/@default/open_door").json() == "open"
        assert as_b.post("/endpoint/@default/open_door").json() == "open"
        bad = httpx.post(
            f"http://127.0.0.1:{levers9_up.http_port}/endpoint/greet", headers={"authorization": "Bearer nope"}
        )
        assert bad.status_code == 401
    # what the gateway answered is counted by route and status on the metrics port
    metrics = _scrape(levers9_up)
    assert metrics[("levers9_gateway_requests_total", (("route", "endpoint"), ("status", "200")))] == 2
    assert metrics[("levers9_gateway_requests_total", (("route", "endpoint"), ("status", "404")))] == 3
    assert metrics[("levers9_gateway_requests_total", (("route", "endpoint"), ("status", "401")))] == 3
    assert metrics[("levers9_gateway_request_seconds_count", (("route", "endpoint"),))] == 8
    assert metrics[("levers9_gateway_wait_seconds_count", ())] >= 1  # the first call waited for its container
    _eventually(
        lambda: _scrape(levers9_up).get(("levers9_serving_containers", (("state", "ready"),))) == 1,
        10,
        "the ready container to show in the metrics",
        levers9_up,
    )


def _scrape(up: Up) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{up.metrics_port}/metrics").text
    return {
        # the replica label (a generated name per process) is left out: one replica runs here
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "replica"))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_full_buffer_answers_429_and_a_container_that_never_comes_504(levers9_up: Up) -> None:
    levers9_up.start()
    source = """
    import time
    import levers9

    @levers9.endpoint(max_containers=1, max_pending=1, start_timeout=30)
    def slow() -> str:
        time.sleep(3)
        return "done"

    @levers9.endpoint(start_timeout=2, image="127.0.0.1:9/nowhere/image@sha256:" + "0" * 64)
    def never() -> str:
        return "unreachable"

    @levers9.endpoint(timeout=1)
    def stuck() -> str:
        time.sleep(4)
        return "too late"
    """
    _deploy(levers9_up, source, "limits.py")
    with _client(levers9_up) as client:
        assert client.post("/endpoint/slow").json() == "done"  # warm: one container, one request at a time
        answers: list[int] = []

        def call() -> None:
            answers.append(client.post("/endpoint/slow").status_code)

        busy = threading.Thread(target=call)
        waiting = threading.Thread(target=call)
        busy.start()
        waiting.start()
        # the warm container's one slot free, whichever of the two comes first takes it and the other waits:
        # one request waiting means one in flight and the buffer (max_pending=1) full
        _eventually(
            lambda: _scrape(levers9_up).get(("levers9_gateway_waiting_requests", ())) == 1,
            10,
            "one request in flight and one waiting",
            levers9_up,
        )
        refused = client.post("/endpoint/slow")
        assert refused.status_code == 429, refused.text
        assert "max_pending=1" in refused.json()["error"]["message"]
        busy.join()
        waiting.join()
        assert answers == [200, 200]
        timed_out = client.post("/endpoint/never")
        assert timed_out.status_code == 504, timed_out.text
        assert "within 2 s" in timed_out.json()["error"]["message"]
        too_slow = client.post("/endpoint/stuck")  # its container comes up; its answer does not, in time
        assert too_slow.status_code == 504, too_slow.text
        assert too_slow.json()["error"]["type"] == "timeout"
        assert "within 1 s" in too_slow.json()["error"]["message"]


def test_an_idle_endpoint_scales_to_zero_after_keep_warm(levers9_up: Up) -> None:
    levers9_up.start()
    _deploy(levers9_up, APP.format(greeting="hello", keep_warm=1))
    with _client(levers9_up) as client:
        assert client.post("/endpoint/greet").status_code == 200
        assert _serving_containers(levers9_up) == 1
        _eventually(lambda: _serving_containers(levers9_up) == 0, 30, "scaling to zero", levers9_up)
        # and back up again on the next call
        assert client.post("/endpoint/greet", json={"name": "again"}).json() == {"greeting": "hello, again"}


def test_a_queue_item_is_retried_once_after_a_failure_and_a_job_runs(shared_up: Up) -> None:
    up = shared_up
    marker = up.exchange / "failed-once"
    source = f"""
    import os
    import levers9

    @levers9.queue(retries=1)
    def flaky(x: int) -> dict:
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            raise RuntimeError("first attempt fails")
        return {{"double": x * 2}}

    @levers9.job
    def report(title: str) -> str:
        return title.upper()
    """
    _deploy(up, source, "work.py")
    with _client(up) as client:
        queued = client.post("/queue/flaky/v1", json={"x": 21})
        assert queued.status_code == 202, queued.text
        task_id = queued.json()["task_id"]
        status: dict[str, Any] = {}

        def finished() -> bool:
            nonlocal status
            status = client.get(f"/queue/flaky/v1/tasks/{task_id}").json()
            return status["status"] in ("complete", "error")

        _eventually(finished, 60, "the queue item", up)
        assert status["status"] == "complete", status
        assert status["result"] == {"double": 42}
        assert status["attempts"] == 1
        started = client.post("/job/report", json={"title": "q3"})
        assert started.status_code == 202, started.text
        run = started.json()["task_id"]
        _eventually(lambda: client.get(f"/job/report/tasks/{run}").json()["status"] == "complete", 60, "the job", up)
        assert client.get(f"/function/report/v1/tasks/{run}").json()["result"] == "Q3"
        # the older /taskqueue path is the same queue
        again = client.post("/taskqueue/flaky", json=[5])
        assert again.status_code == 202
        assert client.get("/queue/flaky/v1").status_code == 405
        assert client.get(f"/queue/flaky/v1/tasks/{run}").status_code == 404  # a job's task is not this queue's


def test_a_box_port_is_proxied(shared_up: Up) -> None:
    up = shared_up
    port = free_port()  # free now, on this host: the box binds it on the worker's host network
    source = f"""
    import http.server
    import levers9

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ("box says " + self.path).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    @levers9.box(ports=[{port}])
    def web():
        http.server.ThreadingHTTPServer(("127.0.0.1", {port}), Hello).serve_forever()
    """
    _deploy(up, source, "boxapp.py")
    with _client(up) as client:
        answer = client.get(f"/box/web/v1/{port}/some/path?q=1")
        assert answer.status_code == 200, answer.text + up.log()[-3000:]
        assert answer.text == "box says /some/path?q=1"
        assert client.get(f"/pod/web/{port}/x").text == "box says /x"
        assert client.get("/box/web/v1/9/x").status_code == 404
    stopped = up.levers9("stop", "web", "--version", "1")  # the box would run for the rest of the shared up
    assert stopped.returncode == 0, stopped.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_endpoints_and_boxes_serve_from_real_containers(levers9_up: Up, runtime: str) -> None:
    """On a container runtime the gateway reaches each container at its own address on the worker's bridge."""
    levers9_up.use_runtime(runtime)
    levers9_up.start()
    source = """
    import http.server
    import socket
    import levers9

    @levers9.endpoint
    def where() -> dict:
        return {"hostname": socket.gethostname()}

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"from the box"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    @levers9.box(ports=[8000])
    def web():
        http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Hello).serve_forever()
    """
    _deploy(levers9_up, source, "contained.py")
    with _client(levers9_up) as client:
        answer = client.post("/endpoint/where")
        assert answer.status_code == 200, answer.text + levers9_up.log()[-3000:]
        assert answer.json()["hostname"] != socket.gethostname()  # its own UTS namespace: a container
        box = client.get("/box/web/8000/")
        assert box.status_code == 200, box.text + levers9_up.log()[-3000:]
        assert box.text == "from the box"


def test_an_asgi_endpoint_serves_every_path_and_never_sees_the_callers_token(shared_up: Up) -> None:
    up = shared_up
    source = """
    import asyncio

    import levers9

    @levers9.asgi(tasks_per_container=16)
    def api():
        import contextlib

        from fastapi import FastAPI, Request
        from fastapi.responses import StreamingResponse

        @contextlib.asynccontextmanager
        async def lifespan(app):
            app.state.model = "loaded at startup"  # what a model server does before its first request
            yield

        app = FastAPI(lifespan=lifespan)

        @app.get("/model")
        def model(request: Request) -> str:
            return request.app.state.model

        @app.get("/items/{item_id}")
        def item(item_id: int, q: str = "") -> dict:
            return {"item": item_id, "q": q}

        @app.post("/echo")
        async def echo(request: Request) -> dict:
            return {"body": (await request.body()).decode(), "headers": dict(request.headers)}

        @app.get("/count")
        def count() -> StreamingResponse:
            async def numbers():
                for i in range(3):
                    yield f"{i}\\n"
                    await asyncio.sleep(0.3)
            return StreamingResponse(numbers(), media_type="text/plain")

        return app
    """
    _deploy(up, source, "asgiapp.py")
    with _client(up) as client:
        item = client.get("/endpoint/api/items/7", params={"q": "x"})
        assert item.status_code == 200, item.text + up.log()[-3000:]
        assert item.json() == {"item": 7, "q": "x"}
        assert client.get("/endpoint/api/v1/items/8").json() == {"item": 8, "q": ""}
        assert client.get("/endpoint/api/nothing").status_code == 404  # the app's own 404
        assert client.get("/endpoint/api/model").json() == "loaded at startup"
        echoed = client.post("/endpoint/api/echo", content=b"payload", headers={"x-custom": "yes"}).json()
        assert echoed["body"] == "payload"
        assert echoed["headers"]["x-custom"] == "yes"
        assert "authorization" not in echoed["headers"]  # the levers9 token stays in the gateway
        assert echoed["headers"]["x-forwarded-for"] == "127.0.0.1"
        started = time.monotonic()
        arrivals = []
        with client.stream("GET", "/endpoint/api/count") as response:
            for line in response.iter_lines():
                arrivals.append((time.monotonic() - started, line))
        assert [line for _, line in arrivals] == ["0", "1", "2"]
        assert arrivals[0][0] < arrivals[-1][0] - 0.4


def test_after_a_killed_controlplane_restarts_the_endpoint_answers_and_its_old_container_is_stopped(
    levers9_up: Up,
) -> None:
    """The restarted controlplane does not know the container the old one started: it starts its own, and
    stops the old one (no replica owns it any more) instead of leaving it running on the worker."""
    levers9_up.start()
    _deploy(levers9_up, APP.format(greeting="hello", keep_warm=600))
    with _client(levers9_up) as client:
        assert client.post("/endpoint/greet").status_code == 200
        [old] = _running_serving_tasks(levers9_up)
        levers9_up.kill()  # SIGKILL: the worker and its serving container keep running
        levers9_up.start(wait_workers=0)
        again = client.post("/endpoint/greet", json={"name": "after"})
        assert again.status_code == 200, again.text + levers9_up.log()[-3000:]
        assert again.json() == {"greeting": "hello, after"}
    with _client(levers9_up) as client:
        _eventually(
            lambda: client.get(f"/api/v1/tasks/{old}").json()["status"] == "cancelled",
            90,
            "the orphaned container's stop",
            levers9_up,
        )
    assert len(_running_serving_tasks(levers9_up)) == 1  # the new controlplane's own


def _running_serving_tasks(up: Up) -> list[str]:
    with _client(up) as client:
        return [t["id"] for t in client.get("/api/v1/tasks", params={"status": "running"}).json()]


def test_a_version_segment_is_strict_and_every_error_is_json_with_one_type_per_condition(shared_up: Up) -> None:
    """``/v0``, ``/v-1``, ``/v01``... name no version (404), never the newest; ``/vfoo`` is an ASGI app's path. A body
    that is not JSON, or nests 100,000 deep, is 4xx JSON on every route, typed ``invalid_json`` on all of them."""
    up = shared_up
    source = """
    import levers9

    @levers9.endpoint(tasks_per_container=4)
    def echo(x: object = None) -> object:
        return x

    @levers9.asgi
    def site():
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": scope["path"].encode()})

        return app

    @levers9.queue
    def work(x: object = None) -> object:
        return x
    """
    _deploy(up, source, "strict.py")
    deep = b"[" * 100_000 + b"]" * 100_000
    with _client(up) as client:
        assert client.post("/endpoint/echo/v1", json={"x": 1}).json() == 1
        for segment in ("v0", "v-1", "v01", "v+1", "v00", "v2147483648", "v99999999999999999999"):
            for url in (f"/endpoint/echo/{segment}", f"/queue/work/{segment}", f"/endpoint/site/{segment}/x"):
                answer = client.post(url, json={"x": 1})
                assert answer.status_code == 404, (url, answer.text)
                error = answer.json()["error"]
                assert error["type"] == "not_found", (url, error)
                assert f"deployment {url.split('/')[2]!r} has no version {segment!r}" in error["message"], error
        assert client.get("/endpoint/site/vfoo/x").text == "/vfoo/x"  # not a version: the app's own path
        assert client.get("/endpoint/site/v1/V2").text == "/V2"
        for url in ("/endpoint/echo", "/queue/work"):
            for body in (b"{not json", deep):
                answer = client.post(url, content=body)
                assert answer.status_code == 400, (url, answer.text[:300])
                assert answer.headers["content-type"] == "application/json"
                assert answer.json()["error"]["type"] == "invalid_json", (url, answer.json())
            assert "nest too deeply" in client.post(url, content=deep).json()["error"]["message"]
        assert client.post("/endpoint/echo", json={"x": [[1]]}).json() == [[1]]  # and it still serves
        rest = client.post("/api/v1/tokens", content=deep, headers={"content-type": "application/json"})
        assert rest.status_code == 422, rest.text[:300]
        assert rest.json()["error"]["type"] == "validation_error"
        assert "nest too deeply" in rest.json()["error"]["message"]
