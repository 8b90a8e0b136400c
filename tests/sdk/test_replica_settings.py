"""Address lists, the context fields of replicas (ca_file, reconnect_s), and refusing an untrusted controlplane."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from typer.testing import CliRunner

from levers9.cli.main import app
from levers9.proto.target import TargetError, parse_targets
from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from levers9.sdk.client import Client
from levers9.sdk.context import Context, ContextError, current_context, load_contexts
from levers9.sdk.errors import ControlPlaneError
from levers9.worker.session import options_from_env
from tests.fixtures.tls import TestCA


@pytest.fixture(autouse=True)
def _no_context_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("LEVERS9_CONTEXT", "LEVERS9_TOKEN", "LEVERS9_GRPC", "LEVERS9_CA_FILE", "LEVERS9_RECONNECT_S"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path / "home"))


# --- the list parser --------------------------------------------------------------------------------


def test_parse_targets_reads_a_comma_list_in_order() -> None:
    assert parse_targets("grpc://a:1, b:2 ,c:3") == (["a:1", "b:2", "c:3"], False)
    assert parse_targets("grpcs://a, grpcs://b:8443") == (["a:443", "b:8443"], True)
    assert parse_targets(["grpcs://a:1", "https://b:2"]) == (["a:1", "b:2"], True)
    assert parse_targets("dns:///cp.internal:1993") == (["dns:///cp.internal:1993"], False)


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        ("a:1,b:2,grpc://a:1", "'grpc://a:1' is listed twice (as a:1)"),
        ("grpcs://a:1,grpc://b:2", "'grpc://b:2' is plain text but 'grpcs://a:1' is TLS"),
        ("a:1,,b:2", "address 2 of 3 is empty"),
        ("a:1,", "address 2 of 2 is empty"),
        ("", "address 1 of 1 is empty"),
    ],
)
def test_parse_targets_refuses_what_cannot_be_dialled(addresses: str, message: str) -> None:
    with pytest.raises(TargetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_targets(addresses)


# --- the context fields -----------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "home" / "config"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_yaml_list_of_replicas_is_read_and_written_back_as_a_list(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        current: ha
        contexts:
          ha:
            grpc: [grpcs://a:1993, grpcs://b:1993]
            token: t
            ca_file: /etc/levers9/ca.pem
            reconnect_s: 30
          one:
            grpc: "a:1, b:2"
        """,
    )
    ctx = current_context()
    assert (ctx.addresses, ctx.ca_file, ctx.reconnect_s) == (
        ["grpcs://a:1993", "grpcs://b:1993"],
        "/etc/levers9/ca.pem",
        30,
    )
    assert load_contexts().get("one").addresses == ["a:1", "b:2"]
    runner = CliRunner()
    assert runner.invoke(app, ["context", "use", "one"]).exit_code == 0  # rewrites the file
    written = yaml.safe_load(path.read_text())["contexts"]
    assert written["ha"]["grpc"] == ["grpcs://a:1993", "grpcs://b:1993"]
    assert written["ha"]["reconnect_s"] == 30
    assert written["one"]["grpc"] == "a:1, b:2"
    assert "reconnect_s" not in written["one"]  # the default is not written


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("grpc: a:1\n    reconnect_s: 0", "contexts.dev.reconnect_s: expected a number of seconds above 0, got 0"),
        ("grpc: a:1\n    reconnect_s: soon", "contexts.dev.reconnect_s: expected a number of seconds above 0, got str"),
        ("grpc: [a:1, grpcs://b:2]", "contexts.dev.grpc: 'grpcs://b:2' is TLS but 'a:1' is plain text"),
        ("grpc: a:1, a:1", "contexts.dev.grpc: 'a:1' is listed twice"),
        ("grpc: [a:1, 7]", "contexts.dev.grpc: expected addresses (strings)"),
        ("grpc: a:1\n    ca_file: 7", "contexts.dev.ca_file: expected a string"),
    ],
)
def test_bad_replica_fields_name_the_file_and_key(tmp_path: Path, entry: str, message: str) -> None:
    path = _write(tmp_path, f"contexts:\n  dev:\n    {entry}\n")
    with pytest.raises(ContextError) as caught:
        load_contexts()
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_environment_overrides_the_replica_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEVERS9_GRPC", " a:1 , b:2 ")
    monkeypatch.setenv("LEVERS9_CA_FILE", "/ca.pem")
    monkeypatch.setenv("LEVERS9_RECONNECT_S", "2.5")
    ctx = current_context()
    assert (ctx.addresses, ctx.ca_file, ctx.reconnect_s) == (["a:1", "b:2"], "/ca.pem", 2.5)
    monkeypatch.setenv("LEVERS9_RECONNECT_S", "-1")
    with pytest.raises(ContextError, match=r"\$LEVERS9_RECONNECT_S: expected a number of seconds above 0, got -1"):
        current_context()
    monkeypatch.setenv("LEVERS9_RECONNECT_S", "1")
    monkeypatch.setenv("LEVERS9_GRPC", "a:1,a:1")
    with pytest.raises(ContextError, match=r"\$LEVERS9_GRPC: 'a:1' is listed twice"):
        current_context()


