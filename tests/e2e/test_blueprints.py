"""Blueprints on a real `levers9 up`: built on its runc (and gVisor) workers, pushed to its registry, run from it.

The user's way: a file with a ``levers9.Blueprint`` (an apt package, a pip package, shell commands and a
local package of their own) as a function's ``image=``, run with ``levers9 run FILE::main``. The build runs
on the pool's worker in containers of its runtime, from the run's shared Debian base
(tests/fixtures/debian_base.py: built once per machine), through the build's egress proxy to this
machine's Debian mirror and pip index; the image goes to the embedded registry behind the controlplane,
the worker pulls it and runs the function in it.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from levers9.builder.base import BaseLayer
from tests.fixtures.dockerd import Dockerd
from tests.fixtures.levers9_up import Up
from tests.fixtures.registry import Registry, htpasswd_file

APP = """\
import json
import levers9

image = (
    levers9.Blueprint(python_version="3.11")
    .apt_install(["jq"])
    .add_python_packages(["six"])
    .add_local_path("mypkg")
    .add_python_packages(["/app/mypkg"])
    .add_commands(["echo {marker} > /built.txt"])
)


@levers9.function(image=image, memory=512)
def probe() -> dict:
    import subprocess

    import mine
    import six

    return {{
        "jq": subprocess.run(["jq", "--version"], capture_output=True, text=True).stdout.strip(),
        "six": six.__version__,
        "mine": mine.VALUE,
        "built": open("/built.txt").read().strip(),
    }}


def main() -> None:
    print(json.dumps(probe.remote()))
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mine"
version = "1.0"

