"""Listings a person can read and a script can parse: every listing command, run as a user runs it.

Piped (the ``cli`` fixture's subprocess has no terminal) a listing is tab-separated
with whole values; on a terminal (forced with ``FORCE_COLOR``, ``COLUMNS`` wide)
ids, names and statuses stay whole however narrow it is; ``--json`` is a list of
objects with stable keys and ISO 8601 times. The controlplane is the in-process
fake of test_client_cmds.py, answering with ids as long as real ones.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import typer

from levers9.cli.main import app
from levers9.proto.v1 import controlplane_pb2 as pb
from tests.cli.test_client_cmds import FakeControlPlane, Server, serving
from tests.conftest import Result

Cli = Callable[..., Result]
NOW = time.time()
TASK_IDS = ["t-01J9ZK3Q8V6W2X4Y5Z7A8B9C0D", "t-01J9ZK3Q8V6W2X4Y5Z7A8B9C0E"]
WORKER_ID = "w-h100-spot-us-east-1-0123456789abcdef"
MACHINE_ID = "i-0abcdef0123456789abcdef"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX = set("─│┃━┏┓┗┛┡┩└┘├┤┼╇…")


class LongNames(FakeControlPlane):
    """Answers with ids, names and errors as long as a real controlplane's."""

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        await self._enter("ListTasks", request, context)
        return pb.ListTasksResponse(
            tasks=[
                pb.Task(
                    id=TASK_IDS[0],
                    function="pipelines.training.fit_transformer_with_lora",
                    status="running",
                    attempts=1,
                    pool="h100-spot",
                    gpu="H100",
                    worker_id=WORKER_ID,
                    created_at=NOW - 90,
                    started_at=NOW - 60,
                ),
                pb.Task(
                    id=TASK_IDS[1],
                    function="pipelines.prep.tokenize_the_whole_corpus",
                    status="error",
                    attempts=3,
                    pool="cpu",
                    worker_id=WORKER_ID,
                    created_at=NOW - 30,
                    started_at=NOW - 20,
                    finished_at=NOW - 10,
                    error="RuntimeError: the corpus shard 17 of 64 is missing\n\tat line 3\nTraceback ...",
                ),
            ]
        )

    async def ListWorkers(self, request: pb.ListWorkersRequest, context: Any) -> pb.ListWorkersResponse:
        await self._enter("ListWorkers", request, context)
        return pb.ListWorkersResponse(
            workers=[
                pb.WorkerSummary(
                    id=WORKER_ID,
                    pool="h100-spot",
                    status="ready",
                    gpu="H100",
                    gpu_total=8,
                    gpu_free=6,
                    cpu_millicores=96000,
                    cpu_free=64500,
                    memory_mib=1048576,
                    memory_free=524288,
                    running=2,
                    machine_id=MACHINE_ID,
                )
            ]
        )

    async def ListSecrets(self, request: pb.ListSecretsRequest, context: Any) -> pb.ListSecretsResponse:
        await self._enter("ListSecrets", request, context)
        return pb.ListSecretsResponse(
            secrets=[pb.SecretInfo(name="OPENAI_API_KEY", created_at=NOW - 100, updated_at=NOW - 50)]
        )

    async def ListDeployments(self, request: pb.ListDeploymentsRequest, context: Any) -> pb.ListDeploymentsResponse:
        await self._enter("ListDeployments", request, context)
        versions = [
            pb.DeploymentVersion(version=1, stub_id="stub-1", created_at=NOW - 200, stopped_at=NOW - 100),
            pb.DeploymentVersion(version=2, stub_id="stub-2", created_at=NOW - 100),
        ]
        return pb.ListDeploymentsResponse(
            deployments=[
                pb.DeploymentInfo(id="dep-1", name="chat", kind="endpoint", active_version=2, versions=versions)
            ]
        )


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    with serving(LongNames(), tmp_path, monkeypatch) as running:
        yield running


def piped(cli: Cli, *argv: str) -> list[list[str]]:
    """The tab-separated rows of a listing run with a pipe for stdout, the header first."""
    result = cli(*argv, env={"COLUMNS": "40"})
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout, "no colour in a pipe"
    assert not BOX & set(result.stdout), "no box characters nor ellipses in a pipe"
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert len({len(row) for row in rows}) == 1, f"every row has the header's fields: {rows}"
    return rows


