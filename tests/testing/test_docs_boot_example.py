"""docs/plugins.md's end-to-end example runs as it is written, against a provider written to the API it fakes.

The example ("Booting your machines end to end", §11) is a third party's
whole test: a fake of its cloud's REST API over ``levers9.testing.FakeCloud``,
``Levers9Up`` with a pool of its provider, ``CloudBooter`` booting the
instances, a call, and nothing left. This test takes the example's ``python``
block from the document, installs beside it a provider ``mycloud`` that speaks
the API the example fakes (a module and a ``.dist-info`` with its entry point,
on ``PYTHONPATH``: what ``pip install`` would leave), and runs the block with
pytest in a subprocess, as its author would. A change to levers9.testing, or
to the document, that breaks the example fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Booting your machines end to end"

#: the provider the example tests: mycloud's REST API (POST/GET /v1/instances, DELETE /v1/instances/<id>)
PLUGIN = '''
"""mycloud: a provider over the REST API the docs' end-to-end example fakes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl
from levers9.bootstrap import cloud_init
from levers9.gpu.catalog import CATALOG
from levers9.hooks.errors import InsufficientCapacity, ProviderError
from levers9.hooks.types import (
    Availability, GpuOffer, Machine, MachineState, Pool, ProviderCheck, ProvisionRequest, settings_of,
)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_url: str


def call(pool: Pool, method: str, path: str, body: object = None) -> Any:
    request = urllib.request.Request(
        settings_of(pool, Settings).api_url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        shown = json.loads(error.read() or b"{}")
        if error.code == 409:
            raise InsufficientCapacity(shown.get("message", "no capacity"), code=shown.get("code")) from None
        raise ProviderError(f"mycloud {method} {path}: {error.code} {shown}", code=shown.get("code")) from None


def machine(instance: dict[str, Any]) -> Machine:
    return Machine(
        provider_id=instance["id"],
        machine_id=instance["tags"].get("levers9:machine-id"),
        pool=instance["tags"]["levers9:pool"],
        state=MachineState(instance["status"]),
        gpu=instance["gpu"],
        gpu_count=instance["gpu_count"],
        region=instance["zone"][:-1],
        zone=instance["zone"],
        instance_type=instance["type"],
    )


class MyCloud:
    LEVERS9_SPEC_VERSION = 2

    @hookimpl
    def levers9_provider_settings(self) -> type[BaseModel]:
        return Settings

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        call(pool, "GET", "/v1/instances")
        return ProviderCheck(ok=True, message="the API answers")

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if pool.gpu is None:
            return []
        return [
            GpuOffer(
                gpu=pool.gpu, gpu_count=max(pool.gpu_count, 1), gpu_memory_mib=CATALOG[pool.gpu].memory_mib,
                region=region, zone=f"{region}a", instance_type=f"mc.{pool.gpu.lower()}",
                availability=Availability.AVAILABLE,
            )
            for region in pool.regions
        ]

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        for instance in call(request.pool, "GET", "/v1/instances"):
            tags = instance["tags"]
            if tags.get("levers9:machine-id") == request.machine_id and instance["status"] != "terminated":
                return machine(instance)
        assert request.offer is not None
        created = call(request.pool, "POST", "/v1/instances", {
            "zone": request.offer.zone, "type": request.offer.instance_type, "gpu": request.resources.gpu,
            "gpu_count": request.resources.gpu_count, "user_data": cloud_init(request.bootstrap),
            "tags": {"levers9:pool": request.pool.name, "levers9:machine-id": request.machine_id},
        })
        return machine(created)

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        try:
            call(pool, "DELETE", f"/v1/instances/{machine.provider_id}")
        except ProviderError as error:
            if error.code != "not-found":
                raise

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        return [
            machine(i) for i in call(pool, "GET", "/v1/instances")
            if i["tags"].get("levers9:pool") == pool.name and i["status"] != "terminated"
        ]


plugin = MyCloud()
'''


def example() -> str:
    """The ``python`` block of the end-to-end subsection of docs/plugins.md."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    assert HEADING in text, f"docs/plugins.md has no {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"the subsection should hold one python block, it holds {len(blocks)}"
    return str(blocks[0])


def test_the_docs_example_passes_against_a_provider_of_the_api_it_fakes(tmp_path: Path) -> None:
    code = example()
    assert not re.search(r"\btests[./]", code), "the example may use levers9.testing, not levers9's own tests"
    site = tmp_path / "site"
    dist = site / "levers9_mycloud-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "levers9_mycloud.py").write_text(PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: levers9-mycloud\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[levers9]\nmycloud = levers9_mycloud:plugin\n")
    tests = tmp_path / "mycloud-tests"
    tests.mkdir()
    (tests / "test_end_to_end.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-8000:]}\n{done.stderr[-3000:]}"
    assert "1 passed" in done.stdout, done.stdout[-3000:]
