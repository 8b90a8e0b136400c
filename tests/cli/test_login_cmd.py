"""`levers9 login` and `levers9 dashboard` refuse what they cannot do safely before anything is sent.

The whole flows (a browser, a real controlplane) are in tests/e2e/test_sign_in.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from levers9.cli.main import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("LEVERS9_CONTEXT", "LEVERS9_GRPC", "LEVERS9_TOKEN", "LEVERS9_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    return tmp_path


def test_login_refuses_plain_http_off_this_computer(home: Path) -> None:
    result = CliRunner().invoke(app, ["login", "--url", "http://levers9.example.com", "--no-browser"])
    assert result.exit_code == 2
    assert "plain http" in result.output
    assert not (home / "config").exists()


@pytest.mark.parametrize("url", ["levers9.example.com", "ftp://levers9.example.com", "https://"])
def test_login_names_a_bad_url(home: Path, url: str) -> None:
    result = CliRunner().invoke(app, ["login", "--url", url, "--no-browser"])
    assert result.exit_code == 2
    assert "--url:" in result.output


def test_login_without_a_context_or_url_says_what_to_do(home: Path) -> None:
    result = CliRunner().invoke(app, ["login", "--no-browser"])
    assert result.exit_code == 2
    assert "--url https://HOST" in result.output


def test_login_gives_up_when_no_sign_in_comes_back(home: Path) -> None:
    result = CliRunner().invoke(app, ["login", "--url", "http://127.0.0.1:9", "--no-browser", "--timeout", "0.5"])
    assert result.exit_code == 1
    assert "open this URL in a browser to sign in:\nhttp://127.0.0.1:9/auth/cli/start?port=" in result.output
    assert "no sign-in came back within 0.5 s" in result.output
    assert not (home / "config").exists()


def test_dashboard_without_a_context_exits_2(home: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--no-browser"])
    assert result.exit_code == 2
    assert "levers9 dashboard: no levers9 context" in result.output
