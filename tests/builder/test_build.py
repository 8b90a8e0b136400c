"""Builds for real: a blueprint's steps in runc and gVisor containers, the image as an OCI layout.

Every test runs on both runtimes, on the real Debian base (mmdebstrap), through the real Debian mirror
and package index this machine is configured with, and checks at the end that nothing is left (the
``box`` fixture: containers, mounts, network namespaces, host-guard rules, work directories).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from levers9.blueprints.context import LocalCopy, LocalFiles
from levers9.blueprints.spec import Base, BuildSpec, Step
from levers9.builder.build import BaseImage, BuildEvent, BuildFailed, BuildResult, StepResult, run_build
from levers9.builder.sources import PipSettings, pip_settings
from levers9.hooks.types import ContainerSpec, ContainerStatus
from tests.builder.conftest import Box, require

BASE = Base(kind="debian", python_version="3.11")


class Contents:
    """Copy steps' files as their deterministic tars, by digest: the ``content`` callable of a build."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tars: dict[str, Path] = {}

    def copy(self, dest: str, name: str, path: Path) -> Step:
        files = LocalFiles("add_local_dir", ((name, path),))
        step = LocalCopy(dest, files).step()
        assert step.content is not None
        tar = self.root / f"{step.content.removeprefix('sha256:')}.tar"
        with open(tar, "wb") as out:
            files.write(out)
        self.tars[step.content] = tar
        return step

    def __call__(self, digest: str) -> Path:
        return self.tars[digest]


async def build(
    box: Box,
    base: BaseImage,
    spec: BuildSpec,
    out: Path,
    *,
    events: list[BuildEvent],
    content: Callable[[str], Path] | None = None,
    cached: dict[str, StepResult] | None = None,
    secrets: dict[str, str] | None = None,
    pip: PipSettings | None = None,
) -> BuildResult:
    return await run_build(
        spec,
        hooks=box.hooks,
        runtime=box.runtime,
        store=box.store,
        base=base,
        cached=cached or {},
        secrets=secrets or {},
        content=content or (lambda d: Path("/nonexistent")),
        on_event=events.append,
        out_dir=out,
        pip=pip,
    )


async def run_image(box: Box, layout: Path, script: str) -> tuple[int | None, str]:
    """Run ``script`` in a container of the built image (as a worker would); its exit code and output."""
    cid = f"t-{secrets.token_hex(6)}"
    box.extra.append(cid)
    # the engine starts a container in the spec's working directory: a worker passes the image's
    workdir = box.store.resolve(str(layout)).config.workdir or "/"
    spec = ContainerSpec(
        container_id=cid, image=str(layout), command=["/bin/sh", "-c", script], network="none", workdir=workdir
    )
    prepared = await box.hooks.container_prepare(box.runtime, spec)
    await box.hooks.container_start(box.runtime, prepared)
    deadline = time.monotonic() + 120
    while (state := await box.hooks.container_state(box.runtime, cid)).status is not ContainerStatus.EXITED:
        if time.monotonic() > deadline:
            pytest.fail(f"container {cid} of the built image did not exit within 120 s")
        await asyncio.sleep(0.05)
    return state.exit_code, (await box.hooks.container_logs(box.runtime, cid, 0)).data.decode()


def blob_bytes(layout: Path) -> dict[str, bytes]:
    """Every blob of the layout, layers uncompressed."""
    found = {}
    for blob in sorted((layout / "blobs" / "sha256").iterdir()):
        data = blob.read_bytes()
        found[blob.name] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    return found


def kinds(events: list[BuildEvent], kind: str) -> list[int]:
    return [e.step for e in events if e.kind == kind]


