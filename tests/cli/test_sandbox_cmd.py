"""`levers9 sandbox list/exec/logs/kill` as a user runs them (a subprocess), against a local stand-in for the REST routes.

The routes' real answers are tested end to end in tests/e2e/test_sandbox_sdk.py; here each answer is
chosen (tests/fixtures/sandbox_rest.py) to check what the command prints and how it exits.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from levers9.cli.sandbox_cmd import _age
from tests.conftest import Result
from tests.fixtures.sandbox_rest import FakeSandboxAPI, error, info, serve_sandbox_api

ID = "sb-1"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSandboxAPI]:
    # the `cli` fixture's home is tmp_path/home too: the subprocess finds the context written here
    with serve_sandbox_api(tmp_path, monkeypatch) as served:
        yield served


def _line(record: dict[str, object]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _out(stream: str, data: str, partial: bool = False) -> bytes:
    return _line({"stream": stream, "data": data, "encoding": "utf-8", "partial": partial})


def _process(api: FakeSandboxAPI, number: int, pid: int, pieces: list[bytes], argv: list[str]) -> None:
    async def output(_: Request) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    api.on("GET", f"/sandboxes/{ID}/processes/{number}/output", output)
    api.on("POST", f"/sandboxes/{ID}/processes", (201, {"process": number, "pid": pid, "argv": argv}))


def test_list_prints_a_row_per_sandbox(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on(
        "GET",
        "/sandboxes",
        (200, {"sandboxes": [info("sb-1", name="agent"), info("sb-2", state="ended", reason="timed out")]}),
    )
    result = cli("sandbox", "list", "--all")
    assert result.returncode == 0, result.stderr
    header, first, second = result.stdout.splitlines()
    assert header.split("\t") == ["id", "name", "pool", "state", "created", "age"]
    assert first.split("\t")[:4] == ["sb-1", "agent", "local", "running"]
    assert second.split("\t")[:4] == ["sb-2", "-", "local", "ended (timed out)"]
    assert api.seen("GET", "/sandboxes")[-1].query == {"all": "true"}

    result = cli("sandbox", "list", "--json")
    assert [s["id"] for s in json.loads(result.stdout)] == ["sb-1", "sb-2"]
    assert api.seen("GET", "/sandboxes")[-1].query == {}


def test_list_with_no_sandboxes_says_how_to_start_one(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on("GET", "/sandboxes", (200, {"sandboxes": []}))
    result = cli("sandbox", "list")
    assert (result.returncode, result.stdout) == (0, "")
    assert "no sandboxes" in result.stderr


def test_create_prints_the_new_sandbox_id(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on("POST", "/sandboxes", (201, info("sb-new")))
    result = cli("sandbox", "create", "--cpu", "500m", "--memory", "1Gi", "--timeout", "-1", "--name", "ci")
    assert (result.returncode, result.stdout) == (0, "sb-new\n"), result.stderr
    sent = api.seen("POST", "/sandboxes")[-1].json()
    assert (sent["cpu_millicores"], sent["memory_mib"], sent["timeout_s"], sent["name"]) == (500, 1024, 0.0, "ci")
    result = cli("sandbox", "create", "--memory", "lots")
    assert result.returncode == 1
    assert "levers9.Sandbox: memory: " in result.stderr
    assert len(api.seen("POST", "/sandboxes")) == 1
    result = cli("sandbox", "create", "--gpu", "h100", "--gpu", "A100-80GB", "--gpu", "cpu", "--gpu-count", "2")
    assert result.returncode == 0, result.stderr
    sent = api.seen("POST", "/sandboxes")[-1].json()
    assert (sent["gpu"], sent["gpu_count"]) == (["H100", "A100-80", "cpu"], 2)
    result = cli("sandbox", "create", "--gpu", "H101")
    assert result.returncode == 1
    assert "levers9.Sandbox: gpu: " in result.stderr
    assert len(api.seen("POST", "/sandboxes")) == 2


def test_exec_streams_both_outputs_and_exits_with_the_process_code(
    api: FakeSandboxAPI, cli: Callable[..., Result]
) -> None:
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    pieces = [_out("stdout", "hello\n"), _out("stderr", "careful\n"), _out("stdout", "last", True), _line({"exit": 3})]
    _process(api, 1, 21, pieces, ["sh", "-c", "x"])
    result = cli("sandbox", "exec", ID, "--cwd", "/tmp", "-e", "A=1", "--", "sh", "-c", "echo hello; exit 3")
    assert (result.returncode, result.stdout) == (3, "hello\nlast")
    assert result.stderr == "careful\n"
    sent = api.seen("POST", f"/sandboxes/{ID}/processes")[-1].json()
    assert sent == {"argv": ["sh", "-c", "echo hello; exit 3"], "cwd": "/tmp", "env": {"A": "1"}}

    _process(api, 2, 22, [_line({"exit": -9})], ["sleep", "100"])
    assert cli("sandbox", "exec", ID, "--", "sleep", "100").returncode == 128 + 9


def test_exec_in_an_ended_sandbox_or_with_bad_input_is_a_clear_error(
    api: FakeSandboxAPI, cli: Callable[..., Result]
) -> None:
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="ended", reason="terminated by its owner")))
    result = cli("sandbox", "exec", ID, "--", "true")
    assert result.returncode == 1
    assert "sandbox sb-1 has ended: terminated by its owner" in result.stderr

    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    api.on("POST", f"/sandboxes/{ID}/processes", error(409, "sandbox_gone", "sandbox sb-1: its worker died"))
    result = cli("sandbox", "exec", ID, "--", "true")
    assert result.returncode == 1
    assert "its worker died" in result.stderr

    result = cli("sandbox", "exec", ID, "-e", "novalue", "--", "true")
    assert result.returncode == 2
    assert "--env 'novalue': expected NAME=VALUE" in result.stderr


def test_logs_prints_each_process_output_or_one(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    api.on(
        "GET",
        f"/sandboxes/{ID}/processes",
        (
            200,
            {
                "processes": [
                    {"process": 1, "pid": 31, "argv": ["server"], "running": False, "exit_code": 0},
                    {"process": 2, "pid": 32, "argv": ["job", "--fast"], "running": False, "exit_code": 1},
                ]
            },
        ),
    )
    _process(api, 1, 31, [_out("stdout", "listening\n"), _line({"exit": 0})], ["server"])
    _process(api, 2, 32, [_out("stderr", "failed\n"), _line({"exit": 1})], ["job"])
    result = cli("sandbox", "logs", ID)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "listening\n"
    assert result.stderr == "==> process 31: server\n==> process 32: job --fast\nfailed\n"

    result = cli("sandbox", "logs", ID, "32")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "failed\n")

    result = cli("sandbox", "logs", ID, "99")
    assert result.returncode == 1
    assert "no process with pid 99 in sandbox sb-1 (its processes' pids: 31, 32)" in result.stderr


def test_kill_terminates_or_says_it_had_ended(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    api.on("DELETE", f"/sandboxes/{ID}", (200, info(ID, state="ended", reason="terminated")))
    result = cli("sandbox", "kill", ID)
    assert (result.returncode, result.stdout) == (0, f"terminated sandbox {ID}\n")
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="ended", reason="terminated")))
    assert cli("sandbox", "kill", ID).stdout == f"sandbox {ID} had ended already\n"
    assert len(api.seen("DELETE", f"/sandboxes/{ID}")) == 1
    api.on("GET", f"/sandboxes/{ID}", error(404, "sandbox_not_found", "no sandbox sb-1 in this workspace"))
    result = cli("sandbox", "kill", ID)
    assert result.returncode == 1
    assert "no sandbox sb-1 in this workspace" in result.stderr


def test_a_context_without_http_is_named(
    cli: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from levers9.sdk.context import Context, save_context

    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path / "home"))  # the `cli` fixture's home
    save_context(Context(name="grpc-only", grpc="127.0.0.1:1", token="x"))
    result = cli("sandbox", "list")
    assert result.returncode == 1
    assert "context 'grpc-only'" in result.stderr
    assert "no http field" in result.stderr


def test_snapshots_are_listed(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    snapshot = {"id": "sbs_1", "sandbox_id": "sb-1", "pool": "local", "size_bytes": 3 << 20, "created_at": 1.0}
    api.on("GET", "/sandbox-snapshots", (200, {"snapshots": [snapshot]}))
    result = cli("sandbox", "snapshots")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split("\t") == ["id", "sandbox", "pool", "size", "created"]
    assert row.split("\t")[:4] == ["sbs_1", "sb-1", "local", "3.0 MiB"]


def test_a_snapshot_is_deleted_or_its_error_named(api: FakeSandboxAPI, cli: Callable[..., Result]) -> None:
    api.on("DELETE", "/sandbox-snapshots/sbs_1", (200, {}))
    result = cli("sandbox", "delete-snapshot", "sbs_1")
    assert (result.returncode, result.stdout) == (0, "deleted snapshot sbs_1\n"), result.stderr
    api.on("DELETE", "/sandbox-snapshots/sbs_2", error(404, "snapshot_not_found", "no snapshot sbs_2"))
    result = cli("sandbox", "delete-snapshot", "sbs_2")
    assert result.returncode == 1
    assert "no snapshot sbs_2" in result.stderr


def test_age_is_short() -> None:
    assert _age({"created_at": 100.0}, 105.0) == "5s"
    assert _age({"created_at": 100.0, "ended_at": 400.0}, 10_000.0) == "5m"
    assert _age({"created_at": 0}, 10.0) == "-"
    assert _age({"created_at": 1.0}, 1.0 + 3 * 86400) == "3d"
