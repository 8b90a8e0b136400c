"""docs/deploy.md's restore procedure, step by step, on a real replica, PostgreSQL and redis-server.

The record lives in PostgreSQL; Redis holds only the working set, rebuilt from
PostgreSQL when a replica starts. So a restore is: stop the replicas,
``pg_dump -Fc`` (taken earlier) restored into an emptied database with
``pg_restore``, Redis emptied (its keys describe the database as it was at the
end, not at the dump), the replicas started again with the same secret key
file. What was in the dump must come back whole: a user's token is accepted,
an operator's token still lists, an endpoint deployed before the dump answers
with the secret it reads (decrypted with the key file), and what was made after
the dump is gone. A step of the guide that does not work fails here first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.parse

import httpx
import pytest
import redis

from tests.fixtures.replicas import Replicas

pytestmark = pytest.mark.timeout(420)

APP = """
import os

import levers9

@levers9.endpoint(secrets=["GREETING"])
def greet(name: str = "you") -> str:
    return os.environ["GREETING"] + ", " + name
"""


def _pg(url: str) -> tuple[list[str], str]:
    """``-h/-p/-U`` options for the client tools, and the database name, of a ``postgresql+psycopg://`` URL."""
    parsed = urllib.parse.urlsplit(url)
    return ["-h", parsed.hostname or "", "-p", str(parsed.port), "-U", parsed.username or ""], parsed.path[1:]


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"


def _client(replicas: Replicas, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A client command as a user runs it: the replicas' addresses and the user's token, no config file."""
    return subprocess.run(
        [sys.executable, "-m", "levers9", *args],
        env=replicas.sdk_env(None, None),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=replicas.root,
    )


def _greet(replicas: Replicas, token: str) -> httpx.Response:
    port = replicas.replicas[0].http_port
    return httpx.post(
        f"http://127.0.0.1:{port}/endpoint/greet",
        json={"name": "ada"},
        headers={"authorization": f"Bearer {token}"},
        timeout=120,
    )


def test_a_dump_restored_as_the_guide_says_brings_back_tokens_secrets_and_deployments(replicas: Replicas) -> None:
    replicas.count = 1
    replicas.start_all()
    secret = _client(replicas, "secret", "create", "GREETING", stdin="hello\n")
    assert secret.returncode == 0, secret.stderr
    app = replicas.root / "webapp.py"
    app.write_text(textwrap.dedent(APP))
    deployed = _client(replicas, "deploy", str(app))
    assert deployed.returncode == 0, deployed.stderr + replicas.logs()
    answer = _greet(replicas, replicas.token)
    assert answer.status_code == 200, answer.text
    assert answer.json() == "hello, ada"
    operator = replicas.levers9("token", "create", "--operator")
    assert operator.returncode == 0, operator.stderr

    # the backup, as deploy.md §9 takes it
    connect, database = _pg(replicas.database_url)
    dump = replicas.root / "levers9.dump"
    _run("pg_dump", *connect, "-Fc", "-f", str(dump), database)

    # after the dump: a token and a secret the restore must forget
    later = replicas.levers9("token", "create", "--workspace", "later")
    assert later.returncode == 0, later.stderr
    assert _client(replicas, "secret", "create", "AFTER", stdin="x\n").returncode == 0

    # the restore, as deploy.md §9 says: every replica stopped, the database emptied and restored, Redis emptied
    replicas.stop_all()
    _run("dropdb", *connect, "--force", database)
    _run("createdb", *connect, database)
    _run("pg_restore", *connect, "--no-owner", "-d", database, str(dump))
    redis.Redis.from_url(replicas.redis_url).flushdb()
    replicas.start(0)

    listed = replicas.levers9("token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [t["state"] for t in json.loads(listed.stdout)] == ["active"]  # the user's token
    gone = replicas.levers9("token", "list", "--workspace", "later")
    assert gone.returncode != 0, gone.stdout  # the workspace made after the dump
    secrets = _client(replicas, "secret", "list", "--json")
    assert secrets.returncode == 0, secrets.stderr + replicas.logs()
    assert [s["name"] for s in json.loads(secrets.stdout)] == ["GREETING"]
    refused = httpx.get(
        f"http://127.0.0.1:{replicas.replicas[0].http_port}/api/v1/tasks",
        headers={"authorization": f"Bearer {later.stdout.strip()}"},
        timeout=10,
    )
    assert refused.status_code == 401, refused.text
    # the deployment serves again, its secret decrypted with the same key file
    answer = _greet(replicas, replicas.token)
    assert answer.status_code == 200, answer.text + replicas.logs()
    assert answer.json() == "hello, ada"
    # the operator's token made before the dump still works
    workers = httpx.get(
        f"http://127.0.0.1:{replicas.replicas[0].http_port}/api/v1/workers",
        headers={"authorization": f"Bearer {operator.stdout.strip()}"},
        timeout=10,
    )
    assert workers.status_code == 200, workers.text
