"""Who may pull and push which images through the controlplane's registry relay (``/v2/``).

The relay (:mod:`levers9.controlplane.registry_proxy`) asks :func:`identify` who is calling and
:func:`authorize` whether they may do what they ask to a repository; it decides nothing itself.

Credentials are a levers9 token, as HTTP basic (any user name, the token as the password: what
``docker login`` and ``skopeo --creds`` send) or as ``Authorization: Bearer <token>``. A worker's
token (a pool's worker token, or a machine's session credential) must also name the worker it speaks
for: the basic user name, or the ``X-Levers9-Worker`` header; it is checked to belong to that token
exactly as the worker gRPC service checks ``levers9-worker-id`` (:func:`levers9.services.fleet.calling_worker`).

Repositories served are ``<registry.repository_prefix>/<workspace id>/<name>`` only; anything else is
:class:`NameUnknown` (404 ``NAME_UNKNOWN``). Within them:

- a user token of workspace W pulls (reads manifests, blobs and tags) W's repositories, and pushes
  nothing; a user token of no workspace (an operator's) pulls nothing;
- a worker pulls W's repositories while a call of W is placed on it (now, in Redis, from any
  replica; or lately, from this replica's memory of what it sent: see
  :meth:`~levers9.services.dataplane.DataPlane.placed_workspaces`), or when its pool is bound to W;
- a worker pulls W's repositories too while a sandbox of W holds room on it (from before the sandbox's
  container starts: :meth:`~levers9.state.redis.workers.WorkerRegistry.sandbox_workspaces`);
- a worker pushes (uploads blobs, puts manifests) to W's repositories only while a task of W's
  ``build`` stub is placed on it (:meth:`~levers9.services.dataplane.DataPlane.building_workspaces`):
  a build that has ended no longer counts; and to ``<prefix>/W/sandboxes`` alone while a sandbox of W
  holds room on it (an image made of a sandbox's filesystem);
- every other token kind (an agent's) pulls and pushes nothing.

Failures: no token, or one unknown, revoked or expired, is
:class:`~levers9.services.auth.Unauthenticated` (401); a valid token without the right is
:class:`~levers9.services.auth.PermissionDenied` (403), whose message names what is missing.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal

from levers9.hooks.errors import Levers9Error
from levers9.registry.errors import InvalidRefError
from levers9.registry.refs import check_repository
from levers9.services import fleet
from levers9.services.auth import PermissionDenied, Principal, Unauthenticated
from levers9.services.dataplane import DataPlane
from levers9.state.errors import NotFound
from levers9.state.sql.records import TokenKind, root_workspace

__all__ = [
    "PULL",
    "PUSH",
    "WORKER_HEADER",
    "Action",
    "NameUnknown",
    "RegistryCaller",
    "authorize",
    "credentials",
    "identify",
    "repository_workspace",
]

PULL: Literal["pull"] = "pull"
PUSH: Literal["push"] = "push"
Action = Literal["pull", "push"]
#: the header a worker names itself in when it sends its token as a bearer token
WORKER_HEADER = "X-Levers9-Worker"


class NameUnknown(Levers9Error):
    """A repository the relay does not serve (outside ``<prefix>/<workspace id>/``), or not a valid name."""


@dataclass(frozen=True)
class RegistryCaller:
    """Who is calling: the token's principal and, for a worker's token, the worker it was shown to speak for."""

    principal: Principal
    worker: fleet.WorkerIdentity | None = None

    def __str__(self) -> str:
        return f"worker {self.worker.worker_id}" if self.worker is not None else f"a {self.principal.kind.value} token"


def credentials(authorization: str | None) -> tuple[str, str | None]:
    """The user name (empty when none) and token of an ``Authorization`` header, basic or bearer."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return "", value or None
    if scheme.lower() == "basic":
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return "", None
        return (user, password or None) if sep else ("", None)
    return "", None


