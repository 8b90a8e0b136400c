"""The ``auth`` section: the dashboard's address, an OpenID Connect issuer and one-time links' lifetime.

Each bad value is a problem naming its field and line; the client secret may come from the environment or from
a file, like the database URL, and is never shown in a problem or in the model's repr.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from levers9.config.load import ConfigError, parse_config
from levers9.config.model import AuthConfig, Config


def parse(text: str, environ: dict[str, str] | None = None) -> Config:
    config, _ = parse_config(textwrap.dedent(text).lstrip("\n"), "levers9.yaml", environ=environ or {})
    assert isinstance(config, Config)
    return config


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, environ)
    return [str(issue) for issue in info.value.issues]


def test_defaults_need_nothing_configured() -> None:
    auth = parse("version: 1\n").auth
    assert auth == AuthConfig()
    assert (auth.public_url, auth.oidc, auth.link_ttl_s) == (None, None, 900)


def test_an_issuer_with_a_secret_from_the_environment() -> None:
    auth = parse(
        """
        auth:
          public_url: https://levers9.example.com/
          link_ttl_s: 600
          oidc:
            issuer: https://accounts.example.com/
            client_id: levers9
            client_secret: ${OIDC_SECRET}
            name: Example
        """,
        {"OIDC_SECRET": "s3cr3t-value"},
    ).auth
    assert auth.public_url == "https://levers9.example.com"
    assert auth.link_ttl_s == 600
    assert auth.oidc is not None
    assert (auth.oidc.issuer, auth.oidc.client_id, auth.oidc.client_secret) == (
        "https://accounts.example.com",
        "levers9",
        "s3cr3t-value",
    )
    assert auth.oidc.scopes == "openid email profile"
    assert auth.oidc.display_name == "Example"
    assert "s3cr3t-value" not in repr(auth)


def test_the_secret_from_a_file_and_the_buttons_default_name(tmp_path: Path) -> None:
    secret = tmp_path / "oidc-secret"
    secret.write_text("from-a-file\n")
    auth = parse(
        f"""
        auth:
          oidc:
            issuer: https://login.example.org
            client_id: levers9
            client_secret_file: {secret}
        """
    ).auth
    assert auth.oidc is not None
    assert auth.oidc.client_secret == "from-a-file"
    assert auth.oidc.display_name == "login.example.org"


def test_a_missing_secret_file_and_variable_name_the_field() -> None:
    [missing_file] = problems(
        """
        auth:
          oidc:
            issuer: https://a.example.com
            client_id: x
            client_secret_file: /nonexistent/levers9-oidc
        """
    )
    assert missing_file.startswith("levers9.yaml:5: auth.oidc.client_secret_file: cannot read")
    [unset] = problems(
        """
        auth:
          oidc:
            issuer: https://a.example.com
            client_id: x
            client_secret: ${NOT_SET_HERE}
        """
    )
    assert "auth.oidc.client_secret: environment variable NOT_SET_HERE is not set" in unset


def test_bad_values_name_their_field_and_line() -> None:
    found = problems(
        """
        auth:
          public_url: http://levers9.example.com
          link_ttl_s: 0
          oidc:
            issuer: ftp://a.example.com
            client_id: ""
            scopes: openid profile
        """
    )
    expected = [
        "levers9.yaml:2: auth.public_url: 'http://levers9.example.com' is plain http",
        "levers9.yaml:3: auth.link_ttl_s: Input should be greater than 0",
        "levers9.yaml:5: auth.oidc.issuer: 'ftp://a.example.com' is not an OpenID Connect issuer URL",
        "levers9.yaml:6: auth.oidc.client_id: String should have at least 1 character",
        "levers9.yaml:7: auth.oidc.scopes: 'openid profile' lacks email",
    ]
    assert len(found) == len(expected), found
    for start in expected:
        assert [line for line in found if line.startswith(start)], (start, found)


def test_plain_http_is_for_loopback_only() -> None:
    auth = parse(
        """
        auth:
          public_url: http://127.0.0.1:1994
          oidc: {issuer: "http://localhost:8080", client_id: x}
        """
    ).auth
    assert auth.public_url == "http://127.0.0.1:1994"
    assert auth.oidc is not None
    assert auth.oidc.issuer == "http://localhost:8080"


def test_unknown_keys_list_the_accepted_ones() -> None:
    [found] = problems("auth:\n  oidc:\n    issuer: https://a.example.com\n    client_id: x\n    secret: y\n")
    assert "auth.oidc.secret: unknown field 'secret'" in found
    assert "client_secret" in found
