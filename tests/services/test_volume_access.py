"""Who may reach a volume over the controlplane's WebDAV: a token opens one volume, for one live worker.

The resolver (levers9.services.volume_access.DavAccess) is called by the WebDAV app with each request;
these tests call it with real requests' scopes against real services (SQLite or PostgreSQL, Redis).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.requests import Request

from levers9.services.core import Services
from levers9.services.volume_access import DavAccess, VolumeToken, mint_token
from levers9.state.redis.workers import WorkerInfo
from levers9.volumes.webdav import DavRefused
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, ONE_POOL_CONFIG, database_url) as opened:
        try:
            yield opened
        finally:
            await opened.volume_files.close()


def _request(method: str, token: str | None) -> Request:
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    return Request({"type": "http", "method": method, "path": "/", "headers": headers, "query_string": b""})


async def _worker(services: Services) -> str:
    spec = services.pools["cpu"]
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    await services.scheduler.register_worker(
        WorkerInfo(id=worker_id, pool="cpu", cpu_millicores=spec.cpu_millicores, memory_mib=spec.memory_mib)
    )
    return worker_id


async def test_a_token_opens_its_one_volume_for_its_live_worker(services: Services) -> None:
    a = await services.workspaces.get_or_create("team-a")
    b = await services.workspaces.get_or_create("team-b")
    weights, _ = await services.volumes.get_or_create(a.id, "weights")
    other, _ = await services.volumes.get_or_create(a.id, "other")
    theirs, _ = await services.volumes.get_or_create(b.id, "weights")
    worker = await _worker(services)
    access = DavAccess(services)
    token = mint_token(services, VolumeToken(worker, a.id, weights.id))
    root = await access.resolve(_request("PUT", token), weights.id)
    assert root.root.endswith(f"{a.id}/{weights.id}")
    # the same token for another volume of the workspace, or another workspace's: refused
    for volume in (other.id, theirs.id):
        with pytest.raises(DavRefused) as refused:
            await access.resolve(_request("GET", token), volume)
        assert refused.value.status == 403
    # a token naming another workspace's volume as if it were this one's finds nothing
    forged = mint_token(services, VolumeToken(worker, a.id, theirs.id))
    with pytest.raises(DavRefused) as refused:
        await DavAccess(services).resolve(_request("GET", forged), theirs.id)
    assert refused.value.status == 404
    # no token, a token of another key, a user's API token: 401
    user_token = (await services.tokens.issue("user", subject="x"))[1]
    for bad in (None, "nonsense", user_token, token[:-4] + "AAAA"):
        with pytest.raises(DavRefused) as refused:
            await DavAccess(services).resolve(_request("GET", bad), weights.id)
        assert refused.value.status == 401


async def test_a_read_only_token_reads_and_a_gone_worker_or_volume_closes_it(services: Services) -> None:
    a = await services.workspaces.get_or_create("team-a")
    weights, _ = await services.volumes.get_or_create(a.id, "weights")
    worker = await _worker(services)
    read_only = mint_token(services, VolumeToken(worker, a.id, weights.id, read_only=True))
    access = DavAccess(services)
    for method in ("GET", "HEAD", "PROPFIND", "OPTIONS"):
        await access.resolve(_request(method, read_only), weights.id)
    for method in ("PUT", "DELETE", "MKCOL", "MOVE", "COPY"):
        with pytest.raises(DavRefused) as refused:
            await access.resolve(_request(method, read_only), weights.id)
        assert refused.value.status == 403
    token = mint_token(services, VolumeToken(worker, a.id, weights.id))
    await services.scheduler.remove_worker(worker, "test: the worker is gone", force=True)
    with pytest.raises(DavRefused) as refused:
        await DavAccess(services).resolve(_request("GET", token), weights.id)
    assert refused.value.status == 401
    assert "is gone" in refused.value.message
    other_worker = await _worker(services)
    token = mint_token(services, VolumeToken(other_worker, a.id, weights.id))
    await services.volumes.delete(a.id, "weights")
    with pytest.raises(DavRefused) as refused:
        await DavAccess(services).resolve(_request("GET", token), weights.id)
    assert refused.value.status == 404
