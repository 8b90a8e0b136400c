"""Volumes through the controlplane: the tokens workers mount them with, and who may reach what with one.

A worker that does not mount the volumes' file system itself (every provider's but ``local``'s: agent
machines behind NAT, attached clusters, cloud machines; :func:`levers9.services.fleet.mounts_volumes_directly`)
mounts each volume a stub names over WebDAV from the controlplane (:mod:`levers9.volumes.webdav`, served at
:data:`DAV_PREFIX`), with ``rclone`` (:mod:`levers9.volumes.rclone`). It never holds the file system's
credentials. What it holds instead is a token per volume, :func:`mint_token`: sealed with the
controlplane's secret key (Fernet: encrypted and authenticated, shared by the replicas), naming the worker,
the workspace and the one volume it opens, and whether it may write.

:class:`DavAccess` answers each WebDAV request: the token must unseal (else 401), name the volume of the
URL (else 403), belong to a worker that is still registered (else 401: a worker's tokens die with it), and
the volume must still exist in that workspace (else 404); a read-only token may only read (else 403).
What it then serves is that volume's directory alone, every path resolved beneath it
(:class:`~levers9.volumes.paths.VolumeRoot`). Answers are cached for :data:`CACHE_S` per token, so a
worker's burst of requests costs one check.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from starlette.requests import Request

from levers9.services.core import Services
from levers9.volumes.paths import VolumeRoot
from levers9.volumes.webdav import DavRefused

__all__ = ["CACHE_S", "DAV_PREFIX", "DavAccess", "VolumeToken", "mint_token"]

#: where the controlplane's HTTP listener serves volumes over WebDAV: ``DAV_PREFIX/<volume id>/<path>``
DAV_PREFIX = "/api/v1/volumes/dav"
#: seconds an accepted token's answer is reused
CACHE_S = 5.0
_CONTEXT = "volume-dav"
_READS = frozenset({"GET", "HEAD", "OPTIONS", "PROPFIND"})


@dataclass(frozen=True)
class VolumeToken:
    worker_id: str
    workspace_id: str
    volume_id: str
    read_only: bool = False


def mint_token(services: Services, token: VolumeToken) -> str:
    """The bearer token that opens ``token.volume_id`` to ``token.worker_id`` while it is registered."""
    payload = {"w": token.worker_id, "ws": token.workspace_id, "v": token.volume_id, "ro": token.read_only}
    return services.box.seal(json.dumps(payload, separators=(",", ":")), context=_CONTEXT).decode()


class DavAccess:
    """The resolver :class:`~levers9.volumes.webdav.WebDav` calls for each request (see the module docstring)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._accepted: dict[str, tuple[float, VolumeToken, VolumeRoot]] = {}

    async def resolve(self, request: Request, volume: str) -> VolumeRoot:
        header = request.headers.get("authorization", "")
        scheme, _, bearer = header.partition(" ")
        if scheme.lower() != "bearer" or not bearer.strip():
            raise DavRefused(401, "a volume's WebDAV needs the bearer token its worker was given")
        bearer = bearer.strip()
        now = time.monotonic()
        hit = self._accepted.get(bearer)
        if hit is not None and hit[0] > now:
            _, token, root = hit
        else:
            token = self._unseal(bearer)
            root = await self._root(token)
            if len(self._accepted) > 10_000:
                self._accepted = {k: v for k, v in self._accepted.items() if v[0] > now}
            self._accepted[bearer] = (now + CACHE_S, token, root)
        if token.volume_id != volume:
            raise DavRefused(403, f"this token opens volume {token.volume_id}, not {volume}")
        if token.read_only and request.method not in _READS:
            raise DavRefused(403, f"this volume is mounted read-only here: {request.method} is refused")
        return root

    def _unseal(self, bearer: str) -> VolumeToken:
        try:
            payload = json.loads(self.services.box.unseal(bearer.encode(), context=_CONTEXT))
            return VolumeToken(payload["w"], payload["ws"], payload["v"], bool(payload["ro"]))
        except Exception:
            raise DavRefused(401, "the bearer token is not a volume token of this controlplane") from None

    async def _root(self, token: VolumeToken) -> VolumeRoot:
        if await self.services.scheduler.workers.get(token.worker_id) is None:
            raise DavRefused(401, f"worker {token.worker_id}, which this token was given to, is gone")
        found = await self.services.volumes.by_ids(token.workspace_id, [token.volume_id])
        record = found.get(token.volume_id)
        if record is None:
            raise DavRefused(404, f"volume {token.volume_id} was deleted")
        return await self.services.volume_files.root(record)