async def test_a_blueprint_builds_runs_and_rebuilds_only_what_changed(
    box: Box, base: BaseImage, tmp_path: Path
) -> None:
    require("skopeo")
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 'from the local package'\n")
    contents = Contents(tmp_path)
    token = f"tok-{secrets.token_hex(16)}"
    use_secret = (
        'test "$API_TOKEN" = "$(cat /run/secrets/API_TOKEN)" && echo "secret of ${#API_TOKEN} characters" '
        "&& echo built > /built && rm /etc/debian_version"
    )
    steps = (
        Step("apt", ("jq",)),
        Step("pip", ("six",)),
        Step("run", (use_secret,), secrets=("API_TOKEN",)),
        contents.copy("/opt/lib", "mypkg", package),
        Step("env", env=(("PYTHONPATH", "/opt/lib"), ("GREETING", "hello"))),
        Step("workdir", ("/work",)),
        Step("run", ("echo one > /last",)),
    )
    events: list[BuildEvent] = []
    first = await build(
        box,
        base,
        BuildSpec(BASE, steps),
        tmp_path / "one",
        events=events,
        content=contents,
        secrets={"API_TOKEN": token},
    )
    assert first.ran == (1, 2, 3, 4, 5, 6, 7)
    assert first.cached == ()
    assert kinds(events, "start") == [1, 2, 3, 4, 5, 6, 7]
    assert any("jq" in e.text for e in events if e.kind == "output" and e.step == 1)
    assert any(e.text == f"secret of {len(token)} characters" for e in events if e.kind == "output")
    assert [r.diff_id is None for r in first.steps] == [False, False, False, False, True, True, False]
    assert first.missing_blobs == ()

    # the layout is an OCI image skopeo and the image store both read
    inspected = json.loads(
        subprocess.run(
            ["skopeo", "inspect", f"oci:{first.layout}"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    assert inspected["Digest"] == first.manifest_digest
    assert "GREETING=hello" in inspected["Env"]
    resolved = box.store.resolve(str(first.layout))
    assert resolved.config.workdir == "/work"
    assert len(resolved.layers) == len(base.layers) + 5

    # a container of the image has it all, and not the deleted base file
    code, output = await run_image(
        box,
        first.layout,
        (
            "jq --version && python3 -c 'import six, mypkg; print(mypkg.VALUE)' && cat /built /last "
            '&& test ! -e /etc/debian_version && echo "$GREETING from $(pwd)" && echo "[$API_TOKEN]"'
        ),
    )
    assert code == 0, output
    assert output.split("\n")[:6] == ["jq-1.6", "from the local package", "built", "one", "hello from /work", "[]"]

    # the secret is in no layer, config, manifest or history: only its name is
    for name, data in blob_bytes(first.layout).items():
        assert token.encode() not in data, f"the secret's value is in blob {name}"
    config = json.loads(blob_bytes(first.layout)[first.config_digest.removeprefix("sha256:")])
    assert "API_TOKEN" in config["history"][len(base.history) + 2]["created_by"]
    assert not [e for e in events if token in e.text]

    # the last step changed: only it runs again
    changed = (*steps[:-1], Step("run", ("echo two > /last",)))
    again: list[BuildEvent] = []
    second = await build(
        box,
        base,
        BuildSpec(BASE, changed),
        tmp_path / "two",
        events=again,
        content=contents,
        secrets={"API_TOKEN": token},
        cached={r.key: r for r in first.steps},
    )
    assert (second.ran, second.cached) == ((7,), (1, 2, 3, 4, 5, 6))
    assert kinds(again, "cached") == [1, 2, 3, 4, 5, 6]
    assert kinds(again, "start") == [7]
    assert [r.key for r in second.steps[:6]] == [r.key for r in first.steps[:6]]
    assert second.steps[6].key != first.steps[6].key
    code, output = await run_image(box, second.layout, "cat /last && jq --version")
    assert (code, output) == (0, "two\njq-1.6\n")


async def test_a_failing_step_is_named_with_its_exit_code_and_last_lines(
    box: Box, base: BaseImage, tmp_path: Path
) -> None:
    token = f"tok-{secrets.token_hex(16)}"
    failing = 'for i in $(seq 1 30); do echo "line $i"; done; echo "the token is $TOKEN"; exit 3'
    spec = BuildSpec(
        BASE,
        (Step("env", env=(("A", "1"),)), Step("run", (failing,), secrets=("TOKEN",)), Step("run", ("echo never",))),
    )
    events: list[BuildEvent] = []
    with pytest.raises(BuildFailed) as info:
        await build(box, base, spec, tmp_path / "out", events=events, secrets={"TOKEN": token})
    failed = info.value
    assert (failed.step, failed.total, failed.op, failed.exit_code) == (2, 3, "run", 3)
    assert failed.lines == (*(f"line {i}" for i in range(12, 31)), "the token is ***")
    assert "step 2/3 (RUN (secrets: TOKEN) /bin/sh -c for i in" in str(failed)
    assert "exited with code 3" in str(failed)
    assert "line 30" in str(failed)
    assert token not in str(failed)
    assert "the token is ***" in [e.text for e in events if e.kind == "output"]
    assert not [e for e in events if token in e.text]
    assert kinds(events, "start") == [1, 2], "nothing after the failing step runs"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


async def test_a_step_reaches_the_index_but_not_the_host(box: Box, base: BaseImage, tmp_path: Path) -> None:
    listener = socket.create_server(("0.0.0.0", 0))
    host_port = listener.getsockname()[1]
    probe = f"""
import os, socket, ssl, urllib.error, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.2:{host_port}/", timeout=30)  # (127.0.0.1 is in no_proxy)
    print("loopback: reached")
except urllib.error.HTTPError as e:
    print("loopback:", e.code)
gateway = os.environ["http_proxy"].split("//")[1].split(":")[0]
s = socket.socket()
s.settimeout(20)
try:
    s.connect((gateway, {host_port}))
    print("host port: connected")
except OSError as e:
    print("host port:", type(e).__name__)
# reachability only: this machine's index may use a CA the base does not carry (pip steps get the machine's)
unverified = ssl._create_unverified_context()
print("index:", urllib.request.urlopen("https://pypi.org/simple/six/", timeout=60, context=unverified).status)
"""
    events: list[BuildEvent] = []
    try:
        result = await build(
            box,
            base,
            BuildSpec(BASE, (Step("run", (f"python3 - <<'EOF'\n{probe}\nEOF",)),)),
            tmp_path / "out",
            events=events,
            pip=pip_settings(),
        )
    finally:
        listener.close()
    said = [e.text for e in events if e.kind == "output"]
    assert said == ["loopback: 403", "host port: ConnectionRefusedError", "index: 200"], said
    assert [r.destination for r in result.refusals] == [f"http://127.0.0.2:{host_port}/"]
    assert "a loopback address" in result.refusals[0].reason
    assert kinds(events, "refused") == [0]


async def test_a_cancelled_build_leaves_nothing(box: Box, base: BaseImage, tmp_path: Path) -> None:
    started = asyncio.Event()

    def on_event(event: BuildEvent) -> None:
        if event.kind == "output" and event.text == "started":
            started.set()

    spec = BuildSpec(BASE, (Step("run", ("echo started; sleep 600",)),))
    task = asyncio.ensure_future(
        run_build(
            spec,
            hooks=box.hooks,
            runtime=box.runtime,
            store=box.store,
            base=base,
            cached={},
            secrets={},
            content=lambda d: Path("/nonexistent"),
            on_event=on_event,
            out_dir=tmp_path / "out",
        )
    )
    await asyncio.wait_for(started.wait(), 120)
    assert await box.hooks.container_list(box.runtime), "the step's container runs"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await box.hooks.container_list(box.runtime) == []


async def test_builds_need_a_runtime_that_can_capture(plain_box: Box, base: BaseImage, tmp_path: Path) -> None:
    from levers9.builder.steps import BuildError

    with pytest.raises(BuildError, match="runtime 'process' cannot build images; builds need runc or gvisor"):
        await run_build(
            BuildSpec(BASE, (Step("run", ("true",)),)),
            hooks=plain_box.hooks,
            runtime=plain_box.runtime,
            store=plain_box.store,
            base=base,
            cached={},
            secrets={},
            content=lambda d: Path("/x"),
            on_event=lambda e: None,
            out_dir=tmp_path / "out",
        )