[tool.setuptools]
py-modules = ["mine"]
"""


def _app(up: Up, marker: str) -> Path:
    (up.root / "mypkg").mkdir(exist_ok=True)
    (up.root / "mypkg" / "pyproject.toml").write_text(PYPROJECT)
    (up.root / "mypkg" / "mine.py").write_text('VALUE = "from my own package"\n')
    path = up.root / "blueprint_app.py"
    path.write_text(textwrap.dedent(APP.format(marker=marker)))
    return path


def _run(up: Up, app: Path) -> tuple[dict[str, Any], str]:
    done = up.levers9("run", f"{app.name}::main", timeout=900)
    assert done.returncode == 0, f"levers9 run failed:\n{done.stdout}\n{done.stderr}\n--- up:\n{up.log()[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_blueprint_builds_and_its_function_runs_in_it(levers9_up: Up, debian_base: BaseLayer, runtime: str) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.builds = True
    levers9_up.start()
    app = _app(levers9_up, "first")
    answer, output = _run(levers9_up, app)
    assert answer["jq"].startswith("jq-1.6"), answer
    assert (answer["mine"], answer["built"]) == ("from my own package", "first")
    assert re.fullmatch(r"\d+\.\d+\.\d+", answer["six"]), answer
    # the build's output streamed to the user, a line per step
    for step in ("step 1/5", "step 5/5"):
        assert step in output, output
    assert "cached" not in output

    # the last line changed: only that step runs again (the others are the workspace's, by key)
    app.write_text(app.read_text().replace("echo first", "echo second"))
    answer, output = _run(levers9_up, app)
    assert answer["built"] == "second"
    assert [f"step {i}/5 cached" in output for i in range(1, 6)] == [True] * 4 + [False], output

    listed = levers9_up.levers9("blueprints", "--json")
    assert listed.returncode == 0, listed.stderr
    images = json.loads(listed.stdout)
    assert len(images) == 2
    assert all(i["image"].split("@")[1].startswith("sha256:") for i in images)


def test_a_failing_step_names_itself_and_records_nothing(levers9_up: Up, debian_base: BaseLayer) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.start()
    app = levers9_up.root / "broken.py"
    app.write_text(
        textwrap.dedent("""\
        import levers9

        image = levers9.Blueprint(python_version="3.11").add_commands(["echo about to fail; exit 7"])
        """)
    )
    done = levers9_up.levers9("blueprint", "build", f"{app.name}::image", timeout=600)
    assert done.returncode == 1
    assert "step 1/1" in done.stderr, done.stderr
    assert re.search(r"exit(ed with| code)? 7", done.stderr), done.stderr
    assert "about to fail" in done.stderr
    listed = levers9_up.levers9("blueprints", "--json")
    assert json.loads(listed.stdout) == []


def test_a_step_secret_reaches_the_step_only(levers9_up: Up, debian_base: BaseLayer, tmp_path: Path) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.start()
    secret = "s3cr3t-value-never-in-a-layer"
    levers9_up.secret("TOKEN", secret)
    app = levers9_up.root / "secretive.py"
    app.write_text(
        textwrap.dedent("""\
        import levers9

        image = levers9.Blueprint(python_version="3.11").add_commands(
            ['test "$TOKEN" = "$(cat /run/secrets/TOKEN)" && echo the step saw it > /seen'], secrets=["TOKEN"]
        )
        """)
    )
    done = levers9_up.levers9("blueprint", "build", f"{app.name}::image", timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    ref = done.stdout.strip()
    assert secret not in done.stderr
    # every blob of the image as the controlplane's registry serves it to the workspace's user
    copied = tmp_path / "copied"
    pulled = subprocess.run(
        [
            "skopeo",
            "copy",
            "--src-tls-verify=false",
            "--src-creds",
            f"user:{levers9_up.token()}",
            f"docker://{ref}",
            f"dir:{copied}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pulled.returncode == 0, f"skopeo copy failed (apt-get install -y skopeo):\n{pulled.stderr}"
    seen = False
    blobs = [p for p in copied.iterdir() if p.name not in ("version",)]
    assert len(blobs) >= 4  # manifest, config, base layer, the step's layer
    for blob in blobs:
        data = blob.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        assert secret.encode() not in data, f"the secret's value is in {blob.name}"
        if data[:2] != b'{"' and b"the step saw it" in data:
            seen = True
    assert seen, "no layer holds /seen: the step did not see its secret"
    config = json.loads(next(b.read_bytes() for b in blobs if b'"rootfs"' in b.read_bytes()[:100000]))
    history = json.dumps(config.get("history", []))
    assert "TOKEN" in history  # the name, not the value


@pytest.mark.parametrize("where", ["own", "private"])
def test_a_blueprint_on_a_registry_base(
    levers9_up: Up, debian_base: BaseLayer, where: str, registry_factory: Callable[..., Registry], tmp_path: Path
) -> None:
    """``Blueprint.from_registry`` on the workspace's first image: in the controlplane's own registry, and copied to
    a private registry (htpasswd) whose login the blueprint names as two workspace secrets."""
    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.start()
    first = levers9_up.root / "first.py"
    first.write_text(
        textwrap.dedent("""\
        import levers9

        image = levers9.Blueprint(python_version="3.11").apt_install(["jq"]).add_commands(["echo below > /below"])
        """)
    )
    built = levers9_up.levers9("blueprint", "build", f"{first.name}::image", timeout=600)
    assert built.returncode == 0, built.stderr
    base_ref = built.stdout.strip()
    credentials = ""
    if where == "private":
        users = htpasswd_file(tmp_path / "htpasswd", "puller", "pa55word")
        private = registry_factory({"htpasswd": {"realm": "levers9-tests", "path": str(users)}})
        digest = base_ref.split("@")[1]
        copied = subprocess.run(
            [
                "skopeo",
                "copy",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                "--src-creds",
                f"user:{levers9_up.token()}",
                "--dest-creds",
                "puller:pa55word",
                f"docker://{base_ref}",
                f"docker://{private.address}/team/base:v1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert copied.returncode == 0, copied.stderr
        base_ref = f"{private.address}/team/base@{digest}"
        for name, value in (("REG_USER", "puller"), ("REG_PASSWORD", "pa55word")):
            levers9_up.secret(name, value)
        credentials = ', credentials=["REG_USER", "REG_PASSWORD"]'
    app = levers9_up.root / "layered.py"
    app.write_text(
        textwrap.dedent(f"""\
        import json
        import subprocess

        import levers9

        image = levers9.Blueprint.from_registry({base_ref!r}{credentials}).add_commands(["echo above > /above"])


        @levers9.function(image=image, memory=512)
        def probe() -> dict:
            return {{
                "jq": subprocess.run(["jq", "--version"], capture_output=True, text=True).stdout.strip(),
                "files": [open(p).read().strip() for p in ("/below", "/above")],
            }}


        def main() -> None:
            print(json.dumps(probe.remote()))
        """)
    )
    answer, output = _run(levers9_up, app)
    assert answer["jq"].startswith("jq-1.6"), answer
    assert answer["files"] == ["below", "above"]
    assert f"base: {base_ref}" in output


def test_docker_and_skopeo_take_a_built_image(levers9_up: Up, debian_base: BaseLayer, dockerd: Dockerd) -> None:
    """The image is a standard OCI image: skopeo inspects it and docker pulls and runs it, through the controlplane."""
    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.start()
    app = levers9_up.root / "plain.py"
    app.write_text(
        textwrap.dedent("""\
        import levers9

        image = levers9.Blueprint(python_version="3.11").apt_install(["jq"]).add_commands(["echo docked > /x"])
        """)
    )
    built = levers9_up.levers9("blueprint", "build", f"{app.name}::image", timeout=600)
    assert built.returncode == 0, built.stderr
    ref, token = built.stdout.strip(), levers9_up.token()
    host, digest = ref.split("/")[0], ref.split("@")[1]
    inspected = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--creds", f"user:{token}", f"docker://{ref}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inspected.returncode == 0, f"(apt-get install -y skopeo) {inspected.stderr}"
    shown = json.loads(inspected.stdout)
    assert shown["Digest"] == digest
    assert shown["Os"] == "linux"
    assert len(shown["Layers"]) == 3

    with tempfile.TemporaryDirectory(prefix="l9-docker-config-") as config:
        env = {**dockerd.env, "DOCKER_CONFIG": config}

        def docker(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["docker", *args], env=env, input=stdin, capture_output=True, text=True, timeout=300)

        login = docker("login", "-u", "user", "--password-stdin", host, stdin=token)
        assert login.returncode == 0, login.stderr
        pulled = docker("pull", ref)
        assert pulled.returncode == 0, pulled.stderr
        try:
            ran = docker("run", "--rm", "--network", "none", ref, "sh", "-c", "cat /x && jq --version")
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.split() == ["docked", "jq-1.6"]
        finally:
            docker("image", "rm", "-f", ref)


KINDS_APP = """\
import http.server

