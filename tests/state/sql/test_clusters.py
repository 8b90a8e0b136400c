"""Attached clusters: their settings (a kubeconfig) are stored encrypted and decrypted only on request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from cryptography.fernet import Fernet

from levers9.state.crypto import SecretBox
from levers9.state.errors import AlreadyExists, DecryptionError, NotFound
from levers9.state.sql.clusters import ClusterStore
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord

KUBECONFIG_TOKEN = "kubeconfig-canary-b81c44d0-bearer-token"
SETTINGS = {"kubeconfig": f"apiVersion: v1\nusers:\n- user:\n    token: {KUBECONFIG_TOKEN}\n", "namespace": "levers9"}

RawStored = Callable[[Database, str], Awaitable[bytes]]


async def test_settings_are_not_stored_in_plaintext(
    db: Database, box: SecretBox, workspace: WorkspaceRecord, raw_stored: RawStored
) -> None:
    await ClusterStore(db, box).create(workspace.id, "canary-cluster-name", "kubernetes", "gpu-pool", SETTINGS)
    stored = await raw_stored(db, "SELECT name, settings_ciphertext FROM clusters")
    assert b"canary-cluster-name" in stored  # the search reads the real data: the name is stored as is
    assert KUBECONFIG_TOKEN.encode() not in stored
    assert b"apiVersion" not in stored


async def test_settings_come_back_only_when_asked(db: Database, box: SecretBox, workspace: WorkspaceRecord) -> None:
    clusters = ClusterStore(db, box)
    cluster = await clusters.create(workspace.id, "onprem", "kubernetes", "a100s", SETTINGS)
    assert cluster.has_settings
    assert KUBECONFIG_TOKEN not in repr(cluster)
    assert await clusters.get(cluster.id) == cluster
    assert await clusters.by_name(workspace.id, "onprem") == cluster
    assert await clusters.settings(cluster.id) == SETTINGS
    bare = await clusters.create(workspace.id, "bare", "kubernetes", "cpu")
    assert not bare.has_settings
    assert await clusters.settings(bare.id) is None
    assert [c.name for c in await clusters.list(workspace.id)] == ["bare", "onprem"]
    cleared = await clusters.set_settings(cluster.id, None)
    assert not cleared.has_settings
    assert await clusters.settings(cluster.id) is None
    assert await clusters.delete(bare.id) is True
    assert await clusters.delete(bare.id) is False
    with pytest.raises(NotFound, match=f"cluster '{bare.id}'"):
        await clusters.settings(bare.id)


async def test_names_keys_and_rotation(db: Database, workspace: WorkspaceRecord) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    clusters = ClusterStore(db, SecretBox([old]))
    cluster = await clusters.create(workspace.id, "onprem", "kubernetes", "a100s", SETTINGS)
    with pytest.raises(AlreadyExists, match="'onprem'"):
        await clusters.create(workspace.id, "onprem", "kubernetes", "a100s")
    with pytest.raises(DecryptionError, match="does not match"):
        await ClusterStore(db, SecretBox([new])).settings(cluster.id)
    rotated = ClusterStore(db, SecretBox([new, old]))
    assert await rotated.reencrypt() == 1
    assert await ClusterStore(db, SecretBox([new])).settings(cluster.id) == SETTINGS
