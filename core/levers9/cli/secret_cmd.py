"""``levers9 secret create``, ``list`` and ``delete``: the workspace's secrets, through the ControlPlane service.

A value never travels on the command line (where ``ps`` and shell histories
would show it) and is never printed: ``create`` reads it from stdin, hidden when
stdin is a terminal, or from an environment variable named with ``--from-env``;
``list`` shows names and times only, because the controlplane never answers a
value to anyone but the worker that runs a function naming it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import typer

from levers9.cli.client_cmds import UNARY_TIMEOUT_S, Metadata, call, context_option, when
from levers9.cli.output import Col, err, iso, out, print_json, print_table

if TYPE_CHECKING:
    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub

__all__ = ["app"]

app = typer.Typer(
    help="Workspace secrets: functions naming one in secrets=[...] see it as an environment variable.",
    no_args_is_help=True,
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


def _check_name(name: str) -> None:
    from levers9.state.sql.secrets import check_secret_name

    try:
        check_secret_name(name)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _read_value(name: str, from_env: str | None) -> str:
    """The value from ``$from_env``, a hidden prompt on a terminal, or all of stdin (one final newline dropped)."""
    if from_env is not None:
        value = os.environ.get(from_env)
        if value is None:
            raise _fail(f"--from-env {from_env}: no such environment variable is set")
        return value
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"value of {name} (not shown): ")
    data = sys.stdin.read()
    # `echo value | levers9 secret create` ends the value with a newline nobody meant as part of it
    if data.endswith("\r\n"):
        return data[:-2]
    return data.removesuffix("\n")


@app.command("create")
def create(
    name: str = typer.Argument(..., metavar="NAME", help="An environment variable's name, e.g. OPENAI_API_KEY."),
    from_env: str | None = typer.Option(
        None, "--from-env", metavar="VAR", help="Take the value from this environment variable instead of stdin."
    ),
    context: str | None = context_option(),
) -> None:
    """Create a secret, or replace its value: read from stdin (hidden at a terminal) or --from-env VAR."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    _check_name(name)
    value = _read_value(name, from_env)
    if not value:
        raise _fail("the value is empty; pipe it on stdin or name a variable that holds it with --from-env")

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.SecretInfo:
        info: pb.SecretInfo = await stub.PutSecret(
            pb.PutSecretRequest(name=name, value=value), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return info

    info = call(context, action)
    verb = "created" if info.created_at == info.updated_at else "updated"
    out.print(f"{verb} secret {info.name}", markup=False, highlight=False)


@app.command("list")
def list_(
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per secret (name and times)."),
) -> None:
    """List the workspace's secrets: names and times, never values."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.SecretInfo]:
        response: pb.ListSecretsResponse = await stub.ListSecrets(
            pb.ListSecretsRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.secrets)

    found = call(context, action)
    if as_json:
        print_json([{"name": s.name, "created_at": iso(s.created_at), "updated_at": iso(s.updated_at)} for s in found])
        return
    if not found:
        err.print("no secrets in this workspace (create one with `levers9 secret create NAME`)", markup=False)
        return
    now = time.time()
    print_table(
        [Col("name"), Col("created"), Col("updated")],
        ([s.name, when(s.created_at, now), when(s.updated_at, now)] for s in found),
    )


@app.command("delete")
def delete(
    name: str = typer.Argument(..., metavar="NAME", help="The secret's name."),
    context: str | None = context_option(),
) -> None:
    """Delete a secret. Functions started afterwards no longer get it (running containers keep their copy)."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> None:
        await stub.DeleteSecret(pb.DeleteSecretRequest(name=name), metadata=metadata, timeout=UNARY_TIMEOUT_S)

    call(context, action)
    out.print(f"deleted secret {name}", markup=False, highlight=False)