async def identify(dp: DataPlane, authorization: str | None, worker_header: str | None = None) -> RegistryCaller:
    """The caller behind an ``Authorization`` header (and a worker's name); Unauthenticated or PermissionDenied."""
    user, token = credentials(authorization)
    if token is None:
        raise Unauthenticated(
            "no token: log in with a levers9 token as the password (docker login -u any -p TOKEN, "
            "skopeo --creds any:TOKEN), or send 'Authorization: Bearer <token>'"
        )
    principal = await dp.services.auth.verify(token)
    if principal.kind is TokenKind.USER:
        return RegistryCaller(principal)
    if principal.kind in (TokenKind.WORKER, TokenKind.MACHINE):
        worker_id = (worker_header or "").strip() or user.strip()
        if not worker_id:
            raise PermissionDenied(
                f"a {principal.kind.value} token must name its worker: as the user name of HTTP basic, or in "
                f"the {WORKER_HEADER} header"
            )
        try:
            worker = await fleet.calling_worker(dp.services, principal, worker_id)
        except NotFound:
            raise PermissionDenied(f"worker {worker_id!r} is not registered (it registers again first)") from None
        return RegistryCaller(principal, worker)
    raise PermissionDenied(f"a {principal.kind.value} token pulls and pushes no images; use a user or worker token")


def repository_workspace(prefix: str, repository: str) -> str:
    """The workspace part of ``<prefix>/<workspace id>/<name>`` (lowercase, as refs name it); NameUnknown else."""
    try:
        check_repository(repository)
    except InvalidRefError as exc:
        raise NameUnknown(str(exc)) from None
    head = prefix + "/"
    workspace, slash, name = repository.removeprefix(head).partition("/")
    if not repository.startswith(head) or not workspace or not slash or not name:
        raise NameUnknown(
            f"repository {repository!r} is not served here; this controlplane serves {prefix}/<workspace id>/<name> "
            "only"
        )
    return workspace


async def authorize(dp: DataPlane, caller: RegistryCaller, repository: str, action: Action) -> None:
    """Return when ``caller`` may ``action`` (pull or push) ``repository``; NameUnknown or PermissionDenied else."""
    workspace = repository_workspace(dp.services.config.registry.repository_prefix, repository)
    principal, worker = caller.principal, caller.worker
    if worker is None:
        own = principal.workspace_id
        if own is None:
            raise PermissionDenied(
                "a user token of no workspace (an operator's) pulls no images; use one of the workspace's tokens"
            )
        if action == PUSH:
            raise PermissionDenied(
                f"a user token may not push to {repository}: only the worker building one of "
                "its workspace's blueprints pushes there"
            )
        if own.lower() != workspace:
            raise PermissionDenied(
                f"{repository} is not of this token's workspace; it may pull only "
                f"{dp.services.config.registry.repository_prefix}/{own.lower()}/..."
            )
        return
    reason = await _worker_refusal(dp, worker, workspace, action, repository)
    if reason is not None:
        dp.refuse(worker.worker_id, f"image {action}", [repository], reason)  # a security event, counted
        raise PermissionDenied(f"worker {worker.worker_id} may not {action} {repository}: {reason}")


async def _worker_refusal(
    dp: DataPlane, worker: fleet.WorkerIdentity, workspace: str, action: Action, repository: str
) -> str | None:
    """Why ``worker`` may not ``action`` ``repository``, one of ``workspace``'s; None when it may."""
    bound = worker.spec.workspace
    if bound is not None and bound.lower() != root_workspace(workspace).lower():
        return f"its pool {worker.spec.name} serves another workspace"
    workers = dp.services.scheduler.workers
    if action == PUSH:
        if workspace in {w.lower() for w in await dp.building_workspaces(worker.worker_id)}:
            return None
        sandboxes = f"{dp.services.config.registry.repository_prefix}/{workspace}/sandboxes"
        if repository == sandboxes and workspace in await workers.sandbox_workspaces(worker.worker_id):
            return None  # an image made of one of the workspace's sandboxes running there
        return "no build of that workspace is placed on it, nor a sandbox of it making an image there"
    if bound is not None:
        return None  # its pool is the workspace's own
    if workspace in {w.lower() for w in await dp.placed_workspaces(worker.worker_id)}:
        return None
    if workspace in await workers.sandbox_workspaces(worker.worker_id):
        return None  # a sandbox of the workspace runs there, or is starting from the image
    return "no call or sandbox of that workspace is placed on it"
