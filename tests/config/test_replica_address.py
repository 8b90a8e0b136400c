"""Where the other replicas reach this one: listen.replica_address, $LEVERS9_REPLICA_ADDRESS, or derived."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from levers9.config.model import ListenConfig
from levers9.controlplane.server import Listeners


@pytest.mark.parametrize("value", ["10.0.0.5:1993", "[fd00::5]:1993", "replica-a.internal:1993"])
def test_a_host_and_port_is_accepted(value: str) -> None:
    assert ListenConfig(replica_address=value).replica_address == value


@pytest.mark.parametrize(
    "value", ["10.0.0.5", "fd00::5:1993", "grpc://10.0.0.5:1993", "10.0.0.5:0", "10.0.0.5:70000", ":1993"]
)
def test_anything_else_is_refused_naming_the_field_and_the_accepted_form(value: str) -> None:
    with pytest.raises(ValidationError, match=r"listen\.replica_address .* accepted: HOST:PORT"):
        ListenConfig(replica_address=value)


def test_the_setting_then_the_variable_then_the_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEVERS9_REPLICA_ADDRESS", raising=False)
    assert Listeners("10.0.0.7", 1993, 1994, 9090).relay_address() == "10.0.0.7:1993"
    assert Listeners("::", 1993, 1994, 9090).relay_address() == f"{socket.getfqdn()}:1993"
    assert Listeners("fd00::7", 1993, 1994, 9090).relay_address() == "[fd00::7]:1993"
    monkeypatch.setenv("LEVERS9_REPLICA_ADDRESS", "10.0.0.8:2001")
    assert Listeners("0.0.0.0", 1993, 1994, 9090).relay_address() == "10.0.0.8:2001"
    configured = Listeners("0.0.0.0", 1993, 1994, 9090, replica_address="10.0.0.9:2002")
    assert configured.relay_address() == "10.0.0.9:2002"
    monkeypatch.setenv("LEVERS9_REPLICA_ADDRESS", "http://10.0.0.8")
    with pytest.raises(ValueError, match=r"\$LEVERS9_REPLICA_ADDRESS 'http://10\.0\.0\.8' is not an address"):
        Listeners("0.0.0.0", 1993, 1994, 9090).relay_address()
