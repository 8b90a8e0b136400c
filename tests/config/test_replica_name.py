"""``listen.replica_name``: a stable name for the replica, checked where the config is read (issue 36 item 3)."""

from __future__ import annotations

import pytest

from levers9.config.load import ConfigError, parse_config


def test_the_replica_name_is_read_and_a_bad_one_is_refused_at_its_line() -> None:
    config, _ = parse_config("listen:\n  replica_name: cp-1.example\n", "levers9.yaml")
    assert config.listen.replica_name == "cp-1.example"
    assert parse_config("version: 1\n", "levers9.yaml")[0].listen.replica_name is None  # the host name, at start
    with pytest.raises(ConfigError) as info:
        parse_config("version: 1\nlisten:\n  replica_name: cp 1/\n", "levers9.yaml")
    assert [str(i) for i in info.value.issues] == [
        "levers9.yaml:3: listen.replica_name: 'cp 1/' is not a replica name; use letters, digits, '.', '-' and "
        "'_' (at most 63, starting and ending with a letter or digit), e.g. the host name (got 'cp 1/')"
    ]
