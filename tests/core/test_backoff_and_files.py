"""The shared back-off and atomic write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from levers9.backoff import Backoff, delay_s
from levers9.files import write_atomic


def test_delay_doubles_from_the_first_failure_up_to_the_cap() -> None:
    waits = [delay_s(n, initial_s=0.5, cap_s=30.0) for n in range(0, 10)]
    assert waits == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert delay_s(10_000, initial_s=0.5, cap_s=30.0) == 30.0  # no overflow


def test_backoff_counts_failures_resets_and_jitters_within_half_either_side() -> None:
    b = Backoff(initial_s=1.0, cap_s=4.0)
    assert [b.next_s() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    b.reset()
    assert b.next_s() == 1.0
    j = Backoff(initial_s=2.0, cap_s=2.0, jitter=True)
    waits = [j.next_s() for _ in range(200)]
    assert all(1.0 <= w < 3.0 for w in waits)
    assert len(set(waits)) > 1
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s=5.0, cap_s=1.0)


def test_write_atomic_replaces_whole_with_the_mode_asked_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "token"
    target.write_text("old")
    write_atomic(target, "new secret", mode=0o600, durable=True)
    assert target.read_text() == "new secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_atomic(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["token"]


def test_write_atomic_into_a_missing_directory_raises_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", "x")
    assert list(tmp_path.iterdir()) == []
