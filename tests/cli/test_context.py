"""Client contexts: the ~/.levers9/config file, which context wins, and the `levers9 context` commands."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from levers9.cli.main import app
from levers9.sdk.context import (
    Context,
    ContextError,
    config_path,
    current_context,
    load_contexts,
    remove_context,
    save_context,
    use_context,
)

LOCAL = Context(name="local", grpc="127.0.0.1:1993", http="http://127.0.0.1:1994", token="tok-local", workspace="me")
TEAM = Context(name="team", grpc="grpcs://l9.example.com", token="tok-team")


@pytest.fixture(autouse=True)
def _no_context_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("LEVERS9_CONTEXT", "LEVERS9_TOKEN", "LEVERS9_GRPC"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "l9home"
    monkeypatch.setenv("LEVERS9_HOME", str(path))
    return path


def write_config(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config"
    path.write_text(textwrap.dedent(text))
    return path


def test_config_path_follows_levers9_home(home: Path) -> None:
    assert config_path() == home / "config"


def test_round_trip_and_file_shape(home: Path) -> None:
    save_context(LOCAL)
    save_context(TEAM, make_current=False)
    loaded = load_contexts()
    assert loaded.exists
    assert loaded.current == "local"
    assert loaded.contexts == {"local": LOCAL, "team": TEAM}
    document = yaml.safe_load((home / "config").read_text())
    assert document == {
        "current": "local",
        "contexts": {
            "local": {
                "grpc": "127.0.0.1:1993",
                "http": "http://127.0.0.1:1994",
                "token": "tok-local",
                "workspace": "me",
            },
            "team": {"grpc": "grpcs://l9.example.com", "token": "tok-team"},
        },
    }


def test_file_is_private_and_replaced_whole(home: Path) -> None:
    path = write_config(home, "contexts: {}\n")
    path.chmod(0o644)
    save_context(LOCAL)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in home.iterdir()) == ["config"], "no temporary file is left behind"


def test_new_home_directory_is_private(home: Path) -> None:
    save_context(LOCAL)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "config").stat().st_mode) == 0o600


def test_numeric_looking_token_survives_the_round_trip(home: Path) -> None:
    save_context(Context(name="n", grpc="h:1", token="0123"))
    assert current_context().token == "0123"


def test_first_context_becomes_current_even_without_make_current(home: Path) -> None:
    save_context(TEAM, make_current=False)
    assert load_contexts().current == "team"
    save_context(LOCAL, make_current=False)
    assert load_contexts().current == "team"
    save_context(LOCAL)
    assert load_contexts().current == "local"


def test_precedence_explicit_then_env_then_current(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_context(LOCAL)
    save_context(TEAM, make_current=False)
    assert current_context() == LOCAL
    monkeypatch.setenv("LEVERS9_CONTEXT", "team")
    assert current_context() == TEAM
    assert current_context("local") == LOCAL
    monkeypatch.setenv("LEVERS9_CONTEXT", "")
    assert current_context() == LOCAL


def test_env_overrides_token_and_address(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_context(LOCAL)
    monkeypatch.setenv("LEVERS9_TOKEN", "from-env")
    ctx = current_context()
    assert (ctx.name, ctx.grpc, ctx.token, ctx.http) == ("local", "127.0.0.1:1993", "from-env", LOCAL.http)
    monkeypatch.setenv("LEVERS9_GRPC", "10.0.0.5:2000")
    assert current_context("local").grpc == "10.0.0.5:2000"
    assert load_contexts().contexts["local"] == LOCAL, "overrides are never written back"


def test_env_alone_is_a_context_when_there_is_no_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEVERS9_GRPC", "cp:1993")
    monkeypatch.setenv("LEVERS9_TOKEN", "t")
    ctx = current_context()
    assert (ctx.name, ctx.grpc, ctx.token) == ("env", "cp:1993", "t")
    with pytest.raises(ContextError, match="asked for 'team'"):
        current_context("team")


def test_no_file_says_how_to_make_one(home: Path) -> None:
    with pytest.raises(ContextError) as info:
        current_context()
    assert str(info.value) == "no levers9 context: run `levers9 up` (one machine) or `levers9 context add ...`"


def test_unknown_name_lists_the_known_ones(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_context(LOCAL)
    save_context(TEAM)
    with pytest.raises(ContextError, match=r"unknown levers9 context 'lcoal' .*\(known: local, team\)"):
        current_context("lcoal")
    monkeypatch.setenv("LEVERS9_CONTEXT", "gone")
    with pytest.raises(ContextError, match="unknown levers9 context 'gone'"):
        current_context()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("contexts:\n  dev:\n    grpc: h:1\n    token: 1234\n", "contexts.dev.token: expected a string, got a number"),
        ("contexts:\n  dev:\n    grpc: h:1\n    tokn: x\n", "contexts.dev.tokn: unknown key"),
        ("contexts:\n  dev:\n    token: x\n", "contexts.dev.grpc: missing"),
        ("contexts:\n  dev: h:1\n", "contexts.dev: expected a mapping"),
        ("contexts: [a, b]\n", "contexts: expected a mapping"),
        ("current: [x]\ncontexts: {}\n", "current: expected a context name"),
        ("- a\n- b\n", "expected a mapping with 'current' and 'contexts', got a list"),
        ("currnet: x\n", "currnet: unknown key"),
    ],
)
def test_malformed_file_names_the_file_and_the_key(home: Path, text: str, where: str) -> None:
    path = write_config(home, text)
    with pytest.raises(ContextError) as info:
        load_contexts()
    assert str(info.value).startswith(f"{path}: ")
    assert where in str(info.value)


def test_yaml_syntax_error_names_the_line(home: Path) -> None:
    path = write_config(home, "current: local\ncontexts:\n  local: {grpc: [\n")
    with pytest.raises(ContextError, match=rf"^{path}:\d+: not valid YAML"):
        current_context()


def test_empty_file_has_no_contexts(home: Path) -> None:
    write_config(home, "")
    loaded = load_contexts()
    assert loaded.exists
    assert (loaded.current, loaded.contexts) == (None, {})
    with pytest.raises(ContextError, match="no current levers9 context"):
        current_context()


def test_dangling_current_is_reported_and_repairable(home: Path) -> None:
    write_config(home, "current: gone\ncontexts:\n  local: {grpc: 'h:1'}\n")
    with pytest.raises(ContextError, match=r"unknown levers9 context 'gone' .*\(known: local\)"):
        current_context()
    use_context("local")
    assert current_context().name == "local"


def test_remove_context(home: Path) -> None:
    save_context(TEAM)
    save_context(LOCAL)
    remove_context("team")
    assert set(load_contexts().contexts) == {"local"}
    assert current_context() == LOCAL
    remove_context("local")
    assert load_contexts().current is None
    with pytest.raises(ContextError, match="no current levers9 context"):
        current_context()
    with pytest.raises(ContextError, match="unknown levers9 context 'local'"):
        remove_context("local")


def test_remove_without_a_file(home: Path) -> None:
    with pytest.raises(ContextError, match="no levers9 context"):
        remove_context("x")


def test_save_rejects_a_context_without_an_address(home: Path) -> None:
    with pytest.raises(ContextError, match="needs a grpc address"):
        save_context(Context(name="x", grpc=""))
    assert not (home / "config").exists()


def test_token_is_not_in_repr() -> None:
    assert "tok-local" not in repr(LOCAL)


def test_context_module_imports_only_the_standard_library_and_yaml() -> None:
    """The SDK reads contexts in every user program; what this module adds to its start must stay small."""
    import ast

    import levers9.sdk.context as module

    tree = ast.parse(Path(module.__file__ or "").read_text())
    imported = {
        name
        for node in tree.body
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    # levers9.files (the one atomic write) and levers9.proto.target (address lists) import only the standard library
    allowed = set(sys.stdlib_module_names) | {
        "__future__",
        "yaml",
        "levers9.hooks.errors",
        "levers9.files",
        "levers9.proto.target",
    }
    assert {name for name in imported if name.split(".")[0] not in allowed and name not in allowed} == set()


# --- the `levers9 context` commands -------------------------------------------------------------

runner = CliRunner()


def test_cli_add_list_use_remove(home: Path) -> None:
    result = runner.invoke(
        app, ["context", "add", "local", "--grpc", "127.0.0.1:1993", "--token", "s3cret", "--http", "http://x:1994"]
    )
    assert result.exit_code == 0, result.output
    assert "context 'local' saved" in result.stdout
    result = runner.invoke(
        app, ["context", "add", "team", "--grpc", "grpcs://l9.example.com", "--token", "-"], input="t2\n"
    )
    assert result.exit_code == 0, result.output
    assert current_context().name == "team"
    assert current_context().token == "t2"

    result = runner.invoke(app, ["context", "list"])
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.stdout
    lines = {
        line.split()[1] if line.startswith("*") else line.split()[0]: line for line in result.stdout.splitlines()[1:]
    }
    assert lines["team"].startswith("*")
    assert "127.0.0.1:1993" in lines["local"]

    result = runner.invoke(app, ["context", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["local"] == {
        "name": "local",
        "current": False,
        "grpc": "127.0.0.1:1993",
        "http": "http://x:1994",
        "workspace": "",
        "token": True,
        "ca_file": "",
        "reconnect_s": 120.0,
    }

    result = runner.invoke(app, ["context", "use", "local"])
    assert result.exit_code == 0, result.output
    assert current_context().name == "local"

    result = runner.invoke(app, ["context", "use", "nope"])
    assert result.exit_code == 1
    assert "unknown levers9 context 'nope'" in result.stderr
    assert "(known: local, team)" in result.stderr

    result = runner.invoke(app, ["context", "remove", "local"])
    assert result.exit_code == 0, result.output
    assert "no context is current now" in result.stdout
    assert set(load_contexts().contexts) == {"team"}


def test_cli_list_without_contexts(home: Path) -> None:
    result = runner.invoke(app, ["context", "list"])
    assert result.exit_code == 0
    assert "no contexts" in result.stderr
    assert json.loads(runner.invoke(app, ["context", "list", "--json"]).stdout) == []


def test_cli_broken_file_fails_with_its_name(home: Path) -> None:
    path = write_config(home, "contexts: 3\n")
    result = runner.invoke(app, ["context", "list"])
    assert result.exit_code == 1
    assert f"{path}: contexts: expected a mapping" in result.stderr


def test_cli_add_needs_a_token_on_stdin(home: Path) -> None:
    result = runner.invoke(app, ["context", "add", "x", "--grpc", "h:1", "--token", "-"], input="")
    assert result.exit_code == 1
    assert "no token on standard input" in result.stderr
    assert not os.path.exists(home / "config")
