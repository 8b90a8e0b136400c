"""The config file docs/deploy.md §3 shows is one the server accepts, with what the guide puts in its environment.

It is checked with ``levers9 config check``, as the guide tells operators to,
so a renamed field or a form the guide uses and the loader does not know fails
here, not on an operator's replica.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).parents[2] / "docs" / "deploy.md"


def _guide_config() -> str:
    text = GUIDE.read_text()
    section = text.index("## 3. The config file")
    start = text.index("```yaml\n", section) + len("```yaml\n")
    return text[start : text.index("```", start)]


def _check(path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_") and k != "CREDENTIALS_DIRECTORY"}
    return subprocess.run(
        [sys.executable, "-m", "levers9", "config", "check", str(path)],
        env={**env, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_guides_config_file_is_accepted_with_its_environment(tmp_path: Path) -> None:
    config = tmp_path / "levers9.yaml"
    config.write_text(_guide_config())
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "redis").write_text("redis://levers9:s3cret-canary@redis.internal:6379/0\n")
    environ = {
        "LEVERS9_DATABASE_URL": "postgresql+psycopg://levers9:pw-canary@db.internal/levers9",
        "CREDENTIALS_DIRECTORY": str(credentials),
        "LEVERS9_REGISTRY_PASSWORD": "registry-canary",
    }
    done = _check(config, environ)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok, 1 pool(s)" in done.stdout
    for secret in ("s3cret-canary", "pw-canary", "registry-canary"):
        assert secret not in done.stdout + done.stderr

    # without the environment the server would not start, and says which variable is missing where
    missing = _check(config, {})
    assert missing.returncode != 0
    assert "state.database_url: environment variable LEVERS9_DATABASE_URL is not set" in missing.stderr + missing.stdout
    assert "CREDENTIALS_DIRECTORY" in missing.stderr + missing.stdout
