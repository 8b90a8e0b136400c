"""levers9.testing.Levers9Up: a config levers9 refuses fails the start with levers9's own words; stop cleans up."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from levers9.testing import Levers9Up, Levers9UpFailed


def test_a_config_levers9_refuses_fails_the_start_with_its_log(tmp_path: Path) -> None:
    up = Levers9Up({"broken": {"provider": "local", "runtime": "process", "no_such_field": 1}}, tmp_path / "up")
    try:
        with pytest.raises(Levers9UpFailed, match=r"^levers9 up exited with \d+:\n") as failed:
            up.start(timeout=120)
    finally:
        left = up.stop()
    assert "no_such_field" in str(failed.value)  # levers9's own message, naming the field
    written = yaml.safe_load((tmp_path / "up" / "home" / "levers9.yaml").read_text())
    assert written["pools"] == {"broken": {"provider": "local", "runtime": "process", "no_such_field": 1}}
    assert written["scheduler"]["register_timeout_s"] == 120
    assert left == []


def test_a_root_it_made_is_removed_by_stop_and_one_given_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEVERS9_CONTEXT", "the-callers")
    own = Levers9Up({})
    assert own.root.is_dir()
    assert own.stop() == []
    assert not own.root.exists()
    given = Levers9Up({}, tmp_path / "kept")
    given.stop()
    assert (tmp_path / "kept").is_dir()
    assert given.ports == [given.grpc_port, given.http_port]
    # nothing of the caller's LEVERS9_* reaches levers9; what the test gives does
    with_credentials = Levers9Up({}, tmp_path / "kept", environment={"MYCLOUD_KEY": "k"})
    assert "LEVERS9_CONTEXT" not in with_credentials.env
    assert with_credentials.env["MYCLOUD_KEY"] == "k"
    assert with_credentials.env["LEVERS9_HOME"] == str(tmp_path / "kept" / "home")
