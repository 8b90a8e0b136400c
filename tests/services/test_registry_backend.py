"""The registry behind the controlplane's relay (levers9.services.registry_backend), with real registries.

The embedded one is Debian's ``docker-registry`` started by the backend itself; the configured ones are
``docker-registry`` processes of the registry fixture, one demanding HTTP basic (an htpasswd file) and
one the bearer-token flow (a token service of tests/registry/test_token_auth.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from levers9.config.model import RegistryConfig
from levers9.services.registry_backend import EMBEDDED_USER, RegistryBackend, RegistryUnavailable
from tests.fixtures.registry import Registry, htpasswd_file
from tests.fixtures.tls import TestCA
from tests.registry.test_token_auth import ISSUER, PASSWORD, SERVICE, USER, TokenService, token_service  # noqa: F401

DEADLINE_S = 30.0


def path_without(binary: str, where: Path) -> str:
    """A PATH on which every program of this one is found except ``binary`` (links in ``where``)."""
    where.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            link = where / entry.name
            if entry.name != binary and not link.exists():
                link.symlink_to(entry)
    return str(where)


@pytest.fixture
def no_registry_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's PATH finds every program but ``docker-registry`` (restored after the test)."""
    monkeypatch.setenv("PATH", path_without("docker-registry", tmp_path / "bin"))


async def test_the_embedded_registry_demands_a_credential_only_its_controlplane_holds(tmp_path: Path) -> None:
    backend = RegistryBackend(RegistryConfig(), tmp_path / "data")
    try:
        url = await backend.ready()  # started on first use
        assert url.startswith("http://127.0.0.1:")
        assert backend.embedded is not None
        assert backend.embedded.alive()
        root = tmp_path / "data/registry"
        for name in ("password", "htpasswd"):
            assert stat.S_IMODE((root / name).stat().st_mode) == 0o600, name
        password = (root / "password").read_text().strip()
        assert len(password) >= 40
        assert password not in (root / "htpasswd").read_text()  # only its bcrypt hash is there
        async with httpx.AsyncClient() as http:
            refused = await http.get(f"{url}/v2/")
            assert refused.status_code == 401
            assert refused.headers["WWW-Authenticate"].startswith("Basic ")
            assert (await http.get(f"{url}/v2/", auth=(EMBEDDED_USER, "a guess"))).status_code == 401
            auth = await backend.authorization("repository:levers9/w/x:pull")
            assert auth is not None
            assert (await http.get(f"{url}/v2/", headers={"Authorization": auth})).status_code == 200
            assert password not in repr(backend.embedded_auth)
    finally:
        await backend.close()
    assert backend.embedded is not None
    assert not backend.embedded.alive()
    # a new backend on the same directory keeps the password (and so the storage it guards)
    again = RegistryBackend(RegistryConfig(), tmp_path / "data")
    try:
        await again.ready()
        assert again.embedded_auth is not None
        assert again.embedded_auth.password == password
    finally:
        await again.close()


