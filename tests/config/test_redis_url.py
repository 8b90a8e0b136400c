"""``state.redis_url``: every accepted form read right, every other refused naming the field and the forms."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from levers9.config.load import ConfigError, load_config
from levers9.config.redis_url import FORMS, RedisTarget, RedisUrlError, parse, redact
from levers9.hooks.manager import PluginPolicy, load_plugins


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("redis://h", dict(scheme="redis", db=0, sentinels=(), tls=False)),
        ("redis://:pw@h:6380/2", dict(db=2, username=None, password="pw")),
        ("redis://alice:s%40cret@h/0", dict(username="alice", password="s@cret")),
        ("rediss://h/1?ca_file=/ca.pem", dict(tls=True, db=1, options={"ca_file": "/ca.pem"})),
        ("unix:///run/redis.sock?db=3", dict(scheme="unix", db=3)),
        (
            "redis+sentinel://a:1,b,[::1]:3/main",
            dict(sentinels=(("a", 1), ("b", 26379), ("::1", 3)), service="main", db=0, tls=False),
        ),
        (
            "rediss+sentinel://u:p@a:26379/main/4?ca_file=/c&cert_file=/x&key_file=/k&sentinel_auth=yes",
            dict(service="main", db=4, tls=True, username="u", password="p", sentinel_auth=True),
        ),
    ],
)
def test_accepted_forms(url: str, want: dict[str, object]) -> None:
    target = parse(url)
    assert isinstance(target, RedisTarget)
    for name, value in want.items():
        assert getattr(target, name) == value, name


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h", "scheme http: is not one of"),
        ("h:6379", "scheme (none)"),
        ("redis://", "no host"),
        ("redis://h/x", "'x' is not a number"),
        ("redis://h:70000", "out of range"),
        ("redis://a,b/0", "several hosts need Sentinel"),
        ("redis+sentinel://a,b", "no service name"),
        ("redis+sentinel://a/main/1/2", "/SERVICE or /SERVICE/DB"),
        ("redis://h?ca_file=/c", "need TLS"),
        ("rediss://h?cert_file=/c", "cert_file and key_file go together"),
        ("redis://h?timeout=1", "unknown option 'timeout'"),
        ("redis://h?sentinel_auth=yes", "belongs to redis+sentinel"),
        ("redis+sentinel://h/m?sentinel_auth=maybe", "sentinel_auth is yes or no"),
        ("unix://run/redis.sock", "must be absolute"),
        ("redis://secretword@h", "USER:PASSWORD or :PASSWORD"),
    ],
)
def test_refused_forms_say_why_and_what_is_accepted(url: str, why: str) -> None:
    with pytest.raises(RedisUrlError) as info:
        parse(url)
    assert why in str(info.value)
    assert FORMS in str(info.value)


def test_no_password_is_ever_shown() -> None:
    assert redact("redis://alice:hunter2@h:6379/0") == "redis://alice:***@h:6379/0"
    assert redact("redis+sentinel://:hunter2@a:1,b:2/main") == "redis+sentinel://:***@a:1,b:2/main"
    assert redact("redis://h/0") == "redis://h/0"
    with pytest.raises(RedisUrlError) as info:
        parse("redis+sentinel://:hunter2@a:1,b:2")
    assert "hunter2" not in str(info.value)
    assert ":***@a:1,b:2" in str(info.value)


def test_a_bad_url_in_the_config_names_the_field_and_the_forms_without_the_password(tmp_path: Path) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text(
        textwrap.dedent("""\
        state:
          redis_url: redis+sentinel://:hunter2@s1:26379,s2:26379
        """)
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, plugins=load_plugins(PluginPolicy()))
    [issue] = info.value.issues
    text = str(issue)
    assert issue.path == "state.redis_url"
    assert "no service name" in text
    assert FORMS in text
    assert "hunter2" not in text


def test_a_sentinel_url_in_the_config_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text("state:\n  redis_url: redis+sentinel://s1:26379,s2:26379,s3:26379/levers9\n")
    loaded = load_config(path, plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    assert loaded.config.state.redis_url == "redis+sentinel://s1:26379,s2:26379,s3:26379/levers9"
