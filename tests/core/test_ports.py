"""levers9's servers pick ports in a range of their own, below the kernel's ephemeral range; the tests pick below it."""

from __future__ import annotations

import socket

import pytest

from levers9 import ports
from tests.fixtures.ports import free_port


def test_the_picked_range_ends_where_the_ephemeral_range_starts() -> None:
    picked = ports.picked_range()
    assert picked.stop == ports.ephemeral_low()
    assert len(picked) == min(ports.SPAN, ports.ephemeral_low() - 1024)


def test_a_pick_binds_and_avoids_what_is_taken() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", ports.pick()))
        taken_port = held.getsockname()[1]
        for _ in range(50):
            port = ports.pick(taken={taken_port})
            assert port in ports.picked_range()
            assert port != taken_port


def test_a_full_range_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "bindable", lambda port, host="0.0.0.0": False)
    with pytest.raises(OSError, match=r"no free TCP port in \d+-\d+ on 0.0.0.0 after 200 tries"):
        ports.pick()


def test_the_tests_pick_below_levers9s_own_range() -> None:
    assert all(10_000 <= free_port() < ports.picked_range().start for _ in range(50))


def test_the_tests_never_get_a_port_twice_and_xdist_workers_pick_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three picks in a row for one `levers9 up` once met (CI at stop 50); two workers' picks could too."""
    from tests.fixtures import ports as test_ports

    picks = [free_port() for _ in range(300)]
    assert len(set(picks)) == len(picks)
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        slices.append(set(test_ports._slice()))
    assert sum(len(s) for s in slices) == len(set().union(*slices))  # disjoint
    assert set().union(*slices) == set(range(10_000, ports.picked_range().start))