def terminal(cli: Cli, *argv: str, columns: int = 80) -> str:
    """What a terminal ``columns`` wide shows, colours stripped."""
    result = cli(*argv, env={"COLUMNS": str(columns), "FORCE_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    return ANSI.sub("", result.stdout)


def test_piped_tasks_are_tab_separated_with_whole_values(server: Server, cli: Cli) -> None:
    header, *rows = piped(cli, "tasks")
    assert header == ["id", "function", "status", "attempts", "pool", "gpu", "worker", "created", "duration", "error"]
    assert [row[0] for row in rows] == TASK_IDS, "`levers9 tasks | cut -f1` gives whole task ids"
    assert [row[2] for row in rows] == ["running", "error"]
    assert [row[1] for row in rows] == [
        "pipelines.training.fit_transformer_with_lora",
        "pipelines.prep.tokenize_the_whole_corpus",
    ]
    assert rows[1][6] == WORKER_ID
    assert rows[1][9] == "RuntimeError: the corpus shard 17 of 64 is missing", "the error's first line, whole"


def test_piped_workers_are_whole(server: Server, cli: Cli) -> None:
    header, row = piped(cli, "workers")
    assert header == ["id", "pool", "status", "gpu free", "cpu free", "memory free", "running", "machine"]
    assert row == [WORKER_ID, "h100-spot", "ready", "6/8 H100", "64.5/96", "512.0/1024.0 GiB", "2", MACHINE_ID]


@pytest.mark.parametrize("columns", [80, 40])
def test_a_narrow_terminal_keeps_ids_and_statuses_whole(server: Server, cli: Cli, columns: int) -> None:
    shown = terminal(cli, "tasks", columns=columns)
    assert "…" not in shown
    lines = shown.splitlines()
    for task_id, status in zip(TASK_IDS, ("running", "error"), strict=True):
        row = next(line for line in lines if task_id in line)
        assert re.search(rf"\s{status}\s", row), (status, row)
        assert WORKER_ID in row
    assert "RuntimeError:" in shown
    workers = terminal(cli, "workers", columns=columns)
    assert "…" not in workers
    assert WORKER_ID in workers
    assert MACHINE_ID in workers


def test_plugins_at_80_columns_never_splits_a_hook_name(cli: Cli) -> None:
    listed = json.loads(cli("plugins", "--json").stdout)
    known = {h.removeprefix("levers9_") for p in listed for h in p["hooks"]} | {"-"}
    lines = terminal(cli, "plugins", columns=80).splitlines()
    start = lines[0].index("hooks")
    words = [w.strip(",") for line in lines[1:] for w in line[start:].split()]
    assert words, "the hooks column is empty"
    assert set(words) <= known, f"split hook names: {sorted(set(words) - known)}"
    assert "…" not in "\n".join(lines)

    header, *rows = piped(cli, "plugins")
    assert header == ["name", "distribution", "status", "roles", "hooks"]
    by_name = {p["name"]: p for p in listed}
    for row in rows:
        hooks = by_name[row[0]]["hooks"]
        assert row[4] == (", ".join(h.removeprefix("levers9_") for h in hooks) or "-"), "whole, comma-separated"


TASK_KEYS = {
    "id",
    "stub_id",
    "function",
    "status",
    "attempts",
    "worker_id",
    "pool",
    "gpu",
    "error",
    "created_at",
    "started_at",
    "finished_at",
}
POOL_KEYS = {
    "name",
    "provider",
    "runtime",
    "gpu",
    "gpu_count",
    "min_workers",
    "max_workers",
    "workers",
    "starting",
    "unavailable",
    "isolation",
}
WORKER_KEYS = {
    "id",
    "pool",
    "status",
    "gpu",
    "gpu_total",
    "gpu_free",
    "cpu_millicores",
    "cpu_free",
    "memory_mib",
    "memory_free",
    "running",
    "machine_id",
}
LISTINGS: list[tuple[list[str], set[str]]] = [
    (["tasks"], TASK_KEYS),
    (["pools"], POOL_KEYS),
    (["workers"], WORKER_KEYS),
    (["secret", "list"], {"name", "created_at", "updated_at"}),
    (["deployments"], {"id", "name", "kind", "active_version", "versions"}),
    (
        ["plugins"],
        {
            "name",
            "module",
            "distribution",
            "version",
            "builtin",
            "status",
            "error",
            "roles",
            "hooks",
            "spec_version",
            "warnings",
        },
    ),
    (["gpu", "list"], {"name", "vendor", "memory_mib"}),
    (["context", "list"], {"name", "current", "grpc", "http", "workspace", "token", "ca_file", "reconnect_s"}),
]


def _iso(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    assert moment.utcoffset() is not None, f"{value!r} has no time zone"
    return moment


@pytest.mark.parametrize(("argv", "keys"), LISTINGS, ids=[" ".join(a) for a, _ in LISTINGS])
def test_json_of_every_listing_command(server: Server, cli: Cli, argv: list[str], keys: set[str]) -> None:
    result = cli(*argv, "--json")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert isinstance(listed, list)
    assert listed, result.stdout
    for item in listed:
        assert set(item) == keys
    for item in listed:
        for key, value in item.items():
            if key.endswith("_at") and value is not None:
                _iso(value)


def test_json_values_are_machine_friendly(server: Server, cli: Cli) -> None:
    tasks = json.loads(cli("tasks", "--json").stdout)
    assert [t["id"] for t in tasks] == TASK_IDS
    assert abs(_iso(tasks[0]["created_at"]).timestamp() - (NOW - 90)) < 0.01
    assert tasks[0]["finished_at"] is None, "not yet is null, not 0"
    assert tasks[1]["attempts"] == 3
    assert tasks[1]["error"].startswith("RuntimeError: the corpus shard 17 of 64 is missing\n"), "the whole error"
    secrets = json.loads(cli("secret", "list", "--json").stdout)
    assert abs(_iso(secrets[0]["updated_at"]).timestamp() - (NOW - 50)) < 0.01
    (chat,) = json.loads(cli("deployments", "--json").stdout)
    assert [(v["version"], v["serving"], v["stopped_at"] is None) for v in chat["versions"]] == [
        (1, False, False),
        (2, True, True),
    ]
    assert abs(_iso(chat["versions"][1]["created_at"]).timestamp() - (NOW - 100)) < 0.01
    (worker,) = json.loads(cli("workers", "--json").stdout)
    assert (worker["gpu_free"], worker["cpu_free"], worker["memory_free"]) == (6, 64500, 524288)


def test_token_list_on_the_database(cli: Cli) -> None:
    """The operator's form: it opens the controlplane's database itself (SQLite in the levers9 home here)."""
    created = cli("token", "create", "--workspace", "team-a")
    assert created.returncode == 0, created.stderr
    token_id = created.stderr.split()[2]
    listed = json.loads(cli("token", "list", "--workspace", "team-a", "--json").stdout)
    assert [(t["id"], t["kind"], t["state"]) for t in listed] == [(token_id, "user", "active")]
    assert set(listed[0]) == {
        "id",
        "kind",
        "subject",
        "state",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    }
    _iso(listed[0]["created_at"])
    header, row = piped(cli, "token", "list", "--workspace", "team-a")
    assert header == ["id", "kind", "state", "subject", "created", "expires", "last used"]
    assert row[:4] == [token_id, "user", "active", "levers9 token create"]
    assert row[4] == listed[0]["created_at"]


def test_config_check_json_lists_the_pools(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text(
        "pools:\n  cpu:\n    provider: local\n    runtime: process\n    workspace: me\n    cpu: 2\n    memory: 4GiB\n"
    )
    result = cli("config", "check", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {
            "name": "cpu",
            "provider": "local",
            "runtime": "process",
            "gpu": None,
            "gpu_count": 0,
            "cpu": 2.0,
            "memory_mib": 4096,
            "min_workers": 0,
            "max_workers": 10,
        }
    ]
    assert "ok, 1 pool(s)" in result.stderr


# A command is a listing when its own name is one of LISTING_NAMES, or when its help starts with
# "List" (what every listing's docstring says first). Every listing must take --json.
LISTING_NAMES = {
    "list",
    "ls",
    "tasks",
    "workers",
    "pools",
    "machines",
    "plugins",
    "secrets",
    "deployments",
    "history",
    "contexts",
    "tokens",
}


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command under ``command`` (typer's own click), with its path of names."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path, command
        return
    for name, sub in subcommands.items():
        yield from _commands(sub, (*path, name))


def test_every_listing_command_takes_json() -> None:
    listings = {
        path: command
        for path, command in _commands(typer.main.get_command(app))
        if path[-1] in LISTING_NAMES or (command.help or "").lstrip().startswith("List")
    }
    found = {" ".join(path) for path in listings}
    expected = {
        "tasks",
        "pools",
        "workers",
        "deployments",
        "plugins",
        "gpu list",
        "context list",
        "secret list",
        "token list",
    }
    assert expected <= found, f"the rule no longer finds {sorted(expected - found)}"
    missing = sorted(
        " ".join(path)
        for path, command in listings.items()
        if not any(p.param_type_name == "option" and "--json" in p.opts for p in command.params)
    )
    assert not missing, f"listing commands without --json: {missing}"
