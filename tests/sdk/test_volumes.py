"""The SDK's volumes and cloud buckets: the published SDK's names, every option checked on the user's machine."""

from __future__ import annotations

import pytest

import levers9
from levers9.sdk.errors import InvalidFunction
from levers9.sdk.options import stub_config


def _work() -> None:
    return None


def test_volumes_and_cloud_buckets_go_into_the_stub_config() -> None:
    weights = levers9.Volume(name="weights", mount_path="./weights")
    bucket = levers9.CloudBucket(
        name="team-data",
        mount_path="/mnt/data",
        config=levers9.CloudBucketConfig(read_only=True, access_key="KEY", secret_key="SECRET", region="eu-west-1"),
    )

    train = levers9.function(volumes=[weights, bucket])(_work)
    assert train.config["volumes"] == [
        {"name": "weights", "mount_path": "/weights"},
        {
            "name": "team-data",
            "mount_path": "/mnt/data",
            "bucket": {
                "read_only": True,
                "force_path_style": False,
                "access_key": "KEY",
                "secret_key": "SECRET",
                "endpoint": "",
                "region": "eu-west-1",
            },
        },
    ]
    message = stub_config(train.config)
    assert [(v.name, v.mount_path, v.HasField("bucket")) for v in message.volumes] == [
        ("weights", "/weights", False),
        ("team-data", "/mnt/data", True),
    ]
    assert message.volumes[1].bucket.read_only


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: levers9.Volume(name="../up", mount_path="/x"), "volume name '../up' is not valid"),
        (lambda: levers9.Volume(name="w", mount_path="/"), "would cover /"),
        (lambda: levers9.Volume(name="w", mount_path="/usr/lib/x"), "would cover /usr/lib/x"),
        (lambda: levers9.Volume(name="w", mount_path="../../etc"), "would cover /etc"),
        (lambda: levers9.CloudBucket(name="Bad_Bucket", mount_path="/b"), "is not a bucket name"),
        (
            lambda: levers9.CloudBucket(
                name="ok-bucket", mount_path="/b", config=levers9.CloudBucketConfig(access_key="AKIA-literal!")
            ),
            "names a workspace secret",
        ),
        (
            lambda: levers9.CloudBucket(
                name="ok-bucket", mount_path="/b", config=levers9.CloudBucketConfig(access_key="K")
            ),
            "give both access_key and secret_key",
        ),
        (
            lambda: levers9.CloudBucket(
                name="ok-bucket", mount_path="/b", config=levers9.CloudBucketConfig(endpoint="minio:9000")
            ),
            "is not http",
        ),
    ],
)
def test_bad_volumes_are_refused_naming_what_is_wrong(make: object, message: str) -> None:
    with pytest.raises(InvalidFunction, match=message):
        make()  # type: ignore[operator]


def test_volumes_must_be_a_list_and_may_not_overlap() -> None:
    weights = levers9.Volume(name="weights", mount_path="/data")
    with pytest.raises(InvalidFunction, match="volumes must be a list"):
        levers9.function(volumes=weights)(_work)  # type: ignore[arg-type]
    with pytest.raises(InvalidFunction, match=r"is not a levers9\.Volume"):
        levers9.function(volumes=["weights"])(_work)  # type: ignore[list-item]
    inner = levers9.Volume(name="inner", mount_path="/data/inner")
    with pytest.raises(InvalidFunction, match="both mount at or below /data"):
        levers9.function(volumes=[weights, inner])(_work)
