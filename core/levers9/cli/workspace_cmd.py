"""``levers9 workspace`` and ``levers9 environment``: workspaces, their members and roles, and environments.

Every command talks to the controlplane's REST API with the current context
(``-c NAME``; ``-e NAME`` for the environment), so what it may do is what the
context's token may: viewers list, owners invite, remove and manage
environments (docs/workspaces.md). Errors are one line, the server's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from levers9.cli.client_cmds import context_option
from levers9.cli.output import Col, failed, out, print_json, print_table

__all__ = ["environment_app", "workspace_app"]

workspace_app = typer.Typer(help="Workspaces, their members and roles.", no_args_is_help=True)
environment_app = typer.Typer(
    help="Environments of the workspace (main, staging, ...): each keeps its own apps, deployments, secrets, "
    "volumes and tokens.",
    no_args_is_help=True,
)
ROLES = ("viewer", "member", "owner")


@contextmanager
def _api(context: str | None) -> Iterator[Any]:
    from levers9.cli.rest_client import RestFailed, rest

    try:
        client = rest(context)
    except RestFailed as exc:
        raise failed(str(exc)) from None
    try:
        yield client
    except RestFailed as exc:
        raise failed(str(exc)) from None
    finally:
        client.close()


def _role(value: str) -> str:
    if value not in ROLES:
        raise failed(f"--role {value!r}: expected one of {', '.join(ROLES)}", 2)
    return value


def _show(
    rows: list[dict[str, Any]], as_json: bool, columns: list[tuple[str, Callable[[dict[str, Any]], str]]]
) -> None:
    if as_json:
        print_json(rows)
        return
    print_table([Col(name) for name, _ in columns], ([cell(row) for _, cell in columns] for row in rows))


@workspace_app.command("list")
def workspace_list(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."), context: str | None = context_option()
) -> None:
    """The workspaces you are a member of (an operator: every workspace)."""
    with _api(context) as api:
        rows = api.get("/workspaces")
    _show(
        rows,
        as_json,
        [
            ("name", lambda r: r["name"]),
            ("id", lambda r: r["id"]),
            ("join domain", lambda r: r.get("join_domain") or "-"),
        ],
    )


@workspace_app.command("create")
def workspace_create(
    name: str = typer.Argument(..., help="The new workspace's name."), context: str | None = context_option()
) -> None:
    """Create a workspace; you become its owner."""
    with _api(context) as api:
        made = api.post("/workspaces", {"name": name})
    out.print(f"created workspace {made['name']} ({made['id']})", markup=False, highlight=False)


@workspace_app.command("members")
def workspace_members(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."), context: str | None = context_option()
) -> None:
    """The members of the context's workspace and their roles."""
    with _api(context) as api:
        rows = api.get("/members")
    _show(
        rows, as_json, [("email", lambda r: r["email"]), ("role", lambda r: r["role"]), ("name", lambda r: r["name"])]
    )


@workspace_app.command("invite")
def workspace_invite(
    email: str = typer.Argument(..., help="Their email: they sign in with it (the dashboard, `levers9 login`)."),
    role: str = typer.Option("member", "--role", help="viewer (reads), member (runs and deploys) or owner."),
    context: str | None = context_option(),
) -> None:
    """Invite someone to the workspace, or change their role (owners only)."""
    with _api(context) as api:
        member = api.put(f"/members/{email}", {"role": _role(role)})
    out.print(f"{member['email']} is a {member['role']} of the workspace", markup=False, highlight=False)


@workspace_app.command("remove")
def workspace_remove(
    email: str = typer.Argument(..., help="The member's email."), context: str | None = context_option()
) -> None:
    """Remove someone from the workspace; every token they hold in it is revoked (owners only)."""
    with _api(context) as api:
        api.delete(f"/members/{email}")
    out.print(f"removed {email}; their tokens in this workspace are revoked", markup=False, highlight=False)


@workspace_app.command("join-domain")
def workspace_join_domain(
    domain: str | None = typer.Argument(None, help="An email domain such as example.com; omitted: invitations only."),
    role: str = typer.Option("member", "--role", help="The role people joining this way get: viewer or member."),
    context: str | None = context_option(),
) -> None:
    """Let everyone whose verified email is at DOMAIN join when they sign in (owners only)."""
    with _api(context) as api:
        updated = api.put("/workspace/join", {"domain": domain, "role": _role(role)})
    if updated.get("join_domain"):
        message = f"people at {updated['join_domain']} may join as {updated['join_role']}s"
    else:
        message = "people join by invitation only"
    out.print(message, markup=False, highlight=False)


@environment_app.command("list")
def environment_list(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."), context: str | None = context_option()
) -> None:
    """The workspace's environments, main first."""
    with _api(context) as api:
        rows = api.get("/environments")
    _show(
        rows,
        as_json,
        [("name", lambda r: r["name"]), ("id", lambda r: r["id"]), ("created", lambda r: r["created_at"])],
    )


@environment_app.command("create")
def environment_create(
    name: str = typer.Argument(..., help="1-32 letters, digits, '-' or '_'."), context: str | None = context_option()
) -> None:
    """Create an environment (owners only); act in it with `levers9 -e NAME ...`."""
    with _api(context) as api:
        made = api.post("/environments", {"name": name})
    out.print(
        f"created environment {made['name']}; use it with `levers9 -e {made['name']} ...`",
        markup=False,
        highlight=False,
    )


@environment_app.command("delete")
def environment_delete(
    name: str = typer.Argument(..., help="The environment."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    context: str | None = context_option(),
) -> None:
    """Delete an environment with its apps, secrets and tokens (owners only; refused while anything runs in it)."""
    if not yes and not typer.confirm(f"delete environment {name} with its apps, secrets and tokens?"):
        raise failed("not deleted", 1)
    with _api(context) as api:
        api.delete(f"/environments/{name}")
    out.print(f"deleted environment {name}", markup=False, highlight=False)
