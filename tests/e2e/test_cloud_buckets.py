"""Cloud buckets on a real `levers9 up`: a function mounts an S3 bucket (moto's S3 server at the wire).

The user's way: two workspace secrets hold the bucket's keys, ``levers9.CloudBucket(name, mount_path,
config=levers9.CloudBucketConfig(access_key=SECRET, secret_key=SECRET, endpoint=..., force_path_style=True))``
in ``volumes=``. The worker mounts the bucket with rclone's s3 backend, the keys in rclone's environment;
the container sees the bucket's objects as files, and a file it closes becomes an object. A read-only
bucket refuses writes. Nothing stays mounted once `up` has stopped.
"""

from __future__ import annotations

import json

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up
from tests.fixtures.volume_stores import ACCESS_KEY, SECRET_KEY, S3Store

APP = """\
import json
import os
import levers9

config = levers9.CloudBucketConfig(access_key="BUCKET_KEY", secret_key="BUCKET_SECRET", endpoint="{endpoint}",
                                   force_path_style=True, region="us-east-1")
data = levers9.CloudBucket(name="{bucket}", mount_path="/mnt/data", config=config)
frozen = levers9.CloudBucket(name="{bucket}", mount_path="/mnt/frozen",
                             config=levers9.CloudBucketConfig(**{{**config.__dict__, "read_only": True}}))


@levers9.function(volumes=[data, frozen], memory=256)
def use() -> dict:
    read = open("/mnt/data/inputs/hello.txt").read()
    os.makedirs("/mnt/data/outputs", exist_ok=True)
    with open("/mnt/data/outputs/result.txt", "w") as f:
        f.write("written by a call")
    try:
        open("/mnt/frozen/nope.txt", "w").write("x")
        refused = ""
    except OSError as exc:
        refused = exc.strerror
    return {{"read": read, "frozen_listing": sorted(os.listdir("/mnt/frozen/inputs")), "refused": refused,
            "env": sorted(k for k in os.environ if "KEY" in k or "SECRET" in k)}}


def main() -> None:
    print(json.dumps(use.remote()))
"""


def test_a_function_reads_and_writes_a_cloud_bucket_and_a_read_only_one_refuses_writes(
    levers9_up: Up, moto_s3: S3Store
) -> None:
    s3 = moto_s3.client
    bucket = moto_s3.bucket("team-data")
    s3.put_object(Bucket=bucket, Key="inputs/hello.txt", Body=b"hello from the bucket")
    levers9_up.use_runtime("runc")
    levers9_up.start()
    for name, value in (("BUCKET_KEY", ACCESS_KEY), ("BUCKET_SECRET", SECRET_KEY)):
        levers9_up.secret(name, value)
    app = levers9_up.root / "bucket_app.py"
    app.write_text(APP.format(endpoint=moto_s3.endpoint, bucket=bucket))
    run = levers9_up.levers9("run", f"{app.name}::main", timeout=600)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- up:\n{levers9_up.log()[-4000:]}"
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["read"] == "hello from the bucket"
    assert answer["frozen_listing"] == ["hello.txt"]
    assert answer["refused"] == "Read-only file system"
    assert answer["env"] == []  # the keys are the worker's rclone's, never the container's
    written = s3.get_object(Bucket=bucket, Key="outputs/result.txt")["Body"].read()
    assert written == b"written by a call"
    assert sorted(moto_s3.objects(bucket)) == ["inputs/hello.txt", "outputs/result.txt"]
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []
