"""A sandbox runs a blueprint, and its filesystem becomes an image another sandbox runs (issue 39).

A real `levers9 up` whose runc pool both builds blueprints and runs sandboxes; the program is a user's, run
as a subprocess with the `up`'s home: ``levers9.Sandbox(image=levers9.Blueprint(...))`` builds the image
through the controlplane first, then ``create_image_from_filesystem()`` pushes what the sandbox changed to
the workspace's repository of the controlplane's registry, and a second sandbox boots from that reference.
"""

from __future__ import annotations

import json

import httpx
import pytest

from levers9.builder.base import BaseLayer
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.e2e

PROGRAM = """
import json, levers9

blueprint = levers9.Blueprint(python_version="3.11").add_commands(["echo from the blueprint > /marker"])
first = levers9.Sandbox(image=blueprint, keep_warm_seconds=300).create()
try:
    seen = first.process.run_code("print(open('/marker').read().strip())")
    first.fs.create_directory("/work")
    first.fs.write_text("/work/notes.txt", "written in the first sandbox")
    first.process.exec("rm", "/marker").wait()
    first.process.exec("ln", "-s", "/work/notes.txt", "/work/link").wait()
    ref = first.create_image_from_filesystem()
    still = first.process.run_code("print('the first runs on')")
finally:
    first.terminate()
second = levers9.Sandbox(image=ref, keep_warm_seconds=300).create()
try:
    listing = second.process.run_code(
        "import os; print(open('/work/notes.txt').read()); print(os.path.exists('/marker')); "
        "print(os.readlink('/work/link'))"
    )
finally:
    second.terminate()
print(json.dumps({"seen": seen.stdout, "still": still.stdout, "ref": ref, "second": listing.stdout}))
"""


def test_a_sandbox_of_a_blueprint_becomes_an_image_another_sandbox_runs(levers9_up: Up, debian_base: BaseLayer) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.builds = True
    levers9_up.sandboxes = 2
    levers9_up.start()
    done = levers9_up.python(PROGRAM, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- up ---\n{levers9_up.log()[-4000:]}"
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["seen"] == "from the blueprint\n"
    assert said["still"] == "the first runs on\n"
    host = f"127.0.0.1:{levers9_up.http_port}"
    assert said["ref"].startswith(f"{host}/levers9/"), said["ref"]
    assert "/sandboxes@sha256:" in said["ref"]
    assert said["second"] == "written in the first sandbox\nFalse\n/work/notes.txt\n"
    # the image is the workspace's: another workspace's token cannot read it from the registry
    made = levers9_up.levers9("token", "create", "--workspace", "team-b")
    repository, digest = said["ref"].removeprefix(host + "/").split("@")
    url = f"http://{host}/v2/{repository}/manifests/{digest}"
    accept = {"accept": "application/vnd.oci.image.manifest.v1+json"}
    own = httpx.get(url, auth=("user", levers9_up.token()), headers=accept, timeout=30)
    assert own.status_code == 200, own.text
    assert httpx.get(url, auth=("user", made.stdout.strip()), headers=accept, timeout=30).status_code in (401, 403, 404)
