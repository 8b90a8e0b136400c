"""levers9.Sandbox's options: each checked on the user's machine, and what reaches the REST API's create body."""

from __future__ import annotations

from pathlib import Path

import pytest

import levers9
from levers9.sdk.context import Context, ContextError, save_context
from levers9.sdk.sandbox_errors import SandboxRequestError
from levers9.sdk.sandbox_http import transport_for


def test_options_become_the_create_body() -> None:
    sandbox = levers9.Sandbox(
        cpu="500m",
        memory="1Gi",
        keep_warm_seconds=-1,
        idle_timeout=30,
        name="agent",
        secrets="hf",
        env={"A": "1"},
        ports=[8000],
        allow_list=["10.0.0.1/8"],
        pool="sandboxes",
    )
    body = sandbox._body("host", "3.11", None)
    assert body == {
        "image": "host",
        "python_version": "3.11",
        "cpu_millicores": 500,
        "memory_mib": 1024,
        "env": {"A": "1"},
        "secrets": ["hf"],
        "ports": [8000],
        "block_network": False,
        "timeout_s": 0.0,
        "idle_timeout_s": 30.0,
        "allow_list": ["10.0.0.0/8"],
        "name": "agent",
        "pool": "sandboxes",
    }
    assert levers9.Sandbox(cpu=2, keep_warm_seconds=90)._body("img", "3.12", "snap-1")["snapshot"] == "snap-1"
    assert levers9.Sandbox(cpu=2, keep_warm_seconds=90)._body("img", "3.12", None)["cpu_millicores"] == 2000
    assert (levers9.Sandbox(gpu="any").gpu, levers9.Sandbox(gpu="any").gpu_count) == (["any"], 1)
    assert (levers9.Sandbox(gpu_count=2).gpu, levers9.Sandbox(gpu_count=2).gpu_count) == (["any"], 2)
    gpus = levers9.Sandbox(gpu=["h100", "A100-80GB", "cpu"], gpu_count=2)._body("host", "3.11", None)
    assert (gpus["gpu"], gpus["gpu_count"]) == (["H100", "A100-80", "cpu"], 2)
    assert "gpu" not in levers9.Sandbox(gpu_count=0)._body("host", "3.11", None)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"cpu": "lots"}, "cpu"),
        ({"memory": "1 potato"}, "memory"),
        ({"memory": 0}, "memory"),
        ({"keep_warm_seconds": 0}, "keep_warm_seconds"),
        ({"keep_warm_seconds": -5}, "keep_warm_seconds"),
        ({"keep_warm_seconds": "10"}, "keep_warm_seconds"),
        ({"idle_timeout": -1}, "idle_timeout"),
        ({"volumes": [object()]}, "volumes"),
        ({"gpu": "H101"}, "gpu"),
        ({"gpu": ["cpu", "H100"]}, "gpu"),
        ({"gpu": "H100", "gpu_count": 3}, "gpu_count"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu": "H100", "snapshots": True}, "snapshots"),
        ({"ports": [0]}, "ports"),
        ({"ports": ["80"]}, "ports"),
        ({"env": {"A": 1}}, "env"),
        ({"secrets": [""]}, "secrets"),
        ({"block_network": True, "allow_list": ["1.2.3.4/32"]}, "allow_list"),
        ({"allow_list": ["not-a-range"]}, "allow_list"),
        ({"image": ""}, "image"),
        ({"image": 3}, "image"),
        ({"pool": ""}, "pool"),
        ({"name": ""}, "name"),
        ({"snapshots": "yes"}, "snapshots"),
    ],
)
def test_a_bad_option_is_refused_by_name(options: dict[str, object], named: str) -> None:
    with pytest.raises(SandboxRequestError, match=rf"levers9\.Sandbox: {named}: ") as caught:
        levers9.Sandbox(**options)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)


def test_volumes_and_cloud_buckets_are_sent() -> None:
    sandbox = levers9.Sandbox(volumes=[levers9.Volume(name="weights", mount_path="/weights")])
    assert sandbox._body("host", "3.11", None)["volumes"] == [{"name": "weights", "mount_path": "/weights"}]
    assert "volumes" not in levers9.Sandbox(volumes=[])._body("host", "3.11", None)
    config = levers9.CloudBucketConfig(access_key="K", secret_key="S", endpoint="http://s3.local:9000", read_only=True)
    bucket = levers9.Sandbox(volumes=[levers9.CloudBucket(name="my-bucket", mount_path="/b", config=config)])
    assert bucket._body("host", "3.11", None)["volumes"] == [
        {
            "name": "my-bucket",
            "mount_path": "/b",
            "bucket": {
                "read_only": True,
                "force_path_style": False,
                "access_key": "K",
                "secret_key": "S",
                "endpoint": "http://s3.local:9000",
                "region": "",
            },
        }
    ]
    with pytest.raises(ValueError, match=r"volumes.*both mount at or below /w"):
        levers9.Sandbox(
            volumes=[levers9.Volume(name="a", mount_path="/w"), levers9.Volume(name="b", mount_path="/w/x")]
        )


def test_a_context_without_http_is_refused_naming_the_file_the_context_and_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LEVERS9_CONTEXT", "LEVERS9_GRPC", "LEVERS9_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    save_context(Context(name="team", grpc="cp.example:1993", token="x"))
    with pytest.raises(ContextError) as caught:
        transport_for(None)
    message = str(caught.value)
    assert "context 'team'" in message
    assert str(tmp_path / "config") in message
    assert "no http field" in message
    with pytest.raises(ContextError, match="no http field"):
        levers9.Sandbox().connect("sb-1")