def test_context_add_takes_replicas_a_ca_file_and_reconnect_s(tmp_path: Path) -> None:
    runner = CliRunner()
    ca = tmp_path / "ca.pem"
    done = runner.invoke(
        app,
        [
            "context",
            "add",
            "ha",
            "--grpc",
            "grpcs://a:1,grpcs://b:2",
            "--token",
            "t",
            "--ca-file",
            str(ca),
            "--reconnect-s",
            "15",
        ],
    )
    assert done.exit_code == 0, done.output
    ctx = current_context()
    assert (ctx.addresses, ctx.ca_file, ctx.reconnect_s) == (["grpcs://a:1", "grpcs://b:2"], str(ca), 15)
    refused = runner.invoke(app, ["context", "add", "x", "--grpc", "a:1", "--token", "t", "--reconnect-s", "0"])
    assert refused.exit_code == 1
    assert "reconnect_s: expected a number of seconds above 0, got 0" in refused.output
    mixed = runner.invoke(app, ["context", "add", "y", "--grpc", "a:1,grpcs://b:2", "--token", "t"])
    assert mixed.exit_code == 1
    assert "'grpcs://b:2' is TLS but 'a:1' is plain text" in mixed.output


# --- the worker's address list and CA ---------------------------------------------------------------


def test_the_worker_reads_its_controlplane_ca(tmp_path: Path) -> None:
    ca = TestCA().write(tmp_path / "ca.pem")
    env = {"LEVERS9_CONTROLPLANE_URL": "grpcs://a:1,grpcs://b:2", "LEVERS9_CONTROLPLANE_CA_FILE": str(ca)}
    values = options_from_env(env)
    assert values["controlplane"] == "grpcs://a:1,grpcs://b:2"
    assert values["controlplane_ca"] == ca.read_text()
    assert options_from_env({"LEVERS9_CONTROLPLANE_CA": "PEM"})["controlplane_ca"] == "PEM"
    with pytest.raises(ValueError, match="LEVERS9_CONTROLPLANE_CA_FILE: cannot read the CA bundle"):
        options_from_env({"LEVERS9_CONTROLPLANE_CA_FILE": str(tmp_path / "missing.pem")})


# --- trusting the controlplane's certificate ----------------------------------------------------------


class _WhoAmI(controlplane_pb2_grpc.ControlPlaneServicer):
    async def WhoAmI(self, request: controlplane_pb2.WhoAmIRequest, context: Any) -> controlplane_pb2.WhoAmIResponse:
        return controlplane_pb2.WhoAmIResponse(workspace_name="w")


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, Path]]:
    """A gRPC server whose certificate a fresh CA signed; yields its port and the CA's PEM file."""
    ca = TestCA()
    issued = ca.issue()
    server = grpc.aio.server()
    add: Any = controlplane_pb2_grpc.add_ControlPlaneServicer_to_server  # generated, unannotated
    add(_WhoAmI(), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(issued.key_pem, issued.cert_pem)]))
    await server.start()
    try:
        yield port, ca.write(tmp_path / "ca.pem")
    finally:
        await server.stop(None)


def _call_who_am_i(ctx: Context) -> str:
    client = Client(ctx)

    async def ask() -> str:
        response = await client.stub.WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=client.metadata)
        return str(response.workspace_name)

    try:
        return client.run(ask(), timeout=60)
    finally:
        client.close()


async def test_an_untrusted_certificate_is_refused_naming_ca_file(tls_server: tuple[int, Path]) -> None:
    import asyncio

    port, ca_file = tls_server
    ctx = Context(name="team", grpc=f"grpcs://127.0.0.1:{port}", token="t", reconnect_s=30)
    with pytest.raises(ControlPlaneError) as caught:
        await asyncio.to_thread(_call_who_am_i, ctx)
    message = str(caught.value)
    assert f"the controlplane's certificate at 127.0.0.1:{port} was not trusted" in message
    assert "ca_file" in message
    assert "$LEVERS9_CA_FILE" in message
    trusted = Context(name="team", grpc=f"grpcs://127.0.0.1:{port}", token="t", ca_file=str(ca_file))
    assert await asyncio.to_thread(_call_who_am_i, trusted) == "w"