import levers9

image = levers9.Blueprint(python_version="3.11").add_commands(["echo {marker} > /kind.txt"])


def mark() -> str:
    return open("/kind.txt").read().strip()


@levers9.endpoint(image=image)
def ep() -> str:
    return "endpoint " + mark()


@levers9.asgi(image=image)
def web():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = ("asgi " + open("/kind.txt").read().strip()).encode()
        await send({{"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]}})
        await send({{"type": "http.response.body", "body": body}})

    return app


@levers9.queue(image=image)
def q(x: int) -> str:
    return f"queue {{x}} " + mark()


@levers9.job(image=image)
def j() -> str:
    return "job " + mark()


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("box " + open("/kind.txt").read().strip()).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@levers9.box(image=image, ports=[8080])
def bx():
    http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Hello).serve_forever()
"""


def test_every_kind_runs_in_its_blueprint(levers9_up: Up, debian_base: BaseLayer) -> None:
    """`image=` takes a blueprint on every kind: deployed, each serves from inside the one image it built."""
    import time

    import httpx

    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.start()
    app = levers9_up.root / "kinds.py"
    app.write_text(KINDS_APP.format(marker="kinds-image"))
    done = levers9_up.levers9("deploy", str(app), "--json", timeout=900)
    assert done.returncode == 0, done.stderr + levers9_up.log()[-3000:]
    assert sorted(d["kind"] for d in json.loads(done.stdout)) == ["box", "endpoint", "endpoint", "job", "queue"]

    def finished(client: httpx.Client, path: str) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while (status := client.get(path).json())["status"] not in ("complete", "error"):
            assert time.monotonic() < deadline, f"{path} did not finish: {status}\n{levers9_up.log()[-3000:]}"
            time.sleep(0.2)
        return status

    headers = {"authorization": f"Bearer {levers9_up.token()}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{levers9_up.http_port}", headers=headers, timeout=120) as client:
        assert client.post("/endpoint/ep/v1", json={}).json() == "endpoint kinds-image"
        served = client.get("/endpoint/web/v1/")
        assert (served.status_code, served.text) == (200, "asgi kinds-image")
        queued = client.post("/queue/q/v1", json={"x": 7})
        assert queued.status_code == 202, queued.text
        assert finished(client, f"/queue/q/v1/tasks/{queued.json()['task_id']}")["result"] == "queue 7 kinds-image"
        started = client.post("/job/j", json={})
        assert started.status_code == 202, started.text
        run = started.json()["task_id"]
        assert finished(client, f"/job/j/tasks/{run}")["status"] == "complete"
        assert client.get(f"/function/j/v1/tasks/{run}").json()["result"] == "job kinds-image"
        boxed = client.get("/box/bx/v1/8080/")
        assert (boxed.status_code, boxed.text) == (200, "box kinds-image")
