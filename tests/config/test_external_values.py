"""Secrets outside the config file: ``${NAME}`` in the secret-bearing fields, and ``_file`` twins (issue 36 item 4).

Each problem names the field, the variable or path, and the line; a resolved value is never shown.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from levers9.config.load import ConfigError, load_config, parse_config
from levers9.hooks.manager import PluginPolicy, load_plugins

DB = "postgresql+psycopg://levers9:s3cr3t-pw@db.internal:5432/levers9"
REDIS = "redis://default:r3d1s-pw@redis.internal:6379/0"


def parse(text: str, environ: dict[str, str] | None = None) -> object:
    config, _ = parse_config(textwrap.dedent(text).lstrip("\n"), "levers9.yaml", environ=environ or {})
    return config


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, environ)
    return [str(issue) for issue in info.value.issues]


def secret_file(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    path.chmod(0o600)
    return path


def test_environment_variables_fill_the_secret_fields() -> None:
    config = parse(
        """
        state:
          database_url: ${LEVERS9_DATABASE_URL}
          redis_url: redis://default:${REDIS_PASSWORD}@redis.internal:6379/0
          secret_key_file: ${CREDENTIALS_DIRECTORY}/secret.key
        listen:
          tls:
            cert_file: ${TLS_DIR}/tls.crt
            key_file: ${TLS_DIR}/tls.key
        """,
        {
            "LEVERS9_DATABASE_URL": DB,
            "REDIS_PASSWORD": "r3d1s-pw",
            "CREDENTIALS_DIRECTORY": "/run/creds/levers9",
            "TLS_DIR": "/etc/levers9",
        },
    )
    state = config.state  # type: ignore[attr-defined]
    assert (state.database_url, state.redis_url) == (DB, REDIS)
    assert state.secret_key_file == "/run/creds/levers9/secret.key"
    tls = config.listen.tls  # type: ignore[attr-defined]
    assert (tls.cert_file, tls.key_file) == ("/etc/levers9/tls.crt", "/etc/levers9/tls.key")


def test_a_double_dollar_is_a_literal_dollar_and_a_lone_one_is_kept() -> None:
    config = parse(
        """
        state:
          database_url: postgresql+psycopg://levers9:pa$$word@db/x?a=$b
        """
    )
    assert config.state.database_url == "postgresql+psycopg://levers9:pa$word@db/x?a=$b"  # type: ignore[attr-defined]


def test_other_fields_are_never_substituted() -> None:
    config = parse(
        """
        data_dir: /srv/${NOT_SUBSTITUTED}
        """,
        {"NOT_SUBSTITUTED": "x"},
    )
    assert config.data_dir == "/srv/${NOT_SUBSTITUTED}"  # type: ignore[attr-defined]


def test_a_missing_variable_names_the_field_the_variable_and_the_line() -> None:
    found = problems(
        """
        version: 1
        state:
          database_url: ${LEVERS9_DATABASE_URL}
          redis_url: redis://${REDIS_HOST:-localhost}/0
        """
    )
    assert found == [
        "levers9.yaml:3: state.database_url: environment variable LEVERS9_DATABASE_URL is not set "
        "(referenced as ${LEVERS9_DATABASE_URL})",
        "levers9.yaml:4: state.redis_url: ${REDIS_HOST:-localhost} is not an environment variable reference: a name "
        "is letters, digits and _; write $$ for a literal $",
    ]


def test_the_file_twins_are_read_with_the_trailing_newline_stripped(tmp_path: Path) -> None:
    db = secret_file(tmp_path, "db", DB + "\n")
    secret_file(tmp_path, "redis", REDIS + "\r\n")
    config = parse(
        f"""
        state:
          database_url_file: {db}
          redis_url_file: ${{CREDENTIALS_DIRECTORY}}/redis
        """,
        {"CREDENTIALS_DIRECTORY": str(tmp_path)},
    )
    state = config.state  # type: ignore[attr-defined]
    assert (state.database_url, state.redis_url) == (DB, REDIS)
    assert (state.database_url_file, state.redis_url_file) == (None, None)  # read: what is used is the value


def test_unreadable_and_empty_files_and_both_forms_are_errors_with_their_lines(tmp_path: Path) -> None:
    empty = secret_file(tmp_path, "empty", "\n")
    locked = secret_file(tmp_path, "locked", DB)
    locked.chmod(0)
    found = problems(
        f"""
        state:
          database_url: {DB}
          database_url_file: {tmp_path / "missing"}
          redis_url_file: {empty}
        """
    )
    assert found == [
        "levers9.yaml:3: state.database_url_file: set either state.database_url or state.database_url_file, not both",
        f"levers9.yaml:4: state.redis_url_file: {empty} is empty",
    ]
    found = problems(f"state:\n  database_url_file: {tmp_path / 'missing'}\n  redis_url_file: {tmp_path}\n")
    assert found == [
        f"levers9.yaml:2: state.database_url_file: cannot read {tmp_path / 'missing'}: no such file",
        f"levers9.yaml:3: state.redis_url_file: cannot read {tmp_path}: it is a directory, not a file",
    ]
    if os.geteuid() != 0:  # root reads a file whatever its mode
        found = problems(f"state:\n  database_url_file: {locked}\n")
        assert found == [
            f"levers9.yaml:2: state.database_url_file: cannot read {locked}: permission denied "
            "(the server's user must be able to)"
        ]


def test_a_bad_value_from_outside_is_reported_at_its_line_without_the_value(tmp_path: Path) -> None:
    wrong = secret_file(tmp_path, "db", "hunter2-not-a-url\n")
    found = problems(
        f"version: 1\nstate:\n  database_url_file: {wrong}\n  redis_url: ${{REDIS_URL}}\n",
        {"REDIS_URL": "http://user:t0p-secret@redis/0"},
    )
    assert len(found) == 2, found
    assert found[0].startswith("levers9.yaml:3: state.database_url_file: the value is not a database URL")
    assert found[0].endswith(f"(read from {wrong})")
    assert found[1].startswith("levers9.yaml:4: state.redis_url: ")
    assert found[1].endswith("(from ${REDIS_URL})")
    for line in found:
        assert "hunter2" not in line, line
        assert "t0p-secret" not in line, line


def test_load_config_takes_the_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text("data_dir: " + str(tmp_path / "data") + "\nstate:\n  database_url: ${L9_TEST_DB}\n")
    monkeypatch.setenv("L9_TEST_DB", f"sqlite:///{tmp_path / 'x.db'}")
    loaded = load_config(path, plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    assert loaded.config.state.database_url == f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.delenv("L9_TEST_DB")
    with pytest.raises(ConfigError, match=r"levers9.yaml:3: state.database_url: environment variable L9_TEST_DB"):
        load_config(path, plugins=load_plugins(PluginPolicy()))