async def test_a_killed_embedded_registry_is_started_again_on_its_port(tmp_path: Path) -> None:
    backend = RegistryBackend(RegistryConfig(), tmp_path / "data")
    try:
        url = await backend.ready()
        assert backend.embedded is not None
        assert backend.embedded.process is not None
        first = backend.embedded.process
        os.kill(first.pid, signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        # the restart is done when the supervisor counts it: the new process is there before it listens
        # (waiting for a new live process alone met "connection refused", 1 run in the full suite)
        assert backend.supervisor is not None
        while backend.supervisor.restarts < 1 or not backend.embedded.alive():
            assert asyncio.get_running_loop().time() < deadline, "the registry was not started again"
            await asyncio.sleep(0.05)
        assert backend.embedded.process is not first
        assert await backend.ready() == url
        auth = await backend.authorization("repository:levers9/w/x:pull")
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/v2/", headers={"Authorization": auth or ""})).status_code == 200
    finally:
        await backend.close()


async def test_without_the_binary_it_warns_once_and_says_how_to_install_it(
    tmp_path: Path, no_registry_binary: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="levers9.services.registry_backend")
    backend = RegistryBackend(RegistryConfig(), tmp_path / "data")
    try:
        for _ in range(3):
            with pytest.raises(RegistryUnavailable, match="apt-get install -y docker-registry"):
                await backend.ready()
        warnings = [r.getMessage() for r in caplog.records if r.name == "levers9.services.registry_backend"]
        assert len(warnings) == 1
        assert "apt-get install -y docker-registry" in warnings[0]
    finally:
        await backend.close()


async def test_a_configured_registry_is_logged_in_to_with_basic(
    tmp_path: Path, registry_factory: Callable[..., Registry]
) -> None:
    locked = registry_factory({"htpasswd": {"realm": "ops", "path": str(htpasswd_file(tmp_path / "h", "ops", "pw"))}})
    config = RegistryConfig(url=locked.url, username="ops", password_env="OPS_REGISTRY_PASSWORD")
    backend = RegistryBackend(config, tmp_path / "data", environ={"OPS_REGISTRY_PASSWORD": "pw"})
    try:
        assert await backend.ready() == locked.url
        assert backend.embedded is None
        auth = await backend.authorization("repository:levers9/w/x:pull")
        answer = await backend.http.get(f"{locked.url}/v2/levers9/w/x/tags/list", headers={"Authorization": auth or ""})
        assert answer.status_code == 404  # let in: the repository is unknown, not the user
        assert answer.json()["errors"][0]["code"] == "NAME_UNKNOWN"
    finally:
        await backend.close()
    assert not (tmp_path / "data/registry").exists()  # nothing embedded was made
    # the password's variable unset, or a user name without one: no registry, and the key named
    for environ, config in (
        ({}, RegistryConfig(url=locked.url, username="ops", password_env="OPS_REGISTRY_PASSWORD")),
        ({"OPS_REGISTRY_PASSWORD": "pw"}, RegistryConfig(url=locked.url, username="ops")),
    ):
        broken = RegistryBackend(config, tmp_path / "data", environ=environ)
        try:
            with pytest.raises(RegistryUnavailable, match=r"registry\.(password_env|username)"):
                await broken.ready()
        finally:
            await broken.close()


async def test_a_configured_registry_is_logged_in_to_with_bearer_tokens_per_scope(
    tmp_path: Path,
    registry_factory: Callable[..., Registry],
    token_service: TokenService,  # noqa: F811
) -> None:
    locked = registry_factory(
        {
            "token": {
                "realm": token_service.url,
                "service": SERVICE,
                "issuer": ISSUER,
                "rootcertbundle": str(token_service.cert),
            }
        }
    )
    config = RegistryConfig(url=locked.url, username=USER, password_env="TOKEN_PASSWORD")
    backend = RegistryBackend(config, tmp_path / "data", environ={"TOKEN_PASSWORD": PASSWORD})
    try:
        await backend.ready()
        scope = "repository:levers9/w/x:pull"
        auth = await backend.authorization(scope)
        assert auth is not None
        assert auth.startswith("Bearer ")
        assert await backend.authorization(scope) == auth  # kept, not asked for again
        answer = await backend.http.get(f"{locked.url}/v2/levers9/w/x/tags/list", headers={"Authorization": auth})
        assert (answer.status_code, answer.json()["errors"][0]["code"]) == (404, "NAME_UNKNOWN")
        assert token_service.scopes == [scope]
    finally:
        await backend.close()


async def test_a_configured_registry_over_tls_is_verified_with_the_ca_bundle_named(
    tmp_path: Path, registry_factory: Callable[..., Registry]
) -> None:
    ca = TestCA("levers9 backend test CA")
    ca.issue().write(tmp_path / "server.pem", tmp_path / "server.key")
    secure = registry_factory(tls=(tmp_path / "server.pem", tmp_path / "server.key"))
    bundle = str(ca.write(tmp_path / "ca.pem"))
    for verify, answers in ((bundle, True), (True, False), (False, True)):
        backend = RegistryBackend(RegistryConfig(url=secure.url, tls_verify=verify), tmp_path / "data")
        try:
            url = await backend.ready()
            if answers:
                assert (await backend.http.get(f"{url}/v2/")).status_code == 200, verify
            else:
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await backend.http.get(f"{url}/v2/")
        finally:
            await backend.close()
    broken = RegistryBackend(RegistryConfig(url=secure.url, tls_verify=str(tmp_path / "missing.pem")), tmp_path)
    try:
        with pytest.raises(RegistryUnavailable, match=r"registry\.tls_verify names a CA bundle that cannot be read"):
            await broken.ready()
    finally:
        await broken.close()
