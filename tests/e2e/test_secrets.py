"""Secrets and tokens as a user manages them through `levers9 up`: the CLI (gRPC), REST, and a function using one.

A secret's value goes in on stdin or from an environment variable, reaches the
functions that name it as an environment variable, and is never printed by the
CLI nor answered by the API. Another workspace neither sees nor deletes it.

The three tests share one `levers9 up` (:func:`shared_up`): only the first
makes secrets, and each gives tokens to a workspace of its own or lists none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import httpx
import pytest

from levers9.proto.v1 import controlplane_pb2, controlplane_pb2_grpc
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

VALUE = "sk-e2e-canary-91c4d2f0"


def _cli(
    up: Up, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "levers9", *args],
        env={**up.env, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=up.root,
    )


def _rest(up: Up, method: str, path: str, token: str, body: object = None) -> httpx.Response:
    return httpx.request(
        method,
        f"http://127.0.0.1:{up.http_port}/api/v1{path}",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_secrets_through_the_cli_rest_and_a_function(shared_up: Up) -> None:
    up = shared_up
    owner = up.token()

    created = _cli(up, "secret", "create", "API_KEY", stdin=VALUE + "\n")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "created secret API_KEY"
    from_env = _cli(up, "secret", "create", "DB_PASSWORD", "--from-env", "MY_PW", env={"MY_PW": "pw-canary"})
    assert from_env.returncode == 0, from_env.stderr
    replaced = _cli(up, "secret", "create", "DB_PASSWORD", "--from-env", "MY_PW", env={"MY_PW": "pw-2"})
    assert replaced.stdout.strip() == "updated secret DB_PASSWORD"
    bad = _cli(up, "secret", "create", "MY-KEY", stdin="x")
    assert bad.returncode == 2
    assert "environment variable" in bad.stderr
    unset = _cli(up, "secret", "create", "K", "--from-env", "NOT_SET_ANYWHERE")
    assert unset.returncode == 2
    assert "NOT_SET_ANYWHERE" in unset.stderr

    listed = _cli(up, "secret", "list")
    assert listed.returncode == 0, listed.stderr
    assert "API_KEY" in listed.stdout
    assert "DB_PASSWORD" in listed.stdout
    as_json = json.loads(_cli(up, "secret", "list", "--json").stdout)
    assert [s["name"] for s in as_json] == ["API_KEY", "DB_PASSWORD"]
    assert set(as_json[0]) == {"name", "created_at", "updated_at"}
    for done in (created, from_env, replaced, listed):
        assert VALUE not in done.stdout + done.stderr
        assert "pw-" not in done.stdout + done.stderr

    # gRPC checks the name itself (the CLI checked it before sending) and never answers the value
    channel = grpc.insecure_channel(f"127.0.0.1:{up.grpc_port}")
    try:
        api = controlplane_pb2_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
        metadata = (("authorization", f"Bearer {owner}"),)
        with pytest.raises(grpc.RpcError) as caught:
            api.PutSecret(controlplane_pb2.PutSecretRequest(name="1BAD", value="x"), metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "environment variable" in (caught.value.details() or "")
        put = api.PutSecret(controlplane_pb2.PutSecretRequest(name="VIA_GRPC", value=VALUE), metadata=metadata)
        assert put.name == "VIA_GRPC"
        assert VALUE.encode() not in put.SerializeToString()
        api.DeleteSecret(controlplane_pb2.DeleteSecretRequest(name="VIA_GRPC"), metadata=metadata)
    finally:
        channel.close()

    # REST sees the same secrets, and adds one the function does not name
    rest = _rest(up, "GET", "/secrets", owner)
    assert [s["name"] for s in rest.json()] == ["API_KEY", "DB_PASSWORD"]
    assert VALUE not in rest.text
    assert _rest(up, "POST", "/secrets", owner, {"name": "UNUSED", "value": "u"}).status_code == 201

    ran = up.python(
        """
        import os, levers9

        @levers9.function(secrets=["API_KEY", "DB_PASSWORD"])
        def env():
            return os.environ.get("API_KEY"), os.environ.get("DB_PASSWORD"), os.environ.get("UNUSED")

        print("ENV", env.remote())
        """
    )
    assert ran.returncode == 0, ran.stderr
    assert f"ENV ('{VALUE}', 'pw-2', None)" in ran.stdout

    # workspace B: sees none of them, and deleting A's answers exactly like a missing one
    other = up.levers9("token", "create", "--workspace", "team-b")
    assert other.returncode == 0, other.stderr
    as_b = {"LEVERS9_TOKEN": other.stdout.strip()}
    assert json.loads(_cli(up, "secret", "list", "--json", env=as_b).stdout) == []
    theirs = _cli(up, "secret", "delete", "API_KEY", env=as_b)
    missing = _cli(up, "secret", "delete", "NEVER_MADE", env=as_b)
    assert theirs.returncode == missing.returncode == 1
    assert theirs.stderr.replace("API_KEY", "NEVER_MADE") == missing.stderr
    assert "does not exist" in missing.stderr
    rest_b = _rest(up, "DELETE", "/secrets/API_KEY", other.stdout.strip())
    assert rest_b.status_code == 404

    # A deletes: over the CLI, then over REST
    deleted = _cli(up, "secret", "delete", "API_KEY")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == "deleted secret API_KEY"
    assert _rest(up, "DELETE", "/secrets/UNUSED", owner).status_code == 204
    assert [s["name"] for s in _rest(up, "GET", "/secrets", owner).json()] == ["DB_PASSWORD"]


def test_a_revoked_token_is_refused(shared_up: Up) -> None:
    up = shared_up
    issued = up.levers9("token", "create", "--workspace", "team-revoke")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    token_id = issued.stderr.split("token id: ", 1)[1].split()[0]
    assert _rest(up, "GET", "/tasks", token).status_code == 200

    listed = json.loads(up.levers9("token", "list", "--workspace", "team-revoke", "--json").stdout)
    assert [(t["id"], t["state"]) for t in listed] == [(token_id, "active")]
    assert token not in json.dumps(listed)

    revoked = up.levers9("token", "revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked {token_id}" in revoked.stdout
    # the controlplane caches a verified token for up to 10 s: wait for the refusal, within a bound
    deadline = time.monotonic() + 30
    while (status := _rest(up, "GET", "/tasks", token).status_code) == 200:
        assert time.monotonic() < deadline, "the revoked token is still accepted"
        time.sleep(0.5)
    assert status == 401
    listed = json.loads(up.levers9("token", "list", "--workspace", "team-revoke", "--json").stdout)
    assert [(t["id"], t["state"]) for t in listed] == [(token_id, "revoked")]

    # revoking by the token itself works too; an unknown one is an error
    again = up.levers9("token", "create", "--workspace", "team-revoke")
    second = again.stdout.strip()
    assert up.levers9("token", "revoke", second).returncode == 0
    unknown = up.levers9("token", "revoke", "tok_nope")
    assert unknown.returncode == 1
    assert "no token 'tok_nope'" in unknown.stderr


def test_an_operator_token_sees_every_worker_and_a_workspace_token_does_not(shared_up: Up) -> None:
    """`token create --operator`: the documented way to get the operator's token for a team's controlplane."""
    up = shared_up
    issued = up.levers9("token", "create", "--operator")
    assert issued.returncode == 0, issued.stderr
    operator = issued.stdout.strip()
    workspace = up.token()
    as_operator = _rest(up, "GET", "/workers", operator)
    as_workspace = _rest(up, "GET", "/workers", workspace)
    assert as_operator.status_code == as_workspace.status_code == 200, as_operator.text
    seen = as_operator.json()
    seen = seen["workers"] if isinstance(seen, dict) else seen
    hidden = as_workspace.json()
    hidden = hidden["workers"] if isinstance(hidden, dict) else hidden
    # the operator sees which machine runs each worker (the shared up runs one or two by now); a workspace, none
    assert seen, as_operator.text
    assert all(w["machine_id"] for w in seen), seen
    assert sorted(str(w["id"]) for w in hidden) == sorted(str(w["id"]) for w in seen)
    assert all(w["machine_id"] in (None, "") for w in hidden), hidden
    both = up.levers9("token", "create", "--operator", "--kind", "worker", "--pool", "cpu")
    assert both.returncode == 2
    assert "--operator makes a user token" in both.stderr
